#include "server/agent/turn_threads.h"

#include <utility>

namespace fwai {

TurnThreads::TurnThreads(size_t kept, std::chrono::milliseconds idle_end) : idle_end_(idle_end) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < kept; ++i) Start(/*kept=*/true);
}

TurnThreads::~TurnThreads() {
  std::vector<std::thread> all;
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
    for (auto& [id, t] : live_) all.push_back(std::move(t));
    live_.clear();
    for (auto& t : ended_) all.push_back(std::move(t));
    ended_.clear();
  }
  for (auto& t : all) t.join();
}

void TurnThreads::Start(bool kept) {
  // A kept thread counts as idle from its creation, so that jobs run at once
  // after construction go to it rather than to new threads.
  if (kept) ++idle_;
  const uint64_t id = next_id_++;
  live_.emplace(id, std::thread([this, id, kept] { Work(id, kept); }));
}

void TurnThreads::Run(std::function<void()> job) {
  std::vector<std::thread> ended;
  {
    MutexLock lock(&mu_);
    ended.swap(ended_);
    jobs_.push_back(std::move(job));
    if (idle_ >= jobs_.size()) {
      cv_.Signal();
    } else {
      Start(/*kept=*/false);
    }
  }
  for (auto& t : ended) t.join();
}

size_t TurnThreads::Live() {
  MutexLock lock(&mu_);
  return live_.size();
}

uint64_t TurnThreads::Created() {
  MutexLock lock(&mu_);
  return next_id_;
}

void TurnThreads::WaitUntilLive(size_t n) {
  MutexLock lock(&mu_);
  while (live_.size() != n) ended_cv_.Wait(&mu_);
}

void TurnThreads::WaitUntilIdle(size_t n) {
  MutexLock lock(&mu_);
  while (idle_ < n) ended_cv_.Wait(&mu_);
}

void TurnThreads::Work(uint64_t id, bool kept) {
  MutexLock lock(&mu_);
  bool counted = kept;  // counted as idle by Start()
  while (true) {
    if (!counted) {
      ++idle_;
      ended_cv_.SignalAll();  // WaitUntilIdle
    }
    counted = false;
    bool woke = true;
    if (kept) {
      while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + idle_end_;
      while (!stop_ && jobs_.empty()) {
        if (cv_.WaitWithDeadline(&mu_, deadline)) break;
      }
      woke = stop_ || !jobs_.empty();
    }
    --idle_;
    if (stop_) return;
    if (!woke) {
      // Idle too long: hand this thread's handle over to be joined.
      auto it = live_.find(id);
      ended_.push_back(std::move(it->second));
      live_.erase(it);
      ended_cv_.SignalAll();
      return;
    }
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.Unlock();
    job();
    job = nullptr;  // the turn's state goes before the thread waits again
    lock.Lock();
  }
}

}  // namespace fwai
