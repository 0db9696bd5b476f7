#include "common/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fwai {
namespace {
constexpr int kBackgroundNice = 10;
}  // namespace

absl::Status SetThisThreadPriority(ThreadPriority priority) {
  sched_param param{};
  param.sched_priority = 0;
  const int policy = priority == ThreadPriority::kIdle ? SCHED_IDLE : SCHED_OTHER;
  // pid 0: the calling thread, not the whole process.
  if (sched_setscheduler(0, policy, &param) != 0) {
    const int err = errno;
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot set the thread's scheduling policy to ",
        policy == SCHED_IDLE ? "SCHED_IDLE" : "SCHED_OTHER", ": ", std::strerror(err)));
  }
  if (priority == ThreadPriority::kBackground) {
    // A thread's nice value is its own on Linux (setpriority on its id);
    // a process already nicer than that keeps its value.
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, tid);
    if (errno == 0 && now >= kBackgroundNice) return absl::OkStatus();
    if (setpriority(PRIO_PROCESS, tid, kBackgroundNice) != 0) {
      const int err = errno;
      return absl::PermissionDeniedError(absl::StrCat("cannot set the thread's nice value to ",
                                                      kBackgroundNice, ": ", std::strerror(err)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ThreadPriority> ThisThreadPriority() {
  const int policy = sched_getscheduler(0);
  if (policy == SCHED_IDLE) return ThreadPriority::kIdle;
  if (policy == SCHED_OTHER) return ThreadPriority::kNormal;  // kBackground too
  if (policy < 0)
    return absl::InternalError(absl::StrCat("sched_getscheduler: ", std::strerror(errno)));
  return absl::FailedPreconditionError(
      absl::StrCat("scheduling policy ", policy, " is neither SCHED_OTHER nor SCHED_IDLE"));
}

void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace fwai
