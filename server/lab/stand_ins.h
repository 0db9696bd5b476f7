// LabStandIns: on a bench, the local leases standing for the lab leases
// other nodes took on its boards — one per lab lease, taken when the node
// first works on the board and ended as soon as the lab lease is gone from
// etcd (released, expired, kicked), which ends its serial streams and debug
// session as a local lease's end does. A stand-in lasts exactly what etcd
// last confirmed of its lab lease (the lease's time to live, read every
// half second): work on the board does not extend it, so while etcd cannot
// be reached it ends when the lab lease's TTL, counted from its last
// confirmed renewal, runs out.
//
// Thread-safe; a thread of its own follows etcd.
#pragma once

#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/hardware/broker.h"

namespace fwai::lab {

class EtcdClient;
class LabLeases;

class LabStandIns {
 public:
  // `node` is this bench; a stand-in's TTL is at most `max_ttl_s`.
  LabStandIns(HardwareBroker& broker, LabLeases& leases, EtcdClient& etcd, std::string node,
              int max_ttl_s);
  ~LabStandIns();

  // The caller that works on `board` for node `node` under lab lease
  // `lease_id` (its stand-in's lease): PERMISSION_DENIED unless that node
  // holds that lease now.
  [[nodiscard]] absl::StatusOr<Caller> Admit(const std::string& node, const std::string& board,
                                             const std::string& lease_id, const std::string& peer);

 private:
  struct Mirror {
    std::string board, lab_lease_id, node, holder;
    int ttl_s = 0;
    Caller caller;
  };

  int MaxTtl(int ttl_s) const { return max_ttl_s_ > 0 ? max_ttl_s_ : ttl_s; }
  // The stand-in's end: what etcd said was left of the lab lease at `confirmed_us`.
  int64_t Until(int64_t confirmed_us, int64_t left_s) const;
  // Why the stand-in ends if nothing confirms the lab lease again.
  static std::string ExpiryReason(const Mirror& m, int64_t confirmed_us,
                                  const absl::Status& etcd = absl::OkStatus());
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  HardwareBroker& broker_;
  LabLeases& leases_;
  EtcdClient& etcd_;
  const std::string node_;
  const int max_ttl_s_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Mirror> mirrors_ ABSL_GUARDED_BY(mu_);  // lab lease id -> its stand-in
  std::thread thread_;
};

}  // namespace fwai::lab
