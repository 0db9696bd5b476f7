#include "server/knowledge/passage.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "server/knowledge/chunker.h"
#include "server/knowledge/tokenizer.h"

namespace fwai {

bool SameSection(const PassageChunk& a, const PassageChunk& b) {
  if (a.section >= 0 && b.section >= 0) return a.section == b.section;
  if (a.title_path.empty() || b.title_path.empty()) return true;
  const size_t n = std::min(a.title_path.size(), b.title_path.size());
  return std::equal(a.title_path.begin(), a.title_path.begin() + static_cast<std::ptrdiff_t>(n),
                    b.title_path.begin());
}

size_t OverlapLength(std::string_view prev, std::string_view next) {
  constexpr size_t kMin = 16, kMax = 2048;
  const size_t most = std::min({prev.size(), next.size(), kMax});
  if (most < kMin) return 0;
  // The longest suffix of `prev` that starts `next`: try start positions
  // from the left, jumping to occurrences of next's first byte.
  const char first = next[0];
  for (size_t i = prev.size() - most; i + kMin <= prev.size();) {
    const void* hit = std::memchr(prev.data() + i, first, prev.size() - kMin + 1 - i);
    if (hit == nullptr) break;
    i = static_cast<size_t>(static_cast<const char*>(hit) - prev.data());
    const size_t len = prev.size() - i;
    if (std::memcmp(prev.data() + i, next.data(), len) == 0) return len;
    ++i;
  }
  return 0;
}

QueryTermScorer::QueryTermScorer(const std::vector<std::pair<std::string, float>>& terms,
                                 const std::function<double(const std::string&)>& idf) {
  for (const auto& [term, weight] : terms) {
    if (weight_.count(term)) continue;
    const double w = std::max(0.0, static_cast<double>(weight)) * std::max(0.0, idf(term));
    weight_[term] = w;
    if (weight >= 1.0f) total_ += w;
  }
}

double QueryTermScorer::CoverageOfTerms(const std::vector<std::string>& terms) const {
  if (total_ <= 0) return 0;
  std::unordered_set<std::string_view> seen;
  double sum = 0;
  for (const auto& t : terms) {
    auto it = weight_.find(t);
    if (it == weight_.end() || !seen.insert(it->first).second) continue;
    sum += it->second;
  }
  return std::min(1.0, sum / total_);
}

double QueryTermScorer::Coverage(std::string_view text) const {
  if (total_ <= 0) return 0;
  std::vector<std::string> terms;
  Tokenize(text, &terms);
  return CoverageOfTerms(terms);
}

namespace {

// Cuts a long line into sentences ("." "?" "!" then a space and a capital,
// a digit or an opening bracket); returns the cut offsets after `begin`.
void SentenceCuts(std::string_view s, size_t begin, size_t end, std::vector<size_t>* cuts) {
  for (size_t i = begin; i + 2 < end; ++i) {
    const char c = s[i];
    if ((c == '.' || c == '?' || c == '!') && s[i + 1] == ' ') {
      const unsigned char n = static_cast<unsigned char>(s[i + 2]);
      if (absl::ascii_isupper(n) || absl::ascii_isdigit(n) || n == '(' || n == '[' || n == '"' ||
          n >= 0x80) {
        cuts->push_back(i + 2);
      }
    }
  }
}

// A partition of a chunk's own text into units: lines, and sentences of
// lines longer than a few sentences. Each unit keeps its line break.
std::vector<std::pair<uint32_t, uint32_t>> Units(std::string_view own) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  size_t start = 0;
  while (start < own.size()) {
    size_t nl = own.find('\n', start);
    const size_t end = nl == std::string_view::npos ? own.size() : nl + 1;
    std::vector<size_t> cuts;
    if (end - start > 240) SentenceCuts(own, start, end, &cuts);
    size_t b = start;
    for (size_t c : cuts) {
      if (c - b >= 40) {
        out.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(c));
        b = c;
      }
    }
    out.emplace_back(static_cast<uint32_t>(b), static_cast<uint32_t>(end));
    start = end;
  }
  return out;
}

bool Blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; });
}

struct Rendered {
  std::string text;
  // Where each unit of the window landed in `text`: (chunk, unit begin) -> offset.
  std::vector<std::pair<DocPos, std::pair<int, int>>> units;
  std::vector<uint32_t> chunks;
};

// Concatenates the own text of the chunks in [begin, end), joining chunks
// with a line break when the text does not carry one.
Rendered Render(const PassageSource& src, DocPos begin, DocPos end) {
  Rendered r;
  for (uint32_t k = begin.chunk; k <= end.chunk; ++k) {
    const PassageChunk* c = src.chunk(k);
    if (c == nullptr) break;
    std::string_view own = c->own();
    const size_t from = k == begin.chunk ? std::min<size_t>(begin.offset, own.size()) : 0;
    const size_t to = k == end.chunk ? std::min<size_t>(end.offset, own.size()) : own.size();
    if (to <= from) continue;
    std::string_view seg = own.substr(from, to - from);
    if (!r.text.empty() && r.text.back() != '\n' && seg.front() != '\n') r.text.push_back('\n');
    const size_t base = r.text.size();
    r.text.append(seg);
    r.chunks.push_back(k);
    for (const auto& [ub, ue] : Units(own)) {
      if (ue <= from || ub >= to) continue;
      const size_t b = std::max<size_t>(ub, from), e = std::min<size_t>(ue, to);
      r.units.push_back({DocPos{k, static_cast<uint32_t>(b)},
                         {static_cast<int>(base + b - from), static_cast<int>(base + e - from)}});
    }
  }
  return r;
}

// Trims surrounding blank space, shifting the unit ranges with it.
void Trim(Rendered* r) {
  size_t lead = 0;
  while (lead < r->text.size() && absl::ascii_isspace(static_cast<unsigned char>(r->text[lead])))
    ++lead;
  size_t keep = r->text.size();
  while (keep > lead && absl::ascii_isspace(static_cast<unsigned char>(r->text[keep - 1]))) --keep;
  r->text = r->text.substr(lead, keep - lead);
  for (auto& u : r->units) {
    u.second.first =
        std::clamp(u.second.first - static_cast<int>(lead), 0, static_cast<int>(r->text.size()));
    u.second.second =
        std::clamp(u.second.second - static_cast<int>(lead), 0, static_cast<int>(r->text.size()));
  }
}

Passage Finish(const PassageSource& src, DocPos begin, DocPos end, const QueryTermScorer& scorer) {
  Passage p;
  p.begin = begin;
  p.end = end;
  Rendered r = Render(src, begin, end);
  Trim(&r);
  p.text = std::move(r.text);
  p.tokens = CountTokens(p.text);
  p.chunks = r.chunks;
  if (!p.chunks.empty()) {
    const PassageChunk* first = src.chunk(p.chunks.front());
    const PassageChunk* last = src.chunk(p.chunks.back());
    p.page = first->page;
    p.end_page = last->page;
    p.start_line = first->start_line;
    p.end_line = last->end_line;
  }
  if (scorer.empty()) return p;
  p.coverage = scorer.Coverage(p.text);
  // The best lines or sentences: up to three, at least half the best's share.
  std::vector<std::pair<double, std::pair<int, int>>> scored;
  for (const auto& [pos, range] : r.units) {
    if (range.second <= range.first) continue;
    std::string_view u = std::string_view(p.text).substr(range.first, range.second - range.first);
    if (Blank(u)) continue;
    const double s = scorer.Coverage(u);
    if (s > 0) scored.push_back({s, range});
    p.best_unit = std::max(p.best_unit, s);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [s, range] : scored) {
    if (p.highlights.size() >= 3 || s < 0.5 * p.best_unit) break;
    int b = range.first, e = range.second;
    while (e > b && absl::ascii_isspace(static_cast<unsigned char>(p.text[e - 1]))) --e;
    while (b < e && absl::ascii_isspace(static_cast<unsigned char>(p.text[b]))) ++b;
    if (e > b) p.highlights.emplace_back(b, e);
  }
  std::sort(p.highlights.begin(), p.highlights.end());
  return p;
}

}  // namespace

Passage RenderPassage(const PassageSource& source, DocPos begin, DocPos end,
                      const QueryTermScorer& scorer) {
  return Finish(source, begin, end, scorer);
}

double WithinDocScore(double score, double doc_best, double coverage, double best_unit,
                      double weight) {
  const double w = std::clamp(weight, 0.0, 1.0);
  const double within =
      0.8 + 0.1 * std::clamp(coverage, 0.0, 1.0) + 0.1 * std::clamp(best_unit, 0.0, 1.0);
  return (1 - w) * score + w * doc_best * within;
}

int PassageTokens(const PassageSource& source, DocPos begin, DocPos end) {
  Rendered r = Render(source, begin, end);
  Trim(&r);
  return CountTokens(r.text);
}

bool IsLeadIn(const PassageChunk& chunk, int budget) {
  std::string_view own = chunk.own();
  while (!own.empty() && absl::ascii_isspace(static_cast<unsigned char>(own.back())))
    own.remove_suffix(1);
  if (own.empty()) return false;
  if (own.back() == ':') return true;
  return budget > 0 && CountTokens(own) * 4 <= budget;
}

Passage BuildPassage(const PassageSource& src, uint32_t hit, int budget,
                     const QueryTermScorer& scorer, PassageGrowth growth) {
  const PassageChunk* h = src.chunk(hit);
  if (h == nullptr) return {};
  const bool forward = growth == PassageGrowth::kForwardFromLeadIn && IsLeadIn(*h, budget);
  // The chunk as stored: its own text plus the overlap it repeats from the
  // previous chunk (the tail of that chunk's own text).
  DocPos begin{hit, 0}, end{hit, static_cast<uint32_t>(h->own().size())};
  const PassageChunk* before = hit > 0 ? src.chunk(hit - 1) : nullptr;
  if (h->overlap > 0 && before != nullptr) {
    const size_t own = before->own().size();
    begin = DocPos{hit - 1, static_cast<uint32_t>(own - std::min(h->overlap, own))};
  }
  if (budget <= 0) return Finish(src, begin, end, scorer);
  const int initial = PassageTokens(src, begin, end);
  const int limit =
      std::min(kMaxPassageTokens, std::max(std::min(budget, kMaxPassageTokens), initial));
  size_t chars = static_cast<size_t>(initial) * 4;
  const size_t max_chars = static_cast<size_t>(limit) * 4;

  // The chunks the window may grow into: the run of the hit's section.
  // Growing forward from a lead-in, the subsections under the hit's
  // heading belong to it too (their title paths continue the hit's).
  auto under_hit = [&](const PassageChunk& x) {
    return !h->title_path.empty() && x.title_path.size() > h->title_path.size() &&
           std::equal(h->title_path.begin(), h->title_path.end(), x.title_path.begin());
  };
  auto allowed = [&](uint32_t k) -> const PassageChunk* {
    const PassageChunk* c = src.chunk(k);
    if (c == nullptr) return nullptr;
    for (uint32_t j = std::min(k, hit); j <= std::max(k, hit); ++j) {
      const PassageChunk* x = src.chunk(j);
      if (x == nullptr) return nullptr;
      if (j == hit || src.same_section(*h, *x)) continue;
      if (forward && j > hit && under_hit(*x)) continue;
      return nullptr;
    }
    return c;
  };
  std::unordered_map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> units;
  auto units_of = [&](uint32_t k,
                      const PassageChunk& c) -> const std::vector<std::pair<uint32_t, uint32_t>>& {
    auto it = units.find(k);
    if (it == units.end()) it = units.emplace(k, Units(c.own())).first;
    return it->second;
  };
  // The unit just left of `pos` / right of `pos`, as the new window edge.
  struct Step {
    DocPos edge;
    size_t chars = 0;
    std::string_view text;
  };
  auto usable = [&](uint32_t k) { return k == hit ? h : allowed(k); };
  auto left_of = [&](DocPos pos) -> std::optional<Step> {
    for (uint32_t k = pos.chunk;; --k) {
      const PassageChunk* c = usable(k);
      if (c == nullptr) return std::nullopt;
      const uint32_t at = k == pos.chunk ? pos.offset : static_cast<uint32_t>(c->own().size());
      const auto& us = units_of(k, *c);
      for (auto it = us.rbegin(); it != us.rend(); ++it) {
        if (it->first < at) {
          return Step{DocPos{k, it->first}, at - it->first,
                      c->own().substr(it->first, at - it->first)};
        }
      }
      if (k == 0) return std::nullopt;
    }
  };
  auto right_of = [&](DocPos pos) -> std::optional<Step> {
    for (uint32_t k = pos.chunk;; ++k) {
      const PassageChunk* c = usable(k);
      if (c == nullptr) return std::nullopt;
      const uint32_t at = k == pos.chunk ? pos.offset : 0;
      for (const auto& u : units_of(k, *c)) {
        if (u.second > at) {
          const uint32_t from = std::max(u.first, at);
          return Step{DocPos{k, u.second}, u.second - from, c->own().substr(from, u.second - from)};
        }
      }
    }
  };
  // How much of the query the next few units on a side carry.
  auto lookahead = [&](DocPos pos, bool left) {
    double gain = 0;
    size_t used = chars;
    for (int i = 0; i < 3; ++i) {
      auto s = left ? left_of(pos) : right_of(pos);
      if (!s || used + s->chars > max_chars) break;
      used += s->chars;
      gain += scorer.empty() ? 0.0 : scorer.Coverage(s->text) / (1 + i);
      pos = s->edge;
    }
    return gain;
  };
  while (true) {
    auto l = left_of(begin);
    auto r = right_of(end);
    const bool lf = l && chars + l->chars <= max_chars;
    const bool rf = r && chars + r->chars <= max_chars;
    if (!lf && !rf) break;
    bool go_left = lf && !rf;
    if (lf && rf) go_left = !forward && lookahead(begin, true) > lookahead(end, false);
    if (go_left) {
      begin = l->edge;
      chars += l->chars;
    } else {
      end = r->edge;
      chars += r->chars;
    }
  }
  // Keep exact token counts: the window may have drawn a join or two.
  while (PassageTokens(src, begin, end) > limit) {
    auto r = right_of(begin);
    if (!r || !(r->edge < end)) break;
    begin = r->edge;
  }
  return Finish(src, begin, end, scorer);
}

}  // namespace fwai
