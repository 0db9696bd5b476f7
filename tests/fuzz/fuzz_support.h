// Helpers shared by the libFuzzer targets (tests/fuzz/*_fuzz.cc).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>

namespace fwai::fuzz {

// A broken promise of the code under test: reported like a crash.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A small deterministic generator seeded from the input itself, so that a
// crash reproduces from its file alone.
class Rng {
 public:
  explicit Rng(std::string_view seed) {
    for (unsigned char c : seed) state_ = (state_ ^ c) * 0x100000001b3ull;
  }
  uint64_t Next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545f4914f6cdd1dull;
  }
  size_t Below(size_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  uint64_t state_ = 0xcbf29ce484222325ull;
};

// Hands `bytes` to `fn` in pieces of 1..max_piece bytes, the way a socket or
// a pipe may split them.
inline void FeedInPieces(std::string_view bytes, Rng& rng, size_t max_piece,
                         const std::function<void(std::string_view)>& fn) {
  while (!bytes.empty()) {
    size_t n = 1 + rng.Below(max_piece);
    if (n > bytes.size()) n = bytes.size();
    fn(bytes.substr(0, n));
    bytes.remove_prefix(n);
  }
}

}  // namespace fwai::fuzz
