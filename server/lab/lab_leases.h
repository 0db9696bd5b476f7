// Board leases of the lab, in etcd: `/fwai/leases/BOARD` exists while the
// board is held and is bound to an etcd lease with the board lease's TTL.
// Acquire is one transaction (create if absent), so of any number of racing
// nodes exactly one wins; renew is a keepalive; release deletes the key and
// revokes the etcd lease; a holder that goes away loses the board when the
// TTL runs out, for the whole lab at once.
//
// Waiting is a fair queue of the whole lab: a caller that waits puts
// `/fwai/queue/QUEUE/WAITER` (QUEUE: "board:ID" or "tags:T1,T2"), bound to
// an etcd lease of its own that its node keeps alive while it waits (a node
// that dies leaves the queue within that TTL). Waiters are ordered by band
// (interactive before CI when `interactive_first`), then by the etcd
// revision that created their key. A free board goes only to the first
// waiter whose request it answers, in a transaction that checks the board
// is still free and that the queue has not changed since it was read.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/lab/registry.h"

namespace fwai::lab {

class EtcdClient;
class EtcdWatch;

inline constexpr char kLeasesPrefix[] = "/fwai/leases/";
inline constexpr char kQueuePrefix[] = "/fwai/queue/";
// Lab leases' ids start so (a bench's local leases' do not).
inline constexpr char kLabLeaseIdPrefix[] = "lab-";
inline bool IsLabLeaseId(const std::string& id) { return id.rfind(kLabLeaseIdPrefix, 0) == 0; }

struct LabLease {
  std::string lease_id;     // "lab-..." (unique in the lab)
  std::string board, node;  // the board and the bench that owns it
  std::string holder;       // "alice (uid 1000)": shown to others
  std::string identity;     // the principal holding it
  std::string via;          // the node the holder came through
  std::string session_id;
  std::string token_id;  // the token it was taken with at `via` (ended when revoked there)
  int64_t acquired_us = 0;
  int64_t expires_us = 0;
  int ttl_s = 0;
  int64_t etcd_lease = 0;
};

std::string LeaseToJson(const LabLease& l);
[[nodiscard]] absl::StatusOr<LabLease> LeaseFromJson(const std::string& text);

// Someone waiting in the lab's queue.
struct LabWaiter {
  std::string key;                // its queue key
  std::string board;              // the board it wants, or
  std::vector<std::string> tags;  // any board with these tags
  std::string node;               // set: only boards of this bench
  std::string wants;              // "b1" or "tags stm32f1, bench:x"
  std::string holder, identity, session_id;
  std::string via;  // the node it waits through
  bool ci = false;  // in the CI band
  int64_t since_us = 0, until_us = 0;
  int64_t create_revision = 0;
  // Filled by Queue(): the boards of the lab that would do, and 1 + how many
  // waiters before it want any of them.
  std::vector<std::string> candidates;
  int position = 0;
};

std::string WaiterToJson(const LabWaiter& w);
[[nodiscard]] absl::StatusOr<LabWaiter> WaiterFromJson(const std::string& text);
// True when board `b` answers waiter `w`'s request.
bool Wants(const LabWaiter& w, const LabBoard& b);

struct LabLeasesOptions {
  int queue_ttl_s = 10;           // a waiter whose node stops renewing leaves the queue after this
  bool interactive_first = true;  // the interactive band is served before the CI band
};

// The leases a node took in the lab; thread-safe.
class LabLeases {
 public:
  LabLeases(EtcdClient& etcd, std::string node, LabLeasesOptions options = {});
  ~LabLeases();

  // Watches the lab's nodes: a lease this node took on a board of a bench
  // that leaves the lab (its node key is gone: stopped, killed, cut off past
  // its TTL) ends at once; its holder hears "bench NODE left the lab".
  void Start();

  struct Request {
    std::string board;              // this board, or
    std::vector<std::string> tags;  // any board with all these tags ("key" or "key:value")
    std::string node;               // set: only boards of this bench
    std::string lease_id;           // set: the lease's id (a bench's local lease to be)
    std::string holder, identity, session_id;
    std::string token_id;  // the token the caller came with, if any
    int ttl_s = 900;
    int wait_s = 0;   // 0: fail at once when every match is held
    bool ci = false;  // queued in the CI band (a principal with role ci)
  };
  // FAILED_PRECONDITION naming the holder when held (and not waiting);
  // NOT_FOUND when no board of the lab matches; UNAVAILABLE (naming the
  // endpoints) when etcd cannot decide.
  [[nodiscard]] absl::StatusOr<LabLease> Acquire(const Request& req,
                                                 const std::function<bool()>& cancelled);
  // A lease this node gave on one of its own boards (`l.lease_id` is its
  // local id) is claimed in the lab too, so no other node hands the board
  // out meanwhile. FAILED_PRECONDITION naming the holder if another node's
  // lease holds it.
  [[nodiscard]] absl::Status Claim(LabLease l);
  // Only the holder (`identity`) or an admin.
  [[nodiscard]] absl::StatusOr<LabLease> Renew(const std::string& lease_id,
                                               const std::string& identity, bool admin);
  // By lease id or board. Only the holder, or an admin with `force`.
  [[nodiscard]] absl::StatusOr<LabLease> Release(const std::string& lease_id,
                                                 const std::string& board,
                                                 const std::string& identity, bool force,
                                                 bool admin);
  // Every lease of the lab now. `exact_expiry`: ask etcd when each lapses
  // (one call per lease); otherwise at least acquired + ttl.
  [[nodiscard]] absl::StatusOr<std::vector<LabLease>> All(bool exact_expiry = false);
  // The lab's queue, in the order it is served, with positions.
  [[nodiscard]] absl::StatusOr<std::vector<LabWaiter>> Queue();
  // The lease on `board`, if any (read from etcd).
  [[nodiscard]] absl::StatusOr<std::optional<LabLease>> Holder(const std::string& board);
  // Leases this node took (for its own callers), including those an
  // earlier run of this node took (killed, restarted): they are read back
  // from etcd once it answers, and stay their holders' until released or
  // expired.
  std::vector<LabLease> Mine();
  // Why lease `lease_id` of `identity`, taken through this node, ended when
  // not by its holder (its bench left the lab); nullopt when it did not, is
  // unknown here, or is another identity's.
  std::optional<std::string> Ended(const std::string& lease_id, const std::string& identity);

 private:
  struct Queued;  // this caller's place in the queue, if it waits
  // Takes `b` if it is free and no waiter before `me` (every waiter when
  // `me` is null) wants it: one transaction that also checks the queue is
  // as read at `queue_revision`. nullopt with `held_by` set when it cannot.
  absl::StatusOr<std::optional<LabLease>> TryTake(const LabBoard& b, const Request& req,
                                                  std::string* held_by, const std::string& lease_id,
                                                  const std::vector<LabWaiter>& queue,
                                                  int64_t queue_revision, const Queued* me,
                                                  bool* raced);
  absl::StatusOr<std::pair<std::vector<LabWaiter>, int64_t>> ReadQueue();
  // Serving order: band, then the revision that created the key.
  bool Before(const LabWaiter& a, const LabWaiter& b) const;
  void NodeLeft(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads back the leases taken through this node by an earlier run of it;
  // until etcd answers, tried again at each use (once a second at most).
  void Recover() ABSL_LOCKS_EXCLUDED(mu_);

  EtcdClient& etcd_;
  const std::string node_;
  const LabLeasesOptions options_;
  mutable Mutex mu_;
  std::map<std::string, LabLease> mine_ ABSL_GUARDED_BY(mu_);  // lease id -> lease
  bool recovered_ ABSL_GUARDED_BY(mu_) = false;                // Recover() has read etcd
  std::chrono::steady_clock::time_point next_recovery_ ABSL_GUARDED_BY(mu_);
  // Why a lease ended when not by its holder (the answer a later renewal
  // gives), for the last kEndedKept such leases: oldest dropped first.
  static constexpr size_t kEndedKept = 1024;
  struct EndedLease {
    std::string why, identity;
  };
  std::map<std::string, EndedLease> ended_ ABSL_GUARDED_BY(mu_);  // lease id -> why and whose
  std::deque<std::string> ended_order_ ABSL_GUARDED_BY(mu_);      // the ids in ended_, oldest first
  std::unique_ptr<EtcdWatch> nodes_watch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai::lab
