// Hardware: devices, leases, flash, serial fan-out, debug. Long operations
// (waiting acquires, flashing, GDB) run on the service's own threads so they
// never hold up the shared pool.
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <pwd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <optional>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/ids.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/auth/principal.h"
#include "server/tools/project_fs.h"
#include "common/paths.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "server/api/lab_forward.h"
#include "server/api/queued_writer.h"
#include "server/api/serial_reactor.h"
#include "server/evidence/evidence_log.h"
#include "server/hardware/broker.h"
#include "server/hardware/firmware_image.h"
#include "server/lab/lab_leases.h"
#include "server/lab/registry.h"
#include "server/project/policy.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;

void ToProto(const LeaseRecord& l, pb::Lease* out) {
  out->set_lease_id(l.lease_id);
  out->set_device_id(l.device_id);
  out->set_holder(l.holder);
  out->set_acquired_us(l.acquired_us);
  out->set_expires_us(l.expires_us);
  out->set_ttl_s(l.ttl_s);
  out->set_session_id(l.session_id);
}

void ToProto(const lab::LabLease& l, pb::Lease* out) {
  out->set_lease_id(l.lease_id);
  out->set_device_id(l.board);
  out->set_holder(l.holder);
  out->set_acquired_us(l.acquired_us);
  out->set_expires_us(l.expires_us);
  out->set_ttl_s(l.ttl_s);
  out->set_session_id(l.session_id);
  out->set_node(l.node);
}

std::vector<std::string> TagsOf(const google::protobuf::RepeatedPtrField<pb::Tag>& tags) {
  std::vector<std::string> out;
  for (const auto& t : tags) out.push_back(t.value().empty() ? t.key() : t.key() + ":" + t.value());
  return out;
}

void TagsToProto(const std::vector<std::string>& tags, pb::Device* o) {
  for (const auto& t : tags) {
    auto* tag = o->add_tags();
    auto eq = t.find(':');
    tag->set_key(eq == std::string::npos ? t : t.substr(0, eq));
    if (eq != std::string::npos) tag->set_value(t.substr(eq + 1));
  }
}

class HardwareService final : public pb::Hardware::CallbackService {
 public:
  explicit HardwareService(ApiDeps deps) : deps_(std::move(deps)), workers_(16) {}
  ~HardwareService() override {
    // Held-lease threads end when their streams are cancelled at shutdown.
    for (int i = 0; i < 300 && holds_ > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  absl::StatusOr<Caller> CallerOf(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                  const std::string& lease_id = "", const std::string& session_id = "") const {
    return AdmitCaller(deps_, ctx, rpc, lease_id, session_id);
  }
  // As CallerOf, and whether its role is ci (the lab's queue serves it in the CI band).
  absl::StatusOr<std::pair<Caller, bool>> CallerAndBandOf(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                                          const std::string& session_id) const {
    auto p = deps_.gate->Admit(ctx, rpc);
    if (!p.ok()) return p.status();
    return std::make_pair(CallerFor(*p, ctx, "", session_id), p->role == Role::kCi);
  }

  // A new lease must fit the caller's limits: leases held and their TTL.
  absl::Status LeaseLimits(const Caller& c, int ttl_s) const {
    Principal p;
    p.id = c.identity;
    p.user = c.user;
    p.aliases = c.aliases;
    p.role = c.admin ? Role::kAdmin : Role::kUser;  // admins are not limited
    const LimitsConfig limits = deps_.gate->identities().LimitsOf(p);
    if (ttl_s > limits.lease_ttl_max_s) {
      return absl::ResourceExhaustedError(absl::StrCat("limit lease_ttl_max_s (", limits.lease_ttl_max_s,
                                                       " s): ask for a shorter ttl and renew it (fwai hw lease --hold)"));
    }
    int64_t held = 0;
    for (const auto& l : deps_.hardware->Leases()) held += l.identity == c.identity;
    if (deps_.lab_leases) {
      // Leases this node took on other nodes' boards count too.
      for (const auto& l : deps_.lab_leases->Mine()) held += l.identity == c.identity && IsLabLeaseId(l.lease_id);
    }
    if (held >= limits.leases) {
      return absl::ResourceExhaustedError(absl::StrCat("limit leases (", limits.leases, ") reached: you hold ", held,
                                                       "; release one (fwai hw release BOARD) and retry"));
    }
    return absl::OkStatus();
  }

  void Audit(nlohmann::json rec, const Caller& c) const {
    if (!deps_.audit) return;
    rec["principal"] = c.identity;
    rec["peer"] = c.peer;
    rec["by"] = c.display;
    deps_.audit(rec);
  }

  grpc::ServerUnaryReactor* Unavailable(grpc::CallbackServerContext* ctx) {
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the hardware broker is not running"));
    return r;
  }

  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, std::function<absl::Status()> work) {
    auto* r = ctx->DefaultReactor();
    if (!deps_.hardware) {
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the hardware broker is not running"));
      return r;
    }
    if (!workers_.Submit([r, work = std::move(work)] { r->Finish(ToGrpcStatus(work())); })) {
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fwaid is shutting down"));
    }
    return r;
  }

  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* ctx, const pb::ListDevicesRequest*,
                                        pb::ListDevicesResponse* resp) override {
    auto c = CallerOf(ctx, "Hardware.ListDevices");
    if (!c.ok()) return Refuse(ctx, c.status());
    return Run(ctx, [this, resp] {
      // In a lab, leases of the lab show who holds boards of every node.
      std::map<std::string, lab::LabLease> lab_holders;
      std::optional<lab::LabView> view;
      if (deps_.lab_leases) {
        auto all = deps_.lab_leases->All();
        auto v = all.ok() ? lab::ReadLab(*deps_.lab_etcd) : absl::StatusOr<lab::LabView>(all.status());
        if (v.ok()) {
          view = *std::move(v);
          for (auto& l : *all) lab_holders[l.board] = std::move(l);
        } else {
          resp->set_lab_error(std::string(v.status().message()));
        }
      }
      std::set<std::string> local;
      for (const auto& d : deps_.hardware->List()) {
        local.insert(d.id);
        auto* o = resp->add_devices();
        o->set_id(d.id);
        o->set_kind(d.kind);
        o->set_name(d.name);
        o->set_health(d.health);
        o->set_health_reason(d.health_reason);
        TagsToProto(d.tags, o);
        o->set_vid_pid(d.vid_pid);
        o->set_serial_number(d.serial_number);
        o->set_path(d.path);
        o->set_holder(d.holder);
        o->set_held_since_us(d.held_since_us);
        o->set_target(d.target);
        o->set_image(d.image);
        o->set_image_sha256(d.image_sha256);
        o->set_running(d.running);
        o->set_lease_expires_us(d.lease_expires_us);
        o->set_state(d.state.empty() ? (d.running ? "running" : "stopped") : d.state);
        o->set_pid(d.pid > 0 ? d.pid : 0);
        o->set_ota_version(d.ota_version);
        o->set_node(deps_.lab_node);
        if (auto it = lab_holders.find(d.id); d.holder.empty() && it != lab_holders.end()) {
          o->set_holder(it->second.holder + " via " + it->second.via);
          o->set_held_since_us(it->second.acquired_us);
        }
      }
      for (const auto& l : deps_.hardware->Leases()) ToProto(l, resp->add_leases());
      if (view) {
        for (const auto& b : view->boards) {
          if (b.node == deps_.lab_node || local.count(b.id)) continue;
          auto* o = resp->add_devices();
          o->set_id(b.id);
          o->set_kind(b.kind);
          o->set_name(b.name);
          o->set_health(b.health);
          o->set_health_reason(b.health_reason);
          TagsToProto(b.tags, o);
          o->set_target(b.target);
          o->set_state("remote");
          o->set_node(b.node);
          if (auto it = lab_holders.find(b.id); it != lab_holders.end()) {
            o->set_holder(it->second.holder + " via " + it->second.via);
            o->set_held_since_us(it->second.acquired_us);
            o->set_lease_expires_us(it->second.expires_us);
            ToProto(it->second, resp->add_leases());
          }
        }
      }
      return absl::OkStatus();
    });
  }

  // True when a device of this node answers the request (by id, or tags).
  bool IsLocal(const std::string& device_id, const std::vector<std::string>& tags) const {
    for (const auto& d : deps_.hardware->List()) {
      if (!device_id.empty()) {
        if (d.id == device_id) return true;
        continue;
      }
      bool all = true;
      for (const auto& t : tags) all = all && std::find(d.tags.begin(), d.tags.end(), t) != d.tags.end();
      if (all) return true;
    }
    return false;
  }

  // A lease on a board of this node, or (in a lab) of any node through etcd.
  absl::StatusOr<pb::Lease> AcquireAny(const Caller& c, const std::string& device_id,
                                       const std::vector<std::string>& tags, int ttl_s, int wait_s,
                                       const std::function<bool()>& cancelled, bool ci = false) {
    pb::Lease out;
    if (deps_.lab_leases && wait_s > 0 && IsLocal(device_id, tags)) {
      return AcquireLocalInLabQueue(c, device_id, tags, ttl_s, wait_s, cancelled, ci);
    }
    if (!deps_.lab_leases || IsLocal(device_id, tags)) {
      auto l = deps_.hardware->Acquire(c, device_id, tags, ttl_s, wait_s, cancelled);
      if (!l.ok()) return l.status();
      if (deps_.lab_leases) {
        // The lab must know: no other node may hand this board out meanwhile.
        absl::Status claimed;
        if (l->renewed) {
          claimed = deps_.lab_leases->Renew(l->lease_id, l->identity, true).status();
        } else {
          lab::LabLease ll;
          ll.lease_id = l->lease_id;
          ll.board = l->device_id;
          ll.node = deps_.lab_node;
          ll.holder = l->holder;
          ll.identity = l->identity;
          ll.session_id = l->session_id;
          ll.ttl_s = l->ttl_s;
          claimed = deps_.lab_leases->Claim(ll);
        }
        if (!claimed.ok()) {
          if (!l->renewed) (void)deps_.hardware->Release(c, l->lease_id, "", false);
          return claimed;
        }
      }
      ToProto(*l, &out);
      out.set_node(deps_.lab_node);
      return out;
    }
    ASSIGN_OR_RETURN(lab::LabLeases::Request r, LabRequest(c, device_id, tags, ttl_s, wait_s, ci));
    auto l = deps_.lab_leases->Acquire(r, cancelled);
    if (!l.ok()) return l.status();
    ToProto(*l, &out);
    return out;
  }

  // A request for a lease in the lab's queue: the TTL (the default when 0)
  // and the wait checked against the hardware limits.
  absl::StatusOr<lab::LabLeases::Request> LabRequest(const Caller& c, const std::string& device_id,
                                                     const std::vector<std::string>& tags,
                                                     int ttl_s, int wait_s, bool ci) const {
    const HardwareConfig& hc = deps_.config->hardware;
    if (ttl_s <= 0) ttl_s = hc.default_ttl_s;
    if (ttl_s > hc.max_ttl_s) {
      return absl::InvalidArgumentError(
          absl::StrCat("ttl ", ttl_s, " s is above the limit of ", hc.max_ttl_s, " s"));
    }
    if (wait_s < 0 || wait_s > 86400) {
      return absl::InvalidArgumentError("wait must be 0..86400 seconds");
    }
    lab::LabLeases::Request r;
    r.board = device_id;
    r.tags = tags;
    r.holder = c.display.empty() ? c.identity : c.display;
    r.identity = c.identity;
    r.session_id = c.session_id;
    r.ttl_s = ttl_s;
    r.wait_s = wait_s;
    r.ci = ci;
    return r;
  }

  // A caller of a bench of a lab who waits for one of its boards waits in
  // the lab's queue with everyone else (whoever holds the board, through
  // whichever node), in its turn: the lab lease it is served is claimed
  // under the id of the local lease it then takes here. The stand-in of a
  // lease held through a front is gone once that lease is (within a second).
  absl::StatusOr<pb::Lease> AcquireLocalInLabQueue(const Caller& c, const std::string& device_id,
                                                   const std::vector<std::string>& tags, int ttl_s,
                                                   int wait_s,
                                                   const std::function<bool()>& cancelled,
                                                   bool ci) {
    ASSIGN_OR_RETURN(lab::LabLeases::Request r, LabRequest(c, device_id, tags, ttl_s, wait_s, ci));
    r.node = deps_.lab_node;
    r.lease_id = NewId("lease");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(r.wait_s);
    auto ll = deps_.lab_leases->Acquire(r, cancelled);
    if (!ll.ok()) return ll.status();
    // The board is this caller's in the lab; here, once the previous
    // holder's stand-in has gone.
    const int left_s =
        static_cast<int>(std::max<int64_t>(5, std::chrono::duration_cast<std::chrono::seconds>(
                                                  deadline - std::chrono::steady_clock::now())
                                                  .count()));
    auto l = deps_.hardware->Acquire(c, ll->board, {}, r.ttl_s, std::min(left_s, 30), cancelled,
                                     ll->lease_id);
    if (!l.ok()) {
      (void)deps_.lab_leases->Release(ll->lease_id, "", c.identity, false, false);
      return l.status();
    }
    pb::Lease out;
    ToProto(*l, &out);
    out.set_node(deps_.lab_node);
    return out;
  }

  static bool IsLabLeaseId(const std::string& id) { return id.rfind("lab-", 0) == 0; }

  // `holder`, when given, gets the holder's principal (an admin may renew another's lease).
  absl::StatusOr<pb::Lease> RenewAny(const Caller& c, const std::string& lease_id, std::string* holder = nullptr) {
    pb::Lease out;
    if (deps_.lab_leases && IsLabLeaseId(lease_id)) {
      auto l = deps_.lab_leases->Renew(lease_id, c.identity, c.admin);
      if (!l.ok()) return l.status();
      if (holder) *holder = l->identity;
      ToProto(*l, &out);
      return out;
    }
    auto l = deps_.hardware->Renew(c, lease_id);
    if (!l.ok()) return l.status();
    if (holder) *holder = l->identity;
    if (deps_.lab_leases) {
      auto lab = deps_.lab_leases->Renew(lease_id, l->identity, true);
      if (absl::IsNotFound(lab.status())) {
        // The lab let it lapse (etcd lost it): the board is no longer ours.
        (void)deps_.hardware->Release(c, lease_id, "", false);
        return absl::NotFoundError(absl::StrCat("lease ", lease_id, " on ", l->device_id,
                                                " has expired in the lab; take the board again"));
      }
      if (!lab.ok()) return lab.status();
    }
    ToProto(*l, &out);
    out.set_node(deps_.lab_node);
    return out;
  }

  // The lease ended, with who held it.
  absl::StatusOr<LeaseRecord> ReleaseAny(const Caller& c, const std::string& lease_id, const std::string& device_id,
                                         bool force) {
    if (deps_.lab_leases &&
        (IsLabLeaseId(lease_id) || (lease_id.empty() && !device_id.empty() && !IsLocal(device_id, {})))) {
      auto l = deps_.lab_leases->Release(lease_id, device_id, c.identity, force, c.admin);
      if (!l.ok()) return l.status();
      LeaseRecord r;
      r.lease_id = l->lease_id;
      r.device_id = l->board;
      r.holder = l->holder;
      r.identity = l->identity;
      return r;
    }
    auto l = deps_.hardware->Release(c, lease_id, device_id, force);
    if (!l.ok()) return l.status();
    if (deps_.lab_leases) {
      auto lab = deps_.lab_leases->Release(l->lease_id, "", l->identity, true, true);
      if (!lab.ok() && !absl::IsNotFound(lab.status())) {
        spdlog::warn("lab: lease {} released here but not in etcd ({}); it lapses with its TTL", l->lease_id,
                     lab.status().ToString());
      }
    }
    return l;
  }

  grpc::ServerUnaryReactor* Who(grpc::CallbackServerContext* ctx, const pb::WhoRequest*,
                                pb::WhoResponse* resp) override {
    auto c = CallerOf(ctx, "Hardware.Who");
    if (!c.ok()) return Refuse(ctx, c.status());
    return Run(ctx, [this, resp] {
      std::set<std::string> shown;
      for (const auto& l : deps_.hardware->Leases()) {
        // A bench's stand-in for another node's lab lease: the lab lease below says who.
        if (deps_.lab_leases && l.identity.rfind("lab:", 0) == 0) continue;
        ToProto(l, resp->add_leases());
        resp->mutable_leases(resp->leases_size() - 1)->set_node(deps_.lab_node);
        shown.insert(l.lease_id);
      }
      if (deps_.lab_leases) {
        // Every holder and waiter of the lab, whichever node they came through.
        auto all = deps_.lab_leases->All(/*exact_expiry=*/true);
        if (!all.ok()) return all.status();
        for (const auto& l : *all) {
          if (shown.count(l.lease_id)) continue;
          pb::Lease* o = resp->add_leases();
          ToProto(l, o);
          o->set_holder(l.holder + " via " + l.via);
        }
        auto queue = deps_.lab_leases->Queue();
        if (!queue.ok()) return queue.status();
        for (const auto& w : *queue) {
          auto* o = resp->add_waiters();
          o->set_holder(w.holder + " via " + w.via);
          o->set_wants(w.ci ? w.wants + " (ci)" : w.wants);
          for (const auto& id : w.candidates) o->add_device_ids(id);
          o->set_position(w.position);
          o->set_since_us(w.since_us);
          o->set_until_us(w.until_us);
          o->set_node(w.via);
          o->set_session_id(w.session_id);
        }
      }
      for (const auto& w : deps_.hardware->Waiters()) {
        auto* o = resp->add_waiters();
        o->set_holder(w.holder);
        o->set_wants(w.wants);
        for (const auto& id : w.candidates) o->add_device_ids(id);
        o->set_position(w.position);
        o->set_since_us(w.since_us);
        o->set_until_us(w.until_us);
        o->set_session_id(w.session_id);
        o->set_node(deps_.lab_node);
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req,
                                    pb::Lease* resp) override {
    auto admitted = CallerAndBandOf(ctx, "Hardware.Acquire", req->session_id());
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = admitted->first, ci = admitted->second, req, resp, ctx] {
      if (auto s = LeaseLimits(c, req->ttl_s()); !s.ok()) return s;
      auto l = AcquireAny(c, req->device_id(), TagsOf(req->tags()), req->ttl_s(), req->wait_s(),
                          [ctx] { return ctx->IsCancelled(); }, ci);
      if (!l.ok()) return l.status();
      *resp = *l;
      Audit({{"kind", "lease_acquired"}, {"lease_id", l->lease_id()}, {"board", l->device_id()}, {"ttl_s", l->ttl_s()},
             {"node", l->node()}},
            c);
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<pb::Lease>* Hold(grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req) override {
    class Reactor final : public grpc::ServerWriteReactor<pb::Lease> {
     public:
      struct State {
        QueuedWriter<pb::Lease> writer;
        std::atomic<bool> gone{false};
        std::mutex mu;
        std::condition_variable cv;
        std::optional<grpc::Status> revoked;  // under mu: the gate's status when the token went
      };
      Reactor(HardwareService* svc, grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req)
          : state_(std::make_shared<State>()) {
        state_->writer.Bind([this](const pb::Lease* m) { StartWrite(m); }, [this](grpc::Status s) { Finish(std::move(s)); });
        if (!svc->deps_.hardware) {
          state_->writer.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the hardware broker is not running"));
          return;
        }
        auto who = svc->deps_.gate->Admit(ctx, "Hardware.Hold");
        if (!who.ok()) {
          state_->writer.Close(ToGrpcStatus(who.status()));
          return;
        }
        Caller c = CallerFor(*who, ctx, "", req->session_id());
        const bool ci = who->role == Role::kCi;
        if (auto s = svc->LeaseLimits(c, req->ttl_s()); !s.ok()) {
          state_->writer.Close(ToGrpcStatus(s));
          return;
        }
        // A revoked or expired token ends the hold as a cancel does (the
        // lease is released, not renewed again), and the stream with the
        // gate's status.
        ticket_ = svc->deps_.gate->Track(*who, ctx, [st = state_](const grpc::Status& why) {
          std::lock_guard lock(st->mu);
          st->revoked = why;
          st->gone = true;
          st->cv.notify_all();
        });
        pb::AcquireRequest copy = *req;
        // One thread per held lease: it may wait for the board, then renews
        // until the stream ends and releases at once.
        svc->holds_++;
        std::thread([st = state_, svc, c, ci, copy] {
          struct Done {
            HardwareService* svc;
            ~Done() { svc->holds_--; }
          } done{svc};
          auto l = svc->AcquireAny(c, copy.device_id(), TagsOf(copy.tags()), copy.ttl_s(), copy.wait_s(),
                                   [st] { return st->gone.load(); }, ci);
          // The status the stream ends with when it was ended from here:
          // the gate's when the token went, else `otherwise`.
          auto final_status = [&st](const grpc::Status& otherwise) {
            std::lock_guard lock(st->mu);
            return st->revoked ? *st->revoked : otherwise;
          };
          if (!l.ok()) {
            st->writer.Close(final_status(ToGrpcStatus(l.status())));
            return;
          }
          st->writer.Push(*l);
          svc->Audit({{"kind", "lease_acquired"}, {"lease_id", l->lease_id()}, {"board", l->device_id()},
                      {"ttl_s", l->ttl_s()}, {"held", true}, {"node", l->node()}},
                     c);
          const auto period = std::chrono::milliseconds(std::max(200, l->ttl_s() * 1000 / 3));
          std::unique_lock lock(st->mu);
          absl::Status ended;
          while (!st->gone) {
            st->cv.wait_for(lock, period);
            if (st->gone) break;
            auto renewed = svc->RenewAny(c, l->lease_id());
            // Ended by someone else, or expired: the holder hears of it. An
            // unreachable etcd is retried until the lease's own end.
            if (!renewed.ok() && !absl::IsUnavailable(renewed.status())) {
              ended = renewed.status();
              break;
            }
          }
          lock.unlock();
          if (svc->ReleaseAny(c, l->lease_id(), "", false).ok()) {
            nlohmann::json rec = {
                {"kind", "lease_released"}, {"lease_id", l->lease_id()}, {"board", l->device_id()}};
            if (auto t = svc->deps_.hardware->TakeTranscript(l->lease_id()); !t.is_null())
              rec["serial_transcript"] = t;
            svc->Audit(rec, c);
          }
          st->writer.Close(ended.ok() ? final_status(grpc::Status(grpc::StatusCode::CANCELLED, "lease released"))
                                      : ToGrpcStatus(ended));
        }).detach();
      }
      void OnWriteDone(bool ok) override { state_->writer.OnWriteDone(ok); }
      void OnCancel() override {
        std::lock_guard lock(state_->mu);
        state_->gone = true;
        state_->cv.notify_all();
      }
      void OnDone() override {
        ticket_.reset();  // first: the gate no longer ends a stream that is gone
        delete this;
      }

     private:
      std::shared_ptr<State> state_;
      std::unique_ptr<Gate::Ticket> ticket_;
    };
    return new Reactor(this, ctx, req);
  }

  grpc::ServerUnaryReactor* Renew(grpc::CallbackServerContext* ctx, const pb::RenewRequest* req,
                                  pb::Lease* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.Renew");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp] {
      if (req->lease_id().empty()) return absl::InvalidArgumentError("lease_id: required");
      std::string holder;
      auto l = RenewAny(c, req->lease_id(), &holder);
      if (!l.ok()) return l.status();
      *resp = *l;
      Audit({{"kind", "lease_renewed"}, {"lease_id", l->lease_id()}, {"board", l->device_id()},
             {"expires_us", l->expires_us()}, {"holder", holder}, {"admin_override", holder != c.identity}},
            c);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const pb::ReleaseRequest* req,
                                    pb::ReleaseResponse*) override {
    auto admitted = CallerOf(ctx, "Hardware.Release");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req] {
      if (req->lease_id().empty() && req->device_id().empty()) {
        return absl::InvalidArgumentError("lease_id or device_id: one is required");
      }
      if (req->force() && !c.admin) {
        return absl::PermissionDeniedError(
            "force: taking another holder's lease is for admins (rule: admin); ask its holder or an admin");
      }
      auto l = ReleaseAny(c, req->lease_id(), req->device_id(), req->force());
      if (!l.ok()) return l.status();
      const bool kick = l->identity != c.identity;
      nlohmann::json rec = {{"kind", kick ? "lease_kicked" : "lease_released"},
                            {"lease_id", l->lease_id},
                            {"board", l->device_id},
                            {"holder", l->identity},
                            {"holder_name", l->holder},
                            {"admin_override", kick}};
      if (auto t = deps_.hardware->TakeTranscript(l->lease_id); !t.is_null())
        rec["serial_transcript"] = t;
      Audit(rec, c);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Reset(grpc::CallbackServerContext* ctx, const pb::ResetRequest* req,
                                  pb::ResetResponse*) override {
    auto admitted = CallerOf(ctx, "Hardware.Reset", req->lease_id());
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req] {
      auto remote = RemoteLease(c, req->device_id(), req->lease_id());
      if (!remote.ok()) return remote.status();
      if (remote->has_value()) {
        auto s = ForwardReset(links_, **remote);
        if (s.ok()) Audit({{"kind", "board_reset"}, {"board", (*remote)->board}, {"node", (*remote)->node}}, c);
        return s;
      }
      auto board = deps_.hardware->ResolveBoard(req->device_id(), c);
      if (!board.ok()) return board.status();
      auto s = deps_.hardware->Reset(c, *board);
      if (s.ok()) Audit({{"kind", "board_reset"}, {"board", *board}}, c);
      return s;
    });
  }

  grpc::ServerUnaryReactor* SetHealth(grpc::CallbackServerContext* ctx, const pb::SetHealthRequest* req,
                                      pb::SetHealthResponse*) override {
    auto admitted = CallerOf(ctx, "Hardware.SetHealth");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req] {
      auto s = deps_.hardware->SetHealth(c, req->device_id(), req->health(), req->reason());
      if (s.ok()) {
        Audit({{"kind", "board_health"}, {"board", req->device_id()}, {"health", req->health()}, {"reason", req->reason()}},
              c);
      }
      return s;
    });
  }

  grpc::ServerUnaryReactor* SelfTest(grpc::CallbackServerContext* ctx, const pb::SelfTestRequest* req,
                                     pb::SelfTestResponse* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.SelfTest");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp] {
      auto board = deps_.hardware->ResolveBoard(req->device_id(), c);
      if (!board.ok()) return board.status();
      auto r = deps_.hardware->SelfTest(c, *board);
      if (!r.ok()) return r.status();
      resp->set_report(*r);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Debug(grpc::CallbackServerContext* ctx, const pb::DebugRequest* req,
                                  pb::DebugResponse* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.Debug", req->lease_id());
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp] {
      std::vector<std::string> cmds(req->commands().begin(), req->commands().end());
      auto remote = RemoteLease(c, req->device_id(), req->lease_id());
      if (!remote.ok()) return remote.status();
      if (remote->has_value()) {
        std::string json;
        auto outputs = ForwardDebug(links_, **remote, cmds, req->timeout_s(), &json);
        if (!outputs.ok()) return outputs.status();
        for (const auto& o : *outputs) resp->add_outputs(o);
        resp->set_result_json(json);
        return absl::OkStatus();
      }
      auto board = deps_.hardware->ResolveBoard(req->device_id(), c);
      if (!board.ok()) return board.status();
      auto r = deps_.hardware->Debug(c, *board, cmds, req->timeout_s() > 0 ? req->timeout_s() * 1000 : 10000);
      if (!r.ok()) return r.status();
      for (const auto& o : r->outputs) resp->add_outputs(o);
      resp->set_result_json(r->results.dump());
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<pb::FlashProgress>* Flash(grpc::CallbackServerContext* ctx,
                                                     const pb::FlashRequest* req) override {
    auto* svc = this;
    using Stream = WorkStreamReactor<pb::FlashProgress>;
    return Stream::Serve(svc->deps_.hardware != nullptr, "the hardware broker is not running", [&](Stream& stream, const std::shared_ptr<Stream::State>& st) {
      auto who = svc->deps_.gate->Admit(ctx, "Hardware.Flash");
      if (!who.ok()) {
        st->writer.Close(ToGrpcStatus(who.status()));
        return;
      }
      // A revoked or expired token ends the stream and cancels the flash.
      stream.Track(*svc->deps_.gate, *who, ctx);
      pb::FlashRequest copy = *req;
      auto work = [st, svc, c = CallerFor(*who, ctx, req->lease_id()), copy] {
        auto remote = svc->RemoteLease(c, copy.device_id(), copy.lease_id());
        if (!remote.ok()) {
          st->writer.Close(ToGrpcStatus(remote.status()));
          return;
        }
        auto board = remote->has_value() ? absl::StatusOr<std::string>((*remote)->board)
                                         : svc->deps_.hardware->ResolveBoard(copy.device_id(), c);
        if (!board.ok()) {
          st->writer.Close(ToGrpcStatus(board.status()));
          return;
        }
        // The policy's flash settings (project and organisation): which
        // boards, whether a person must approve, whether sources must be older.
        std::string root = copy.project_root().empty() ? FindProjectRoot(copy.image_path()) : copy.project_root();
        bool approved = copy.approved();
        auto rules = LoadPolicy(root, svc->deps_.config ? svc->deps_.config->policy_file : "");
        if (!rules.ok()) {
          st->writer.Close(ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat("policy: ", rules.status().message()))));
          return;
        }
        PolicyDecision d = CheckFlashPolicy(*rules, *board, approved);
        if (!d.allowed && d.rule.rfind("flash.allowed_boards", 0) == 0) {
          if (svc->deps_.evidence) {
            (void)svc->deps_.evidence->Append({{"kind", "policy_refusal"}, {"action", "flash"}, {"board", *board},
                                               {"image", copy.image_path()}, {"rule", d.rule}, {"by", c.display}});
          }
          st->writer.Close(ToGrpcStatus(absl::PermissionDeniedError(absl::StrCat("refused by policy (", d.rule, "): ", d.reason))));
          return;
        }
        if (!rules->flash_require_approval) approved = true;  // waived by the policy
        auto progress = [st](const FlashProgressUpdate& u) {
          pb::FlashProgress p;
          p.set_stage(u.stage);
          p.set_fraction(u.fraction);
          p.set_message(u.message);
          st->writer.Push(std::move(p));
        };
        if (remote->has_value()) {
          // A board of another node: its bench flashes the bytes sent from here.
          FrontFlashGuard guard;
          guard.project_root = root;
          guard.policy.check_fresh = rules->flash_require_fresh;
          guard.policy.require_verified_toolchain = rules->flash_require_verified_toolchain;
          guard.policy.flash_max_pct = rules->memory_flash_max_pct;
          guard.policy.ram_max_pct = rules->memory_ram_max_pct;
          guard.policy.max_growth_bytes = rules->memory_max_growth_bytes;
          guard.build_record = [hw = svc->deps_.hardware](const std::string& sha) {
            return hw->BuildRecordOf(sha);
          };
          auto r = ForwardFlash(svc->links_, **remote, c, copy.image_path(), approved, progress,
                                &st->cancel, guard);
          if (!r.ok()) {
            st->writer.Close(ToGrpcStatus(r.status()));
            return;
          }
          svc->Audit({{"kind", "lab_flash"}, {"board", *board}, {"node", (*remote)->node},
                      {"lease_id", (*remote)->lease_id}, {"image", copy.image_path()}, {"image_sha256", r->sha256}},
                     c);
          pb::FlashProgress done;
          done.set_stage("done");
          done.set_fraction(1);
          done.set_done(true);
          done.set_image_sha256(r->sha256);
          done.set_boot_line(r->boot_line);
          done.set_seconds(r->seconds);
          done.set_message(absl::StrCat("flashed ", *board, " on ", (*remote)->node));
          st->writer.Push(std::move(done));
          st->writer.Close(grpc::Status::OK);
          return;
        }
        FlashGuardPolicy guard;
        guard.check_fresh = rules->flash_require_fresh;
        guard.require_verified_toolchain = rules->flash_require_verified_toolchain;
        guard.flash_max_pct = rules->memory_flash_max_pct;
        guard.ram_max_pct = rules->memory_ram_max_pct;
        guard.max_growth_bytes = rules->memory_max_growth_bytes;
        auto r = svc->deps_.hardware->Flash(
            c, *board, copy.image_path(), approved, copy.project_root(), progress, &st->cancel, guard);
        if (!r.ok()) {
          st->writer.Close(ToGrpcStatus(r.status()));
          return;
        }
        pb::FlashProgress done;
        done.set_stage("done");
        done.set_fraction(1);
        done.set_done(true);
        done.set_image_sha256(r->sha256);
        done.set_boot_line(r->boot_line);
        done.set_seconds(r->seconds);
        done.set_message(absl::StrCat("flashed ", *board));
        st->writer.Push(std::move(done));
        st->writer.Close(grpc::Status::OK);
      };
      if (!svc->workers_.Submit(std::move(work))) {
        st->writer.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fwaid is shutting down"));
      }
    });
  }

  grpc::ServerBidiReactor<pb::SerialClientMessage, pb::SerialServerMessage>* Serial(
      grpc::CallbackServerContext* ctx) override {
    SerialHooks hooks;
    // The opener, kept for the stream's life so that its token is watched.
    auto who = std::make_shared<Principal>();
    hooks.admit = [this, ctx, who](const pb::SerialOpen& o) -> absl::StatusOr<Caller> {
      auto p = deps_.gate->Admit(ctx, "Hardware.Serial");
      if (!p.ok()) return p.status();
      *who = *std::move(p);
      return CallerFor(*who, ctx, o.lease_id());
    };
    hooks.track = [this, ctx, who](std::function<void(const grpc::Status&)> end) {
      return deps_.gate->Track(*who, ctx, std::move(end));
    };
    if (deps_.lab_leases) {
      hooks.relay = [this](const Caller& c, const pb::SerialOpen& o) -> absl::StatusOr<std::optional<SerialRelay>> {
        auto remote = RemoteLease(c, o.device_id(), o.lease_id());
        if (!remote.ok()) return remote.status();
        if (!remote->has_value()) return std::optional<SerialRelay>();
        auto channel = links_.ChannelTo((*remote)->node);
        if (!channel.ok()) return channel.status();
        SerialRelay r;
        r.channel = *channel;
        r.open = o;
        r.open.set_device_id((*remote)->board);
        r.open.set_lease_id((*remote)->lease_id);
        return std::optional<SerialRelay>(std::move(r));
      };
    }
    return new SerialReactor(deps_.hardware, std::move(hooks));
  }

  // On a front: the caller's lab lease when the request is for a board of
  // another node (nullopt for this node's boards). FAILED_PRECONDITION when
  // the board is another node's and the caller holds no lease on it.
  absl::StatusOr<std::optional<lab::LabLease>> RemoteLease(const Caller& c, const std::string& device_id,
                                                           const std::string& lease_id) const {
    if (!deps_.lab_leases) return std::optional<lab::LabLease>();
    if (!device_id.empty() && IsLocal(device_id, {})) return std::optional<lab::LabLease>();
    if (device_id.empty() && !IsLabLeaseId(lease_id)) {
      // "" picks the caller's leased board: a local one first.
      for (const auto& l : deps_.hardware->Leases()) {
        if (l.identity == c.identity) return std::optional<lab::LabLease>();
      }
    }
    std::vector<lab::LabLease> found;
    for (const auto& l : deps_.lab_leases->Mine()) {
      if (!IsLabLeaseId(l.lease_id) || l.identity != c.identity) continue;
      if (!device_id.empty() && l.board != device_id) continue;
      if (!lease_id.empty() && l.lease_id != lease_id) continue;
      found.push_back(l);
    }
    if (found.size() == 1) return std::optional<lab::LabLease>(found[0]);
    // A lab lease id that is not one of the caller's: as unknown (another
    // holder's lease is not revealed).
    if (found.empty() && IsLabLeaseId(lease_id)) {
      return absl::NotFoundError(absl::StrCat("no lab lease ", lease_id, " of yours",
                                              device_id.empty() ? "" : " on board " + device_id,
                                              " (rule: a lease is used by its holder only)"));
    }
    if (device_id.empty()) {
      if (found.empty()) return std::optional<lab::LabLease>();  // the local broker says what is missing
      return absl::FailedPreconditionError("you hold several boards of the lab: name one (--board)");
    }
    // Somebody else holds the board: refused, naming the rule.
    if (auto holder = deps_.lab_leases->Holder(device_id);
        holder.ok() && holder->has_value() &&
        ((*holder)->identity != c.identity || (*holder)->via != deps_.lab_node)) {
      return absl::PermissionDeniedError(
          absl::StrCat("board ", device_id, " is held by ", (*holder)->holder,
                       "; only its holder works on it (rule: the board's lease holder)"));
    }
    return absl::FailedPreconditionError(absl::StrCat("board ", device_id,
                                                      " is not on this node and you hold no lab lease on it "
                                                      "(fwai hw lease ",
                                                      device_id, ")"));
  }

 private:
  const ApiDeps deps_;
  ThreadPool workers_;
  mutable LabLinks links_{deps_};
  std::atomic<int> holds_{0};
};

}  // namespace

std::unique_ptr<grpc::Service> MakeHardwareService(const ApiDeps& deps) {
  return std::make_unique<HardwareService>(deps);
}

}  // namespace fwai
