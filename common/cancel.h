// A cancellation flag shared by a turn, its HTTP stream, its tools and its
// sub-agents. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "common/mutex.h"

namespace fwai {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  void Cancel() {
    std::vector<std::function<void()>> callbacks;
    {
      MutexLock lock(&mu_);
      if (cancelled_.exchange(true)) return;
      callbacks.swap(callbacks_);
    }
    cv_.SignalAll();
    for (auto& cb : callbacks) cb();
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // Sleeps up to `d`; returns true if cancelled meanwhile.
  bool WaitFor(std::chrono::milliseconds d) {
    MutexLock lock(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + d;
    while (!cancelled_.load()) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    return cancelled_.load();
  }

  // Runs `cb` on Cancel() (at once if already cancelled). `cb` must not block.
  void OnCancel(std::function<void()> cb) {
    {
      MutexLock lock(&mu_);
      if (!cancelled_) {
        callbacks_.push_back(std::move(cb));
        return;
      }
    }
    cb();
  }

 private:
  std::atomic<bool> cancelled_{false};
  Mutex mu_;
  CondVar cv_;
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
