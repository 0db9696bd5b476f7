#include "server/daemon/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fwai {
namespace {

struct Holder {
  long pid = 0;
  std::string state;  // "running" | "stopping" | "" (not yet written)
};

Holder ReadHolder(int fd) {
  char buf[128] = {};
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  Holder h;
  if (n <= 0) return h;
  // "pid 1234 running\n"
  std::vector<std::string> parts = absl::StrSplit(absl::StripTrailingAsciiWhitespace(buf), ' ');
  if (parts.size() == 3 && parts[0] == "pid" && absl::SimpleAtoi(parts[1], &h.pid))
    h.state = parts[2];
  return h;
}

// True when `pid` has exited or is exiting (gone, a zombie, or dead in
// /proc): its lock is let go as the kernel finishes with it.
bool ProcessGone(long pid) {
  if (pid <= 0) return false;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!in || !std::getline(in, stat)) return true;
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'Z' || state == 'X' || state == 'x';
}

}  // namespace

absl::StatusOr<DataDirLock> DataDirLock::Acquire(
    const std::string& data_dir, int wait_for_stopping_ms,
    const std::function<void(const std::string&)>& waiting) {
  const std::string path = data_dir + "/fwaid.lock";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno)));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_for_stopping_ms);
  // A holder that has not written its line yet is given a moment to do so.
  const auto unknown_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  bool said_waiting = false;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      int e = errno;
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(path, ": flock: ", std::strerror(e)));
    }
    Holder h = ReadHolder(fd);
    const auto now = std::chrono::steady_clock::now();
    // A holder killed while serving (kill -9, a crash) holds the lock until
    // the kernel has finished with it: waited for, as a stopping one is.
    const bool gone = ProcessGone(h.pid);
    if (gone && !said_waiting && waiting) {
      waiting(absl::StrCat("fwaid pid ", h.pid, ", which held data dir ", data_dir,
                           ", has exited; waiting up to ", wait_for_stopping_ms / 1000,
                           " s for its lock to be let go"));
      said_waiting = true;
    }
    if (!gone && (h.state == "running" || (h.state.empty() && now > unknown_deadline))) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("data dir ", data_dir, " is in use by another fwaid",
                       h.pid > 0 ? absl::StrCat(" (pid ", h.pid, ")") : std::string(),
                       "; stop it first (fwai daemon stop) or give this one its own --data-dir"));
    }
    if (now > deadline) {
      close(fd);
      return absl::DeadlineExceededError(absl::StrCat(
          "data dir ", data_dir, ": fwaid pid ", h.pid,
          gone ? " has exited but its lock is still held after " : " is still stopping after ",
          wait_for_stopping_ms / 1000, " s; try again when it has exited"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  DataDirLock lock(fd);
  lock.Write("running");
  return lock;
}

DataDirLock::DataDirLock(DataDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

DataDirLock::~DataDirLock() {
  if (fd_ >= 0) close(fd_);  // closing the descriptor releases the flock
}

void DataDirLock::MarkStopping() { Write("stopping"); }

void DataDirLock::Write(const char* state) {
  if (fd_ < 0) return;
  std::string line = absl::StrCat("pid ", getpid(), " ", state);
  // Same length for both states keeps a reader from seeing a torn line.
  line.resize(32, ' ');
  line.back() = '\n';
  if (pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) return;
  (void)ftruncate(fd_, static_cast<off_t>(line.size()));
}

}  // namespace fwai
