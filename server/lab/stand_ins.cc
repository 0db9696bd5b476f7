#include "server/lab/stand_ins.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "server/lab/etcd_client.h"
#include "server/lab/lab_leases.h"

namespace fwai::lab {

LabStandIns::LabStandIns(HardwareBroker& broker, LabLeases& leases, EtcdClient& etcd,
                         std::string node, int max_ttl_s)
    : broker_(broker), leases_(leases), etcd_(etcd), node_(std::move(node)), max_ttl_s_(max_ttl_s) {
  thread_ = std::thread([this] { Run(); });
}

LabStandIns::~LabStandIns() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<Caller> LabStandIns::Admit(const std::string& node, const std::string& board,
                                          const std::string& lease_id, const std::string& peer) {
  if (board.empty() || lease_id.empty()) {
    return absl::InvalidArgumentError("device_id and lease_id (the lab lease) are required");
  }
  bool here = false;
  for (const auto& d : broker_.List()) here = here || d.id == board;
  if (!here) return absl::NotFoundError(absl::StrCat("no board ", board, " on node ", node_));
  auto holder = leases_.Holder(board);
  if (!holder.ok()) return holder.status();
  const auto refused = [&] {
    return absl::PermissionDeniedError(absl::StrCat("node ", node, " holds no lab lease ", lease_id,
                                                    " on board ", board,
                                                    " (rule: a valid lab lease)"));
  };
  if (!holder->has_value() || (*holder)->lease_id != lease_id || (*holder)->via != node) {
    return refused();
  }
  const LabLease& l = **holder;
  // How long etcd still gives the lab lease: the stand-in lasts that long.
  auto left = etcd_.LeaseTimeToLive(l.etcd_lease);
  if (absl::IsNotFound(left.status()) || (left.ok() && *left <= 0)) return refused();
  if (!left.ok()) return left.status();
  const int64_t confirmed_us = NowMicros();
  MutexLock lock(&mu_);
  if (auto it = mirrors_.find(lease_id); it != mirrors_.end()) {
    if (broker_
            .SetLeaseExpiry(it->second.caller.lease_id, Until(confirmed_us, *left),
                            ExpiryReason(it->second, confirmed_us))
            .ok()) {
      return it->second.caller;
    }
    mirrors_.erase(it);  // its stand-in ran out meanwhile: a new one
  }
  // A mirror of an earlier lab lease on this board that has ended.
  for (auto it = mirrors_.begin(); it != mirrors_.end();) {
    if (it->second.board == board) {
      (void)broker_.Release(it->second.caller, it->second.caller.lease_id, "", false);
      it = mirrors_.erase(it);
    } else {
      ++it;
    }
  }
  Mirror m;
  m.board = board;
  m.lab_lease_id = lease_id;
  m.node = node;
  m.holder = l.holder;
  m.ttl_s = l.ttl_s;
  m.caller.identity = "lab:" + lease_id;
  m.caller.user = "node:" + node;
  m.caller.display = absl::StrCat(l.holder, " via ", node);
  m.caller.peer = peer;
  m.caller.session_id = "";
  // The image arrives as bytes this daemon writes: it reads them as itself.
  auto self = LookupAccount(static_cast<uint32_t>(getuid()));
  if (self.ok()) m.caller.account = *self;
  const int ttl = std::max(2, std::min(l.ttl_s, MaxTtl(l.ttl_s)));
  auto local = broker_.Acquire(m.caller, board, {}, ttl, 0, nullptr);
  if (!local.ok()) return local.status();
  m.caller.lease_id = local->lease_id;
  if (auto s = broker_.SetLeaseExpiry(local->lease_id, Until(confirmed_us, *left),
                                      ExpiryReason(m, confirmed_us));
      !s.ok()) {
    (void)broker_.Release(m.caller, local->lease_id, "", false);
    return s;
  }
  spdlog::info("lab: lease {} of node {} on {} is local lease {}", lease_id, node, board,
               local->lease_id);
  mirrors_[lease_id] = m;
  return m.caller;
}

int64_t LabStandIns::Until(int64_t confirmed_us, int64_t left_s) const {
  return confirmed_us + std::min<int64_t>(left_s, MaxTtl(static_cast<int>(left_s))) * 1000000;
}

std::string LabStandIns::ExpiryReason(const Mirror& m, int64_t confirmed_us,
                                      const absl::Status& etcd) {
  std::string why = absl::StrCat(
      "lab lease ", m.lab_lease_id, " of ", m.holder, " via ", m.node, " expired: its ", m.ttl_s,
      " s TTL ran out after the last renewal etcd confirmed (", FormatUtc(confirmed_us), ")");
  if (!etcd.ok()) absl::StrAppend(&why, "; etcd unreachable: ", etcd.message());
  return why;
}

void LabStandIns::Run() {
  std::map<std::string, int64_t> confirmed;  // lab lease id -> when etcd last confirmed it
  std::set<std::string> unconfirmed;         // lab lease ids etcd cannot say about now
  MutexLock lock(&mu_);
  while (!stop_) {
    cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(500));
    if (stop_) break;
    auto copy = mirrors_;
    lock.Unlock();
    std::vector<std::string> ended;
    for (const auto& [lease_id, m] : copy) {
      const int64_t now = NowMicros();
      if (!confirmed.count(lease_id)) confirmed[lease_id] = now;
      auto holder = leases_.Holder(m.board);
      absl::Status unreachable;
      if (!holder.ok()) {
        unreachable = holder.status();
      } else if (holder->has_value() && (*holder)->lease_id == lease_id) {
        auto left = etcd_.LeaseTimeToLive((*holder)->etcd_lease);
        if (left.ok() && *left > 0) {
          confirmed[lease_id] = now;
          unconfirmed.erase(lease_id);
          if (broker_.SetLeaseExpiry(m.caller.lease_id, Until(now, *left), ExpiryReason(m, now))
                  .ok()) {
            continue;
          }
        } else if (!left.ok() && !absl::IsNotFound(left.status())) {
          unreachable = left.status();
        }
      }
      if (!unreachable.ok()) {
        // etcd cannot say: the stand-in runs out on what it last confirmed.
        if (unconfirmed.insert(lease_id).second) {
          spdlog::warn(
              "lab: etcd cannot say whether lab lease {} still holds {} ({}); its stand-in, "
              "local lease {}, runs out on the TTL etcd last confirmed ({})",
              lease_id, m.board, std::string(unreachable.message()), m.caller.lease_id,
              FormatUtc(confirmed[lease_id]));
        }
        if (broker_
                .SetLeaseExpiry(m.caller.lease_id, std::nullopt,
                                ExpiryReason(m, confirmed[lease_id], unreachable))
                .ok()) {
          continue;
        }
      }
      (void)broker_.Release(m.caller, m.caller.lease_id, "", false);
      spdlog::info("lab: lease {} on {} ended in the lab; local lease {} released", lease_id,
                   m.board, m.caller.lease_id);
      ended.push_back(lease_id);
    }
    for (const auto& id : ended) {
      confirmed.erase(id);
      unconfirmed.erase(id);
    }
    lock.Lock();
    for (const auto& id : ended) mirrors_.erase(id);
  }
}

}  // namespace fwai::lab
