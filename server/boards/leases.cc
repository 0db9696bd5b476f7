#include "server/boards/leases.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/status_macros.h"
#include "server/lab/etcd_client.h"
#include "server/lab/lab_leases.h"
#include "server/lab/registry.h"

namespace fwai {
namespace {

using lab::IsLabLeaseId;

BoardLease FromLab(const lab::LabLease& l) {
  BoardLease b;
  b.lease_id = l.lease_id;
  b.board = l.board;
  b.node = l.node;
  b.holder = l.holder;
  b.identity = l.identity;
  b.via = l.via;
  b.session_id = l.session_id;
  b.token_id = l.token_id;
  b.acquired_us = l.acquired_us;
  b.expires_us = l.expires_us;
  b.ttl_s = l.ttl_s;
  return b;
}

// Another node's board as the registry lists it.
ListedBoard FromRegistry(const lab::LabBoard& b) {
  ListedBoard out;
  out.device.id = b.id;
  out.device.kind = b.kind;
  out.device.name = b.name;
  out.device.health = b.health;
  out.device.health_reason = b.health_reason;
  out.device.tags = b.tags;
  out.device.target = b.target;
  out.device.state = "remote";
  out.device.streams = b.streams;
  out.node = b.node;
  return out;
}

}  // namespace

BoardLeases::BoardLeases(HardwareBroker& broker, const HardwareConfig& config, lab::LabLeases* lab,
                         lab::EtcdClient* etcd, std::string node)
    : broker_(broker), config_(config), lab_(lab), etcd_(etcd), node_(std::move(node)) {}

BoardLease BoardLeases::FromLocal(const LeaseRecord& l) const {
  BoardLease b;
  b.lease_id = l.lease_id;
  b.board = l.device_id;
  b.node = node_;
  b.holder = l.holder;
  b.identity = l.identity;
  b.session_id = l.session_id;
  b.token_id = l.token_id;
  b.acquired_us = l.acquired_us;
  b.expires_us = l.expires_us;
  b.ttl_s = l.ttl_s;
  b.renewed = l.renewed;
  return b;
}

BoardListing BoardLeases::List() const {
  BoardListing out;
  // In a lab, the lab's leases show who holds boards of every node.
  std::map<std::string, lab::LabLease> lab_holders;
  std::optional<lab::LabView> view;
  if (lab_) {
    auto all = lab_->All();
    auto v = all.ok() ? lab::ReadLab(*etcd_) : absl::StatusOr<lab::LabView>(all.status());
    if (v.ok()) {
      view = *std::move(v);
      for (auto& l : *all) lab_holders[l.board] = std::move(l);
    } else {
      out.lab_error = std::string(v.status().message());
      out.lab_error_detail = lab::EtcdMemberAnswers(v.status());
    }
  }
  std::set<std::string> local;
  for (auto& d : broker_.List()) {
    local.insert(d.id);
    ListedBoard b{std::move(d), node_};
    if (b.device.state.empty()) b.device.state = b.device.running ? "running" : "stopped";
    if (auto it = lab_holders.find(b.device.id);
        b.device.holder.empty() && it != lab_holders.end()) {
      b.device.holder = it->second.holder + " via " + it->second.via;
      b.device.held_since_us = it->second.acquired_us;
    }
    out.boards.push_back(std::move(b));
  }
  for (const auto& l : broker_.Leases()) out.leases.push_back(FromLocal(l));
  if (!view) return out;
  for (const auto& rb : view->boards) {
    if (rb.node == node_ || local.count(rb.id)) continue;
    ListedBoard b = FromRegistry(rb);
    if (auto it = lab_holders.find(rb.id); it != lab_holders.end()) {
      b.device.holder = it->second.holder + " via " + it->second.via;
      b.device.held_since_us = it->second.acquired_us;
      b.device.lease_expires_us = it->second.expires_us;
      out.leases.push_back(FromLab(it->second));
    }
    out.boards.push_back(std::move(b));
  }
  return out;
}

absl::StatusOr<std::pair<std::vector<BoardLease>, std::vector<BoardWaiter>>> BoardLeases::Who()
    const {
  std::vector<BoardLease> leases;
  std::vector<BoardWaiter> waiters;
  std::set<std::string> shown;
  for (const auto& l : broker_.Leases()) {
    // A bench's stand-in for another node's lab lease: the lab lease says who.
    if (lab_ && l.identity.rfind("lab:", 0) == 0) continue;
    leases.push_back(FromLocal(l));
    shown.insert(l.lease_id);
  }
  if (lab_) {
    // Every holder and waiter of the lab, whichever node they came through.
    ASSIGN_OR_RETURN(std::vector<lab::LabLease> all, lab_->All(/*exact_expiry=*/true));
    for (const auto& l : all) {
      if (shown.count(l.lease_id)) continue;
      BoardLease b = FromLab(l);
      b.holder = l.holder + " via " + l.via;
      leases.push_back(std::move(b));
    }
    ASSIGN_OR_RETURN(std::vector<lab::LabWaiter> queue, lab_->Queue());
    for (const auto& w : queue) {
      BoardWaiter o;
      o.holder = w.holder + " via " + w.via;
      o.wants = w.ci ? w.wants + " (ci)" : w.wants;
      o.candidates = w.candidates;
      o.position = w.position;
      o.since_us = w.since_us;
      o.until_us = w.until_us;
      o.node = w.via;
      o.session_id = w.session_id;
      waiters.push_back(std::move(o));
    }
  }
  for (const auto& w : broker_.Waiters()) {
    BoardWaiter o;
    o.holder = w.holder;
    o.wants = w.wants;
    o.candidates = w.candidates;
    o.position = w.position;
    o.since_us = w.since_us;
    o.until_us = w.until_us;
    o.session_id = w.session_id;
    o.node = node_;
    waiters.push_back(std::move(o));
  }
  return std::make_pair(std::move(leases), std::move(waiters));
}

bool BoardLeases::IsLocal(const std::string& board, const std::vector<std::string>& tags) const {
  for (const auto& d : broker_.List()) {
    if (!board.empty()) {
      if (d.id == board) return true;
      continue;
    }
    bool all = true;
    for (const auto& t : tags) {
      all = all && std::find(d.tags.begin(), d.tags.end(), t) != d.tags.end();
    }
    if (all) return true;
  }
  return false;
}

int BoardLeases::HeldBy(const std::string& identity) const {
  int held = 0;
  for (const auto& l : broker_.Leases()) held += l.identity == identity;
  if (lab_) {
    // Leases this node took on other nodes' boards count too.
    for (const auto& l : lab_->Mine()) held += l.identity == identity && IsLabLeaseId(l.lease_id);
  }
  return held;
}

nlohmann::json BoardLeases::TakeTranscript(const std::string& lease_id) {
  return broker_.TakeTranscript(lease_id);
}

namespace {

// A request for a lease in the lab's queue: the TTL (the default when 0)
// and the wait checked against the hardware limits.
absl::StatusOr<lab::LabLeases::Request> LabRequest(const HardwareConfig& hc, const Caller& c,
                                                   const LeaseRequest& req) {
  int ttl_s = req.ttl_s <= 0 ? hc.default_ttl_s : req.ttl_s;
  if (ttl_s > hc.max_ttl_s) {
    return absl::InvalidArgumentError(
        absl::StrCat("ttl ", ttl_s, " s is above the limit of ", hc.max_ttl_s, " s"));
  }
  if (req.wait_s < 0 || req.wait_s > 86400) {
    return absl::InvalidArgumentError("wait must be 0..86400 seconds");
  }
  lab::LabLeases::Request r;
  r.board = req.board;
  r.tags = req.tags;
  r.holder = c.display.empty() ? c.identity : c.display;
  r.identity = c.identity;
  r.session_id = c.session_id;
  r.token_id = c.token_id;
  r.ttl_s = ttl_s;
  r.wait_s = req.wait_s;
  r.ci = req.ci;
  return r;
}

}  // namespace

absl::StatusOr<BoardLease> BoardLeases::Acquire(const Caller& caller, const LeaseRequest& req,
                                                const std::function<bool()>& cancelled) {
  const bool local = IsLocal(req.board, req.tags);
  if (lab_ && req.wait_s > 0 && local) return AcquireLocalInLabQueue(caller, req, cancelled);
  if (!lab_ || local) return AcquireLocal(caller, req, cancelled);
  ASSIGN_OR_RETURN(lab::LabLeases::Request r, LabRequest(config_, caller, req));
  ASSIGN_OR_RETURN(lab::LabLease l, lab_->Acquire(r, cancelled));
  return FromLab(l);
}

absl::StatusOr<BoardLease> BoardLeases::LeaseFor(const Caller& caller, const BoardRef& board,
                                                 int ttl_s,
                                                 const std::function<bool()>& cancelled) {
  if (board.remote && lab_) {
    for (const auto& l : lab_->Mine()) {
      if (l.lease_id != board.lease_id || l.identity != caller.identity) continue;
      BoardLease out = FromLab(l);
      out.renewed = true;
      return out;
    }
    return absl::FailedPreconditionError(absl::StrCat("you no longer hold the lab lease on board ",
                                                      board.id, " (it was released or expired)"));
  }
  LeaseRequest r;
  r.board = board.id;
  r.ttl_s = ttl_s;
  return Acquire(caller, r, cancelled);
}

absl::StatusOr<BoardLease> BoardLeases::AcquireLocal(const Caller& caller, const LeaseRequest& req,
                                                     const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(LeaseRecord l,
                   broker_.Acquire(caller, req.board, req.tags, req.ttl_s, req.wait_s, cancelled));
  if (lab_) {
    // The lab must know: no other node may hand this board out meanwhile.
    absl::Status claimed;
    if (l.renewed) {
      claimed = lab_->Renew(l.lease_id, l.identity, true).status();
    } else {
      lab::LabLease ll;
      ll.lease_id = l.lease_id;
      ll.board = l.device_id;
      ll.node = node_;
      ll.holder = l.holder;
      ll.identity = l.identity;
      ll.session_id = l.session_id;
      ll.token_id = l.token_id;
      ll.ttl_s = l.ttl_s;
      claimed = lab_->Claim(ll);
    }
    if (!claimed.ok()) {
      if (!l.renewed) (void)broker_.Release(caller, l.lease_id, "", false);
      return claimed;
    }
  }
  return FromLocal(l);
}

// A caller of a bench of a lab who waits for one of its boards waits in the
// lab's queue with everyone else (whoever holds the board, through
// whichever node), in its turn: the lab lease it is served is claimed under
// the id of the local lease it then takes here. The stand-in of a lease
// held through a front is gone once that lease is (within a second).
absl::StatusOr<BoardLease> BoardLeases::AcquireLocalInLabQueue(
    const Caller& caller, const LeaseRequest& req, const std::function<bool()>& cancelled) {
  ASSIGN_OR_RETURN(lab::LabLeases::Request r, LabRequest(config_, caller, req));
  r.node = node_;
  r.lease_id = NewId("lease");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(r.wait_s);
  ASSIGN_OR_RETURN(lab::LabLease ll, lab_->Acquire(r, cancelled));
  // The board is this caller's in the lab; here, once the previous holder's
  // stand-in has gone.
  const int left_s =
      static_cast<int>(std::max<int64_t>(5, std::chrono::duration_cast<std::chrono::seconds>(
                                                deadline - std::chrono::steady_clock::now())
                                                .count()));
  auto l =
      broker_.Acquire(caller, ll.board, {}, r.ttl_s, std::min(left_s, 30), cancelled, ll.lease_id);
  if (!l.ok()) {
    (void)lab_->Release(ll.lease_id, "", caller.identity, false, false);
    return l.status();
  }
  return FromLocal(*l);
}

absl::StatusOr<BoardLease> BoardLeases::Renew(const Caller& caller, const std::string& lease_id) {
  if (lab_ && IsLabLeaseId(lease_id)) {
    ASSIGN_OR_RETURN(lab::LabLease l, lab_->Renew(lease_id, caller.identity, caller.admin));
    return FromLab(l);
  }
  ASSIGN_OR_RETURN(LeaseRecord l, broker_.Renew(caller, lease_id));
  if (lab_) {
    auto renewed = lab_->Renew(lease_id, l.identity, true);
    if (absl::IsNotFound(renewed.status())) {
      // The lab let it lapse (etcd lost it): the board is no longer ours.
      (void)broker_.Release(caller, lease_id, "", false);
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, " on ", l.device_id,
                                              " has expired in the lab; take the board again"));
    }
    if (!renewed.ok()) return renewed.status();
  }
  return FromLocal(l);
}

void BoardLeases::DropLabClaim(const LeaseRecord& l) {
  if (!lab_) return;
  auto released = lab_->Release(l.lease_id, "", l.identity, true, true);
  if (!released.ok() && !absl::IsNotFound(released.status())) {
    spdlog::warn("lab: lease {} ended here but not in etcd ({}); it lapses with its TTL",
                 l.lease_id, released.status().ToString());
  }
}

std::vector<BoardLease> BoardLeases::EndTakenWith(const std::string& token_id,
                                                  const std::string& reason) {
  std::vector<BoardLease> ended;
  if (token_id.empty()) return ended;
  // This node's boards: ended here, then in the lab.
  for (const LeaseRecord& l : broker_.TokenEnded(token_id, reason)) {
    DropLabClaim(l);
    ended.push_back(FromLocal(l));
  }
  if (!lab_) return ended;
  // Other nodes' boards, leased through this node with that token.
  for (const lab::LabLease& l : lab_->Mine()) {
    if (l.token_id != token_id || !IsLabLeaseId(l.lease_id)) continue;
    auto released = lab_->Release(l.lease_id, "", l.identity, true, true);
    if (released.ok()) {
      spdlog::info("lab: lease {} of {} on {} ended: {}", l.lease_id, l.holder, l.board, reason);
      ended.push_back(FromLab(*released));
    } else if (!absl::IsNotFound(released.status())) {
      spdlog::warn("lab: lease {} on {} not ended ({}); it lapses with its TTL", l.lease_id,
                   l.board, released.status().ToString());
    }
  }
  return ended;
}

absl::StatusOr<BoardLease> BoardLeases::Release(const Caller& caller, const std::string& lease_id,
                                                const std::string& board, bool force) {
  if (lab_ &&
      (IsLabLeaseId(lease_id) || (lease_id.empty() && !board.empty() && !IsLocal(board, {})))) {
    ASSIGN_OR_RETURN(lab::LabLease l,
                     lab_->Release(lease_id, board, caller.identity, force, caller.admin));
    return FromLab(l);
  }
  ASSIGN_OR_RETURN(LeaseRecord l, broker_.Release(caller, lease_id, board, force));
  DropLabClaim(l);
  return FromLocal(l);
}

BoardLeases::Held BoardLeases::Hold(const Caller& caller, const LeaseRequest& req,
                                    CancelToken& stop,
                                    const std::function<void(const BoardLease&)>& acquired) {
  Held out;
  auto l = Acquire(caller, req, [&stop] { return stop.cancelled(); });
  if (!l.ok()) {
    out.status = l.status();
    return out;
  }
  out.lease = *l;
  acquired(*l);
  const auto period = std::chrono::milliseconds(std::max(200, l->ttl_s * 1000 / 3));
  while (!stop.WaitFor(period)) {
    auto renewed = Renew(caller, l->lease_id);
    // Ended by someone else, or expired: the holder hears of it.
    if (!renewed.ok() && !absl::IsUnavailable(renewed.status())) {
      out.status = renewed.status();
      break;
    }
  }
  if (Release(caller, l->lease_id, "", false).ok()) {
    out.released = true;
    out.transcript = TakeTranscript(l->lease_id);
  }
  return out;
}

}  // namespace fwai
