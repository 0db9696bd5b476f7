#include "server/project/policy.h"

#include <fnmatch.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/local_account.h"
#include "common/status_macros.h"
#include "common/yaml.h"

namespace fwai {

namespace {

bool Glob(const std::string& pattern, const std::string& path) {
  // `*` and `**` both cross directories; a trailing "/**" also matches the directory itself.
  if (fnmatch(pattern.c_str(), path.c_str(), 0) == 0) return true;
  if (absl::EndsWith(pattern, "/**") && path == pattern.substr(0, pattern.size() - 3)) return true;
  return false;
}

std::string ReadFile(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

namespace {

// ParsePolicy without its guard against what yaml-cpp throws.
absl::StatusOr<PolicyRules> ParsePolicyRules(const std::string& text, const std::string& source) {
  PolicyRules r;
  ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(text, source));
  if (!root.IsMap() || !root["policy"]) return r;
  const YAML::Node p = root["policy"];
  auto err = [&](const YAML::Node& n, const std::string& f, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", n.Mark().line + 1, ": policy.", f, ": ", what));
  };
  if (!p.IsMap()) return err(p, "", "expected a mapping");
  static const std::set<std::string> kKeys = {
      "protected_paths", "allowed_paths", "blocked_tools", "allowed_tools", "blocked_commands",
      "change_budget",   "network",       "flash",         "memory"};
  for (const auto& kv : p) {
    if (!kKeys.count(kv.first.as<std::string>()))
      return err(kv.first, kv.first.as<std::string>(), "unknown rule");
  }
  auto list = [&](const char* key, std::vector<std::string>& out) -> absl::Status {
    const auto& n = p[key];
    if (!n) return absl::OkStatus();
    if (!n.IsSequence()) return err(n, key, "expected a list");
    for (const auto& x : n) {
      if (!x.IsScalar()) return err(x, key, "expected strings");
      if (x.Scalar().empty()) return err(x, key, "an empty entry matches nothing; remove it");
      out.push_back(x.Scalar());
    }
    return absl::OkStatus();
  };
  for (auto [k, v] : std::vector<std::pair<const char*, std::vector<std::string>*>>{
           {"protected_paths", &r.protected_paths},
           {"allowed_paths", &r.allowed_paths},
           {"blocked_tools", &r.blocked_tools},
           {"allowed_tools", &r.allowed_tools},
           {"blocked_commands", &r.blocked_commands}}) {
    if (auto s = list(k, *v); !s.ok()) return s;
  }
  r.has_allowed_tools = static_cast<bool>(p["allowed_tools"]);
  auto number = [&](const YAML::Node& n, const std::string& f, int& out) -> absl::Status {
    int v = 0;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v) || v < 0)
      return err(n, f, "expected a number (0: no limit)");
    out = v;
    return absl::OkStatus();
  };
  auto boolean = [&](const YAML::Node& n, const std::string& f, bool& out) -> absl::Status {
    if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "false"))
      return err(n, f, "expected true or false");
    out = n.Scalar() == "true";
    return absl::OkStatus();
  };
  if (const auto& b = p["change_budget"]) {
    if (!b.IsMap())
      return err(b, "change_budget",
                 "expected {max_files, max_lines, max_files_per_run, max_lines_per_run}");
    const std::vector<std::pair<const char*, int*>> fields = {
        {"max_files", &r.max_files_per_turn},
        {"max_lines", &r.max_lines_per_turn},
        {"max_files_per_run", &r.max_files_per_run},
        {"max_lines_per_run", &r.max_lines_per_run}};
    for (const auto& kv : b) {
      const std::string k = kv.first.Scalar();
      auto it =
          std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return k == f.first; });
      if (it == fields.end())
        return err(kv.first, "change_budget." + k,
                   "unknown (max_files, max_lines, max_files_per_run, max_lines_per_run)");
      if (auto st = number(kv.second, "change_budget." + k, *it->second); !st.ok()) return st;
    }
  }
  if (const auto& f = p["flash"]) {
    if (!f.IsMap())
      return err(
          f, "flash",
          "expected {require_approval, allowed_boards, require_fresh, require_verified_toolchain, "
          "register_check}");
    for (const auto& kv : f) {
      const std::string k = kv.first.Scalar();
      if (k == "require_approval") {
        if (auto st = boolean(kv.second, "flash.require_approval", r.flash_require_approval);
            !st.ok())
          return st;
      } else if (k == "require_fresh") {
        if (auto st = boolean(kv.second, "flash.require_fresh", r.flash_require_fresh); !st.ok())
          return st;
      } else if (k == "require_verified_toolchain") {
        if (auto st = boolean(kv.second, "flash.require_verified_toolchain",
                              r.flash_require_verified_toolchain);
            !st.ok())
          return st;
      } else if (k == "register_check") {
        const std::string v = kv.second.IsScalar() ? kv.second.Scalar() : "";
        if (v != "off" && v != "warn" && v != "block") {
          return err(kv.second, "flash.register_check", "expected off, warn or block");
        }
        r.flash_register_check = v;
      } else if (k == "allowed_boards") {
        if (!kv.second.IsSequence())
          return err(kv.second, "flash.allowed_boards", "expected a list of board ids or globs");
        for (const auto& x : kv.second) r.flash_allowed_boards.push_back(x.Scalar());
      } else {
        return err(kv.first, "flash." + k,
                   "unknown (require_approval, allowed_boards, require_fresh, "
                   "require_verified_toolchain, register_check)");
      }
    }
  }
  if (const auto& m = p["memory"]) {
    if (!m.IsMap())
      return err(m, "memory", "expected {flash_max_pct, ram_max_pct, max_growth_bytes}");
    for (const auto& kv : m) {
      const std::string k = kv.first.Scalar();
      if (k == "flash_max_pct" || k == "ram_max_pct") {
        double v = 0;
        if (!kv.second.IsScalar() || !absl::SimpleAtod(kv.second.Scalar(), &v) || v < 0 ||
            v > 100) {
          return err(kv.second, "memory." + k, "expected a percentage 0..100 (0: no budget)");
        }
        (k == "flash_max_pct" ? r.memory_flash_max_pct : r.memory_ram_max_pct) = v;
      } else if (k == "max_growth_bytes") {
        int64_t v = 0;
        if (!kv.second.IsScalar() || !absl::SimpleAtoi(kv.second.Scalar(), &v) || v < 0) {
          return err(kv.second, "memory." + k, "expected a number of bytes (0: no limit)");
        }
        r.memory_max_growth_bytes = v;
      } else {
        return err(kv.first, "memory." + k,
                   "unknown (flash_max_pct, ram_max_pct, max_growth_bytes)");
      }
    }
  }
  if (const auto& n = p["network"]) {
    if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "false"))
      return err(n, "network", "expected true or false");
    r.network = n.Scalar() == "true";
  }
  return r;
}

}  // namespace

absl::StatusOr<PolicyRules> ParsePolicy(const std::string& text, const std::string& source) {
  // A node of the wrong kind (a mapping as a key, say) throws when read.
  try {
    return ParsePolicyRules(text, source);
  } catch (const YAML::Exception& e) {
    return YamlStatus(source, e);
  }
}

PolicyRules MergePolicy(const PolicyRules& proj, const PolicyRules& org, bool have_org) {
  if (!have_org) return proj;
  PolicyRules m = proj;
  auto add = [](std::vector<std::string>& to, const std::vector<std::string>& from) {
    for (const auto& x : from) {
      if (std::find(to.begin(), to.end(), x) == to.end()) to.push_back(x);
    }
  };
  add(m.protected_paths, org.protected_paths);
  add(m.blocked_tools, org.blocked_tools);
  add(m.blocked_commands, org.blocked_commands);
  if (org.has_allowed_tools) {
    if (m.has_allowed_tools) {
      std::vector<std::string> both;
      for (const auto& t : m.allowed_tools) {
        if (std::find(org.allowed_tools.begin(), org.allowed_tools.end(), t) !=
            org.allowed_tools.end())
          both.push_back(t);
      }
      m.allowed_tools = both;
    } else {
      m.allowed_tools = org.allowed_tools;
      m.has_allowed_tools = true;
    }
  }
  if (!org.allowed_paths.empty())
    m.allowed_paths = org.allowed_paths;  // the organisation's list wins
  // Budgets: the smaller limit wins.
  auto tighter = [](int& mine, int theirs) {
    if (theirs > 0 && (mine == 0 || theirs < mine)) mine = theirs;
  };
  tighter(m.max_files_per_turn, org.max_files_per_turn);
  tighter(m.max_lines_per_turn, org.max_lines_per_turn);
  tighter(m.max_files_per_run, org.max_files_per_run);
  tighter(m.max_lines_per_run, org.max_lines_per_run);
  // Flash: either side may require approval and freshness; the organisation's board list wins.
  m.flash_require_approval = proj.flash_require_approval || org.flash_require_approval;
  m.flash_require_fresh = proj.flash_require_fresh || org.flash_require_fresh;
  m.flash_require_verified_toolchain =
      proj.flash_require_verified_toolchain || org.flash_require_verified_toolchain;
  // register_check: the stricter of the two (off < warn < block).
  auto rank = [](const std::string& v) { return v == "block" ? 2 : v == "warn" ? 1 : 0; };
  if (rank(org.flash_register_check) > rank(m.flash_register_check))
    m.flash_register_check = org.flash_register_check;
  auto tighter_d = [](double& mine, double theirs) {
    if (theirs > 0 && (mine == 0 || theirs < mine)) mine = theirs;
  };
  tighter_d(m.memory_flash_max_pct, org.memory_flash_max_pct);
  tighter_d(m.memory_ram_max_pct, org.memory_ram_max_pct);
  if (org.memory_max_growth_bytes > 0 &&
      (m.memory_max_growth_bytes == 0 || org.memory_max_growth_bytes < m.memory_max_growth_bytes)) {
    m.memory_max_growth_bytes = org.memory_max_growth_bytes;
  }
  if (!org.flash_allowed_boards.empty()) m.flash_allowed_boards = org.flash_allowed_boards;
  m.network = proj.network && org.network;
  return m;
}

absl::StatusOr<PolicyRules> LoadPolicy(const std::string& project_root,
                                       const std::string& org_file) {
  return LoadPolicy(project_root, org_file, nullptr);
}

absl::StatusOr<PolicyRules> LoadPolicy(const std::string& project_root, const std::string& org_file,
                                       const LocalAccount* account) {
  PolicyRules proj, org;
  const std::string path = project_root + "/.fwai/project.yaml";
  std::error_code ec;
  std::optional<std::string> text;
  if (!project_root.empty()) {
    // The project's file is read as its account (fwaid's own file is not).
    std::optional<ScopedFsIdentity> as;
    if (account) {
      as.emplace(*account);
      if (!as->status().ok()) return as->status();
    }
    if (std::filesystem::exists(path, ec)) text = ReadFile(path);
  }
  if (text) {
    auto p = ParsePolicy(*text, path);
    if (!p.ok()) return p.status();
    proj = *p;
  }
  const bool have_org = !org_file.empty() && std::filesystem::exists(org_file, ec);
  if (have_org) {
    auto o = ParsePolicy(ReadFile(org_file), org_file);
    if (!o.ok()) return o.status();
    org = *o;
  }
  return MergePolicy(proj, org, have_org);
}

PolicyDecision CheckPolicy(const PolicyRules& r, const std::string& kind,
                           const std::string& target) {
  PolicyDecision d;
  auto refuse = [&](const std::string& rule, const std::string& reason) {
    d.allowed = false;
    d.rule = rule;
    d.reason = reason;
    return d;
  };
  if (kind == "write") {
    for (const auto& g : r.protected_paths) {
      if (Glob(g, target))
        return refuse(absl::StrCat("protected_paths: ", g), absl::StrCat(target, " is protected"));
    }
    if (!r.allowed_paths.empty()) {
      bool ok = std::any_of(r.allowed_paths.begin(), r.allowed_paths.end(),
                            [&](const std::string& g) { return Glob(g, target); });
      if (!ok) {
        return refuse(absl::StrCat("allowed_paths: ", absl::StrJoin(r.allowed_paths, ", ")),
                      absl::StrCat(target, " is outside the allowed paths"));
      }
    }
  } else if (kind == "tool") {
    if (std::find(r.blocked_tools.begin(), r.blocked_tools.end(), target) !=
        r.blocked_tools.end()) {
      return refuse(absl::StrCat("blocked_tools: ", target),
                    absl::StrCat("the tool ", target, " is blocked"));
    }
    if (r.has_allowed_tools && std::find(r.allowed_tools.begin(), r.allowed_tools.end(), target) ==
                                   r.allowed_tools.end()) {
      return refuse(absl::StrCat("allowed_tools: ", absl::StrJoin(r.allowed_tools, ", ")),
                    absl::StrCat("the tool ", target, " is not in the allowed list"));
    }
  } else if (kind == "command") {
    for (const auto& w : r.blocked_commands) {
      if (w.empty()) continue;  // refused when parsed; never a word to search for
      // Whole words: `rm` blocks `rm -rf x` but not `make format`.
      size_t pos = 0;
      while ((pos = target.find(w, pos)) != std::string::npos) {
        const bool left = pos == 0 || !std::isalnum(static_cast<unsigned char>(target[pos - 1]));
        const size_t end = pos + w.size();
        const bool right =
            end >= target.size() || !std::isalnum(static_cast<unsigned char>(target[end]));
        if (left && right)
          return refuse(absl::StrCat("blocked_commands: ", w),
                        absl::StrCat("the command uses '", w, "'"));
        pos = end;
      }
    }
  } else if (kind == "flash") {
    if (!r.flash_allowed_boards.empty() &&
        std::none_of(r.flash_allowed_boards.begin(), r.flash_allowed_boards.end(),
                     [&](const std::string& g) { return Glob(g, target); })) {
      return refuse(
          absl::StrCat("flash.allowed_boards: ", absl::StrJoin(r.flash_allowed_boards, ", ")),
          absl::StrCat("flashing ", target, " is not allowed here"));
    }
  }
  d.reason = "no rule refuses it";
  return d;
}

PolicyDecision CheckFlashPolicy(const PolicyRules& r, const std::string& board, bool approved) {
  PolicyDecision d = CheckPolicy(r, "flash", board);
  if (!d.allowed) return d;
  if (r.flash_require_approval && !approved) {
    return {false, "flash.require_approval: true", "",
            "flashing needs a person's approval (--yes, or answer the prompt); a project may waive "
            "it with "
            "policy.flash.require_approval: false"};
  }
  return d;
}

}  // namespace fwai
