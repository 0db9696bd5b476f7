// Random identifiers.
#pragma once

#include <string>

namespace fwai {

// A random id: `prefix` followed by 16 lowercase hex digits from a CSPRNG.
std::string NewId(const std::string& prefix);

}  // namespace fwai
