// Build artifacts: the images a build produced (the ELF, and the .bin/.hex
// made from it), found from the project's configured image or, when none is
// set, from the build's own outputs, each with its SHA-256.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct FileDigests {
  std::string sha256;  // hex
  std::string sha1;    // hex (SPDX files need it)
  uint64_t bytes = 0;
};
[[nodiscard]] absl::StatusOr<FileDigests> HashFile(const std::string& path);
FileDigests HashBytes(std::string_view bytes);

struct BuildArtifact {
  std::string path;  // relative to the project root when inside it
  std::string abs_path;
  std::string format;  // elf | bin | hex
  std::string sha256;
  uint64_t bytes = 0;
  bool fresh = false;  // written by this build (not older than its start)
};

// The images of a build that started at `since_ns` (wall clock, ns):
//  - `configured_image` (flash.image) when set and present, with its .bin/.hex
//    siblings where they are not older than it;
//  - else every linked ELF executable under the project (not .git, .fwai,
//    node_modules) written since the start, with their .bin/.hex siblings;
//  - else, when the build wrote none (nothing to do), the newest ELF under a
//    build directory, marked not fresh.
std::vector<BuildArtifact> FindBuildArtifacts(const std::string& project_root,
                                              const std::string& configured_image,
                                              int64_t since_ns);

}  // namespace fwai
