#include "common/clock.h"

#include <time.h>

namespace fwai {

int64_t NowMicros() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
}

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

namespace {
class RealClock final : public Clock {
 public:
  int64_t NowMicros() const override { return ::fwai::NowMicros(); }
};
}  // namespace

const Clock& SystemClock() {
  static const RealClock* clock = new RealClock();
  return *clock;
}

}  // namespace fwai
