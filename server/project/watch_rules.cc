#include "server/project/watch_rules.h"

#include <re2/re2.h>
#include <yaml-cpp/yaml.h>

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace fwai {

namespace {

// RE2's memory for one pattern: ample for any banner, too little for a
// pattern that would blow up (((a{100}){100}){100} and the like).
constexpr int64_t kPatternMemory = 1 << 20;

bool ValidStream(const std::string& s) {
  if (s.empty() || s == "uart" || s == "semihosting") return true;
  int n = -1;
  return absl::StartsWith(s, "rtt:") && absl::SimpleAtoi(s.substr(4), &n) && n >= 0 && n < 16;
}

// "10", "10s", "2m" -> seconds; -1 when not a duration.
int Seconds(const std::string& text) {
  std::string t = text;
  int mult = 1;
  if (!t.empty() && (t.back() == 's' || t.back() == 'm')) {
    mult = t.back() == 'm' ? 60 : 1;
    t.pop_back();
  }
  int v = -1;
  if (!absl::SimpleAtoi(t, &v) || v < 0 || v > 86400) return -1;
  return v * mult;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const re2::RE2>> CompileWatchPattern(const std::string& pattern,
                                                                    const std::string& where) {
  if (pattern.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty"));
  re2::RE2::Options o;
  o.set_log_errors(false);
  o.set_max_mem(kPatternMemory);
  auto re = std::make_shared<const re2::RE2>(pattern, o);
  if (!re->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", pattern, "' is not a pattern fwai runs: ", re->error(),
                     re->error_code() == re2::RE2::ErrorPatternTooLarge
                         ? " (it would take too much memory to match)"
                         : ""));
  }
  return re;
}

absl::Status CheckWatchRule(const WatchRule& r, const std::string& where) {
  if (r.name.empty() || r.name.size() > 64 ||
      r.name.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") !=
          std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": name: '", r.name, "' (letters, digits, - and _, at most 64)"));
  }
  if (!ValidStream(r.stream))
    return absl::InvalidArgumentError(absl::StrCat(where, ": stream: '", r.stream,
                                                   "' (uart, rtt:N with N 0..15, or semihosting)"));
  if (auto re = CompileWatchPattern(r.pattern, absl::StrCat(where, ": pattern")); !re.ok())
    return re.status();
  if (r.count < 1 || r.count > 1000)
    return absl::InvalidArgumentError(absl::StrCat(where, ": count: ", r.count, " (1..1000)"));
  if (r.count > 1 && r.within_s <= 0)
    return absl::InvalidArgumentError(absl::StrCat(where, ": within: a count of ", r.count,
                                                   " needs a window (e.g. within: 10s)"));
  if (!r.capture && !r.notify && r.wake_session.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": actions: none (capture, notify, wake: SESSION)"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WatchRule>> ParseWatchRules(const YAML::Node& node,
                                                       const std::string& source) {
  auto at = [&source](const YAML::Node& n, const std::string& field) {
    return absl::StrCat(source, ":", n.Mark().line + 1, ": ", field);
  };
  if (!node.IsSequence())
    return absl::InvalidArgumentError(
        absl::StrCat(at(node, "watch"), ": expected a list of rules"));
  static const std::set<std::string> kKeys = {"name",  "board",  "stream",       "pattern",
                                              "count", "within", "min_interval", "actions"};
  std::vector<WatchRule> rules;
  std::set<std::string> names;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& n = node[i];
    const std::string f = absl::StrCat("watch[", i, "]");
    if (!n.IsMap()) return absl::InvalidArgumentError(absl::StrCat(at(n, f), ": expected a rule"));
    for (const auto& kv : n) {
      if (!kv.first.IsScalar() || !kKeys.count(kv.first.Scalar()))
        return absl::InvalidArgumentError(absl::StrCat(at(kv.first, f), ": unknown setting"));
    }
    WatchRule r;
    r.source = absl::StrCat(source, ":", n.Mark().line + 1);
    auto scalar = [&](const char* key, std::string& out) -> absl::Status {
      if (!n[key]) return absl::OkStatus();
      if (!n[key].IsScalar())
        return absl::InvalidArgumentError(
            absl::StrCat(at(n[key], f + "." + key), ": expected a value"));
      out = n[key].Scalar();
      return absl::OkStatus();
    };
    std::string count, within, interval;
    for (auto [k, out] :
         std::vector<std::pair<const char*, std::string*>>{{"name", &r.name},
                                                           {"board", &r.board},
                                                           {"stream", &r.stream},
                                                           {"pattern", &r.pattern},
                                                           {"count", &count},
                                                           {"within", &within},
                                                           {"min_interval", &interval}}) {
      if (auto s = scalar(k, *out); !s.ok()) return s;
    }
    if (r.stream == "uart") r.stream.clear();
    if (!count.empty() && !absl::SimpleAtoi(count, &r.count))
      return absl::InvalidArgumentError(
          absl::StrCat(at(n["count"], f + ".count"), ": expected a number"));
    if (!within.empty() && (r.within_s = Seconds(within)) < 0)
      return absl::InvalidArgumentError(
          absl::StrCat(at(n["within"], f + ".within"), ": expected a duration (10s, 2m)"));
    if (!interval.empty() && (r.min_interval_s = Seconds(interval)) < 0)
      return absl::InvalidArgumentError(absl::StrCat(at(n["min_interval"], f + ".min_interval"),
                                                     ": expected a duration (10s, 2m)"));
    if (n["actions"]) {
      if (!n["actions"].IsSequence())
        return absl::InvalidArgumentError(
            absl::StrCat(at(n["actions"], f + ".actions"), ": expected a list"));
      r.notify = false;
      for (const auto& a : n["actions"]) {
        if (a.IsScalar() && a.Scalar() == "capture") {
          r.capture = true;
        } else if (a.IsScalar() && a.Scalar() == "notify") {
          r.notify = true;
        } else if (a.IsMap() && a["wake"] && a["wake"].IsScalar()) {
          r.wake_session = a["wake"].Scalar();
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(at(a, f + ".actions"), ": expected capture, notify or {wake: SESSION}"));
        }
      }
    }
    if (auto s = CheckWatchRule(r, at(n, f)); !s.ok()) return s;
    if (!names.insert(r.name).second)
      return absl::InvalidArgumentError(
          absl::StrCat(at(n["name"], f + ".name"), ": '", r.name, "' is already a rule's name"));
    rules.push_back(std::move(r));
  }
  return rules;
}

}  // namespace fwai
