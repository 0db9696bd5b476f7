#include "common/clock.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "common/cancel.h"

namespace fwai {

namespace {

constexpr char kClockOffsetFileEnv[] = "FWAI_CLOCK_OFFSET_FILE";

// The 8 bytes (a native int64) of the file FWAI_CLOCK_OFFSET_FILE names,
// mapped shared: how many microseconds this process's wall clock runs ahead
// of the system's (NowMicros adds it; MonotonicNanos does not). Tests that
// start a real fwaid move its time with it (lease TTLs, token expiry) instead
// of sleeping; null (no offset) without the variable. A file that cannot be
// mapped is said once, on stderr, and ignored.
const int64_t* MapClockOffset() {
  const char* path = std::getenv(kClockOffsetFileEnv);
  if (path == nullptr || *path == '\0') return nullptr;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st {};
  void* p = MAP_FAILED;
  if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size >= 8)
    p = mmap(nullptr, 8, PROT_READ, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "%s=%s: not an 8-byte file that can be mapped; the clock is not moved\n",
                 kClockOffsetFileEnv, path);
    return nullptr;
  }
  return static_cast<const int64_t*>(p);
}

int64_t ClockOffsetMicros() {
  static const int64_t* offset = MapClockOffset();
  return offset == nullptr ? 0 : __atomic_load_n(offset, __ATOMIC_RELAXED);
}

}  // namespace

int64_t NowMicros() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000 + ClockOffsetMicros();
}

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

namespace {

// Waits `us` (at least a millisecond) on `cancel`, or just sleeps without
// one; true if cancelled.
bool Nap(int64_t us, CancelToken* cancel) {
  const auto d = std::chrono::milliseconds(std::max<int64_t>(1, (us + 999) / 1000));
  if (cancel != nullptr) return cancel->WaitFor(d);
  std::this_thread::sleep_for(d);
  return false;
}

class RealClock final : public Clock {
 public:
  int64_t NowMicros() const override { return ::fwai::NowMicros(); }

  bool SleepFor(int64_t us, CancelToken* cancel) const override {
    // Naps of at most 50 ms, so that a moved wall clock (the offset file)
    // is noticed soon; whichever of the two clocks reaches `us` first ends it.
    constexpr int64_t kNapUs = 50'000;
    const int64_t wall_end = NowMicros() + us;
    const int64_t real_end = MonotonicNanos() / 1000 + us;
    while (true) {
      if (cancel != nullptr && cancel->cancelled()) return true;
      const int64_t left = std::min(wall_end - NowMicros(), real_end - MonotonicNanos() / 1000);
      if (left <= 0) return false;
      if (Nap(std::min(left, kNapUs), cancel)) return true;
    }
  }
};

}  // namespace

bool Clock::SleepUntil(int64_t deadline_us, CancelToken* cancel) const {
  const int64_t left = deadline_us - NowMicros();
  if (left <= 0) return cancel != nullptr && cancel->cancelled();
  return SleepFor(left, cancel);
}

bool ManualClock::SleepFor(int64_t us, CancelToken* cancel) const {
  return SleepUntil(NowMicros() + us, cancel);
}

bool ManualClock::SleepUntil(int64_t deadline_us, CancelToken* cancel) const {
  while (NowMicros() < deadline_us) {
    if (Nap(1000, cancel)) return true;
  }
  return cancel != nullptr && cancel->cancelled();
}

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
