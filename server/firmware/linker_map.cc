#include "server/firmware/linker_map.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fwai {

namespace fs = std::filesystem;

std::string FindLinkerMap(const std::string& image) {
  std::error_code ec;
  const fs::path p(image);
  for (const fs::path& candidate :
       {fs::path(p).replace_extension(".map"), fs::path(image + ".map")}) {
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
  }
  std::string only;
  int count = 0;
  for (const auto& e :
       fs::directory_iterator(p.parent_path().empty() ? "." : p.parent_path(), ec)) {
    if (e.path().extension() == ".map" && e.is_regular_file(ec)) {
      only = e.path().string();
      ++count;
    }
  }
  return count == 1 ? only : "";
}

std::vector<LinkerInput> ParseLinkerInputs(const std::string& text, const std::string& dir) {
  std::vector<LinkerInput> out;
  std::map<std::string, size_t> index;  // path -> out position
  auto absolute = [&](std::string path) {
    if (!path.empty() && path[0] != '/' && !dir.empty()) path = (fs::path(dir) / path).string();
    return fs::path(path).lexically_normal().string();
  };
  auto add = [&](const std::string& raw) -> LinkerInput& {
    const std::string path = absolute(raw);
    auto it = index.find(path);
    if (it != index.end()) return out[it->second];
    LinkerInput in;
    in.path = path;
    in.archive = absl::EndsWith(path, ".a");
    index[path] = out.size();
    out.push_back(std::move(in));
    return out.back();
  };
  bool members = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "Archive member included")) {
      members = true;
      continue;
    }
    if (members) {
      // "/usr/lib/.../libc_nano.a(lib_a-memset.o)" at the start of a line; the
      // reason follows indented on the next line.
      if (absl::StartsWith(line, "Discarded input sections") ||
          absl::StartsWith(line, "Memory Configuration") ||
          absl::StartsWith(line, "Allocating common symbols")) {
        members = false;
      } else if (!line.empty() && line[0] != ' ' &&
                 absl::EndsWith(absl::StripTrailingAsciiWhitespace(line), ")")) {
        absl::string_view l = absl::StripTrailingAsciiWhitespace(line);
        size_t open = l.rfind('(');
        if (open != absl::string_view::npos && open > 0) {
          std::string archive(l.substr(0, open)), member(l.substr(open + 1, l.size() - open - 2));
          auto& in = add(archive);
          in.archive = true;
          if (std::find(in.members.begin(), in.members.end(), member) == in.members.end())
            in.members.push_back(member);
        }
      }
    }
    if (absl::StartsWith(line, "LOAD ")) {
      std::string path(absl::StripAsciiWhitespace(line.substr(5)));
      if (!path.empty() && path != "linker stubs") add(path);
    }
  }
  // LOAD names an archive even when nothing was taken from it: keep the ones used.
  std::vector<LinkerInput> used;
  for (auto& in : out) {
    if (!in.archive || !in.members.empty()) used.push_back(std::move(in));
  }
  return used;
}

}  // namespace fwai
