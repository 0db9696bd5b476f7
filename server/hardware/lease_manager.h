// Leases: one holder per device, with a TTL renewed by keepalive. Written to
// RocksDB with sync so they survive a daemon restart; expired ones are
// cleaned on start and by a sweeper while running.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace fwai {

class Clock;
class Storage;

struct LeaseRecord {
  std::string lease_id;
  std::string device_id;
  std::string holder;      // "alice (uid 1000)"; shown to others
  int64_t uid = -1;        // -1: not a local user (tcp)
  std::string identity;    // "uid:N" or "tcp:..."
  std::string session_id;  // set: released when that session goes away
  std::string token_id;    // set: released when that token is revoked
  int64_t acquired_us = 0;
  int64_t expires_us = 0;
  int ttl_s = 0;
  bool renewed = false;  // Acquire found it already held by the same holder (not persisted)
  // Stands for a lease granted elsewhere (a lab lease in etcd): its expiry
  // is set only by SetExpiry, from what that lease's owner confirmed; use
  // (Touch) and Renew do not extend it.
  bool held_elsewhere = false;
  std::string expiry_reason;  // why it ended, when it runs out ("" : the TTL's own words)
};

// Someone queued in Acquire for a board (or any board of a tag set).
struct LeaseWaiter {
  std::string holder;  // as LeaseRecord::holder
  std::string identity;
  std::string session_id;
  std::string wants;  // what was asked: a board id or "tags a, b"
  std::vector<std::string> candidates;
  int position = 0;  // 1: next; counts the earlier waiters for any of the same boards
  int64_t since_us = 0;
  int64_t until_us = 0;  // when it stops waiting
};

class LeaseManager {
 public:
  // `on_end(lease, reason)` runs after a lease ends for any reason. Times
  // (acquired, expires, the TTL running out) are `clock`'s (null: the
  // system's); waiting in Acquire is real time.
  LeaseManager(Storage& storage, std::function<void(const LeaseRecord&, const std::string&)> on_end,
               const Clock* clock = nullptr);
  ~LeaseManager();

  // Loads persisted leases, dropping expired ones; starts the sweeper.
  [[nodiscard]] absl::Status Start();

  // Takes the first free device of `candidates` for which `available` says
  // OK. Waits up to `wait_ms` (0: fail at once) while all are held, in a
  // first-come first-served queue: a free device goes to the earliest waiter
  // that wants it, and nobody takes one an earlier waiter wants. `cancelled`
  // is polled while waiting; a cancelled waiter leaves the queue. `wants`
  // describes the request for Waiters() ("sim-1", "tags stm32").
  [[nodiscard]] absl::StatusOr<LeaseRecord> Acquire(
      const std::vector<std::string>& candidates, const LeaseRecord& who, int ttl_s, int wait_ms,
      const std::function<absl::Status(const std::string&)>& available,
      const std::function<bool()>& cancelled, const std::string& wants = "");
  // The queue, earliest first.
  std::vector<LeaseWaiter> Waiters() const;
  [[nodiscard]] absl::StatusOr<LeaseRecord> Renew(const std::string& lease_id,
                                                  const std::string& identity, bool admin);
  // Extends the lease on `device_id` held by `identity`, if any (use = keepalive);
  // not a lease held elsewhere.
  void Touch(const std::string& device_id, const std::string& identity);
  // Makes `lease_id` a lease held elsewhere: it ends at `expires_us` (when
  // set; unchanged otherwise) unless set again, saying `reason` (when not
  // empty) as why. NOT_FOUND when it has ended.
  [[nodiscard]] absl::Status SetExpiry(const std::string& lease_id,
                                       std::optional<int64_t> expires_us,
                                       const std::string& reason);
  // By lease id or device id. Only the holder, or an admin with `force`.
  [[nodiscard]] absl::StatusOr<LeaseRecord> Release(const std::string& lease_id,
                                                    const std::string& device_id,
                                                    const std::string& identity, bool force,
                                                    bool admin);
  // Ends every lease bound to `session_id`.
  void ReleaseSession(const std::string& session_id);
  // Ends every lease taken with token `token_id`, saying `reason`; the
  // leases that ended.
  std::vector<LeaseRecord> ReleaseTakenWith(const std::string& token_id, const std::string& reason);

  // Ends the leases whose time has run out now (the sweeper does this
  // every 250 ms); how many ended.
  int ExpireDue();

  std::optional<LeaseRecord> Holder(const std::string& device_id) const;
  std::vector<LeaseRecord> All() const;
  // OK if `identity` holds `device_id` (fwaid's own work, which names no
  // identity: if `lease_id` or `session_id` is the lease's); otherwise
  // FAILED_PRECONDITION naming the holder and since when. Another identity is
  // refused whatever lease id or session it names.
  [[nodiscard]] absl::Status CheckHeld(const std::string& device_id, const std::string& identity,
                                       const std::string& lease_id,
                                       const std::string& session_id = "") const;

 private:
  absl::Status Persist(const LeaseRecord& l);
  void Erase(const std::string& device_id);
  void End(const LeaseRecord& l, const std::string& reason);
  void Sweep();
  // Ends every lease `pred` picks, saying `reason`.
  std::vector<LeaseRecord> ReleaseIf(const std::function<bool(const LeaseRecord&)>& pred,
                                     const std::string& reason);

  // The leases past their expiry, taken out (under mu_); ended by the caller.
  std::vector<LeaseRecord> TakeExpiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Storage& storage_;
  const std::function<void(const LeaseRecord&, const std::string&)> on_end_;
  const Clock& clock_;
  mutable Mutex mu_;
  CondVar cv_;  // a lease ended
  std::map<std::string, LeaseRecord> by_device_ ABSL_GUARDED_BY(mu_);
  struct Queued {
    uint64_t ticket;
    LeaseWaiter w;
  };
  std::vector<Queued> queue_ ABSL_GUARDED_BY(mu_);  // by ticket
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // True when a waiter queued before `ticket` (all waiters when 0) wants `device_id`.
  bool WantedEarlier(const std::string& device_id, uint64_t ticket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;  // started by Start, joined by the destructor
};

std::string DescribeHeld(const LeaseRecord& l);

}  // namespace fwai
