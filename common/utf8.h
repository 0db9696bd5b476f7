// UTF-8 as Unicode defines it (well-formed sequences only: no overlong forms,
// no surrogates, nothing above U+10FFFF), which is what JSON and protobuf
// strings must hold.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fwai {

// The length (1..4) of the well-formed sequence starting at s[i], or 0 when
// the bytes there are not one.
size_t Utf8SequenceLength(std::string_view s, size_t i);

bool IsValidUtf8(std::string_view s);

// `s` with each byte that is not part of a well-formed sequence replaced by
// U+FFFD.
std::string ToValidUtf8(std::string_view s);

// The longest prefix of `s` of at most `max_bytes` that does not end inside a
// multi-byte sequence (a cut that keeps valid UTF-8 valid).
std::string_view Utf8Prefix(std::string_view s, size_t max_bytes);

}  // namespace fwai
