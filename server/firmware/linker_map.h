// GNU ld map files (-Wl,-Map=FILE): which inputs the linker loaded (object
// files, archives and the archive members it pulled in) and the memory
// configuration. A build that writes no map leaves these empty.
#pragma once

#include <string>
#include <vector>

namespace fwai {

struct LinkerInput {
  std::string path;                  // as the map names it (made absolute against `dir`)
  bool archive = false;              // a .a library
  std::vector<std::string> members;  // archive members linked in (lib_a-memcpy.o ...)
};

// The map of `image`: IMAGE_STEM.map, IMAGE.map, or the only .map beside it.
std::string FindLinkerMap(const std::string& image);

// The inputs a map lists (LOAD lines; "Archive member included" entries),
// relative paths taken against `dir` (the directory the link ran in).
std::vector<LinkerInput> ParseLinkerInputs(const std::string& map_text, const std::string& dir);

}  // namespace fwai
