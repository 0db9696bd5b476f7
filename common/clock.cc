#include "common/clock.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

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
