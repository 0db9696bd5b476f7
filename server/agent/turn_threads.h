// turn_threads: the threads that run chat turns. Owns every one of them:
// `kept` started up front that wait for turns for as long as it lives (a
// burst of turns on a fresh daemon then creates no thread and grows no new
// heap), and more started when every thread is busy, which end after
// `idle_end` with nothing to run. Destruction waits for the running jobs and
// joins every thread; jobs still queued then are dropped.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace fwai {

class TurnThreads {
 public:
  explicit TurnThreads(size_t kept, std::chrono::milliseconds idle_end = std::chrono::minutes(1));
  ~TurnThreads();
  TurnThreads(const TurnThreads&) = delete;
  TurnThreads& operator=(const TurnThreads&) = delete;

  // Runs `job` on an idle thread, or on a new one when none is idle.
  void Run(std::function<void()> job);

  // Threads alive now (running a job or waiting for one).
  size_t Live();
  // Threads created since construction (the kept ones included).
  uint64_t Created();
  // Waits until exactly `n` threads are alive (the extra ones ended idle).
  void WaitUntilLive(size_t n);
  // Waits until at least `n` threads wait for a job (a thread whose job has
  // returned is busy until it is back waiting).
  void WaitUntilIdle(size_t n);

 private:
  void Start(bool kept) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Work(uint64_t id, bool kept) ABSL_LOCKS_EXCLUDED(mu_);

  const std::chrono::milliseconds idle_end_;
  Mutex mu_;
  CondVar cv_;        // a job queued, or stop
  CondVar ended_cv_;  // a thread ended idle, or went idle
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::thread> live_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> ended_ ABSL_GUARDED_BY(mu_);  // extra ones that ended idle, to join
};

}  // namespace fwai
