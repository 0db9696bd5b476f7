#include "server/auth/quotas.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace fwai {

absl::Status Quotas::Request(const std::string& principal, const LimitsConfig& l) {
  const int64_t now = clock_.NowMicros();
  MutexLock lock(&mu_);
  Bucket& b = buckets_[principal];
  if (b.tokens < 0) {
    b.tokens = static_cast<double>(l.burst);
    b.at_us = now;
  }
  b.tokens = std::min<double>(static_cast<double>(l.burst),
                              b.tokens + (now - b.at_us) / 1e6 * l.requests_per_second);
  b.at_us = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  const int64_t wait_ms =
      static_cast<int64_t>(std::ceil((1 - b.tokens) / l.requests_per_second * 1000));
  return absl::ResourceExhaustedError(absl::StrCat("limit requests_per_second (",
                                                   l.requests_per_second, ", bursts of ", l.burst,
                                                   ") reached; retry in ", wait_ms, " ms"));
}

absl::Status Quotas::Ingest(const std::string& principal, int64_t bytes, const LimitsConfig& l) {
  const int64_t now = clock_.NowMicros();
  const int64_t hour = int64_t{3600} * 1000000;
  const int64_t budget = l.ingest_mb_per_hour << 20;
  MutexLock lock(&mu_);
  auto& w = ingest_[principal];
  while (!w.empty() && w.front().first <= now - hour) w.pop_front();
  int64_t used = 0;
  for (const auto& [t, n] : w) used += n;
  if (used + bytes > budget) {
    // Room comes back as the oldest ingests leave the window.
    int64_t need = used + bytes - budget, freed = 0, retry_us = hour;
    for (const auto& [t, n] : w) {
      freed += n;
      if (freed >= need) {
        retry_us = t + hour - now;
        break;
      }
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "limit ingest_mb_per_hour (", l.ingest_mb_per_hour, " MB) reached: ", used >> 20,
        " MB in the last hour; retry in ", std::max<int64_t>(1, retry_us / 60000000), " min"));
  }
  w.emplace_back(now, bytes);
  return absl::OkStatus();
}

}  // namespace fwai
