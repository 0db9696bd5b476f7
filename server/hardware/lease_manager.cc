#include "server/hardware/lease_manager.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/ids.h"
#include "server/storage/storage.h"

namespace fwai {

namespace {

constexpr char kPrefix[] = "lease/";

nlohmann::json ToJson(const LeaseRecord& l) {
  return {{"lease_id", l.lease_id},
          {"device_id", l.device_id},
          {"holder", l.holder},
          {"uid", l.uid},
          {"identity", l.identity},
          {"session_id", l.session_id},
          {"token_id", l.token_id},
          {"acquired_us", l.acquired_us},
          {"expires_us", l.expires_us},
          {"ttl_s", l.ttl_s},
          {"held_elsewhere", l.held_elsewhere},
          {"expiry_reason", l.expiry_reason}};
}

LeaseRecord FromJson(const nlohmann::json& j) {
  LeaseRecord l;
  l.lease_id = j.value("lease_id", "");
  l.device_id = j.value("device_id", "");
  l.holder = j.value("holder", "");
  l.uid = j.value("uid", int64_t{-1});
  l.identity = j.value("identity", "");
  l.session_id = j.value("session_id", "");
  l.token_id = j.value("token_id", "");
  l.acquired_us = j.value("acquired_us", int64_t{0});
  l.expires_us = j.value("expires_us", int64_t{0});
  l.ttl_s = j.value("ttl_s", 0);
  l.held_elsewhere = j.value("held_elsewhere", false);
  l.expiry_reason = j.value("expiry_reason", "");
  return l;
}

// Why a lease that ran out ended.
std::string ExpiryReason(const LeaseRecord& l) {
  return l.expiry_reason.empty() ? absl::StrCat("its ", l.ttl_s, " s TTL ran out without a renewal")
                                 : l.expiry_reason;
}

}  // namespace

std::string DescribeHeld(const LeaseRecord& l) {
  return absl::StrCat(l.device_id, " is held by ", l.holder, " since ",
                      FormatLocalTime(l.acquired_us), " (lease ", l.lease_id, ", expires ",
                      FormatLocalTime(l.expires_us), ")");
}

LeaseManager::LeaseManager(Storage& storage,
                           std::function<void(const LeaseRecord&, const std::string&)> on_end,
                           const Clock* clock)
    : storage_(storage),
      on_end_(std::move(on_end)),
      clock_(clock != nullptr ? *clock : SystemClock()) {}

LeaseManager::~LeaseManager() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (sweeper_.joinable()) sweeper_.join();
}

absl::Status LeaseManager::Start() {
  const int64_t now = clock_.NowMicros();
  std::vector<std::string> expired;
  std::vector<LeaseRecord> loaded;  // into by_device_ under mu_ once scanned
  auto s = storage_.Scan(Cf::kLeases, kPrefix, "lease0",
                         [&](std::string_view key, std::string_view value) {
                           auto j = nlohmann::json::parse(value, nullptr, false);
                           if (j.is_discarded()) {
                             expired.emplace_back(key);
                             return true;
                           }
                           LeaseRecord l = FromJson(j);
                           if (l.expires_us <= now) {
                             expired.emplace_back(key);
                           } else {
                             loaded.push_back(std::move(l));
                           }
                           return true;
                         });
  {
    MutexLock lock(&mu_);
    for (auto& l : loaded) by_device_[l.device_id] = std::move(l);
  }
  if (!s.ok()) return s;
  for (const auto& k : expired) {
    if (auto d = storage_.Delete(Cf::kLeases, k, true); !d.ok()) return d;
  }
  sweeper_ = std::thread([this] { Sweep(); });
  return absl::OkStatus();
}

absl::Status LeaseManager::Persist(const LeaseRecord& l) {
  return storage_.Put(Cf::kLeases, kPrefix + l.device_id, ToJson(l).dump(), /*sync=*/true);
}

void LeaseManager::Erase(const std::string& device_id) {
  (void)storage_.Delete(Cf::kLeases, kPrefix + device_id, /*sync=*/true);
}

void LeaseManager::End(const LeaseRecord& l, const std::string& reason) {
  if (on_end_) on_end_(l, reason);
}

bool LeaseManager::WantedEarlier(const std::string& device_id, uint64_t ticket) const {
  for (const auto& q : queue_) {
    if (ticket != 0 && q.ticket >= ticket) break;
    if (std::find(q.w.candidates.begin(), q.w.candidates.end(), device_id) != q.w.candidates.end())
      return true;
  }
  return false;
}

absl::StatusOr<LeaseRecord> LeaseManager::Acquire(
    const std::vector<std::string>& candidates, const LeaseRecord& who, int ttl_s, int wait_ms,
    const std::function<absl::Status(const std::string&)>& available,
    const std::function<bool()>& cancelled, const std::string& wants) {
  if (candidates.empty()) return absl::NotFoundError("no device matches");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  MutexLock lock(&mu_);
  uint64_t ticket = 0;  // 0: not queued (yet)
  // Leaving for any reason takes us out of the queue, and lets the next one look.
  struct Leave {
    LeaseManager* m;
    uint64_t* ticket;
    ~Leave() {
      m->mu_.AssertHeld();  // destroyed before `lock`, declared earlier
      if (*ticket == 0) return;
      std::erase_if(m->queue_, [t = *ticket](const Queued& q) { return q.ticket == t; });
      m->cv_.SignalAll();
    }
  } leave{this, &ticket};
  while (true) {
    absl::Status last_unavailable;
    std::optional<LeaseRecord> held_by;
    bool queued_before = false;
    for (const auto& id : candidates) {
      auto it = by_device_.find(id);
      if (it != by_device_.end()) {
        if (it->second.identity == who.identity && it->second.session_id == who.session_id) {
          // Already ours: acquiring again renews it.
          it->second.ttl_s = ttl_s;
          it->second.expires_us = clock_.NowMicros() + int64_t{ttl_s} * 1000000;
          if (auto s = Persist(it->second); !s.ok()) return s;
          LeaseRecord again = it->second;
          again.renewed = true;
          return again;
        }
        if (!held_by) held_by = it->second;
        continue;
      }
      if (absl::Status a = available(id); !a.ok()) {
        last_unavailable = a;
        continue;
      }
      // Free, but someone who came first wants it: theirs.
      if (WantedEarlier(id, ticket)) {
        queued_before = true;
        continue;
      }
      LeaseRecord l = who;
      l.lease_id = who.lease_id.empty() ? NewId("lease") : who.lease_id;
      l.device_id = id;
      l.acquired_us = clock_.NowMicros();
      l.ttl_s = ttl_s;
      l.expires_us = l.acquired_us + int64_t{ttl_s} * 1000000;
      if (auto s = Persist(l); !s.ok()) return s;
      by_device_[id] = l;
      return l;
    }
    if (!held_by && !queued_before) {
      return last_unavailable.ok() ? absl::NotFoundError("no device matches") : last_unavailable;
    }
    if (stopping_ || std::chrono::steady_clock::now() >= deadline || (cancelled && cancelled())) {
      int ahead = 0;
      for (const auto& q : queue_) {
        if (ticket != 0 && q.ticket >= ticket) break;
        for (const auto& id : candidates) {
          if (std::find(q.w.candidates.begin(), q.w.candidates.end(), id) != q.w.candidates.end()) {
            ++ahead;
            break;
          }
        }
      }
      std::string why = held_by ? DescribeHeld(*held_by)
                                : absl::StrCat(absl::StrJoin(candidates, ", "), " is free");
      if (ahead > 0)
        absl::StrAppend(&why, "; ", ahead, ahead == 1 ? " caller waits" : " callers wait",
                        " before you (fwai hw who)");
      return absl::FailedPreconditionError(
          absl::StrCat(why, wait_ms > 0 ? "; still held after waiting"
                                        : "; use --wait SECONDS to queue for it"));
    }
    if (ticket == 0) {
      ticket = next_ticket_++;
      Queued q{ticket, {}};
      q.w.holder = who.holder;
      q.w.identity = who.identity;
      q.w.session_id = who.session_id;
      q.w.wants = wants.empty() ? absl::StrJoin(candidates, ", ") : wants;
      q.w.candidates = candidates;
      q.w.since_us = clock_.NowMicros();
      q.w.until_us = q.w.since_us + int64_t{wait_ms} * 1000;
      queue_.push_back(std::move(q));
    }
    cv_.WaitWithDeadline(&mu_, std::min(deadline, std::chrono::steady_clock::now() +
                                                      std::chrono::milliseconds(200)));
  }
}

std::vector<LeaseWaiter> LeaseManager::Waiters() const {
  MutexLock lock(&mu_);
  std::vector<LeaseWaiter> out;
  for (size_t i = 0; i < queue_.size(); ++i) {
    LeaseWaiter w = queue_[i].w;
    w.position = 1;
    for (size_t j = 0; j < i; ++j) {
      for (const auto& id : w.candidates) {
        const auto& c = queue_[j].w.candidates;
        if (std::find(c.begin(), c.end(), id) != c.end()) {
          ++w.position;
          break;
        }
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

absl::StatusOr<LeaseRecord> LeaseManager::Renew(const std::string& lease_id,
                                                const std::string& identity, bool admin) {
  MutexLock lock(&mu_);
  for (auto& [id, l] : by_device_) {
    if (l.lease_id != lease_id) continue;
    if (l.identity != identity && !admin) {
      return absl::PermissionDeniedError(
          absl::StrCat("lease ", lease_id, " belongs to ", l.holder,
                       "; only its holder (or an admin) renews it (rule: the lease's holder)"));
    }
    if (l.held_elsewhere) return l;  // its owner's renewals come through SetExpiry
    l.expires_us = clock_.NowMicros() + int64_t{l.ttl_s} * 1000000;
    if (auto s = Persist(l); !s.ok()) return s;
    return l;
  }
  return absl::NotFoundError(
      absl::StrCat("lease ", lease_id, ": no such lease (expired or released)"));
}

void LeaseManager::Touch(const std::string& device_id, const std::string& identity) {
  MutexLock lock(&mu_);
  auto it = by_device_.find(device_id);
  if (it == by_device_.end() || it->second.identity != identity) return;
  // A lease granted elsewhere lasts what its owner confirmed, however busy it is.
  if (it->second.held_elsewhere) return;
  it->second.expires_us = clock_.NowMicros() + int64_t{it->second.ttl_s} * 1000000;
  (void)Persist(it->second);
}

absl::Status LeaseManager::SetExpiry(const std::string& lease_id, std::optional<int64_t> expires_us,
                                     const std::string& reason) {
  MutexLock lock(&mu_);
  for (auto& [id, l] : by_device_) {
    if (l.lease_id != lease_id) continue;
    l.held_elsewhere = true;
    if (expires_us) l.expires_us = *expires_us;
    if (!reason.empty()) l.expiry_reason = reason;
    cv_.SignalAll();  // the sweeper looks again (an earlier end)
    return Persist(l);
  }
  return absl::NotFoundError(
      absl::StrCat("lease ", lease_id, ": no such lease (expired or released)"));
}

absl::StatusOr<LeaseRecord> LeaseManager::Release(const std::string& lease_id,
                                                  const std::string& device_id,
                                                  const std::string& identity, bool force,
                                                  bool admin) {
  LeaseRecord ended;
  {
    MutexLock lock(&mu_);
    auto it = by_device_.end();
    if (!lease_id.empty()) {
      for (auto i = by_device_.begin(); i != by_device_.end(); ++i) {
        if (i->second.lease_id == lease_id) it = i;
      }
      if (it == by_device_.end()) {
        return absl::NotFoundError(
            absl::StrCat("lease ", lease_id, ": no such lease (expired or released)"));
      }
    } else {
      it = by_device_.find(device_id);
      if (it == by_device_.end())
        return absl::NotFoundError(absl::StrCat(device_id, " is not leased"));
    }
    if (it->second.identity != identity) {
      if (!force) {
        return absl::PermissionDeniedError(
            absl::StrCat(DescribeHeld(it->second), admin ? "; use --force to take it away" : ""));
      }
      if (!admin) {
        return absl::PermissionDeniedError(
            "only root or the daemon's user may force-release another holder's lease");
      }
    }
    ended = it->second;
    Erase(it->first);
    by_device_.erase(it);
    cv_.SignalAll();
  }
  End(ended, ended.identity == identity ? "released by its holder"
                                        : absl::StrCat("force-released by ", identity));
  return ended;
}

void LeaseManager::ReleaseSession(const std::string& session_id) {
  if (session_id.empty()) return;
  ReleaseIf([&](const LeaseRecord& l) { return l.session_id == session_id; },
            absl::StrCat("session ", session_id, " ended"));
}

std::vector<LeaseRecord> LeaseManager::ReleaseTakenWith(const std::string& token_id,
                                                        const std::string& reason) {
  if (token_id.empty()) return {};
  return ReleaseIf([&](const LeaseRecord& l) { return l.token_id == token_id; }, reason);
}

std::vector<LeaseRecord> LeaseManager::ReleaseIf(
    const std::function<bool(const LeaseRecord&)>& pred, const std::string& reason) {
  std::vector<LeaseRecord> ended;
  {
    MutexLock lock(&mu_);
    for (auto it = by_device_.begin(); it != by_device_.end();) {
      if (pred(it->second)) {
        ended.push_back(it->second);
        Erase(it->first);
        it = by_device_.erase(it);
      } else {
        ++it;
      }
    }
    cv_.SignalAll();
  }
  for (const auto& l : ended) End(l, reason);
  return ended;
}

std::optional<LeaseRecord> LeaseManager::Holder(const std::string& device_id) const {
  MutexLock lock(&mu_);
  auto it = by_device_.find(device_id);
  if (it == by_device_.end()) return std::nullopt;
  return it->second;
}

std::vector<LeaseRecord> LeaseManager::All() const {
  MutexLock lock(&mu_);
  std::vector<LeaseRecord> out;
  for (const auto& [id, l] : by_device_) out.push_back(l);
  return out;
}

absl::Status LeaseManager::CheckHeld(const std::string& device_id, const std::string& identity,
                                     const std::string& lease_id,
                                     const std::string& session_id) const {
  MutexLock lock(&mu_);
  auto it = by_device_.find(device_id);
  if (it == by_device_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(device_id, " is not leased; take it first (fwai hw lease ", device_id, ")"));
  }
  const LeaseRecord& l = it->second;
  // A lease is used by its holder only. Its id and its session say which
  // lease a caller means; neither stands in for who holds it (every lease's id
  // is listed to everyone, and a session's id to all it is shared with).
  // Only fwaid's own work, which names no identity, is let in by them alone.
  if (!identity.empty()) {
    if (l.identity == identity) return absl::OkStatus();
  } else if ((!lease_id.empty() && l.lease_id == lease_id) ||
             (!session_id.empty() && l.session_id == session_id)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(DescribeHeld(l));
}

void LeaseManager::Sweep() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(250));
    if (stopping_) break;
    std::vector<LeaseRecord> expired = TakeExpiredLocked();
    if (expired.empty()) continue;
    lock.Unlock();
    for (const auto& l : expired) End(l, ExpiryReason(l));
    lock.Lock();
  }
}

std::vector<LeaseRecord> LeaseManager::TakeExpiredLocked() {
  const int64_t now = clock_.NowMicros();
  std::vector<LeaseRecord> expired;
  for (auto it = by_device_.begin(); it != by_device_.end();) {
    if (it->second.expires_us <= now) {
      expired.push_back(it->second);
      Erase(it->first);
      it = by_device_.erase(it);
    } else {
      ++it;
    }
  }
  if (!expired.empty()) cv_.SignalAll();
  return expired;
}

int LeaseManager::ExpireDue() {
  std::vector<LeaseRecord> expired;
  {
    MutexLock lock(&mu_);
    expired = TakeExpiredLocked();
  }
  for (const auto& l : expired) End(l, ExpiryReason(l));
  return static_cast<int>(expired.size());
}

}  // namespace fwai
