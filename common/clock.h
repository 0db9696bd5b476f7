// Time sources. Code that needs time takes a Clock so tests can control it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace fwai {

// Microseconds since the Unix epoch (wall clock).
int64_t NowMicros();
// Monotonic nanoseconds; comparable across processes on the same Linux host.
int64_t MonotonicNanos();
// `us` (since the epoch) in local time, strftime `format`; "-" for 0 or less.
std::string FormatLocalTime(int64_t us, const char* format = "%Y-%m-%d %H:%M:%S");
// `us` as UTC in ISO 8601 ("2026-11-24T05:01:02Z"); "-" for 0 or less.
std::string FormatUtc(int64_t us);

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMicros() const = 0;
};

// The real clock; a process-wide singleton that is never destroyed.
const Clock& SystemClock();

// A clock that moves only when told (tests): it starts at `start_us` and
// stays there until Advance or Set. Safe from any thread.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_us = ::fwai::NowMicros()) : now_us_(start_us) {}
  int64_t NowMicros() const override { return now_us_.load(); }
  void Advance(int64_t us) { now_us_.fetch_add(us); }
  void Set(int64_t us) { now_us_.store(us); }

 private:
  std::atomic<int64_t> now_us_;
};

}  // namespace fwai
