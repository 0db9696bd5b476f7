// A fixed pool of worker threads for work that must not run on gRPC threads.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace fwai {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : ThreadPool(threads, nullptr) {}
  // `on_start` runs first on each worker (its name, its priority).
  ThreadPool(int threads, std::function<void()> on_start) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this, on_start] {
        if (on_start) on_start();
        Loop();
      });
    }
  }
  ~ThreadPool() { Shutdown(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs `fn` on a worker. After Shutdown, returns false and does not run it.
  bool Submit(std::function<void()> fn) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return false;
      queue_.push_back(std::move(fn));
    }
    cv_.Signal();
    return true;
  }

  // Finishes queued work, then joins the workers.
  void Shutdown() {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.SignalAll();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        while (!(stopping_ || !queue_.empty())) cv_.Wait(&mu_);
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Filled in the constructor; joined once, by the Shutdown that set stopping_.
  std::vector<std::thread> workers_;
};

}  // namespace fwai
