// A cancellation flag shared by a turn, its HTTP stream, its tools and its
// sub-agents. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace fwai {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  void Cancel() {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_.exchange(true)) return;
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    for (auto& cb : callbacks) cb();
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // Sleeps up to `d`; returns true if cancelled meanwhile.
  bool WaitFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [this] { return cancelled_.load(); });
  }

  // Runs `cb` on Cancel() (at once if already cancelled). `cb` must not block.
  void OnCancel(std::function<void()> cb) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_) {
        callbacks_.push_back(std::move(cb));
        return;
      }
    }
    cb();
  }

 private:
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> callbacks_;
};

}  // namespace fwai
