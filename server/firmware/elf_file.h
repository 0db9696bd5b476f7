// ElfFile: what fwai reads out of a linked firmware image with elfutils
// (libelf for sections, segments and symbols; libdw for the DWARF that says
// where each symbol is declared and which sources were compiled into it).
// elfutils' libraries are LGPL-3+ (or GPL-2+): linked dynamically under the
// LGPL.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct ElfSection {
  std::string name;
  uint64_t address = 0;       // VMA
  uint64_t load_address = 0;  // LMA (from the program header that holds it)
  uint64_t size = 0;
  uint64_t flags = 0;  // SHF_*
  uint32_t type = 0;   // SHT_*
  bool alloc() const;
  bool has_contents() const;  // not NOBITS
  // The class arm-none-eabi-size (Berkeley format) counts it in: text | data | bss, "" if not
  // allocated.
  std::string berkeley_class() const;
};

struct ElfSymbol {
  std::string name;
  uint64_t address = 0;
  uint64_t size = 0;
  char type = '?';  // nm's letter: T t D d B b R r W V A ...
  std::string section;
  bool function = false;
  std::string file;  // declaring file (DWARF), "" if unknown
  int line = 0;
};

struct ElfCompileUnit {
  std::string name;                // as compiled (absolute when comp_dir is known)
  std::string producer;            // DW_AT_producer, e.g. "GNU C17 12.2.1 -mcpu=cortex-m3 ..."
  std::vector<std::string> files;  // every source file of its line table (absolute)
};

struct ElfFile {
  std::string path;
  int machine = 0;
  bool executable = false;  // ET_EXEC
  std::vector<ElfSection> sections;
  std::vector<ElfSymbol> symbols;     // defined symbols with a size, in symbol table order
  std::vector<ElfCompileUnit> units;  // empty without DWARF
  std::vector<std::string> comments;  // the .comment strings ("GCC: (...) 12.2.1")
};

// Reads `path`; with `dwarf`, also resolves each symbol's declaring file:line
// and the compile units. Errors name the file and what is wrong with it.
[[nodiscard]] absl::StatusOr<ElfFile> ReadElfFile(const std::string& path, bool dwarf = true);

// True if `path` starts with an ELF header of a linked executable (ET_EXEC).
bool IsElfExecutable(const std::string& path);

}  // namespace fwai
