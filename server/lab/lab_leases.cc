#include "server/lab/lab_leases.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/ids.h"
#include "server/lab/etcd_client.h"

namespace fwai::lab {

std::string LeaseToJson(const LabLease& l) {
  return nlohmann::json{{"lease_id", l.lease_id},     {"board", l.board},           {"node", l.node},
                        {"holder", l.holder},         {"identity", l.identity},     {"via", l.via},
                        {"session_id", l.session_id}, {"acquired_us", l.acquired_us}, {"ttl_s", l.ttl_s},
                        {"etcd_lease", l.etcd_lease}}
      .dump();
}

absl::StatusOr<LabLease> LeaseFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("lease_id")) return absl::InvalidArgumentError("not a lease record");
  LabLease l;
  l.lease_id = j.value("lease_id", "");
  l.board = j.value("board", "");
  l.node = j.value("node", "");
  l.holder = j.value("holder", "");
  l.identity = j.value("identity", "");
  l.via = j.value("via", "");
  l.session_id = j.value("session_id", "");
  l.acquired_us = j.value("acquired_us", int64_t{0});
  l.ttl_s = j.value("ttl_s", 0);
  l.etcd_lease = j.value("etcd_lease", int64_t{0});
  return l;
}

LabLeases::LabLeases(EtcdClient& etcd, std::string node) : etcd_(etcd), node_(std::move(node)) {}

absl::StatusOr<std::optional<LabLease>> LabLeases::TryTake(const LabBoard& b, const Request& req, std::string* held_by,
                                                           const std::string& lease_id) {
  LabLease l;
  l.lease_id = lease_id.empty() ? NewId("lab-") : lease_id;
  l.board = b.id;
  l.node = b.node;
  l.holder = req.holder;
  l.identity = req.identity;
  l.via = node_;
  l.session_id = req.session_id;
  l.ttl_s = req.ttl_s;
  auto granted = etcd_.LeaseGrant(req.ttl_s);
  if (!granted.ok()) return granted.status();
  l.etcd_lease = *granted;
  l.acquired_us = NowMicros();
  const std::string value = LeaseToJson(l);
  auto r = etcd_.CreateIfAbsent(kLeasesPrefix + b.id, value, l.etcd_lease);
  if (!r.ok() || !r->created) {
    (void)etcd_.LeaseRevoke(l.etcd_lease);
    if (!r.ok()) return r.status();
    auto held = LeaseFromJson(r->current.value);
    if (held.ok()) {
      // The same holder asking again keeps what it has.
      if (held->identity == req.identity && held->session_id == req.session_id) {
        std::lock_guard lock(mu_);
        if (mine_.count(held->lease_id)) {
          auto ttl = etcd_.LeaseKeepAlive(held->etcd_lease);
          if (ttl.ok()) {
            LabLease out = mine_[held->lease_id];
            out.expires_us = NowMicros() + *ttl * 1000000;
            return std::optional<LabLease>(out);
          }
        }
      }
      *held_by = absl::StrCat("board ", b.id, " (on ", b.node, ") is held by ", held->holder, " since ",
                              FormatUtc(held->acquired_us), " through ", held->via);
    }
    return std::optional<LabLease>();
  }
  l.expires_us = l.acquired_us + int64_t{req.ttl_s} * 1000000;
  std::lock_guard lock(mu_);
  mine_[l.lease_id] = l;
  return std::optional<LabLease>(l);
}

absl::StatusOr<LabLease> LabLeases::Acquire(const Request& req, const std::function<bool()>& cancelled) {
  if (req.ttl_s <= 0) return absl::InvalidArgumentError("ttl must be positive");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(req.wait_s);
  while (true) {
    auto view = ReadLab(etcd_);
    if (!view.ok()) return view.status();
    std::vector<LabBoard> candidates;
    std::vector<std::string> unhealthy;
    for (const auto& b : view->boards) {
      bool match = req.board.empty() ? true : b.id == req.board;
      for (const auto& t : req.tags) match = match && std::find(b.tags.begin(), b.tags.end(), t) != b.tags.end();
      if (!match) continue;
      if (b.health != "good") {
        unhealthy.push_back(absl::StrCat("board ", b.id, " (on ", b.node, ") is ", b.health,
                                         b.health_reason.empty() ? "" : ": " + b.health_reason));
        continue;
      }
      candidates.push_back(b);
    }
    if (candidates.empty()) {
      if (!unhealthy.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(absl::StrJoin(unhealthy, "; "), "; it is not handed out"));
      }
      return absl::NotFoundError(req.board.empty()
                                     ? absl::StrCat("no board of the lab has tags ", absl::StrJoin(req.tags, ", "),
                                                    " (fwai hw ls)")
                                     : absl::StrCat("no board '", req.board, "' in the lab (fwai hw ls)"));
    }
    std::vector<std::string> held;
    for (const auto& b : candidates) {
      std::string why;
      auto taken = TryTake(b, req, &why);
      if (!taken.ok()) return taken.status();
      if (taken->has_value()) return **taken;
      if (!why.empty()) held.push_back(why);
    }
    if (std::chrono::steady_clock::now() >= deadline || (cancelled && cancelled())) {
      return absl::FailedPreconditionError(absl::StrCat(absl::StrJoin(held, "; "),
                                                        req.wait_s > 0 ? " (waited " + std::to_string(req.wait_s) + " s)"
                                                                       : " (fwai hw lease --wait SECONDS waits for it)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

absl::Status LabLeases::Claim(LabLease l) {
  LabBoard b;
  b.id = l.board;
  b.node = node_;
  Request req;
  req.holder = l.holder;
  req.identity = l.identity;
  req.session_id = l.session_id;
  req.ttl_s = l.ttl_s;
  std::string why;
  auto taken = TryTake(b, req, &why, l.lease_id);
  if (!taken.ok()) return taken.status();
  if (!taken->has_value()) return absl::FailedPreconditionError(why.empty() ? "board " + l.board + " is held in the lab" : why);
  return absl::OkStatus();
}

absl::StatusOr<LabLease> LabLeases::Renew(const std::string& lease_id, const std::string& identity, bool admin) {
  LabLease l;
  {
    std::lock_guard lock(mu_);
    auto it = mine_.find(lease_id);
    if (it == mine_.end()) return absl::NotFoundError(absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
    if (it->second.identity != identity && !admin) {
      return absl::NotFoundError(absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
    }
    l = it->second;
  }
  auto ttl = etcd_.LeaseKeepAlive(l.etcd_lease);
  if (absl::IsNotFound(ttl.status())) {
    std::lock_guard lock(mu_);
    mine_.erase(lease_id);
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " on ", l.board, " has expired; the board is free again"));
  }
  if (!ttl.ok()) return ttl.status();
  l.expires_us = NowMicros() + *ttl * 1000000;
  std::lock_guard lock(mu_);
  mine_[lease_id] = l;
  return l;
}

absl::StatusOr<LabLease> LabLeases::Release(const std::string& lease_id, const std::string& board,
                                            const std::string& identity, bool force, bool admin) {
  std::optional<LabLease> target;
  std::string value;
  if (!board.empty()) {
    auto kv = etcd_.Get(kLeasesPrefix + board);
    if (!kv.ok()) return kv.status();
    if (!kv->has_value()) return absl::NotFoundError(absl::StrCat("board ", board, " is not held"));
    auto l = LeaseFromJson((*kv)->value);
    if (!l.ok()) return l.status();
    target = *l;
    value = (*kv)->value;
  } else {
    std::lock_guard lock(mu_);
    auto it = mine_.find(lease_id);
    if (it != mine_.end()) target = it->second;
  }
  if (!target || (!lease_id.empty() && target->lease_id != lease_id)) {
    return absl::NotFoundError(absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
  }
  if (target->identity != identity && !(force && admin)) {
    if (!board.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("board ", board, " is held by ", target->holder,
                                                        "; only its holder (or an admin with --force) releases it"));
    }
    return absl::NotFoundError(absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
  }
  if (value.empty()) {
    auto kv = etcd_.Get(kLeasesPrefix + target->board);
    if (!kv.ok()) return kv.status();
    if (kv->has_value()) value = (*kv)->value;
  }
  if (!value.empty()) {
    auto deleted = etcd_.DeleteIfValue(kLeasesPrefix + target->board, value);
    if (!deleted.ok()) return deleted.status();
  }
  if (auto s = etcd_.LeaseRevoke(target->etcd_lease); !s.ok()) return s;
  std::lock_guard lock(mu_);
  mine_.erase(target->lease_id);
  return *target;
}

absl::StatusOr<std::vector<LabLease>> LabLeases::All() {
  auto r = etcd_.GetPrefix(kLeasesPrefix);
  if (!r.ok()) return r.status();
  std::vector<LabLease> out;
  for (const auto& kv : r->kvs) {
    auto l = LeaseFromJson(kv.value);
    if (l.ok()) {
      l->expires_us = l->acquired_us + int64_t{l->ttl_s} * 1000000;  // at least; renewals extend it
      out.push_back(*std::move(l));
    }
  }
  return out;
}

absl::StatusOr<std::optional<LabLease>> LabLeases::Holder(const std::string& board) {
  auto kv = etcd_.Get(kLeasesPrefix + board);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<LabLease>();
  auto l = LeaseFromJson((*kv)->value);
  if (!l.ok()) return std::optional<LabLease>();
  return std::optional<LabLease>(*l);
}

std::vector<LabLease> LabLeases::Mine() const {
  std::lock_guard lock(mu_);
  std::vector<LabLease> out;
  for (const auto& [id, l] : mine_) out.push_back(l);
  return out;
}

}  // namespace fwai::lab
