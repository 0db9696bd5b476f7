// Projects: detection of a firmware project's build system and settings for
// `fwai init`, .fwai/project.yaml (validated, file:line errors), EMBEDDER.md
// import/export, and the checks of `fwai doctor`.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/project/watch_rules.h"

namespace fwai {

struct ProjectSettings {
  std::string name;
  std::string build_system;  // cmake | make | platformio | zephyr | cargo | arduino | unknown
  std::string build_command;
  std::string flash_command;
  std::string image;         // the firmware image to flash (flash.image); "" : the newest ELF
  std::string test_command;  // test.command
  std::string target;        // MCU, e.g. stm32f100rb
  std::string svd;           // the device's CMSIS-SVD file ("" : the one fwai has for `target`)
  std::string board;
  std::string debug_interface;  // e.g. stlink, jlink, cmsis-dap, qemu
  std::string serial_port;
  int baud = 115200;
  std::string boot_pattern;          // serial.boot_pattern: a line that means the firmware booted
  std::vector<std::string> missing;  // what detection could not find
  std::vector<WatchRule> watch;      // watch: rules on a board's output (watch_rules.h)
};

// Looks at `root` (not recursively beyond a few levels) and fills what it can.
ProjectSettings DetectProject(const std::string& root);
// Fields from EMBEDDER.md's <OVERVIEW> and <COMMANDS> blocks (key = value)
// override detected ones. Missing file: unchanged.
void ApplyEmbedderMd(const std::string& root, ProjectSettings& s);
std::string EmbedderMd(const ProjectSettings& s);

std::string ProjectYaml(const ProjectSettings& s);
// Re-running init over an existing config: what the person had set stays,
// except the fields given now (`given`).
void KeepExistingSettings(const ProjectSettings& existing, const std::set<std::string>& given,
                          ProjectSettings& s);
// The sections init does not manage (policy, mcp_servers, skills, template) of
// an existing config, as YAML to append.
std::string UnmanagedSections(const std::string& yaml_text);
[[nodiscard]] absl::StatusOr<ProjectSettings> ParseProjectYaml(const std::string& text,
                                                               const std::string& source);
// Sets one field by its yaml name (values from a person or a request).
[[nodiscard]] absl::Status SetProjectField(ProjectSettings& s, const std::string& key,
                                           const std::string& value);

// Run logs kept under .fwai/runs (skill runs and agent turns): the oldest
// run-* directories beyond `keep` are removed.
constexpr size_t kKeptRunDirs = 200;
void PruneRunDirs(const std::string& runs_dir, size_t keep);

struct DoctorCheck {
  std::string name;
  bool ok = false;
  std::string detail;
  std::string fix;
};
// Toolchains on this machine (versions) and the project config under `root`.
std::vector<DoctorCheck> DoctorChecks(const std::string& root);

}  // namespace fwai
