#include "server/project/secrets.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fwai {
namespace {

using std::regex;
constexpr auto kFlags = regex::ECMAScript | regex::optimize;

std::vector<SecretScanner::Pattern> Builtins() {
  std::vector<SecretScanner::Pattern> p;
  auto add = [&](std::string name, const char* re, std::vector<std::string> triggers, int group = 0,
                 bool icase = false) {
    p.push_back({std::move(name), regex(re, icase ? kFlags | regex::icase : kFlags),
                 std::move(triggers), group});
  };
  add("private_key",
      R"(-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----[\s\S]*?-----END ([A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----)",
      {"PRIVATE KEY"});
  add("anthropic_key", R"(sk-ant-[A-Za-z0-9_\-]{20,})", {"sk-ant-"});
  add("openai_key", R"(sk-(proj-|svcacct-)?[A-Za-z0-9_\-]{20,})", {"sk-"});
  add("aws_access_key", R"(\b(AKIA|ASIA)[0-9A-Z]{16}\b)", {"AKIA", "ASIA"});
  add("github_token", R"(\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}))",
      {"gh", "github_pat_"});
  add("gitlab_token", R"(\bglpat-[A-Za-z0-9_\-]{20,})", {"glpat-"});
  add("google_api_key", R"(\bAIza[0-9A-Za-z_\-]{35})", {"AIza"});
  add("slack_token", R"(\bxox[abprs]-[A-Za-z0-9\-]{10,})", {"xox"});
  add("stripe_key", R"(\b[rs]k_live_[A-Za-z0-9]{16,})", {"k_live_"});
  add("jwt", R"(\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})", {"eyJ"});
  add("bearer_token", R"((?:Bearer|Token)\s+([A-Za-z0-9_\-\.=+/]{16,}))", {"earer", "oken"}, 1);
  // scheme://user:password@host — only the password goes.
  add("url_password", R"([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@\[\]]+:([^\s@/]+)@)", {"://"}, 1);
  // password = "...", "api_key": "...", client_secret='...', #define WIFI_PASSWORD "..." (a quoted
  // value; it goes).
  add("assignment",
      R"(\b[A-Za-z0-9_\-]*(?:password|passwd|secret|token|api[_\-]?key|access[_\-]?key|auth[_\-]?key)["']?(?:\s*[:=]\s*|\s+)["']([^\s"']{6,})["'])",
      {"ass", "ecret", "oken", "ey", "ASS", "ECRET", "OKEN", "EY"}, 1, true);
  // PASSWORD=..., GITHUB_TOKEN=..., FOO_API_KEY=... (environment style; not $REFERENCES).
  add("env_assignment",
      R"(\b[A-Z0-9_]*(?:PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|ACCESS_KEY)[A-Z0-9_]*=([^\s"'$]{6,}))",
      {"PASS", "SECRET", "TOKEN", "_KEY"}, 1);
  return p;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SecretScanner>> SecretScanner::Make(
    const std::vector<std::string>& extra) {
  auto s = std::make_shared<SecretScanner>();
  s->patterns_ = Builtins();
  for (const auto& e : extra) {
    std::string name = "custom", re = e;
    if (auto eq = e.find('=');
        eq != std::string::npos && eq > 0 && std::all_of(e.begin(), e.begin() + eq, [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        })) {
      name = e.substr(0, eq);
      re = e.substr(eq + 1);
    }
    try {
      s->patterns_.push_back({name, regex(re, kFlags), {}, 0});
    } catch (const std::regex_error& err) {
      return absl::InvalidArgumentError(
          absl::StrCat("secrets.patterns: '", e, "' is not a valid regex: ", err.what()));
    }
  }
  return std::shared_ptr<const SecretScanner>(std::move(s));
}

std::shared_ptr<const SecretScanner> SecretScanner::Default() {
  static const std::shared_ptr<const SecretScanner> d = *Make({});
  return d;
}

std::string SecretScanner::Redact(std::string_view text, int* found) const {
  std::string cur(text);
  int n = 0;
  for (const auto& p : patterns_) {
    if (!p.triggers.empty() &&
        std::none_of(p.triggers.begin(), p.triggers.end(),
                     [&](const std::string& t) { return cur.find(t) != std::string::npos; })) {
      continue;
    }
    std::string out;
    out.reserve(cur.size());
    auto begin = cur.cbegin();
    std::smatch m;
    const std::string marker = absl::StrCat("[REDACTED:", p.name, "]");
    auto it = begin;
    while (std::regex_search(it, cur.cend(), m, p.re)) {
      const auto& g = m[p.group];
      if (!g.matched || g.length() == 0 ||
          std::string_view(&*g.first, g.length()).starts_with("[REDACTED")) {
        out.append(it, m[0].second);
      } else {
        out.append(it, g.first);
        out += marker;
        out.append(g.second, m[0].second);
        ++n;
      }
      it = m[0].second;
      if (m[0].length() == 0) {
        if (it == cur.cend()) break;
        out += *it++;
      }
    }
    out.append(it, cur.cend());
    cur = std::move(out);
  }
  if (found) *found = n;
  return cur;
}

int SecretScanner::RedactJson(nlohmann::json& doc) const {
  int total = 0;
  if (doc.is_string()) {
    int n = 0;
    std::string r = Redact(doc.get_ref<const std::string&>(), &n);
    if (n) doc = std::move(r);
    total += n;
  } else if (doc.is_object() || doc.is_array()) {
    for (auto& v : doc) total += RedactJson(v);
  }
  return total;
}

}  // namespace fwai
