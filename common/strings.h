// Debian's abseil has its own string_view type; this adapts std::string_view.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace fwai {

inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view SV(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace fwai
