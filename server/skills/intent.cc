#include "server/skills/intent.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/llm/provider.h"

namespace fwai {
namespace {

const std::set<std::string>& StopWords() {
  static const std::set<std::string> s = {
      "a",    "an",     "the",   "and",   "or",    "to",   "of",   "in",    "on",   "for",
      "it",   "its",    "this",  "that",  "my",    "me",   "i",    "we",    "our",  "you",
      "your", "is",     "are",   "be",    "do",    "does", "did",  "then",  "now",  "with",
      "up",   "please", "can",   "could", "would", "will", "just", "again", "all",  "some",
      "let",  "lets",   "go",    "get",   "make",  "us",   "at",   "from",  "into", "so",
      "and",  "fwai",   "skill", "run",   "start"};
  return s;
}

std::string Stem(std::string w) {
  auto strip = [&](const char* suf) {
    const size_t n = std::char_traits<char>::length(suf);
    if (w.size() > n + 3 && w.compare(w.size() - n, n, suf) == 0) {
      w.erase(w.size() - n);
      return true;
    }
    return false;
  };
  if (!strip("ing") && !strip("ed") && !strip("es")) strip("s");
  strip("e");
  return w;
}

std::vector<std::string> Words(const std::string& text, bool drop_stop) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty() && !(drop_stop && StopWords().count(cur))) out.push_back(Stem(cur));
    cur.clear();
  };
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      flush();
    }
  }
  flush();
  return out;
}

std::string Normalize(std::string t) {
  t = std::string(absl::StripAsciiWhitespace(absl::AsciiStrToLower(t)));
  while (!t.empty() && (t.back() == '.' || t.back() == '!')) t.pop_back();
  for (const char* p : {"/", "fwai run ", "run "}) {
    if (t.rfind(p, 0) == 0) t = t.substr(std::char_traits<char>::length(p));
  }
  return std::string(absl::StripAsciiWhitespace(t));
}

bool LooksLikeQuestion(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (!t.empty() && t.back() == '?') return true;
  for (const char* q :
       {"why ", "how ", "what ", "where ", "when ", "which ", "explain ", "is ", "does "}) {
    if (t.rfind(q, 0) == 0) return true;
  }
  return false;
}

IntentMatch Decide(IntentMatch m) {
  m.confidence = std::clamp(m.confidence, 0.0, 1.0);
  m.action = m.skill.empty()              ? "chat"
             : m.confidence >= kIntentRun ? "run"
             : m.confidence >= kIntentAsk ? "ask"
                                          : "chat";
  return m;
}

}  // namespace

IntentMatch ResolveIntent(const std::string& text, const std::vector<Skill>& skills,
                          Provider* provider, CancelToken* cancel) {
  IntentMatch none;
  none.reason = "no skill matches";
  if (skills.empty() || text.size() > 2000) return Decide(none);
  // Tier 1: the name itself.
  const std::string norm = Normalize(text);
  for (const auto& s : skills) {
    if (norm == s.name) return Decide({s.name, 1.0, "exact", "the skill's name", ""});
  }
  const std::vector<std::string> words = Words(norm, false);
  for (const auto& s : skills) {
    if (words.size() > 1 && Words(s.name, false) == words)
      return Decide({s.name, 0.95, "exact", "the skill's name, spaced", ""});
  }
  // Tier 2: keyword scoring.
  const std::vector<std::string> content = Words(text, true);
  if (content.empty()) return Decide(none);
  const bool question = LooksLikeQuestion(text);
  struct Scored {
    const Skill* skill;
    double score;
    std::string why;
  };
  std::vector<Scored> scored;
  const std::set<std::string> text_set(content.begin(), content.end());
  std::set<std::string> all_name_parts;
  for (const auto& s : skills) {
    for (const auto& w : Words(s.name, false)) all_name_parts.insert(w);
  }
  for (const auto& s : skills) {
    std::vector<std::string> name_parts = Words(s.name, false);
    std::set<std::string> keys;
    for (const auto& k : s.keywords) {
      for (const auto& w : Words(k, false)) keys.insert(w);
    }
    std::set<std::string> vocab(name_parts.begin(), name_parts.end());
    vocab.insert(keys.begin(), keys.end());
    for (const auto& w : Words(s.description, true)) vocab.insert(w);
    int name_hits = 0;
    for (const auto& p : name_parts) name_hits += text_set.count(p) ? 1 : 0;
    int key_hits = 0;
    std::vector<std::string> matched;
    for (const auto& w : text_set) {
      if (keys.count(w)) {
        ++key_hits;
        matched.push_back(w);
      }
    }
    int covered = 0;
    for (const auto& w : content) covered += vocab.count(w) ? 1 : 0;
    const double name_cov =
        name_parts.empty() ? 0 : static_cast<double>(name_hits) / name_parts.size();
    const double kw = std::min(1.0, key_hits / 2.0);
    const double cov = static_cast<double>(covered) / content.size();
    // Naming more parts of a compound name ("build and flash") is stronger.
    const double name_score = std::min(1.0, name_cov + 0.1 * std::max(0, name_hits - 1));
    double score = std::max(0.55 * name_score + 0.25 * kw + 0.2 * cov, 0.5 * kw + 0.3 * cov);
    // A word naming another skill's action that this skill does not do
    // ("build" for flash) speaks against it.
    int foreign = 0;
    for (const auto& w : text_set) foreign += all_name_parts.count(w) && !vocab.count(w) ? 1 : 0;
    score -= 0.15 * foreign;
    // Words the skill does not explain ("... and explain the warnings") mean
    // the person wants more than the skill: ask rather than run.
    score -= 0.08 * (static_cast<int>(content.size()) - covered);
    if (question) score *= 0.7;  // questions are for the chat
    scored.push_back({&s, score,
                      absl::StrCat("name ", name_hits, "/", name_parts.size(), ", keywords [",
                                   absl::StrJoin(matched, ", "), "], covers ", covered, "/",
                                   content.size(), " words", question ? ", a question" : "")});
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const Scored& a, const Scored& b) { return a.score > b.score; });
  IntentMatch best{scored[0].skill->name, scored[0].score, "keywords", scored[0].why, ""};
  if (scored.size() > 1 && scored[0].score - scored[1].score < 0.05 &&
      scored[0].score >= kIntentAsk) {
    best.confidence = std::min(best.confidence, kIntentRun - 0.01);  // a tie is asked, not run
    absl::StrAppend(&best.reason, "; close to ", scored[1].skill->name);
  }
  if (best.confidence < 0.3) {
    best.skill.clear();
    best.tier = "none";
  }
  // Tier 3: the provider settles the plausible but uncertain.
  if (provider && best.confidence >= 0.3 && best.confidence < kIntentRun) {
    ChatRequest cr;
    cr.model = provider->config().model;
    cr.max_tokens = 200;
    cr.temperature = 0;
    std::string list;
    for (const auto& s : skills) absl::StrAppend(&list, "- ", s.name, ": ", s.description, "\n");
    cr.system =
        "You map a firmware engineer's request to one of the project's skills (workflows), or to "
        "none when the request "
        "is a question or anything else for a chat. Reply with JSON only: {\"skill\": \"<name or "
        "empty>\", "
        "\"confidence\": <0..1>}.";
    LlmMessage m;
    m.role = "user";
    m.content = nlohmann::json::array(
        {{{"type", "text"},
          {"text", absl::StrCat("Skills:\n", list, "\nRequest: ", text.substr(0, 1000))}}});
    cr.messages.push_back(std::move(m));
    struct Quiet final : StreamObserver {
      void OnText(std::string_view) override {}
    } obs;
    CancelToken local;
    auto r = provider->Stream(cr, obs, cancel ? *cancel : local);
    if (r.ok()) {
      std::string reply;
      for (const auto& b : r->content) {
        if (b.value("type", "") == "text") reply += b.value("text", "");
      }
      const size_t open = reply.find('{'), close = reply.rfind('}');
      auto j = open == std::string::npos || close == std::string::npos
                   ? nlohmann::json()
                   : nlohmann::json::parse(reply.substr(open, close - open + 1), nullptr, false);
      if (j.is_object() && j.contains("skill") && j["skill"].is_string() &&
          j.contains("confidence") && j["confidence"].is_number()) {
        const std::string name = j["skill"].get<std::string>();
        const double c = j["confidence"].get<double>();
        if (name.empty()) {
          return Decide({"", 0, "provider", "the provider sees no skill in it", ""});
        }
        if (std::any_of(skills.begin(), skills.end(),
                        [&](const Skill& s) { return s.name == name; })) {
          return Decide({name, c, "provider", absl::StrCat("the provider (", cr.model, ")"), ""});
        }
      }
    }
  }
  return Decide(best);
}

}  // namespace fwai
