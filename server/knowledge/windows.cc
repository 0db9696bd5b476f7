#include "server/knowledge/windows.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>

#include "server/knowledge/tokenizer.h"

namespace fwai {

namespace {

struct Word {
  DocPos begin, end;
  uint32_t chunk = 0;
  int terms = 0;  // index terms in the word
  // Query terms the word holds (indexes into the term list), and their weight.
  std::vector<int> hits;
  double weight = 0;
};

}  // namespace

std::vector<TextWindow> ScoreWindows(const std::vector<const PassageChunk*>& chunks,
                                     const std::unordered_map<std::string, double>& term_weight,
                                     int words) {
  std::vector<TextWindow> out;
  if (words < 2 || term_weight.empty()) return out;
  std::vector<std::string> names;
  std::vector<double> weights;
  std::unordered_map<std::string_view, int> term_index;
  names.reserve(term_weight.size());
  for (const auto& [t, w] : term_weight) {
    if (w <= 0) continue;
    names.push_back(t);
    weights.push_back(w);
  }
  for (size_t i = 0; i < names.size(); ++i) term_index[names[i]] = static_cast<int>(i);
  if (names.empty()) return out;
  std::vector<std::string> prefixes;
  for (const auto& t : names) prefixes.push_back(t.substr(0, 3));
  std::sort(prefixes.begin(), prefixes.end());
  prefixes.erase(std::unique(prefixes.begin(), prefixes.end()), prefixes.end());
  std::vector<Word> ws;
  std::vector<std::string> terms;
  std::string lower;
  for (const PassageChunk* c : chunks) {
    if (c == nullptr) continue;
    const std::string_view own = c->own();
    size_t i = 0;
    while (i < own.size()) {
      while (i < own.size() && std::isspace(static_cast<unsigned char>(own[i]))) ++i;
      if (i >= own.size()) break;
      size_t j = i;
      while (j < own.size() && !std::isspace(static_cast<unsigned char>(own[j]))) ++j;
      Word w;
      w.chunk = c->index;
      w.begin = {c->index, static_cast<uint32_t>(i)};
      w.end = {c->index, static_cast<uint32_t>(j)};
      // Only words that may hold a question term are tokenized (a term's
      // first three letters appear in any word it comes from: stems and
      // identifier parts alike); the others count as one term each.
      lower.assign(own.substr(i, j - i));
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      bool maybe = false;
      for (const auto& p : prefixes) {
        if (lower.find(p) != std::string::npos) {
          maybe = true;
          break;
        }
      }
      terms.clear();
      if (maybe) {
        Tokenize(own.substr(i, j - i), &terms);
        w.terms = static_cast<int>(terms.size());
      } else {
        w.terms = 1;
      }
      for (const auto& t : terms) {
        auto it = term_index.find(t);
        if (it == term_index.end()) continue;
        w.hits.push_back(it->second);
        w.weight += weights[static_cast<size_t>(it->second)];
      }
      ws.push_back(std::move(w));
      i = j;
    }
  }
  if (ws.empty()) return out;
  const size_t n = ws.size(), size = static_cast<size_t>(words), step = size / 2;
  std::vector<size_t> starts;
  for (size_t s = 0;; s += step) {
    if (s + size >= n) {
      starts.push_back(n > size ? n - size : 0);
      break;
    }
    starts.push_back(s);
  }
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  // Prefix sums of index terms, for window lengths.
  std::vector<int64_t> len(n + 1, 0);
  for (size_t i = 0; i < n; ++i) len[i + 1] = len[i] + ws[i].terms;
  double avg = 0;
  for (size_t s : starts) avg += static_cast<double>(len[std::min(n, s + size)] - len[s]);
  avg = std::max(1.0, avg / static_cast<double>(starts.size()));
  constexpr double k1 = 1.2, b = 0.75;
  std::vector<int> tf(names.size());
  std::unordered_map<uint32_t, double> per_chunk;
  for (size_t s : starts) {
    const size_t e = std::min(n, s + size);
    std::fill(tf.begin(), tf.end(), 0);
    per_chunk.clear();
    for (size_t i = s; i < e; ++i) {
      for (int h : ws[i].hits) ++tf[static_cast<size_t>(h)];
      if (ws[i].weight > 0) per_chunk[ws[i].chunk] += ws[i].weight;
    }
    const double dl = static_cast<double>(len[e] - len[s]);
    double score = 0;
    for (size_t t = 0; t < names.size(); ++t) {
      if (tf[t] == 0) continue;
      const double f = tf[t];
      score += weights[t] * f * (k1 + 1) / (f + k1 * (1 - b + b * dl / avg));
    }
    if (score <= 0) continue;
    TextWindow w;
    w.begin = ws[s].begin;
    w.end = ws[e - 1].end;
    w.score = score;
    double best = -1;
    for (size_t i = s; i < e; ++i) {  // first chunk with the most weight
      const auto it = per_chunk.find(ws[i].chunk);
      if (it != per_chunk.end() && it->second > best) {
        best = it->second;
        w.best_chunk = ws[i].chunk;
      }
    }
    out.push_back(w);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TextWindow& a, const TextWindow& b) { return a.score > b.score; });
  return out;
}

bool OverlapsWindow(const TextWindow& w, DocPos begin, DocPos end) {
  return begin < w.end && w.begin < end;
}

double WindowFusedScore(size_t rank, int window_rank, double weight, double k) {
  k = std::max(0.0, k);
  weight = std::max(0.0, weight);
  double s = 1.0 / (k + static_cast<double>(rank) + 1);
  if (window_rank >= 0) s += weight / (k + window_rank + 1);
  return s / ((1 + weight) / (k + 1));
}

}  // namespace fwai
