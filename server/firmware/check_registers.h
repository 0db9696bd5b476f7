// `fwai check registers`, the agent's checkRegisters tool, the skill step
// `tool: check_registers` and the flash guard's register_check: which SVD,
// which sources, and the findings (register_check.h) as one JSON report.
//
// The SVD is, in order: `svd` (a file, relative to the project or absolute);
// the SVD shipped with fwai or added to the knowledge base for `target` (a
// part: "stm32f100rb" finds STM32F100.svd, the longest name the part starts
// with); the project's `svd:`; the one for the project's `target:`. A part
// with no SVD is an error naming the parts that have one.
//
// Sources are `paths` (files or directories, relative to the project or
// absolute, inside the project), else every C/C++ source and header under
// the project (build output, .git, .fwai and node_modules left out). Headers
// are read first, so their macros serve every source. A file that cannot be
// checked (outside the project, unreadable, binary, not UTF-8, over 4 MiB) is
// named in "skipped" with why; the rest are still checked.
//
// Every file is read through the FileAccess given: fwaid reads as the
// caller, so a check tells nobody anything of a file they could not read.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/firmware/svd_model.h"

namespace fwai {

struct FileAccess {
  // The whole file; NOT_FOUND / PERMISSION_DENIED / FAILED_PRECONDITION
  // (too big) say why not.
  std::function<absl::StatusOr<std::string>(const std::string& path, uint64_t max_bytes)> read;
  // The regular files under `dir`, recursively (paths as found), skipping
  // directories `skip` says no to.
  std::function<absl::StatusOr<std::vector<std::string>>(
      const std::string& dir, const std::function<bool(const std::string& name)>& skip)>
      list;
  // Whether `path` is a directory.
  std::function<bool(const std::string& path)> is_dir;
};

// Plain file access as this process (the CLI, tests).
FileAccess LocalFileAccess();

// Where SVDs are found by part: the directories shipped with fwai, then the
// one SVDs added to the knowledge base are kept in (`added_dir`, which fwaid
// owns; a part that ships keeps the vendor's file). Parsed devices are kept
// (by path, size and modification time): safe from any thread.
class SvdCatalog {
 public:
  explicit SvdCatalog(std::vector<std::string> dirs, std::string added_dir = "");
  ~SvdCatalog();

  // Keeps an SVD added to the knowledge base as ADDED_DIR/DEVICE.svd (its
  // <name>), replacing an earlier one of that device: the device's name, or
  // why it is no SVD fwai can check with.
  [[nodiscard]] absl::StatusOr<std::string> Add(std::string_view xml,
                                                const std::string& name) const;

  // The SVD file for `part`, or NOT_FOUND naming the parts there are.
  [[nodiscard]] absl::StatusOr<std::string> FindForPart(const std::string& part) const;
  // The parts (SVD file names) known.
  std::vector<std::string> Parts() const;
  // Parses `path` (read through `access`); cached for files under the
  // catalog's directories, which fwaid owns.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const SvdDevice>> Load(
      const FileAccess& access, const std::string& path) const;
  const std::vector<std::string>& dirs() const { return dirs_; }

 private:
  struct Cache;
  std::vector<std::string> dirs_;  // the shipped ones, then added_dir_
  std::string added_dir_;
  std::unique_ptr<Cache> cache_;
};

struct RegisterCheckRequest {
  std::string project_root;
  std::vector<std::string> paths;
  std::string svd;
  std::string target;
  // The project's settings (svd:, target:), already read as the caller.
  std::string project_svd;
  std::string project_target;
  // When not empty: only findings on these lines are reported (the lines an
  // edit changed), by file as the report names it.
  std::map<std::string, std::set<int>> only_lines;
};

// {"findings": [...], "checked": {svd, device, files, lines, accesses,
// errors, warnings}, "skipped": [{"path", "why"}]}. Errors: no SVD for the
// request (INVALID_ARGUMENT, naming the parts there are), an SVD that does not
// parse (INVALID_ARGUMENT with file:line), a project root that is not a
// directory. Paths in findings are relative to the project.
[[nodiscard]] absl::StatusOr<nlohmann::json> CheckRegisters(const SvdCatalog& catalog,
                                                            const FileAccess& access,
                                                            const RegisterCheckRequest& req);

// The report as SARIF 2.1.0 (one run, rule ids = finding kinds).
nlohmann::json RegisterFindingsSarif(const nlohmann::json& report);
// The report for people: one finding per paragraph, then a summary line.
std::string RegisterFindingsText(const nlohmann::json& report);

// Whether `path` is a C or C++ source or header by its name.
bool IsCSourceName(const std::string& path);

}  // namespace fwai
