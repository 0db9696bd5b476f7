// Memory analysis of a firmware image: per memory region used and free (the
// regions from the linker map, else the linker script, else the board's
// memory map), per section, the largest symbols with the file:line that
// declares them (DWARF), stack use per function (-fstack-usage .su files),
// the diff against another report, and the budget check the flash guard makes.
// Reports are JSON objects (they go into build records as they are).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/firmware/elf_file.h"

namespace fwai {

struct MemoryRegion {
  std::string name;
  uint64_t origin = 0;
  uint64_t length = 0;
  std::string attributes;  // as the linker script gives them: rx, rwx, ...
  std::string kind;        // flash | ram | other
};

struct MemoryOptions {
  std::string project_root;  // for relative paths, the linker script and .su files
  // Used when the build left no linker map and the project has no linker script.
  std::vector<MemoryRegion> board_regions;
  std::string board;
  size_t max_symbols = 300;  // the largest kept in the report (all are counted)
};

// The MEMORY block of a GNU linker script (K and M sizes, ORIGIN/LENGTH).
std::vector<MemoryRegion> ParseLinkerScriptMemory(const std::string& text);
// The "Memory Configuration" table of a GNU ld map file.
std::vector<MemoryRegion> ParseMapMemory(const std::string& text);

// The report for `image`. Errors name the image and what is wrong with it.
[[nodiscard]] absl::StatusOr<nlohmann::json> AnalyzeMemory(const std::string& image,
                                                           const MemoryOptions& options);
// The same for `elf`, already read from wherever (a private copy): `image` is
// the path it is known by, beside which its linker map and .su files are
// looked for. Every file is opened by the calling thread's identity.
[[nodiscard]] absl::StatusOr<nlohmann::json> AnalyzeMemory(const ElfFile& elf,
                                                           const std::string& image,
                                                           const MemoryOptions& options);

// What changed from `before` to `after` (both AnalyzeMemory reports):
// regions, sections and symbols added, removed, grown and shrunk.
nlohmann::json DiffMemory(const nlohmann::json& before, const nlohmann::json& after);

struct MemoryBudget {
  double flash_max_pct = 0;  // 0: none
  double ram_max_pct = 0;
  int64_t max_growth_bytes = 0;  // per region, against the previous build
};

// OK, or FAILED_PRECONDITION naming the region and the rule
// ("flash guard (memory): RAM is 93.8% used ..."). `diff` may be null.
[[nodiscard]] absl::Status CheckMemoryBudget(const nlohmann::json& report,
                                             const nlohmann::json& diff,
                                             const MemoryBudget& budget);

// A few lines for people (the CLI and agent tool results).
std::string MemorySummaryText(const nlohmann::json& report, const nlohmann::json& diff,
                              size_t top_symbols);

}  // namespace fwai
