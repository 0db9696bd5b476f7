// The policy engine: one place that answers every check from the tools, the
// runner and the broker with a decision and the rule that made it. Rules come
// from the project (.fwai/project.yaml `policy:`) and an optional organisation
// file, which overrides: blocked tools are the union, allowed tools the
// intersection, protected paths the union, network only if both allow it.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct PolicyRules {
  std::vector<std::string> protected_paths;  // globs; a match is refused (deny wins)
  std::vector<std::string> allowed_paths;    // globs; when given, writes must match one
  std::vector<std::string> blocked_tools;
  std::vector<std::string> allowed_tools;     // empty: every tool
  std::vector<std::string> blocked_commands;  // a command containing any of these words is refused
  int max_files_per_turn = 0;                 // change budget; 0: none
  int max_lines_per_turn = 0;
  int max_files_per_run = 0;  // a skill run (git numstat since it began)
  int max_lines_per_run = 0;
  // Flash guard settings.
  bool flash_require_approval = true;  // a person approves each flash (--yes, the prompt)
  std::vector<std::string> flash_allowed_boards;  // globs; empty: any board
  bool flash_require_fresh = true;                // refuse an image older than the sources
  bool flash_require_verified_toolchain =
      false;  // refuse an image whose build's toolchain did not verify (dpkg -V)
  // Register code checked against the device's SVD before a flash:
  // off | warn (the flash goes on, the findings are said) | block (an error
  // in the sources refuses the flash).
  std::string flash_register_check = "off";
  // Memory budgets the flash guard enforces (0: none): a flash or RAM region
  // used beyond the percentage, or a region grown by more than the bytes since
  // the previous build.
  double memory_flash_max_pct = 0;
  double memory_ram_max_pct = 0;
  int64_t memory_max_growth_bytes = 0;
  bool network = false;  // commands may use the network
  bool has_allowed_tools = false;
};

struct PolicyDecision {
  bool allowed = true;
  std::string rule;    // e.g. "protected_paths: src/boot/**"
  std::string source;  // project | organisation | built-in
  std::string reason;
};

// Parses a `policy:` mapping out of a YAML document (project.yaml or the org file).
[[nodiscard]] absl::StatusOr<PolicyRules> ParsePolicy(const std::string& yaml_text,
                                                      const std::string& source);
// Project rules under `root` merged with the organisation file (either may be absent).
[[nodiscard]] absl::StatusOr<PolicyRules> LoadPolicy(const std::string& project_root,
                                                     const std::string& org_file);
struct LocalAccount;
// The same, the project's file read as `account` (null: as fwaid).
[[nodiscard]] absl::StatusOr<PolicyRules> LoadPolicy(const std::string& project_root,
                                                     const std::string& org_file,
                                                     const LocalAccount* account);
PolicyRules MergePolicy(const PolicyRules& project, const PolicyRules& org, bool have_org);

// kind: write (target = path relative to the project) | command | tool | flash (target = board id).
PolicyDecision CheckPolicy(const PolicyRules& rules, const std::string& kind,
                           const std::string& target);
// The flash guard settings: the board must be allowed, and unless the rules
// waive it, the person must have approved.
PolicyDecision CheckFlashPolicy(const PolicyRules& rules, const std::string& board, bool approved);

}  // namespace fwai
