#include "server/knowledge/query_expansion.h"

#include <map>
#include <regex>
#include <set>

#include "server/knowledge/tokenizer.h"

namespace fwai {
namespace {

// Groups of words and phrases used for the same thing in firmware and tool
// documentation; one group per line.
constexpr const char* kGroups[] = {
    "erase|wipe|blank|clear|purge",
    "delete|remove",
    "flash|program memory|flash memory|internal flash",
    "ram|sram|working memory",
    "show|display|print|list|view",
    "size|bytes|how big|length",
    "directory|folder",
    "address|location|where stored",
    "note|remark|annotation",
    "reply|answer|respond",
    "search|find|look up|locate",
    "breakpoint|stop at|break at",
    "run|execute|launch",
    "reset|reboot|restart",
    "read|fetch|get",
    "write|store|program",
    "load|copy into|download|upload|transfer",
    "variable|symbol",
    "commit|revision",
    "ancestor|forked|fork point|merge base",
    "tag|label",
    "undo|revert|roll back",
    "history|log",
    "diff|difference|compare",
    "frequency|clock|speed",
    "watchpoint|watch",
    "backtrace|call stack|stack trace",
    "lock|protect|write protect|read protect",
    "unlock|unprotect",
    "checksum|crc",
    "image|binary|firmware",
    "chip|device|mcu|target",
    "adapter|probe|debugger",
    "uart|serial",
    "verify|check|validate",
    "issue|bug|ticket",
    "repository|repo|project",
    "pull request|merge request",
    "rename|move",
    "modify|edit|change",
    "option|setting",
    "entries|contents|listing",
    "thread|conversation",
    "source code|code",
    "mass erase|entire flash|whole flash|chip erase|all sectors|in one go",
};

// Part numbers -> the family names tools use.
void Families(const std::string& t, std::set<std::string>& out) {
  static const std::regex kTwo(R"(^([a-z]+)(\d+)([a-z]+)(\d+)[a-z0-9]*$)");
  static const std::regex kOne(R"(^([a-z]+)(\d+)[a-z0-9]*$)");
  std::smatch m;
  if (std::regex_match(t, m, kTwo)) {
    const std::string base = m[1].str() + m[2].str() + m[3].str();
    const std::string d = m[4].str();
    if (base.size() >= 4) out.insert(base);
    out.insert(base + d.substr(0, 1));
    out.insert(base + d.substr(0, 1) + "x");
    if (d.size() >= 2) out.insert(base + d.substr(0, 2) + "x");
  } else if (std::regex_match(t, m, kOne)) {
    const std::string base = m[1].str();
    const std::string d = m[2].str();
    if (d.size() < 3 || base.size() < 2) return;  // "uart1", "pa5": not part numbers
    out.insert(base + d.substr(0, 1));
    out.insert(base + d.substr(0, 1) + "x");
    out.insert(base + d.substr(0, 2));
    out.insert(base + d.substr(0, 2) + "x");
  }
}

struct Thesaurus {
  // Each entry: the phrase's terms -> the other entries of its group, as terms.
  std::vector<std::pair<std::vector<std::string>, std::vector<std::vector<std::string>>>> entries;
  Thesaurus() {
    TokenizerOptions o;
    o.drop_stop_words = false;
    for (const char* g : kGroups) {
      std::vector<std::vector<std::string>> members;
      std::string s(g);
      size_t start = 0;
      while (start <= s.size()) {
        size_t bar = s.find('|', start);
        if (bar == std::string::npos) bar = s.size();
        std::vector<std::string> terms;
        Tokenize(std::string_view(s).substr(start, bar - start), &terms, o);
        if (!terms.empty()) members.push_back(std::move(terms));
        start = bar + 1;
      }
      for (size_t i = 0; i < members.size(); ++i) {
        std::vector<std::vector<std::string>> others;
        for (size_t j = 0; j < members.size(); ++j) {
          if (j != i) others.push_back(members[j]);
        }
        entries.emplace_back(members[i], std::move(others));
      }
    }
  }
};

bool ContainsPhrase(const std::vector<std::string>& text, const std::vector<std::string>& phrase) {
  if (phrase.empty() || phrase.size() > text.size()) return false;
  for (size_t i = 0; i + phrase.size() <= text.size(); ++i) {
    bool all = true;
    for (size_t j = 0; j < phrase.size() && all; ++j) all = text[i + j] == phrase[j];
    if (all) return true;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, float>> ExpandQuery(std::string_view text,
                                                       const std::vector<std::string>& terms,
                                                       const ExpansionWeights& w) {
  static const Thesaurus th;
  const std::set<std::string> own(terms.begin(), terms.end());
  std::map<std::string, float> extra;
  auto add = [&](const std::string& t, float weight) {
    if (t.empty() || own.count(t) || IsStopWord(t)) return;
    auto& e = extra[t];
    e = std::max(e, weight);
  };
  // Part-number families.
  for (const auto& t : terms) {
    std::set<std::string> fam;
    Families(t, fam);
    for (const auto& f : fam) add(f, w.family);
  }
  // Synonyms: phrases matched on the text's terms (stop words kept, so
  // "in one go" and "where stored" can match).
  TokenizerOptions o;
  o.drop_stop_words = false;
  std::vector<std::string> all;
  Tokenize(text, &all, o);
  for (const auto& [phrase, others] : th.entries) {
    if (!ContainsPhrase(all, phrase)) continue;
    for (const auto& other : others) {
      // A phrase's words share the weight.
      for (const auto& t : other) add(t, w.synonym / static_cast<float>(other.size() > 1 ? 2 : 1));
    }
  }
  return {extra.begin(), extra.end()};
}

std::vector<std::pair<std::string, float>> WeightedQuery(std::string_view text,
                                                         const std::vector<std::string>& terms,
                                                         const ExpansionWeights& w) {
  std::vector<std::pair<std::string, float>> out;
  for (const auto& t : terms) out.emplace_back(t, 1.0f);
  for (auto& e : ExpandQuery(text, terms, w)) out.push_back(std::move(e));
  return out;
}

}  // namespace fwai
