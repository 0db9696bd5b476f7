// CPU priority of the calling thread: background work (document ingest)
// yields the cores to interactive work (streaming turns) whenever both want
// them, without a fixed share or a sleep.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fwai {

enum class ThreadPriority {
  kNormal,  // SCHED_OTHER, the process's nice value
  kIdle,    // SCHED_IDLE: runs only on a core nothing else wants
  // SCHED_OTHER at nice 10 (a tenth of a nice-0 thread's share of a busy
  // core): work that others may wait for (it holds a lock) but that must
  // not take the cores from interactive work. Threads it starts (OpenMP's
  // workers) inherit it. It cannot be undone without privilege.
  kBackground,
};

// Sets the calling thread's scheduling policy (Linux: per thread).
[[nodiscard]] absl::Status SetThisThreadPriority(ThreadPriority priority);

// The calling thread's policy, as SetThisThreadPriority names it (kNormal for
// kBackground: both are SCHED_OTHER); other policies are an error naming them.
[[nodiscard]] absl::StatusOr<ThreadPriority> ThisThreadPriority();

// Names the calling thread (at most 15 bytes are kept), as top and perf show it.
void NameThisThread(const std::string& name);

}  // namespace fwai
