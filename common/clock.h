// Time sources. Code that needs time takes a Clock so tests can control it.
#pragma once

#include <cstdint>

namespace fwai {

// Microseconds since the Unix epoch (wall clock).
int64_t NowMicros();
// Monotonic nanoseconds; comparable across processes on the same Linux host.
int64_t MonotonicNanos();

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMicros() const = 0;
};

// The real clock; a process-wide singleton that is never destroyed.
const Clock& SystemClock();

}  // namespace fwai
