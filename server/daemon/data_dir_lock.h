// One fwaid per data directory. The lock is an flock(2) on DATA/fwaid.lock,
// so it ends with the process however it ends; the file also says which
// process holds it and whether that process is still serving or stopping.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace fwai {

class DataDirLock {
 public:
  // Takes the lock. A daemon that is stopping, or has exited (killed) while
  // the kernel still holds its lock, is waited for (up to
  // `wait_for_stopping_ms`; `waiting` hears once why); one that is serving
  // is not: FAILED_PRECONDITION names its pid.
  [[nodiscard]] static absl::StatusOr<DataDirLock> Acquire(
      const std::string& data_dir, int wait_for_stopping_ms = 60000,
      const std::function<void(const std::string&)>& waiting = nullptr);
  DataDirLock(DataDirLock&& other) noexcept;
  DataDirLock& operator=(DataDirLock&&) = delete;
  DataDirLock(const DataDirLock&) = delete;
  ~DataDirLock();

  // Says "stopping" to whoever waits: a new fwaid waits instead of failing.
  void MarkStopping();

 private:
  explicit DataDirLock(int fd) : fd_(fd) {}
  void Write(const char* state);
  int fd_ = -1;
};

}  // namespace fwai
