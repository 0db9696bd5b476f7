// watches: rules (server/project/watch_rules.h) running on boards' output.
//
// Each rule reads its board's stream through Boards as its owner, so a
// bench's board of a lab is watched as one of this node's, and under the
// owner's lease: when the lease ends the reader ends, and so does the rule
// (recorded). A line that matches counts; `count` matches within `within_s`
// fire the rule, at most once per `min_interval_s` (what it held back is
// counted and said in the next firing). A firing:
//   - capture: the board's stopped core (fault_capture.h) saved into the
//     owner's project (.fwai/captures/), as the owner's local account;
//   - notify: a notice (SerialLine::notice) to every reader of the board
//     opened through Boards, and the hook's to the sessions holding it;
//     the record says how many of each it reached;
//   - wake: a turn in the named session, which must be the owner's, whose
//     first message is the matched line and the capture's decode.
// Every firing is an evidence record {kind: watch_fired, ...}.
//
// Thread-safety: every method may be called from any thread; each rule runs
// on a thread of its own, stopped by Remove and by the destructor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/auth/caller.h"
#include "server/project/watch_rules.h"

namespace fwai {

class Boards;
class Clock;

// A rule as it runs: what it is, whose, and what it did.
struct WatchState {
  WatchRule rule;     // rule.board resolved
  std::string owner;  // the owner's identity
  std::string owner_display;
  std::string project_root;  // where captures are kept
  int64_t lines = 0;         // lines read
  int fired = 0;
  int suppressed = 0;  // held back by min_interval since the last firing
  int64_t last_fired_us = 0;
  std::string last_line, last_capture;
  bool active = true;
  std::string ended;  // why it stopped, once it has
  nlohmann::json ToJson() const;
};

class Watches {
 public:
  struct Hooks {
    // Appends an evidence record.
    std::function<void(const nlohmann::json&)> record;
    // A notice to the sessions holding `board`; returns how many it reached.
    std::function<int(const std::string& board, const std::string& rule, const std::string& text)>
        notify;
    // Starts a turn in `session` as `owner` with `text` as its message.
    std::function<absl::Status(const Caller& owner, const std::string& session,
                               const std::string& text)>
        wake;
  };
  Watches(Boards& boards, Hooks hooks, const Clock* clock);
  ~Watches();
  Watches(const Watches&) = delete;
  Watches& operator=(const Watches&) = delete;

  // Starts `rule` on the board the caller holds (rule.board, "" : the one
  // they hold). INVALID_ARGUMENT for a bad rule, FAILED_PRECONDITION when
  // the caller holds no lease on it, ALREADY_EXISTS for a name in use there.
  [[nodiscard]] absl::StatusOr<WatchState> Add(const Caller& caller, WatchRule rule,
                                               const std::string& project_root);
  // The caller's rules (an admin's: everyone's), running and ended.
  std::vector<WatchState> List(const Caller& caller) const;
  // Stops the caller's rule `name` on `board` ("" : any board).
  [[nodiscard]] absl::Status Remove(const Caller& caller, const std::string& board,
                                    const std::string& name);

 private:
  struct Running;
  void Run(Running* r);
  void Fire(Running* r, const std::string& line, uint64_t seq, int64_t now_us);
  void End(Running* r, const std::string& why);

  Boards& boards_;
  const Hooks hooks_;
  const Clock* const clock_;
  mutable Mutex mu_;
  // "board/name": running, and ended until replaced or removed.
  std::map<std::string, std::unique_ptr<Running>> running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
