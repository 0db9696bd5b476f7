// Toolchain attestation: which compiler, assembler, linker and C library
// built an image (found from the image's machine: arm-none-eabi-gcc for ARM,
// avr-gcc for AVR, ...), their SHA-256, the Debian packages they come from
// with their versions, and `dpkg -V` of those packages. A toolchain
// "verifies" when every file is from a package and dpkg finds none changed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fwai {

struct ToolchainOptions {
  std::string dpkg_admindir;  // dpkg's database ("" : /var/lib/dpkg)
};

// {prefix, producer, comment, binaries:[{role, path, sha256, package}],
//  packages:[{name, version, architecture}], dpkg_verify:{ok, command,
//  problems, checked_us, reused}, files_reused, verified, error?}.
// dpkg -V reads every file of the packages (seconds for a GCC); its answer is
// reused while no file of those packages, nor dpkg's record of them, has
// changed (size, mtime, ctime, inode); so are the files found and their
// packages while neither they nor dpkg's status file changed. Thread-safe.
nlohmann::json AttestToolchain(int elf_machine, const std::string& producer,
                               const std::string& comment, const ToolchainOptions& options);

// The GNU tool prefix for an ELF machine ("arm-none-eabi-"), "" if unknown.
std::string ToolPrefixFor(int elf_machine);

}  // namespace fwai
