// BoardLeases: who holds which board, wherever it is hosted — the leases
// and the listing of the board contract (server/boards/boards.h does the
// work on a board).
//
// Outside a lab every board is this node's and a lease is the broker's. On
// a node of a lab:
//  - a lease on one of this node's boards is also claimed in the lab (etcd),
//    so no other node hands the board out meanwhile; a wait for it waits in
//    the lab's queue with everyone else's;
//  - a lease on another node's board is a lab lease taken through this node
//    (its id starts "lab-"); the board's bench honours it;
//  - the listing shows every node's boards, with who holds each through
//    which node, and every waiter of the lab.
// A lease is renewed and released only by its holder, or by an admin.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "server/boards/boards.h"
#include "server/hardware/broker.h"

namespace fwai {

namespace lab {
class EtcdClient;
class LabLeases;
}  // namespace lab

// A lease, wherever it was granted.
struct BoardLease {
  std::string lease_id;
  std::string board;
  std::string node;      // the node whose board it is ("" outside a lab)
  std::string holder;    // "alice (uid 1000)", shown to others
  std::string identity;  // the principal holding it
  std::string via;       // a lab lease: the node its holder came through
  std::string session_id;
  std::string token_id;  // the token it was taken with: it ends when that token is revoked
  int64_t acquired_us = 0;
  int64_t expires_us = 0;
  int ttl_s = 0;
  bool renewed = false;  // the caller already held it: renewed, not taken
};

// Someone waiting for a board.
struct BoardWaiter {
  std::string holder;  // who waits ("NAME via NODE" in a lab)
  std::string wants;   // "b1" or "tags stm32f1"
  std::vector<std::string> candidates;
  std::string node;  // the node they wait through
  std::string session_id;
  int position = 0;
  int64_t since_us = 0;
  int64_t until_us = 0;
};

struct ListedBoard {
  DeviceInfo
      device;  // another node's: id, kind, name, health, tags, target, holder; state "remote"
  std::string node;
};

struct BoardListing {
  std::vector<ListedBoard> boards;
  std::vector<BoardLease> leases;
  std::string lab_error;  // the lab's registry could not be read: only this node's boards
  std::vector<std::string> lab_error_detail;  // then each etcd member's own answer
};

struct LeaseRequest {
  std::string board;              // this board, or
  std::vector<std::string> tags;  // any board with all these tags
  int ttl_s = 0;                  // 0: the default
  int wait_s = 0;                 // 0: fail at once when held
  bool ci = false;                // the lab's queue serves it in the CI band
};

class BoardLeases {
 public:
  // `lab` and `etcd` are null outside a lab; `node` names this node.
  BoardLeases(HardwareBroker& broker, const HardwareConfig& config, lab::LabLeases* lab,
              lab::EtcdClient* etcd, std::string node);

  BoardListing List() const;
  // Every lease and every waiter, whichever node they came through.
  [[nodiscard]] absl::StatusOr<std::pair<std::vector<BoardLease>, std::vector<BoardWaiter>>> Who()
      const;

  // A lease on a board of this node, or (in a lab) of any node. Holding one
  // already renews it (`renewed`).
  [[nodiscard]] absl::StatusOr<BoardLease> Acquire(const Caller& caller, const LeaseRequest& req,
                                                   const std::function<bool()>& cancelled);
  // A lease to work on `board` (as Boards resolved it) under: on a board of
  // this node, the caller's (renewed) or a new one taken for them; on a
  // board of another node, the caller's lab lease it was resolved by
  // (`renewed`: not the work's to release).
  [[nodiscard]] absl::StatusOr<BoardLease> LeaseFor(const Caller& caller, const BoardRef& board,
                                                    int ttl_s,
                                                    const std::function<bool()>& cancelled);
  // The lease renewed; `identity` is its holder's (an admin may renew another's).
  [[nodiscard]] absl::StatusOr<BoardLease> Renew(const Caller& caller, const std::string& lease_id);
  // By id or board: the lease that ended, with who held it.
  [[nodiscard]] absl::StatusOr<BoardLease> Release(const Caller& caller,
                                                   const std::string& lease_id,
                                                   const std::string& board, bool force);
  // A token was revoked: every lease taken with it through this node ends
  // at once (on this node's boards and, in a lab, on other nodes' boards),
  // its holder's record saying `reason`, and the board goes to the next
  // waiter. The leases that ended.
  std::vector<BoardLease> EndTakenWith(const std::string& token_id, const std::string& reason);
  // A lease held while `stop` is not cancelled: acquired (waiting as asked),
  // announced to `acquired`, renewed every third of its TTL and released
  // when `stop` is cancelled or the lease is lost (ended by someone else,
  // expired). An unreachable lab registry is retried until the lease's own
  // end. Blocks the calling thread for as long as it holds.
  struct Held {
    absl::Status status;              // why it ended: OK when stopped
    std::optional<BoardLease> lease;  // none: never acquired (`status` says why)
    bool released = false;            // released here at its end
    nlohmann::json transcript;        // of a released lease, if kept
  };
  Held Hold(const Caller& caller, const LeaseRequest& req, CancelToken& stop,
            const std::function<void(const BoardLease&)>& acquired);
  // Leases the principal holds, through this node, on any board.
  int HeldBy(const std::string& identity) const;
  // The serial transcript of a lease just released here (see
  // HardwareBroker::TakeTranscript); null if none.
  nlohmann::json TakeTranscript(const std::string& lease_id);

 private:
  bool IsLocal(const std::string& board, const std::vector<std::string>& tags) const;
  absl::StatusOr<BoardLease> AcquireLocal(const Caller& caller, const LeaseRequest& req,
                                          const std::function<bool()>& cancelled);
  absl::StatusOr<BoardLease> AcquireLocalInLabQueue(const Caller& caller, const LeaseRequest& req,
                                                    const std::function<bool()>& cancelled);
  BoardLease FromLocal(const LeaseRecord& l) const;
  // A lease of this node's board ended here: its claim in the lab goes too
  // (failing that, it lapses with its TTL).
  void DropLabClaim(const LeaseRecord& l);

  HardwareBroker& broker_;
  const HardwareConfig& config_;
  lab::LabLeases* const lab_;
  lab::EtcdClient* const etcd_;
  const std::string node_;
};

}  // namespace fwai
