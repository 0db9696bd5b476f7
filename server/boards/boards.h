// boards: one contract for a board, wherever it is hosted.
//
// A board is a device fwai flashes, reads and writes over serial, debugs and
// resets. It lives on one node: this fwaid's own broker (LocalBoards) or, on a
// node of a lab, a bench reached over the node's mutual TLS (LabBoards in
// server/lab/). Everything that works on a board — the gRPC adapters, skill
// runs, the agent's tools, a bench serving another node — calls `Boards`,
// which resolves the board and routes to its host. None of them knows, or
// needs to know, where a board is: the same request gets the same results,
// the same refusals and the same evidence record either way (a board of
// another node is named with its node).
//
// Who may do what (enforced by the hosts; the router only routes):
//  - anyone may read a board of this node's serial output and history;
//  - writing, flashing, debugging and resetting need the caller's lease on
//    the board (held by the caller's principal, or by its session);
//  - a board of another node is worked on only under the caller's lab lease,
//    taken through this node; a board someone else holds is refused naming
//    its holder and the rule;
//  - every flash passes the flash guard — the policy's boards, approval,
//    freshness, toolchain and memory budgets — and leaves exactly one
//    evidence record, written here whichever host flashed.
//
// Thread-safety: Boards and every BoardHost may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/hardware/broker.h"

namespace fwai {

class CancelToken;

// A board a request names, once resolved.
struct BoardRef {
  std::string id;
  std::string node;      // the node that hosts it ("" outside a lab)
  bool remote = false;   // hosted by another node of the lab
  std::string lease_id;  // remote: the caller's lab lease it is worked on under
};

// One reader of a board's serial port (and, for the lease holder, a writer).
class BoardSerial {
 public:
  virtual ~BoardSerial() = default;
  // Waits up to `timeout_ms` for the next line.
  [[nodiscard]] virtual SerialReader::Next Wait(SerialLine& line, int timeout_ms) = 0;
  // Why the stream ended (after Wait returned kEnded).
  virtual std::string end_reason() const = 0;
  // Lines this reader lost because it fell behind.
  virtual uint64_t dropped() const = 0;
  // Writes need the caller's lease; a refusal says why. A host that hears
  // of a refusal only after the write left (a bench) answers it through
  // TakeRefusal.
  [[nodiscard]] virtual absl::Status Write(std::string_view bytes) = 0;
  [[nodiscard]] virtual absl::Status SendLine(std::string_view line) = 0;
  // The oldest write refused since the last call ("" : none). The stream
  // stays open for reading.
  virtual std::string TakeRefusal() { return ""; }
  // The number the board's next line had when this reader opened: of a
  // reader opened from the history, the lines numbered below it are the
  // history (none when it is 1). 0 when the host does not say.
  virtual uint64_t next_seq() const = 0;
  // With the end: it came because the daemon serving the board stops (open
  // the stream again once it is back), not because the port or lease did.
  virtual bool host_stopping() const { return false; }
  // Queues a notice (SerialLine::notice) for this reader behind the lines
  // already queued: Wait returns it in order with them. Thread-safe.
  virtual void Notice(const std::string& text) = 0;
};

struct PolicyRules;
// The flash guard's rules from a project's (merged) policy.
FlashGuardPolicy FlashGuardFromRules(const PolicyRules& rules);

// A flash as the caller asks for it.
struct FlashOrder {
  std::string image;         // path, read as the caller's local account
  std::string project_root;  // "": found from the image's path
  bool approved = false;     // a person approved it (--yes, a prompt)
  // The guard's rules when the caller has applied the policy itself (a skill
  // run, a bench flashing for a front); unset: the project's and the
  // organisation's policy is loaded and applied here.
  std::optional<FlashGuardPolicy> guard;
  std::string via;  // who asked, for the record: "api", "agent", "skill run", "lab"
};

// The boards one host serves. The router asks the resolution questions; a
// host answers only for its own boards. The defaults answer "none here".
class BoardHost {
 public:
  virtual ~BoardHost() = default;

  // -- Resolution (local host) --
  // True when `board` is one of this host's boards.
  virtual bool Has(const std::string& board) const { return false; }
  // True when the caller (principal or session) holds a lease on a board here.
  virtual bool HoldsAny(const Caller& caller) const { return false; }
  // `wanted` ("" : the caller's leased board, else the only board), or why not.
  [[nodiscard]] virtual absl::StatusOr<BoardRef> Pick(const Caller& caller,
                                                      const std::string& wanted) const {
    return absl::NotFoundError("no boards here");
  }

  // -- Resolution (lab host) --
  // The caller's lab leases taken through this node, on `board` ("": any)
  // and with id `lease_id` ("": any).
  virtual std::vector<BoardRef> Held(const Caller& caller, const std::string& board,
                                     const std::string& lease_id) const {
    return {};
  }
  // Who holds `board` if not the caller through this node ("NAME through NODE").
  virtual std::optional<std::string> HeldByAnother(const Caller& caller,
                                                   const std::string& board) const {
    return std::nullopt;
  }
  // Why the caller's lab lease `lease_id` ended other than by its holder
  // (its bench left the lab), if it did.
  virtual std::optional<std::string> WhyEnded(const Caller& caller,
                                              const std::string& lease_id) const {
    return std::nullopt;
  }

  // OK when the caller holds a lease on `board` (its principal's or its
  // session's); else why not. The default: a board here is held by its ref.
  [[nodiscard]] virtual absl::Status CheckHeld(const Caller& caller, const BoardRef& board) const {
    return board.lease_id.empty() ? absl::FailedPreconditionError("no lease on it")
                                  : absl::OkStatus();
  }

  // -- Work on a resolved board --
  // Flashes under `guard` (already decided by the router). The result's
  // `record` holds what the evidence record says of the flash; the host
  // writes no record itself.
  [[nodiscard]] virtual absl::StatusOr<FlashResult> Flash(
      const Caller& caller, const BoardRef& board, const FlashOrder& order, bool approved,
      const FlashGuardPolicy& guard,
      const std::function<void(const FlashProgressUpdate&)>& progress, CancelToken* cancel) = 0;
  // `stream` picks the board's UART ("") or an RTT channel ("rtt:N"); see
  // HardwareBroker::OpenSerial.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<BoardSerial>> OpenSerial(
      const Caller& caller, const BoardRef& board, bool from_history,
      const std::string& stream) = 0;
  // The number the stream's next line will get.
  [[nodiscard]] virtual absl::StatusOr<uint64_t> SerialNextSeq(const Caller& caller,
                                                               const BoardRef& board,
                                                               const std::string& stream) = 0;
  // The last `max_lines` lines of the stream's history (0: all kept).
  [[nodiscard]] virtual absl::StatusOr<std::vector<SerialLine>> SerialHistory(
      const Caller& caller, const BoardRef& board, size_t max_lines, const std::string& stream) = 0;
  // `cancel` (may be null) ends the session at once: a command waiting on
  // the target returns and no further one runs.
  [[nodiscard]] virtual absl::StatusOr<DebugResult> Debug(const Caller& caller,
                                                          const BoardRef& board,
                                                          const std::vector<std::string>& commands,
                                                          int timeout_ms, CancelToken* cancel) = 0;
  [[nodiscard]] virtual absl::Status Reset(const Caller& caller, const BoardRef& board) = 0;
  // Health by hand (admins), and the board's self-test (health follows it).
  [[nodiscard]] virtual absl::Status SetHealth(const Caller& caller, const BoardRef& board,
                                               const std::string& health,
                                               const std::string& reason) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::string> SelfTest(const Caller& caller,
                                                             const BoardRef& board) = 0;
  // Over-the-air updates through the board's bootloader slots (see
  // HardwareBroker): each needs the caller's lease but OtaSlots.
  [[nodiscard]] virtual absl::Status OtaStage(const Caller& caller, const BoardRef& board,
                                              const std::string& image, bool permanent) = 0;
  [[nodiscard]] virtual absl::StatusOr<OtaBootResult> OtaRestart(const Caller& caller,
                                                                 const BoardRef& board,
                                                                 int boot_timeout_ms) = 0;
  [[nodiscard]] virtual absl::Status OtaConfirm(const Caller& caller, const BoardRef& board) = 0;
  [[nodiscard]] virtual absl::Status OtaRestorePrevious(const Caller& caller,
                                                        const BoardRef& board) = 0;
  [[nodiscard]] virtual absl::StatusOr<OtaSlotsInfo> OtaSlots(const BoardRef& board) = 0;
};

// The router: resolves a request's board and hands the work to its host.
struct OpenBoardReaders;

class Boards {
 public:
  // `local` serves this node's boards; `lab` (null outside a lab) those of
  // the other nodes. `node` names this node in records ("" outside a lab).
  Boards(BoardHost& local, BoardHost* lab, std::string node);

  // Where flash records go (the evidence log); set before the first flash.
  void SetRecorder(std::function<void(const nlohmann::json&)> recorder) {
    recorder_ = std::move(recorder);
  }
  // Told of each flash that succeeded (after its record); set before the first flash.
  using FlashObserver =
      std::function<void(const Caller&, const BoardRef&, const FlashOrder&, const FlashResult&)>;
  void SetFlashObserver(FlashObserver fn) { flash_observer_ = std::move(fn); }
  // The organisation's policy file, applied with the project's own.
  void SetPolicyFile(std::string path) { policy_file_ = std::move(path); }

  // The board `wanted` names for `caller`: one of this node's by id; else,
  // in a lab, the one the caller holds through this node (by id or by
  // `lease_id`). "" picks the caller's leased board (this node's first),
  // else the only board. Refusals name the holder and the rule.
  [[nodiscard]] absl::StatusOr<BoardRef> Resolve(const Caller& caller, const std::string& wanted,
                                                 const std::string& lease_id = "") const;

  // The flash guard (policy, then the host's own rules), the flash, and
  // its one evidence record.
  [[nodiscard]] absl::StatusOr<FlashResult> Flash(
      const Caller& caller, const BoardRef& board, const FlashOrder& order,
      const std::function<void(const FlashProgressUpdate&)>& progress, CancelToken* cancel);
  // OK when the caller holds a lease on `board`, else why not.
  [[nodiscard]] absl::Status CheckHeld(const Caller& caller, const BoardRef& board) const {
    return HostOf(board).CheckHeld(caller, board);
  }
  // A reader of `board`'s `stream` ("" : uart). It hears Notice's notices
  // unless `hears_notices` is false (a watch's own reader).
  [[nodiscard]] absl::StatusOr<std::unique_ptr<BoardSerial>> OpenSerial(
      const Caller& caller, const BoardRef& board, bool from_history,
      const std::string& stream = "", bool hears_notices = true);
  [[nodiscard]] absl::StatusOr<std::vector<SerialLine>> SerialHistory(
      const Caller& caller, const BoardRef& board, size_t max_lines,
      const std::string& stream = "");
  // A notice to every reader of `board` opened through this object (any
  // stream, local or lab): a watch on it fired on the line numbered
  // `after_seq` of `stream` (0: on no line). A reader of that stream shows it
  // after that line (at once if it opened after it; about a second later if
  // it lost it); readers of other streams at once. Returns how many readers
  // got it.
  int Notice(const std::string& board, const std::string& text, const std::string& stream = "",
             uint64_t after_seq = 0);
  [[nodiscard]] absl::StatusOr<uint64_t> SerialNextSeq(const Caller& caller, const BoardRef& board,
                                                       const std::string& stream = "");
  [[nodiscard]] absl::StatusOr<DebugResult> Debug(const Caller& caller, const BoardRef& board,
                                                  const std::vector<std::string>& commands,
                                                  int timeout_ms, CancelToken* cancel = nullptr);
  [[nodiscard]] absl::Status Reset(const Caller& caller, const BoardRef& board);
  [[nodiscard]] absl::Status SetHealth(const Caller& caller, const BoardRef& board,
                                       const std::string& health, const std::string& reason);
  [[nodiscard]] absl::StatusOr<std::string> SelfTest(const Caller& caller, const BoardRef& board);
  [[nodiscard]] absl::Status OtaStage(const Caller& caller, const BoardRef& board,
                                      const std::string& image, bool permanent);
  [[nodiscard]] absl::StatusOr<OtaBootResult> OtaRestart(const Caller& caller,
                                                         const BoardRef& board,
                                                         int boot_timeout_ms);
  [[nodiscard]] absl::Status OtaConfirm(const Caller& caller, const BoardRef& board);
  [[nodiscard]] absl::Status OtaRestorePrevious(const Caller& caller, const BoardRef& board);
  [[nodiscard]] absl::StatusOr<OtaSlotsInfo> OtaSlots(const BoardRef& board);

  bool in_lab() const { return lab_ != nullptr; }
  const std::string& node() const { return node_; }

 private:
  BoardHost& HostOf(const BoardRef& board) const { return board.remote ? *lab_ : local_; }
  // The guard's policy, then the host's flash.
  absl::StatusOr<FlashResult> GuardAndFlash(
      const Caller& caller, const BoardRef& board, const FlashOrder& order,
      const std::function<void(const FlashProgressUpdate&)>& progress, CancelToken* cancel);
  // The policy's verdict on flashing `board`, and the guard it sets.
  absl::StatusOr<FlashGuardPolicy> GuardFor(const Caller& caller, const BoardRef& board,
                                            const FlashOrder& order, bool* approved) const;
  void Record(nlohmann::json rec, const Caller& caller, const BoardRef& board,
              const FlashOrder& order) const;

  BoardHost& local_;
  BoardHost* const lab_;
  const std::string node_;
  std::shared_ptr<OpenBoardReaders> open_;  // what Notice reaches; shared with each reader
  std::function<void(const nlohmann::json&)> recorder_;
  FlashObserver flash_observer_;
  std::string policy_file_;
};

}  // namespace fwai
