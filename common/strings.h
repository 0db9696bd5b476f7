// Debian's abseil has its own string_view type; this adapts std::string_view.
// And a word quoted for the shell.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace fwai {

inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view SV(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// `s` as one word for /bin/sh: in single quotes, a quote inside as '\''.
inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace fwai
