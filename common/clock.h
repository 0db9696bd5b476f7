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

class CancelToken;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMicros() const = 0;
  // Waits until `us` microseconds of this clock's time have passed; returns
  // true if `cancel` (may be null) was cancelled first, which ends the wait
  // at once. The system clock's wait also ends once `us` of real (monotonic)
  // time has passed: a step of the wall clock backwards never lengthens it,
  // and a step forwards (or a test moving FWAI_CLOCK_OFFSET_FILE) ends it
  // within 50 ms. A ManualClock's wait ends only when Advance or Set have
  // moved it far enough.
  virtual bool SleepFor(int64_t us, CancelToken* cancel) const = 0;
  // Waits until this clock reads `deadline_us` or later, as SleepFor does;
  // a deadline already passed returns at once. Unlike SleepFor from a
  // reading taken earlier, a clock moved between that reading and the wait
  // does not lengthen it.
  virtual bool SleepUntil(int64_t deadline_us, CancelToken* cancel) const;
};

// The real clock; a process-wide singleton that is never destroyed.
const Clock& SystemClock();

// A clock that moves only when told (tests): it starts at `start_us` and
// stays there until Advance or Set. Safe from any thread.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_us = ::fwai::NowMicros()) : now_us_(start_us) {}
  int64_t NowMicros() const override { return now_us_.load(); }
  bool SleepFor(int64_t us, CancelToken* cancel) const override;
  bool SleepUntil(int64_t deadline_us, CancelToken* cancel) const override;
  void Advance(int64_t us) { now_us_.fetch_add(us); }
  void Set(int64_t us) { now_us_.store(us); }

 private:
  std::atomic<int64_t> now_us_;
};

}  // namespace fwai
