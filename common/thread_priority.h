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
};

// Sets the calling thread's scheduling policy (Linux: per thread).
[[nodiscard]] absl::Status SetThisThreadPriority(ThreadPriority priority);

// The calling thread's policy, as SetThisThreadPriority names it; other
// policies are an error naming them.
[[nodiscard]] absl::StatusOr<ThreadPriority> ThisThreadPriority();

// Names the calling thread (at most 15 bytes are kept), as top and perf show it.
void NameThisThread(const std::string& name);

}  // namespace fwai
