// Quotas: the per-principal limits that are about rates — requests per
// second (a token bucket: a sustained rate with bursts) and ingested bytes
// per hour (a sliding window). Counts of things held (sessions, turns,
// runs, leases) are taken from their owners when asked. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/security_config.h"

namespace fwai {

class Quotas {
 public:
  explicit Quotas(const Clock& clock = SystemClock()) : clock_(clock) {}
  Quotas(const Quotas&) = delete;
  Quotas& operator=(const Quotas&) = delete;

  // One request by `principal`; RESOURCE_EXHAUSTED names the limit and
  // when to retry.
  [[nodiscard]] absl::Status Request(const std::string& principal, const LimitsConfig& limits);
  // `bytes` more ingested by `principal`; refused past the hourly budget.
  [[nodiscard]] absl::Status Ingest(const std::string& principal, int64_t bytes,
                                    const LimitsConfig& limits);

 private:
  struct Bucket {
    double tokens = -1;  // < 0: not started (full)
    int64_t at_us = 0;
  };
  const Clock& clock_;
  Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<std::pair<int64_t, int64_t>>> ingest_
      ABSL_GUARDED_BY(mu_);  // (time, bytes)
};

}  // namespace fwai
