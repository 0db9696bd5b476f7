#include "server/lab/lab_leases.h"

#include <spdlog/spdlog.h>

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
  return nlohmann::json{
      {"lease_id", l.lease_id},     {"board", l.board},          {"node", l.node},
      {"holder", l.holder},         {"identity", l.identity},    {"via", l.via},
      {"session_id", l.session_id}, {"token_id", l.token_id},    {"acquired_us", l.acquired_us},
      {"ttl_s", l.ttl_s},           {"etcd_lease", l.etcd_lease}}
      .dump();
}

absl::StatusOr<LabLease> LeaseFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("lease_id"))
    return absl::InvalidArgumentError("not a lease record");
  LabLease l;
  l.lease_id = j.value("lease_id", "");
  l.board = j.value("board", "");
  l.node = j.value("node", "");
  l.holder = j.value("holder", "");
  l.identity = j.value("identity", "");
  l.via = j.value("via", "");
  l.session_id = j.value("session_id", "");
  l.token_id = j.value("token_id", "");
  l.acquired_us = j.value("acquired_us", int64_t{0});
  l.ttl_s = j.value("ttl_s", 0);
  l.etcd_lease = j.value("etcd_lease", int64_t{0});
  return l;
}

std::string WaiterToJson(const LabWaiter& w) {
  return nlohmann::json{
      {"board", w.board},           {"tags", w.tags},        {"node", w.node},
      {"wants", w.wants},           {"holder", w.holder},    {"identity", w.identity},
      {"session_id", w.session_id}, {"via", w.via},          {"ci", w.ci},
      {"since_us", w.since_us},     {"until_us", w.until_us}}
      .dump();
}

absl::StatusOr<LabWaiter> WaiterFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("identity"))
    return absl::InvalidArgumentError("not a waiter record");
  LabWaiter w;
  w.board = j.value("board", "");
  if (j.contains("tags") && j["tags"].is_array()) {
    for (const auto& t : j["tags"]) {
      if (t.is_string()) w.tags.push_back(t.get<std::string>());
    }
  }
  w.node = j.value("node", "");
  w.wants = j.value("wants", "");
  w.holder = j.value("holder", "");
  w.identity = j.value("identity", "");
  w.session_id = j.value("session_id", "");
  w.via = j.value("via", "");
  w.ci = j.value("ci", false);
  w.since_us = j.value("since_us", int64_t{0});
  w.until_us = j.value("until_us", int64_t{0});
  return w;
}

bool Wants(const LabWaiter& w, const LabBoard& b) {
  if (!w.board.empty() && w.board != b.id) return false;
  if (!w.node.empty() && w.node != b.node) return false;
  for (const auto& t : w.tags) {
    if (std::find(b.tags.begin(), b.tags.end(), t) == b.tags.end()) return false;
  }
  return true;
}

namespace {

// The queue a request waits in: one per board, or per set of tags.
std::string QueueName(const LabLeases::Request& req) {
  if (!req.board.empty()) return "board:" + req.board;
  std::vector<std::string> tags = req.tags;
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  return "tags:" + absl::StrJoin(tags, ",") + (req.node.empty() ? "" : "@" + req.node);
}

std::string Describe(const LabLeases::Request& req) {
  if (!req.board.empty()) return req.board;
  return "tags " + absl::StrJoin(req.tags, ", ") + (req.node.empty() ? "" : " on " + req.node);
}

}  // namespace

struct LabLeases::Queued {
  LabWaiter w;
  int64_t etcd_lease = 0;
  std::chrono::steady_clock::time_point renewed;
};

LabLeases::LabLeases(EtcdClient& etcd, std::string node, LabLeasesOptions options)
    : etcd_(etcd), node_(std::move(node)), options_(options) {}

LabLeases::~LabLeases() {
  std::unique_ptr<EtcdWatch> w;
  {
    MutexLock lock(&mu_);
    w = std::move(nodes_watch_);
  }
  w.reset();
}

void LabLeases::Start() {
  auto watch = etcd_.Watch(kNodesPrefix, 0, [this](const std::vector<WatchEvent>& events, int64_t) {
    for (const auto& e : events) {
      if (e.type == WatchEvent::kDelete) NodeLeft(e.kv.key.substr(sizeof(kNodesPrefix) - 1));
    }
  });
  {
    MutexLock lock(&mu_);
    nodes_watch_ = std::move(watch);
  }
  Recover();
}

void LabLeases::Recover() {
  {
    MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    if (recovered_ || now < next_recovery_) return;
    next_recovery_ = now + std::chrono::seconds(1);
  }
  auto r = etcd_.GetPrefix(kLeasesPrefix);
  if (!r.ok()) return;  // etcd does not answer yet: tried again at the next use
  MutexLock lock(&mu_);
  if (recovered_) return;
  for (const auto& kv : r->kvs) {
    auto l = LeaseFromJson(kv.value);
    if (!l.ok() || l->via != node_) continue;
    l->etcd_lease = kv.lease;
    l->expires_us = l->acquired_us + int64_t{l->ttl_s} * 1000000;  // at least
    // One taken (or released) since this run started is as this run has it.
    if (mine_.emplace(l->lease_id, *l).second) {
      spdlog::info(
          "lab: lease {} of {} on {} taken through this node before it restarted is "
          "theirs again",
          l->lease_id, l->holder, l->board);
    }
  }
  recovered_ = true;
}

void LabLeases::NodeLeft(const std::string& node) {
  std::vector<LabLease> gone;
  {
    MutexLock lock(&mu_);
    for (auto it = mine_.begin(); it != mine_.end();) {
      // Only leases on other benches' boards: this node's own are its own business.
      if (it->second.node == node && node != node_) {
        gone.push_back(it->second);
        const std::string why =
            absl::StrCat("bench ", node, " left the lab (stopped, killed or cut off)");
        if (ended_.emplace(it->first, EndedLease{why, it->second.identity}).second) {
          ended_order_.push_back(it->first);
          if (ended_order_.size() > kEndedKept) {
            ended_.erase(ended_order_.front());
            ended_order_.pop_front();
          }
        }
        it = mine_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& l : gone) {
    // The board is gone with its bench: nobody can use it; the key goes too.
    auto kv = etcd_.Get(kLeasesPrefix + l.board);
    if (kv.ok() && kv->has_value()) {
      auto held = LeaseFromJson((*kv)->value);
      if (held.ok() && held->lease_id == l.lease_id)
        (void)etcd_.DeleteIfValue(kLeasesPrefix + l.board, (*kv)->value);
    }
    (void)etcd_.LeaseRevoke(l.etcd_lease);
  }
}

bool LabLeases::Before(const LabWaiter& a, const LabWaiter& b) const {
  if (options_.interactive_first && a.ci != b.ci) return !a.ci;
  return a.create_revision < b.create_revision;
}

absl::StatusOr<std::pair<std::vector<LabWaiter>, int64_t>> LabLeases::ReadQueue() {
  auto r = etcd_.GetPrefix(kQueuePrefix);
  if (!r.ok()) return r.status();
  std::vector<LabWaiter> out;
  for (const auto& kv : r->kvs) {
    auto w = WaiterFromJson(kv.value);
    if (!w.ok()) continue;
    w->key = kv.key;
    w->create_revision = kv.create_revision;
    out.push_back(*std::move(w));
  }
  std::sort(out.begin(), out.end(),
            [this](const LabWaiter& a, const LabWaiter& b) { return Before(a, b); });
  return std::make_pair(std::move(out), r->revision);
}

absl::StatusOr<std::vector<LabWaiter>> LabLeases::Queue() {
  auto q = ReadQueue();
  if (!q.ok()) return q.status();
  auto view = ReadLab(etcd_);
  if (!view.ok()) return view.status();
  std::vector<LabWaiter> out = std::move(q->first);
  for (size_t i = 0; i < out.size(); ++i) {
    for (const auto& b : view->boards) {
      if (Wants(out[i], b)) out[i].candidates.push_back(b.id);
    }
    out[i].position = 1;
    for (size_t j = 0; j < i; ++j) {
      bool overlap = false;
      for (const auto& id : out[i].candidates) {
        overlap = overlap || std::find(out[j].candidates.begin(), out[j].candidates.end(), id) !=
                                 out[j].candidates.end();
      }
      out[i].position += overlap;
    }
  }
  return out;
}

absl::StatusOr<std::optional<LabLease>> LabLeases::TryTake(
    const LabBoard& b, const Request& req, std::string* held_by, const std::string& lease_id,
    const std::vector<LabWaiter>& queue, int64_t queue_revision, const Queued* me, bool* raced) {
  // Someone the queue serves first wants this board: it is theirs.
  int ahead = 0;
  for (const auto& w : queue) {
    if (me && w.key == me->w.key) break;
    ahead += Wants(w, b);
  }
  auto current = etcd_.Get(kLeasesPrefix + b.id);
  if (!current.ok()) return current.status();
  if (current->has_value()) {
    auto held = LeaseFromJson((*current)->value);
    if (held.ok()) {
      // The same holder asking again keeps what it has — also a lease taken
      // through this node whose answer etcd's loss of quorum swallowed.
      if (held->identity == req.identity && held->session_id == req.session_id) {
        MutexLock lock(&mu_);
        if (!mine_.count(held->lease_id) && held->via == node_) {
          held->etcd_lease = (*current)->lease;
          held->expires_us = held->acquired_us + int64_t{held->ttl_s} * 1000000;
          spdlog::info("lab: lease {} of {} on {}, whose grant went unanswered, is theirs",
                       held->lease_id, held->holder, held->board);
          mine_[held->lease_id] = *held;
        }
        if (mine_.count(held->lease_id)) {
          auto ttl = etcd_.LeaseKeepAlive(held->etcd_lease);
          if (ttl.ok()) {
            LabLease out = mine_[held->lease_id];
            out.expires_us = NowMicros() + *ttl * 1000000;
            return std::optional<LabLease>(out);
          }
        }
      }
      *held_by = absl::StrCat("board ", b.id, " (on ", b.node, ") is held by ", held->holder,
                              " since ", FormatUtc(held->acquired_us), " through ", held->via);
    }
    if (ahead > 0)
      absl::StrAppend(held_by, "; ", ahead, ahead == 1 ? " caller waits" : " callers wait",
                      " before you");
    return std::optional<LabLease>();
  }
  if (ahead > 0) {
    *held_by = absl::StrCat("board ", b.id, " (on ", b.node, ") is free, but ", ahead,
                            ahead == 1 ? " caller of the lab waits" : " callers of the lab wait",
                            " for it before you (fwai hw who)");
    return std::optional<LabLease>();
  }
  LabLease l;
  l.lease_id = lease_id.empty() ? NewId(kLabLeaseIdPrefix) : lease_id;
  l.board = b.id;
  l.node = b.node;
  l.holder = req.holder;
  l.identity = req.identity;
  l.via = node_;
  l.session_id = req.session_id;
  l.token_id = req.token_id;
  l.ttl_s = req.ttl_s;
  auto granted = etcd_.LeaseGrant(req.ttl_s);
  if (!granted.ok()) return granted.status();
  l.etcd_lease = *granted;
  l.acquired_us = NowMicros();
  EtcdClient::GuardedCreate g;
  g.key = kLeasesPrefix + b.id;
  g.value = LeaseToJson(l);
  g.lease = l.etcd_lease;
  g.unchanged_prefix = kQueuePrefix;
  g.unchanged_since = queue_revision;
  if (me) {
    g.consume_key = me->w.key;
    g.consume_create_revision = me->w.create_revision;
  }
  auto r = etcd_.CreateGuarded(g);
  if (!r.ok()) {
    // No answer: etcd may have applied it. Read back; if that fails too the
    // key (if any) is found as this caller's at its next look (above).
    auto back = etcd_.Get(g.key);
    if (back.ok() && back->has_value() && (*back)->value == g.value) {
      r = EtcdClient::CreateResult{};
      r->created = true;
    }
  }
  if (!r.ok() || !r->created) {
    if (!r.ok() && absl::IsUnavailable(r.status())) return r.status();  // unknown: keep the lease
    (void)etcd_.LeaseRevoke(l.etcd_lease);
    if (!r.ok()) return r.status();
    // Taken meanwhile, or the queue changed: look again.
    *raced = true;
    return std::optional<LabLease>();
  }
  l.expires_us = l.acquired_us + int64_t{req.ttl_s} * 1000000;
  MutexLock lock(&mu_);
  mine_[l.lease_id] = l;
  return std::optional<LabLease>(l);
}

absl::StatusOr<LabLease> LabLeases::Acquire(const Request& req,
                                            const std::function<bool()>& cancelled) {
  if (req.ttl_s <= 0) return absl::InvalidArgumentError("ttl must be positive");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(req.wait_s);
  // Leaving for any reason takes this caller out of the queue.
  std::optional<Queued> me;
  struct Leave {
    EtcdClient& etcd;
    std::optional<Queued>& me;
    ~Leave() {
      if (me) (void)etcd.LeaseRevoke(me->etcd_lease);  // deletes its queue key
    }
  } leave{etcd_, me};
  // While a caller waits, the registry losing its quorum is a pause, not the
  // end: the wait goes on to its deadline (its place in the queue kept if
  // etcd is back within the queue's TTL), and fails UNAVAILABLE only then.
  bool paused = false;
  const auto pause = [&](const absl::Status& s) {
    if (!absl::IsUnavailable(s) || req.wait_s <= 0 ||
        std::chrono::steady_clock::now() >= deadline || (cancelled && cancelled())) {
      return false;
    }
    if (!paused) {
      spdlog::warn("lab: the wait for {} of {} goes on while the registry is unavailable: {}",
                   Describe(req), req.holder, std::string(s.message()));
      paused = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return true;
  };
  while (true) {
    auto view = ReadLab(etcd_);
    if (!view.ok()) {
      if (pause(view.status())) continue;
      return view.status();
    }
    std::vector<LabBoard> candidates;
    std::vector<std::string> unhealthy;
    for (const auto& b : view->boards) {
      bool match =
          (req.board.empty() || b.id == req.board) && (req.node.empty() || b.node == req.node);
      for (const auto& t : req.tags)
        match = match && std::find(b.tags.begin(), b.tags.end(), t) != b.tags.end();
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
        return absl::FailedPreconditionError(
            absl::StrCat(absl::StrJoin(unhealthy, "; "), "; it is not handed out"));
      }
      return absl::NotFoundError(
          req.board.empty() ? absl::StrCat("no board of the lab has tags ",
                                           absl::StrJoin(req.tags, ", "), " (fwai hw ls)")
                            : absl::StrCat("no board '", req.board, "' in the lab (fwai hw ls)"));
    }
    auto queue = ReadQueue();
    if (!queue.ok()) {
      if (pause(queue.status())) continue;
      return queue.status();
    }
    if (me) {
      // Still queued? (Our etcd lease may have lapsed while etcd was cut off.)
      bool there = false;
      for (const auto& w : queue->first) there = there || w.key == me->w.key;
      if (!there) {
        (void)etcd_.LeaseRevoke(me->etcd_lease);
        me.reset();
      }
    }
    std::vector<std::string> held;
    bool raced = false;
    for (const auto& b : candidates) {
      std::string why;
      auto taken = TryTake(b, req, &why, req.lease_id, queue->first, queue->second,
                           me ? &*me : nullptr, &raced);
      if (!taken.ok()) {
        if (pause(taken.status())) {
          raced = true;  // read everything again
          break;
        }
        return taken.status();
      }
      if (taken->has_value()) {
        if (me) {
          (void)etcd_.LeaseRevoke(me->etcd_lease);  // its key went with the take
          me.reset();
        }
        return **taken;
      }
      if (raced) break;
      if (!why.empty()) held.push_back(why);
    }
    if (raced) continue;  // the board or the queue changed under us: read again at once
    if (std::chrono::steady_clock::now() >= deadline || (cancelled && cancelled())) {
      return absl::FailedPreconditionError(absl::StrCat(
          absl::StrJoin(held, "; "), req.wait_s > 0
                                         ? " (waited " + std::to_string(req.wait_s) + " s)"
                                         : " (fwai hw lease --wait SECONDS waits for it)"));
    }
    if (!me) {
      // Join the queue, under an etcd lease of our own kept alive while we wait.
      Queued q;
      auto granted = etcd_.LeaseGrant(options_.queue_ttl_s);
      if (!granted.ok()) {
        if (pause(granted.status())) continue;
        return granted.status();
      }
      q.etcd_lease = *granted;
      q.w.board = req.board;
      q.w.tags = req.tags;
      q.w.node = req.node;
      q.w.wants = Describe(req);
      q.w.holder = req.holder;
      q.w.identity = req.identity;
      q.w.session_id = req.session_id;
      q.w.via = node_;
      q.w.ci = req.ci;
      q.w.since_us = NowMicros();
      q.w.until_us = q.w.since_us + int64_t{req.wait_s} * 1000000;
      q.w.key = absl::StrCat(kQueuePrefix, QueueName(req), "/", NewId("w-"));
      auto rev = etcd_.Put(q.w.key, WaiterToJson(q.w), q.etcd_lease);
      if (!rev.ok()) {
        (void)etcd_.LeaseRevoke(q.etcd_lease);
        if (pause(rev.status())) continue;
        return rev.status();
      }
      q.w.create_revision = *rev;
      q.renewed = std::chrono::steady_clock::now();
      me = std::move(q);
      continue;  // our place is known: look at once
    }
    if (std::chrono::steady_clock::now() - me->renewed >=
        std::chrono::milliseconds(options_.queue_ttl_s * 1000 / 3)) {
      auto ttl = etcd_.LeaseKeepAlive(me->etcd_lease);
      if (ttl.ok()) me->renewed = std::chrono::steady_clock::now();
      // NOT_FOUND: lapsed; the next look finds our key gone and queues again.
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::Status LabLeases::Claim(LabLease l) {
  LabBoard b;
  b.id = l.board;
  b.node = node_;
  // The board's tags, so waiters for a tag set are seen too.
  if (auto view = ReadLab(etcd_); view.ok()) {
    for (const auto& vb : view->boards) {
      if (vb.id == l.board) b = vb;
    }
  }
  Request req;
  req.holder = l.holder;
  req.identity = l.identity;
  req.session_id = l.session_id;
  req.token_id = l.token_id;
  req.ttl_s = l.ttl_s;
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto queue = ReadQueue();
    if (!queue.ok()) return queue.status();
    std::string why;
    bool raced = false;
    auto taken = TryTake(b, req, &why, l.lease_id, queue->first, queue->second, nullptr, &raced);
    if (!taken.ok()) return taken.status();
    if (taken->has_value()) return absl::OkStatus();
    if (!raced)
      return absl::FailedPreconditionError(why.empty() ? "board " + l.board + " is held in the lab"
                                                       : why);
  }
  return absl::UnavailableError(
      absl::StrCat("board ", l.board, ": the lab's queue kept changing; try again"));
}

absl::StatusOr<LabLease> LabLeases::Renew(const std::string& lease_id, const std::string& identity,
                                          bool admin) {
  Recover();
  LabLease l;
  {
    MutexLock lock(&mu_);
    auto it = mine_.find(lease_id);
    if (it == mine_.end()) {
      if (auto e = ended_.find(lease_id); e != ended_.end()) {
        return absl::NotFoundError(absl::StrCat("lease ", lease_id, " has ended: ", e->second.why));
      }
      return absl::NotFoundError(
          absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
    }
    if (it->second.identity != identity && !admin) {
      return absl::NotFoundError(
          absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
    }
    l = it->second;
  }
  auto ttl = etcd_.LeaseKeepAlive(l.etcd_lease);
  if (absl::IsNotFound(ttl.status())) {
    MutexLock lock(&mu_);
    mine_.erase(lease_id);
    return absl::NotFoundError(
        absl::StrCat("lease ", lease_id, " on ", l.board, " has expired; the board is free again"));
  }
  if (!ttl.ok()) return ttl.status();
  l.expires_us = NowMicros() + *ttl * 1000000;
  MutexLock lock(&mu_);
  mine_[lease_id] = l;
  return l;
}

absl::StatusOr<LabLease> LabLeases::Release(const std::string& lease_id, const std::string& board,
                                            const std::string& identity, bool force, bool admin) {
  Recover();
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
    MutexLock lock(&mu_);
    auto it = mine_.find(lease_id);
    if (it != mine_.end()) target = it->second;
  }
  if (!target || (!lease_id.empty() && target->lease_id != lease_id)) {
    return absl::NotFoundError(
        absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
  }
  if (target->identity != identity && !(force && admin)) {
    if (!board.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "board ", board, " is held by ", target->holder,
          "; only its holder (or an admin with --force) releases it (rule: the lease's holder)"));
    }
    return absl::NotFoundError(
        absl::StrCat("no lease ", lease_id, " (it expired or was released)"));
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
  MutexLock lock(&mu_);
  mine_.erase(target->lease_id);
  return *target;
}

absl::StatusOr<std::vector<LabLease>> LabLeases::All(bool exact_expiry) {
  auto r = etcd_.GetPrefix(kLeasesPrefix);
  if (!r.ok()) return r.status();
  std::vector<LabLease> out;
  for (const auto& kv : r->kvs) {
    auto l = LeaseFromJson(kv.value);
    if (l.ok()) {
      l->expires_us = l->acquired_us + int64_t{l->ttl_s} * 1000000;  // at least; renewals extend it
      if (exact_expiry) {
        auto ttl = etcd_.LeaseTimeToLive(kv.lease);
        if (ttl.ok()) l->expires_us = NowMicros() + *ttl * 1000000;
      }
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

std::vector<LabLease> LabLeases::Mine() {
  Recover();
  MutexLock lock(&mu_);
  std::vector<LabLease> out;
  for (const auto& [id, l] : mine_) out.push_back(l);
  return out;
}

std::optional<std::string> LabLeases::Ended(const std::string& lease_id,
                                            const std::string& identity) {
  MutexLock lock(&mu_);
  auto e = ended_.find(lease_id);
  if (e == ended_.end() || e->second.identity != identity) return std::nullopt;
  return e->second.why;
}

}  // namespace fwai::lab
