// One target's RTT, kept flowing: a thread that polls an RttLink over the
// target's memory at a fixed interval (on a Clock, so tests move time),
// hands each up-channel's bytes to a sink and writes what callers queue for
// the down-channels. While the firmware has not set up its control block
// (or a reset cleared it) the pump looks again, less often each time up to
// a second; once found it polls at the interval again. A ring found half
// full or more is polled again at once (busy_poll_us), so a firmware that
// writes faster than the interval drains is not cut short.
//
// Thread-safe. The sink runs on the pump's thread; it must not call back
// into the pump.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/cancel.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "server/hardware/rtt.h"

namespace fwai {

struct RttPumpOptions {
  int64_t poll_us = 10'000;            // between polls while the block is found
  int64_t busy_poll_us = 500;          // after a poll that found a ring half full or more
  int64_t max_backoff_us = 1'000'000;  // between looks while it is not
  int idle_polls = 5;                  // polls without bytes before a partial line goes out
};

class RttPump {
 public:
  // What the pump found: bytes of an up-channel, or (bytes empty, `idle`)
  // a channel that has had nothing for `idle_polls` polls since its last
  // bytes (a partial line may go out now).
  using Sink = std::function<void(unsigned channel, std::string_view bytes, bool idle)>;

  // Starts the thread. `memory` must outlive the pump.
  RttPump(TargetMemory& memory, RttSearch where, RttPumpOptions options, const Clock& clock,
          Sink sink);
  ~RttPump();  // stops the thread
  RttPump(const RttPump&) = delete;
  RttPump& operator=(const RttPump&) = delete;

  // Queues `bytes` for down-channel `channel`; they go out as the target
  // makes room. Errors as RttLink::QueueDown says (the block not found
  // yet, no such channel, too much waiting).
  [[nodiscard]] absl::Status Send(unsigned channel, std::string_view bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The block last found (nullopt while there is none), and why there is
  // none or the last memory error ("" if neither).
  std::optional<RttControlBlock> block() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string problem() const ABSL_LOCKS_EXCLUDED(mu_);
  // Polls done so far (tests wait for a poll after moving the clock).
  uint64_t polls() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  // One poll under mu_; the bytes to hand to the sink, and the wait before
  // the next poll.
  int64_t PollOnce(std::map<unsigned, std::string>& up, std::vector<unsigned>& idle)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RttPumpOptions options_;
  const Clock& clock_;
  const Sink sink_;
  mutable Mutex mu_;
  RttLink link_ ABSL_GUARDED_BY(mu_);
  std::string problem_ ABSL_GUARDED_BY(mu_);
  uint64_t polls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t backoff_us_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<unsigned, int> quiet_ ABSL_GUARDED_BY(mu_);  // polls since a channel's last bytes
  CancelToken stop_;
  std::thread thread_;
};

}  // namespace fwai
