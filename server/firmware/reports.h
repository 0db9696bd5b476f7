// The memory report and SBOM of an image or a build run, as `fwai mem`,
// `fwai sbom` and the agent's memoryReport / sbom tools give them. Build
// records come from the evidence log through the lookups given.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/local_account.h"
#include "server/tools/tool.h"

namespace fwai {

struct FirmwareReportDeps {
  // The project's newest build record (a skill run with artifacts); null if none.
  std::function<nlohmann::json(const std::string& project_root)> latest_build;
  // A record by run id; null if none.
  std::function<nlohmann::json(const std::string& run_id)> record;
  std::string dpkg_admindir;
  std::string version;
};

// Every path a report names (relative to `root`, or absolute; a run id,
// which has no '/' or '.', is no path) is opened as `account` before fwaid
// reads it for a report: nobody learns, through a report, of a file they
// could not read. PERMISSION_DENIED names the path and the account.
[[nodiscard]] absl::Status AccountCanRead(const LocalAccount& account, const std::string& root,
                                          const std::vector<std::string>& paths);

// {image, report, diff?, source}: `image` ("" : the project's newest build's
// ELF); `diff` "" : against the previous build of the project, else an image
// path or a run id. A report of an image the newest build made is that
// build's (with its diff); any other image is analysed now.
[[nodiscard]] absl::StatusOr<nlohmann::json> MemoryReportFor(const FirmwareReportDeps& deps,
                                                             const std::string& project_root,
                                                             const std::string& image,
                                                             const std::string& diff);

// The CycloneDX SBOM of a run (its record's; a flash record's too) or of an
// image (the newest build's record when it made that image, else made now);
// neither given: the project's newest build. `format`: cyclonedx | spdx.
[[nodiscard]] absl::StatusOr<nlohmann::json> SbomFor(const FirmwareReportDeps& deps,
                                                     const std::string& project_root,
                                                     const std::string& run_or_image,
                                                     const std::string& format);

// Registers memoryReport and sbom (read-only agent tools).
void RegisterFirmwareTools(ToolRegistry& registry, FirmwareReportDeps deps);

}  // namespace fwai
