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
// they came. With `slots` 0 there is no limit.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "common/cancel.h"

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
  [[nodiscard]] Hold Enter(CancelToken* cancel = nullptr);

  // Gives up the slot this thread holds, if it holds one.
  static void LeaveHeld();

  // Holders counting against the limit now.
  size_t Inside();
  // Threads waiting in Enter now.
  size_t Waiting();
  // Waits until exactly `n` threads wait in Enter.
  void WaitUntilWaiting(size_t n);

 private:
  void Leave(uint64_t id);
  // Wakes the waiters (a cancel may concern one of them).
  struct Waker {
    std::mutex mu;
    StartGate* gate = nullptr;  // null once the gate is gone
  };
  size_t CountingLocked(Clock::time_point now);  // drops holders past the budget

  const size_t slots_;
  const Clock::duration budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_id_ = 1;
  std::deque<uint64_t> waiting_;                   // ids in order of arrival
  std::map<uint64_t, Clock::time_point> holders_;  // id -> when it entered
  // Shared with cancel callbacks, which may run after the gate is gone.
  std::shared_ptr<Waker> waker_ = std::make_shared<Waker>();
};

}  // namespace fwai
