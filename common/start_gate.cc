#include "common/start_gate.h"

#include <algorithm>

namespace fwai {

namespace {

// The slot this thread holds, if any: LeaveHeld gives it up.
struct HeldSlot {
  StartGate* gate = nullptr;
  uint64_t id = 0;
};
thread_local HeldSlot held;

}  // namespace

StartGate::StartGate(size_t slots, std::chrono::milliseconds budget)
    : slots_(slots), budget_(budget) {
  MutexLock lock(&waker_->mu);
  waker_->gate = this;
}

StartGate::~StartGate() {
  MutexLock lock(&waker_->mu);
  waker_->gate = nullptr;
}

StartGate::Hold::Hold(StartGate* gate, uint64_t id) : gate_(gate), id_(id) {}

StartGate::Hold::Hold(Hold&& other) noexcept : gate_(other.gate_), id_(other.id_) {
  other.gate_ = nullptr;
}

StartGate::Hold::~Hold() {
  if (gate_ == nullptr) return;
  if (held.gate == gate_ && held.id == id_) held = {};
  gate_->Leave(id_);
}

size_t StartGate::CountingLocked(Clock::time_point now) {
  for (auto it = holders_.begin(); it != holders_.end();) {
    it = now - it->second >= budget_ ? holders_.erase(it) : std::next(it);
  }
  return holders_.size();
}

void StartGate::WakeFrontLocked() {
  if (!waiting_.empty()) waiting_.front()->cv.Signal();
}

void StartGate::WaitLocked(Waiter& me) {
  if (holders_.empty() || waiting_.front() != &me) {
    me.cv.Wait(&mu_);
  } else {
    // Full: wait for a leave, or for the oldest holder to pass its budget.
    auto oldest =
        std::min_element(holders_.begin(), holders_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    me.cv.WaitWithDeadline(&mu_, oldest->second + budget_);
  }
  ++wakeups_;
}

StartGate::Hold StartGate::Enter(CancelToken* cancel) {
  if (slots_ > 0 && cancel != nullptr) {
    cancel->OnCancel([waker = std::weak_ptr<Waker>(waker_)] {
      auto w = waker.lock();
      if (!w) return;
      MutexLock lock(&w->mu);
      if (w->gate == nullptr) return;
      MutexLock gate_lock(&w->gate->mu_);
      for (Waiter* waiter : w->gate->waiting_) waiter->cv.Signal();  // rare: all may look
    });
  }
  MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  if (slots_ > 0) {
    Waiter me;
    waiting_.push_back(&me);
    arrived_.SignalAll();  // WaitUntilWaiting
    while (true) {
      if (cancel != nullptr && cancel->cancelled()) {
        const bool first = waiting_.front() == &me;
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &me));
        if (first) WakeFrontLocked();  // the next in line is at the front now
        arrived_.SignalAll();
        return Hold(nullptr, 0);
      }
      if (waiting_.front() == &me && CountingLocked(Clock::now()) < slots_) break;
      WaitLocked(me);
    }
    waiting_.pop_front();
    holders_[id] = Clock::now();
    WakeFrontLocked();  // the next in line may fit too
    arrived_.SignalAll();
  }
  held = {this, id};
  return Hold(this, id);
}

void StartGate::Leave(uint64_t id) {
  MutexLock lock(&mu_);
  if (holders_.erase(id) == 0) return;
  WakeFrontLocked();
}

void StartGate::LeaveHeld() {
  if (held.gate == nullptr) return;
  StartGate* gate = held.gate;
  const uint64_t id = held.id;
  held = {};
  gate->Leave(id);
}

size_t StartGate::Inside() {
  MutexLock lock(&mu_);
  return CountingLocked(Clock::now());
}

size_t StartGate::Waiting() {
  MutexLock lock(&mu_);
  return waiting_.size();
}

void StartGate::WaitUntilWaiting(size_t n) {
  MutexLock lock(&mu_);
  while (waiting_.size() != n) arrived_.Wait(&mu_);
}

uint64_t StartGate::Wakeups() {
  MutexLock lock(&mu_);
  return wakeups_;
}

}  // namespace fwai
