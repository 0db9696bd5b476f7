// Firmware images: ELF32 parsing for the flash guard (machine, loadable
// segments, vector table) and the guard's checks against a board.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"

namespace fwai {

struct ElfSegment {
  uint64_t paddr = 0;  // load address
  uint64_t vaddr = 0;
  uint64_t filesz = 0;
  uint64_t memsz = 0;
};

struct FirmwareImage {
  std::string path;
  int machine = 0;  // e_machine (40 = ARM)
  uint64_t entry = 0;
  std::vector<ElfSegment> segments;  // PT_LOAD with bytes in the file
  uint32_t initial_sp = 0;           // first word at the lowest load address
  bool has_vectors = false;
  int64_t mtime_ns = 0;
  uint64_t bytes = 0;
};

[[nodiscard]] absl::StatusOr<FirmwareImage> ReadFirmwareImage(const std::string& path);
// The same from the file's bytes (`path` only names it in errors; no mtime).
// INVALID_ARGUMENT says what is wrong with the ELF.
[[nodiscard]] absl::StatusOr<FirmwareImage> ParseFirmwareImage(std::string_view elf,
                                                               const std::string& path);

std::string ElfMachineName(int machine);

// The guard's image rules, each refusal naming the rule:
//  fits:   loadable bytes lie inside the board's flash and fit its size;
//  target: an ARM image whose vector table's stack pointer is in the board's RAM;
//  fresh:  no source file under `project_root` is newer than the image.
[[nodiscard]] absl::Status CheckImageFits(const FirmwareImage& image, const BoardConfig& board);
[[nodiscard]] absl::Status CheckImageTarget(const FirmwareImage& image, const BoardConfig& board);
[[nodiscard]] absl::Status CheckImageFresh(const FirmwareImage& image,
                                           const std::string& project_root);

// The directory above `image_path` that holds Makefile / CMakeLists.txt /
// .fwai, or "" if none within a few levels.
std::string FindProjectRoot(const std::string& image_path);

// Hex SHA-256 of a file.
[[nodiscard]] absl::StatusOr<std::string> FileSha256(const std::string& path);
// Hex SHA-256 of what is left to read from `fd` (not closed), and how many
// bytes that was.
[[nodiscard]] absl::StatusOr<std::pair<std::string, int64_t>> FdSha256(int fd);
// SHA-256 of `bytes`, lowercase hex.
std::string BytesSha256Hex(std::string_view bytes);

}  // namespace fwai
