// Small helpers shared by the benchmarks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"

namespace fwai::testing {

// The p-quantile (0..1) of `v` by nearest rank; 0 for none.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

inline double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

// The CLOCK_MONOTONIC stamps ("<ns>;" padded) the fake provider put in a text
// delta; several when deltas were coalesced.
inline std::vector<int64_t> ChunkStamps(const std::string& t) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos < t.size()) {
    size_t semi = t.find(';', pos);
    if (semi == std::string::npos) break;
    int64_t sent = 0;
    if (absl::SimpleAtoi(t.substr(pos, semi - pos), &sent) && sent > 0) out.push_back(sent);
    size_t next = t.find_first_of("0123456789", semi);
    pos = next == std::string::npos ? t.size() : next;
  }
  return out;
}

}  // namespace fwai::testing
