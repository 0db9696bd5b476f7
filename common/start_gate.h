// start_gate: lets at most `slots` threads at a time do the CPU work of
// starting something (a chat turn: loading its conversation, choosing its
// tools, building its first model request), so a burst of starts does not
// make the work already under way (streams being delivered) wait for a core.
//
// A thread holds its slot from Enter until its Hold ends, or until it is
// about to wait on the network (LeaveHeld, called by the HTTP client): the
// wait for a reply is not start work. A holder that keeps its slot longer
// than `budget` stops counting against the limit, so one slow start never
// holds the others back for longer than that. Waiters enter in the order
// they came, and only the one at the front is woken when a slot may have
// freed: a burst of hundreds of starts costs one wakeup per start, not one
// per waiter per start. With `slots` 0 there is no limit.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>

#include "common/cancel.h"
#include "common/mutex.h"

namespace fwai {

class StartGate {
 public:
  using Clock = std::chrono::steady_clock;

  StartGate(size_t slots, std::chrono::milliseconds budget);
  ~StartGate();
  StartGate(const StartGate&) = delete;
  StartGate& operator=(const StartGate&) = delete;

  // A slot held; leaving it (at most once) when it ends or on LeaveHeld.
  class Hold {
   public:
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&&) = delete;
    Hold(const Hold&) = delete;
    ~Hold();

   private:
    friend class StartGate;
    Hold(StartGate* gate, uint64_t id);
    StartGate* gate_;
    uint64_t id_;
  };

  // Waits for a slot (in order of arrival) and takes it for this thread.
  // When `cancel` is cancelled first, stops waiting and returns a Hold of
  // no slot (the cancelled work then goes on to see it and end).
  [[nodiscard]] Hold Enter(CancelToken* cancel = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Gives up the slot this thread holds, if it holds one.
  static void LeaveHeld();

  // Holders counting against the limit now.
  size_t Inside() ABSL_LOCKS_EXCLUDED(mu_);
  // Threads waiting in Enter now.
  size_t Waiting() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until exactly `n` threads wait in Enter.
  void WaitUntilWaiting(size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // Times a waiter has woken to look again whether it may enter, since the
  // gate was made.
  uint64_t Wakeups() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One thread in Enter, on its own stack; woken alone.
  struct Waiter {
    CondVar cv;
  };
  void Leave(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes the waiters (a cancel may concern one of them).
  struct Waker {
    Mutex mu;
    StartGate* gate ABSL_GUARDED_BY(mu) = nullptr;  // null once the gate is gone
  };
  // Drops holders past the budget.
  size_t CountingLocked(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the waiter first in line, if any: it alone may enter next.
  void WakeFrontLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits as the waiter `me` until woken or, when the slots are full and
  // `me` is first, until the oldest holder passes its budget.
  void WaitLocked(Waiter& me) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t slots_;
  const Clock::duration budget_;
  Mutex mu_;
  CondVar arrived_;  // the number of waiters changed (WaitUntilWaiting)
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Waiter*> waiting_ ABSL_GUARDED_BY(mu_);  // in order of arrival
  // id -> when it entered
  std::map<uint64_t, Clock::time_point> holders_ ABSL_GUARDED_BY(mu_);
  // Shared with cancel callbacks, which may run after the gate is gone.
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
};

}  // namespace fwai
