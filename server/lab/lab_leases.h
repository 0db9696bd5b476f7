// Board leases of the lab, in etcd: `/fwai/leases/BOARD` exists while the
// board is held and is bound to an etcd lease with the board lease's TTL.
// Acquire is one transaction (create if absent), so of any number of racing
// nodes exactly one wins; renew is a keepalive; release deletes the key and
// revokes the etcd lease; a holder that goes away loses the board when the
// TTL runs out, for the whole lab at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/lab/registry.h"

namespace fwai::lab {

class EtcdClient;

inline constexpr char kLeasesPrefix[] = "/fwai/leases/";

struct LabLease {
  std::string lease_id;   // "lab-..." (unique in the lab)
  std::string board, node;  // the board and the bench that owns it
  std::string holder;     // "alice (uid 1000)": shown to others
  std::string identity;   // the principal holding it
  std::string via;        // the node the holder came through
  std::string session_id;
  int64_t acquired_us = 0;
  int64_t expires_us = 0;
  int ttl_s = 0;
  int64_t etcd_lease = 0;
};

std::string LeaseToJson(const LabLease& l);
[[nodiscard]] absl::StatusOr<LabLease> LeaseFromJson(const std::string& text);

// The leases a node took in the lab; thread-safe.
class LabLeases {
 public:
  LabLeases(EtcdClient& etcd, std::string node);

  struct Request {
    std::string board;              // this board, or
    std::vector<std::string> tags;  // any board with all these tags ("key" or "key:value")
    std::string holder, identity, session_id;
    int ttl_s = 900;
    int wait_s = 0;  // 0: fail at once when every match is held
  };
  // FAILED_PRECONDITION naming the holder when held (and not waiting);
  // NOT_FOUND when no board of the lab matches; UNAVAILABLE (naming the
  // endpoints) when etcd cannot decide.
  [[nodiscard]] absl::StatusOr<LabLease> Acquire(const Request& req, const std::function<bool()>& cancelled);
  // A lease this node gave on one of its own boards (`l.lease_id` is its
  // local id) is claimed in the lab too, so no other node hands the board
  // out meanwhile. FAILED_PRECONDITION naming the holder if another node's
  // lease holds it.
  [[nodiscard]] absl::Status Claim(LabLease l);
  // Only the holder (`identity`) or an admin.
  [[nodiscard]] absl::StatusOr<LabLease> Renew(const std::string& lease_id, const std::string& identity, bool admin);
  // By lease id or board. Only the holder, or an admin with `force`.
  [[nodiscard]] absl::StatusOr<LabLease> Release(const std::string& lease_id, const std::string& board,
                                                 const std::string& identity, bool force, bool admin);
  // Every lease of the lab now.
  [[nodiscard]] absl::StatusOr<std::vector<LabLease>> All();
  // The lease on `board`, if any (read from etcd).
  [[nodiscard]] absl::StatusOr<std::optional<LabLease>> Holder(const std::string& board);
  // Leases this node took (for its own callers).
  std::vector<LabLease> Mine() const;

 private:
  absl::StatusOr<std::optional<LabLease>> TryTake(const LabBoard& b, const Request& req, std::string* held_by,
                                                  const std::string& lease_id = "");

  EtcdClient& etcd_;
  const std::string node_;
  mutable std::mutex mu_;
  std::map<std::string, LabLease> mine_;  // lease id -> lease
};

}  // namespace fwai::lab
