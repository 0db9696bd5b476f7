#include "server/knowledge/tokenizer.h"

#include <algorithm>
#include <unordered_set>

#include "absl/container/flat_hash_map.h"

namespace fwai {
namespace {

bool IsAlnum(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}
bool IsUpper(unsigned char c) { return c >= 'A' && c <= 'Z'; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
// Characters that join the parts of one identifier when between two alnums.
bool IsJoiner(unsigned char c) { return c == '_' || c == '-' || c == ',' || c == '.' || c == '#'; }

char Lower(unsigned char c) {
  return IsUpper(c) ? static_cast<char>(c - 'A' + 'a') : static_cast<char>(c);
}

std::string LowerStr(std::string_view s) {
  std::string out(s.size(), '\0');
  for (size_t i = 0; i < s.size(); ++i) out[i] = Lower(s[i]);
  return out;
}

// A run of alnum segments joined by single joiner characters, e.g.
// "RCC_AHB2ENR", "snps,dw-apb-uart", "0x40021000", "v1.2". A joiner is kept
// only when an alnum follows it, so sentence punctuation is not absorbed.
// Underscores at the ends belong to the word ("__vector_table").
struct Compound {
  std::string_view text;
  bool has_joiner;
};

template <typename Fn>
void ForEachCompound(std::string_view s, Fn&& fn) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    if (!(IsAlnum(c) || c == '_' || c >= 0x80)) {
      ++i;
      continue;
    }
    size_t start = i;
    bool joiner = false;
    while (i < n) {
      unsigned char d = s[i];
      if (IsAlnum(d) || d == '_' || d >= 0x80) {
        ++i;
      } else if (IsJoiner(d) && i + 1 < n && (IsAlnum(s[i + 1]) || s[i + 1] == '_') && i > start) {
        // '.' joins only between alnums with no spaces: "v1.2", "snps,dw" but not "end. Next".
        if (d == ',' && i + 1 < n && s[i + 1] == ' ') break;
        joiner = true;
        ++i;
      } else {
        break;
      }
    }
    std::string_view word = s.substr(start, i - start);
    if (word.find('_') != std::string_view::npos) joiner = true;
    fn(Compound{word, joiner});
  }
}

const std::unordered_set<std::string_view>& StopWords() {
  static const auto* words = new std::unordered_set<std::string_view>{
      "a",     "an",    "and",  "are",   "as",   "at",    "be",    "but",   "by",   "can",
      "do",    "does",  "for",  "from",  "had",  "has",   "have",  "how",   "i",    "if",
      "in",    "into",  "is",   "it",    "its",  "me",    "my",    "no",    "not",  "of",
      "on",    "or",    "our",  "so",    "such", "that",  "the",   "their", "then", "there",
      "these", "they",  "this", "to",    "was",  "we",    "were",  "what",  "when", "where",
      "which", "while", "who",  "why",   "will", "with",  "would", "you",   "your", "should",
      "could", "than",  "them", "those", "been", "being", "did",   "any",   "some", "also"};
  return *words;
}

// Porter stems of recent words: documentation repeats its vocabulary, so
// most words are stemmed once per thread. Bounded; cleared when full.
const std::string& CachedStem(const std::string& lw) {
  thread_local absl::flat_hash_map<std::string, std::string> cache;
  auto it = cache.find(lw);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 200000) cache.clear();
  return cache.emplace(lw, PorterStem(lw)).first->second;
}

// Splits a compound at its joiners.
template <typename Fn>
void ForEachPart(std::string_view word, Fn&& fn) {
  size_t start = 0;
  for (size_t i = 0; i <= word.size(); ++i) {
    if (i == word.size() || IsJoiner(word[i])) {
      if (i > start) fn(word.substr(start, i - start));
      start = i + 1;
    }
  }
}

void AddWord(std::string_view word, std::vector<std::string>* terms, const TokenizerOptions& o) {
  std::string lw = LowerStr(word);
  if (o.drop_stop_words && IsStopWord(lw)) return;
  if (LooksLikeIdentifier(word)) {
    terms->push_back(std::move(lw));
    return;
  }
  if (o.stem) {
    terms->push_back(CachedStem(lw));
  } else {
    terms->push_back(std::move(lw));
  }
}

}  // namespace

bool IsStopWord(std::string_view w) { return w.size() <= 6 && StopWords().count(w) > 0; }

bool LooksLikeIdentifier(std::string_view w) {
  if (w.size() < 2) return false;
  bool digit = false, alpha = false, inner_upper = false, joiner = false;
  int upper = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    unsigned char c = w[i];
    if (IsDigit(c)) digit = true;
    if (IsUpper(c)) {
      ++upper;
      if (i > 0) inner_upper = true;
    }
    if ((c >= 'a' && c <= 'z') || IsUpper(c)) alpha = true;
    if (IsJoiner(c)) joiner = true;
  }
  if (joiner) return true;                  // RCC_AHB2ENR, snps,dw-apb-uart
  if (digit && alpha) return true;          // PA5, STM32F103, ahb2enr, 0x4002
  if (digit && w.size() >= 4) return true;  // 1000, 9600: numbers are kept exact
  if (inner_upper) return true;             // CANGCON, MODER, camelCase
  (void)upper;
  return false;
}

void Tokenize(std::string_view text, std::vector<std::string>* terms, const TokenizerOptions& o) {
  ForEachCompound(text, [&](const Compound& c) {
    if (!c.has_joiner) {
      AddWord(c.text, terms, o);
      return;
    }
    std::string whole = LowerStr(c.text);
    // Strip leading/trailing underscores for the whole-term too: "__init" ~ "init".
    terms->push_back(whole);
    if (!o.identifier_parts) return;
    size_t parts = 0;
    ForEachPart(c.text, [&](std::string_view) { ++parts; });
    if (parts < 2) return;
    ForEachPart(c.text, [&](std::string_view part) { AddWord(part, terms, o); });
  });
}

std::vector<std::string> FindIdentifiers(std::string_view text, size_t max) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  ForEachCompound(text, [&](const Compound& c) {
    if (out.size() >= max) return;
    if (c.text.size() < 3 || !LooksLikeIdentifier(c.text)) return;
    // A bare number is not an identifier; hex constants are.
    bool all_digits =
        std::all_of(c.text.begin(), c.text.end(), [](char ch) { return IsDigit(ch); });
    if (all_digits) return;
    std::string s(c.text);
    if (seen.insert(s).second) out.push_back(std::move(s));
  });
  return out;
}

}  // namespace fwai
