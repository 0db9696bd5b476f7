#include "common/clock.h"

#include <time.h>

#include <ctime>

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

std::string FormatLocalTime(int64_t us, const char* format) {
  if (us <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string FormatUtc(int64_t us) {
  if (us <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fwai
