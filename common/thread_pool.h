// A fixed pool of worker threads for work that must not run on gRPC threads.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
    return true;
  }

  // Finishes queued work, then joins the workers.
  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace fwai
