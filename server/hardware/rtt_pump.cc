#include "server/hardware/rtt_pump.h"

#include <algorithm>

#include "common/thread_priority.h"

namespace fwai {

RttPump::RttPump(TargetMemory& memory, RttSearch where, RttPumpOptions options, const Clock& clock,
                 Sink sink)
    : options_(options), clock_(clock), sink_(std::move(sink)), link_(memory, where) {
  thread_ = std::thread([this] { Run(); });
}

RttPump::~RttPump() {
  stop_.Cancel();
  if (thread_.joinable()) thread_.join();
}

void RttPump::Run() {
  NameThisThread("fwaid-rtt");
  while (!stop_.cancelled()) {
    std::map<unsigned, std::string> up;
    std::vector<unsigned> idle;
    int64_t next_us;
    {
      MutexLock lock(&mu_);
      // The next poll's time is fixed with this one, so a clock moved while
      // the sink runs brings it nearer instead of being lost.
      next_us = clock_.NowMicros() + PollOnce(up, idle);
    }
    for (const auto& [channel, bytes] : up) sink_(channel, bytes, false);
    for (unsigned channel : idle) sink_(channel, {}, true);
    if (clock_.SleepUntil(next_us, &stop_)) break;
  }
}

int64_t RttPump::PollOnce(std::map<unsigned, std::string>& up, std::vector<unsigned>& idle) {
  ++polls_;
  auto poll = link_.Poll();
  if (!poll.ok()) {
    problem_ = std::string(poll.status().message());
    backoff_us_ = std::clamp(backoff_us_ * 2, options_.poll_us, options_.max_backoff_us);
    return backoff_us_;
  }
  if (!poll->located) {
    problem_ = poll->why_not;
    backoff_us_ = std::clamp(backoff_us_ * 2, options_.poll_us, options_.max_backoff_us);
    return backoff_us_;
  }
  // Bytes taken before a failed access are passed on all the same.
  problem_ = poll->error.ok() ? "" : std::string(poll->error.message());
  backoff_us_ =
      poll->error.ok() ? 0 : std::clamp(backoff_us_ * 2, options_.poll_us, options_.max_backoff_us);
  bool pressed = false;  // a ring was half full or more: the firmware writes fast
  const RttControlBlock* block = link_.block();
  for (auto& [channel, bytes] : poll->up) {
    if (bytes.empty()) continue;
    quiet_[channel] = 0;
    if (block && channel < block->up.size())
      pressed |= 2 * bytes.size() >= block->up[channel].size - 1;
    up[channel] = std::move(bytes);
  }
  for (auto& [channel, quiet] : quiet_) {
    if (up.count(channel)) continue;
    if (++quiet == options_.idle_polls) idle.push_back(channel);
  }
  if (!poll->error.ok()) return backoff_us_;
  return pressed ? std::min(options_.busy_poll_us, options_.poll_us) : options_.poll_us;
}

absl::Status RttPump::Send(unsigned channel, std::string_view bytes) {
  MutexLock lock(&mu_);
  return link_.QueueDown(channel, bytes);
}

std::optional<RttControlBlock> RttPump::block() const {
  MutexLock lock(&mu_);
  if (const RttControlBlock* b = link_.block()) return *b;
  return std::nullopt;
}

std::string RttPump::problem() const {
  MutexLock lock(&mu_);
  return problem_;
}

uint64_t RttPump::polls() const {
  MutexLock lock(&mu_);
  return polls_;
}

}  // namespace fwai
