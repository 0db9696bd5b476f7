// Skills: YAML workflows in .fwai/skills/*.yaml plus the built-ins (build,
// flash, monitor, test, build-flash-verify). A skill is a list of steps, each
// one of: a tool (build | flash | monitor | test | shell), an evidence record,
// an llm_analyze (a log and a prompt to the provider) or an agentic goal.
// Values may use ${VAR}; files are validated with file:line errors.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct SkillStep {
  std::string name;
  std::string type;          // tool | evidence | llm_analyze | agentic
  std::string tool;          // build | flash | monitor | test | shell | check_registers (type tool)
  std::string command;       // shell (and an override for build / test)
  std::string image, board;  // flash
  std::string expect, send;  // monitor: a regex to wait for; a line to send first
  std::string since = "run";       // monitor: run (lines since the run began) | now
  std::string stream;              // monitor: "" (the UART) | rtt:N | semihosting
  std::vector<std::string> files;  // evidence: files (globs under the project) to hash
  std::vector<std::string> paths;  // check_registers: files or directories (none: all sources)
  std::string target, svd;         // check_registers: the part or SVD file (none: the project's)
  std::string note;                // evidence
  std::string log, prompt;         // llm_analyze: a step name or a file, and the question
  std::string goal;                // agentic
  std::string on_fail = "abort";   // abort | retry | continue
  int retries = 2;                 // on_fail: retry
  int timeout_s = 0;               // 0: the tool's default
  std::string timeout_text;        // a timeout given by variables ("${BOOT_TIMEOUT}"):
                                   // timeout_s is set from it when a run starts
  std::string when = "success";    // success | failure | always
  int line = 0;                    // where it is defined
};

// What a plugin's skill may do: the capabilities its plugin declared.
struct SkillScope {
  std::string plugin;
  bool build = false;
  bool flash = false;
  bool network = false;
  std::vector<std::string> boards;  // board tags
};

struct Skill {
  std::string name;
  std::string description;
  std::string source;  // file path, or "built-in"
  bool builtin = false;
  int timeout_s = 1800;
  std::vector<std::string> keywords;  // for the intent resolver
  std::map<std::string, std::string> vars;
  std::vector<SkillStep> steps;
  std::optional<SkillScope> scope;  // a plugin's skill
  bool flashes() const;
};

// The skill files of an installed plugin; its skills are named "<plugin>:<name>".
struct PluginSkillSet {
  std::string dir;
  std::vector<std::string> files;  // relative to dir
  // The files' texts, read by fwaid when the set is made (the plugin store
  // is fwaid's, not the caller's: skills are loaded as the caller after).
  std::vector<std::string> texts;
  SkillScope scope;
};

// Parses one skill document; errors name `source`:line and the field.
[[nodiscard]] absl::StatusOr<Skill> ParseSkill(const std::string& yaml_text,
                                               const std::string& source);
// The built-in skills.
const std::vector<Skill>& BuiltinSkills();
// Built-ins, then the project's .fwai/skills/*.yaml (a project skill with a
// built-in's name replaces it). A file that does not parse is an error.
// Then the installed plugins' skills.
[[nodiscard]] absl::StatusOr<std::vector<Skill>> LoadSkills(
    const std::string& project_root, const std::vector<PluginSkillSet>& plugins = {});

// Replaces ${NAME} with vars[NAME] ($$ is a literal $). An unknown name is an
// error naming it.
[[nodiscard]] absl::StatusOr<std::string> Interpolate(
    const std::string& text, const std::map<std::string, std::string>& vars);
// Seconds from "30", "30s", "5m" or "1h" (positive, at most a week); an
// error saying what was expected otherwise.
[[nodiscard]] absl::StatusOr<int> ParseDuration(const std::string& text);
// The names referenced by ${...} in `text`.
std::vector<std::string> ReferencedVars(const std::string& text);

}  // namespace fwai
