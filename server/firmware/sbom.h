// SBOM of a firmware image, as CycloneDX 1.6 JSON: the firmware as
// metadata.component (type firmware, SHA-256 of the image and, after a flash,
// of what the guard flashed), components = the toolchain (compiler, binutils,
// C library with their Debian package versions and binary hashes), the
// libraries and object files actually linked (from the linker map), and the
// project's sources compiled into it (from the DWARF line tables) with their
// hashes; formulation = the build (and flash) steps of the run. SPDX 2.3 JSON
// is made from the CycloneDX document.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace fwai {

struct SbomInput {
  std::string image;  // the ELF
  std::string project_root;
  std::string project_name;
  std::string target;
  std::string run_id;
  std::string skill;
  nlohmann::json toolchain;                        // AttestToolchain; null: none
  nlohmann::json steps = nlohmann::json::array();  // [{name, type, command, exit_code, ok}]
  std::string tool_version;
};

// Errors name the image and what is wrong with it.
[[nodiscard]] absl::StatusOr<nlohmann::json> MakeSbom(const SbomInput& input);

// The SBOM of a flash: the build's SBOM (or one made for the image) with the
// board and the SHA-256 of the bytes written, and the flash as a deploy step.
nlohmann::json AddFlashToSbom(nlohmann::json sbom, const std::string& board,
                              const std::string& flashed_sha256, const std::string& flashed_file,
                              const std::string& by);

// The SBOM a flash record carries: the SBOM of the build record that made the
// image (null when there is none: one is made now for the image, with its
// toolchain attested), with the flash added.
nlohmann::json FlashRecordSbom(const nlohmann::json& flash_record,
                               const nlohmann::json& build_record, const std::string& tool_version,
                               const std::string& dpkg_admindir);

// SPDX 2.3 JSON for a CycloneDX document made by MakeSbom.
nlohmann::json SbomToSpdx(const nlohmann::json& cyclonedx);

}  // namespace fwai
