// Hardware: the board contract (server/boards) over gRPC — devices, leases,
// flash, serial, debug — translated, whichever node hosts the board. Long
// operations (waiting acquires, flashing, GDB) run on the service's own
// threads so they never hold up the shared pool.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/queued_writer.h"
#include "server/api/serial_reactor.h"
#include "server/auth/principal.h"
#include "server/boards/boards.h"
#include "server/boards/leases.h"
#include "server/boards/watches.h"
#include "server/hardware/broker.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;

void ToProto(const BoardLease& l, pb::Lease* out) {
  out->set_lease_id(l.lease_id);
  out->set_device_id(l.board);
  out->set_holder(l.holder);
  out->set_acquired_us(l.acquired_us);
  out->set_expires_us(l.expires_us);
  out->set_ttl_s(l.ttl_s);
  out->set_session_id(l.session_id);
  out->set_node(l.node);
}

void ToProto(const ListedBoard& b, pb::Device* o) {
  const DeviceInfo& d = b.device;
  o->set_id(d.id);
  o->set_kind(d.kind);
  o->set_name(d.name);
  o->set_health(d.health);
  o->set_health_reason(d.health_reason);
  for (const auto& t : d.tags) {
    auto* tag = o->add_tags();
    auto eq = t.find(':');
    tag->set_key(eq == std::string::npos ? t : t.substr(0, eq));
    if (eq != std::string::npos) tag->set_value(t.substr(eq + 1));
  }
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
  o->set_state(d.state);
  o->set_pid(d.pid > 0 ? d.pid : 0);
  o->set_ota_version(d.ota_version);
  o->set_node(b.node);
  for (const auto& [id, name] : d.streams) {
    auto* s = o->add_streams();
    s->set_id(id);
    s->set_name(name);
  }
}

void ToProto(const BoardWaiter& w, pb::LeaseWaiter* o) {
  o->set_holder(w.holder);
  o->set_wants(w.wants);
  for (const auto& id : w.candidates) o->add_device_ids(id);
  o->set_position(w.position);
  o->set_since_us(w.since_us);
  o->set_until_us(w.until_us);
  o->set_node(w.node);
  o->set_session_id(w.session_id);
}

std::vector<std::string> TagsOf(const google::protobuf::RepeatedPtrField<pb::Tag>& tags) {
  std::vector<std::string> out;
  for (const auto& t : tags) out.push_back(t.value().empty() ? t.key() : t.key() + ":" + t.value());
  return out;
}

class HardwareService final : public pb::Hardware::CallbackService {
 public:
  explicit HardwareService(ApiDeps deps) : deps_(std::move(deps)), workers_(16) {}
  ~HardwareService() override {
    // Held-lease threads end when their streams are cancelled at shutdown.
    for (int i = 0; i < 300 && holds_ > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  absl::StatusOr<Caller> CallerOf(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                  const std::string& lease_id = "",
                                  const std::string& session_id = "") const {
    return AdmitCaller(deps_, ctx, rpc, lease_id, session_id);
  }
  // As CallerOf, and whether its role is ci (the lab's queue serves it in the CI band).
  absl::StatusOr<std::pair<Caller, bool>> CallerAndBandOf(grpc::CallbackServerContext* ctx,
                                                          std::string_view rpc,
                                                          const std::string& session_id) const {
    auto p = deps_.gate->Admit(ctx, rpc);
    if (!p.ok()) return p.status();
    Caller c = CallerFor(*p, ctx, "", session_id);
    // A lease its holder keeps by hand ends when the token it was taken
    // with is revoked (the work of a stream, a run or a rollout ends with
    // the token and releases its own lease once it has put the board back).
    c.token_id = p->token_id;
    return std::make_pair(std::move(c), p->role == Role::kCi);
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
      return absl::ResourceExhaustedError(
          absl::StrCat("limit lease_ttl_max_s (", limits.lease_ttl_max_s,
                       " s): ask for a shorter ttl and renew it (fwai hw lease --hold)"));
    }
    const int64_t held = deps_.leases->HeldBy(c.identity);
    if (held >= limits.leases) {
      return absl::ResourceExhaustedError(
          absl::StrCat("limit leases (", limits.leases, ") reached: you hold ", held,
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

  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx,
                                std::function<absl::Status()> work) {
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

  grpc::ServerUnaryReactor* ListDevices(grpc::CallbackServerContext* ctx,
                                        const pb::ListDevicesRequest*,
                                        pb::ListDevicesResponse* resp) override {
    auto c = CallerOf(ctx, "Hardware.ListDevices");
    if (!c.ok()) return Refuse(ctx, c.status());
    return Run(ctx, [this, c = *c, resp] {
      BoardListing listing = deps_.leases->List();
      for (const auto& b : listing.boards) ToProto(b, resp->add_devices());
      for (const auto& l : listing.leases) {
        pb::Lease* out = resp->add_leases();
        ToProto(l, out);
        // As Release and Renew see it: the same principal (a unix account
        // only through the node it was taken on).
        out->set_yours(!l.identity.empty() && l.identity == c.identity &&
                       (!absl::StartsWith(l.identity, "uid:") || l.via.empty() ||
                        l.via == deps_.boards->node()));
      }
      resp->set_lab_error(listing.lab_error);
      for (const auto& d : listing.lab_error_detail) resp->add_lab_error_detail(d);
      return absl::OkStatus();
    });
  }

  static LeaseRequest RequestOf(const pb::AcquireRequest& req, bool ci) {
    LeaseRequest r;
    r.board = req.device_id();
    r.tags = TagsOf(req.tags());
    r.ttl_s = req.ttl_s();
    r.wait_s = req.wait_s();
    r.ci = ci;
    return r;
  }

  grpc::ServerUnaryReactor* Who(grpc::CallbackServerContext* ctx, const pb::WhoRequest*,
                                pb::WhoResponse* resp) override {
    auto who_asks = deps_.gate->Admit(ctx, "Hardware.Who");
    if (!who_asks.ok()) return Refuse(ctx, who_asks.status());
    return Run(ctx, [this, p = *who_asks, resp] {
      ASSIGN_OR_RETURN(auto who, deps_.leases->Who());
      for (const auto& l : who.first) {
        pb::Lease* out = resp->add_leases();
        ToProto(l, out);
        // Which token holds a lease is its holder's (and the admins') to
        // know, and only of a token of this node.
        if (p.MaySee(l.identity) && (l.via.empty() || l.via == deps_.boards->node())) {
          out->set_token_id(l.token_id);
        }
      }
      for (const auto& w : who.second) ToProto(w, resp->add_waiters());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req,
                                    pb::Lease* resp) override {
    auto admitted = CallerAndBandOf(ctx, "Hardware.Acquire", req->session_id());
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = admitted->first, ci = admitted->second, req, resp, ctx] {
      if (auto s = LeaseLimits(c, req->ttl_s()); !s.ok()) return s;
      ASSIGN_OR_RETURN(BoardLease l, deps_.leases->Acquire(c, RequestOf(*req, ci),
                                                           [ctx] { return ctx->IsCancelled(); }));
      ToProto(l, resp);
      Audit({{"kind", "lease_acquired"},
             {"lease_id", l.lease_id},
             {"board", l.board},
             {"ttl_s", l.ttl_s},
             {"node", l.node}},
            c);
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<pb::Lease>* Hold(grpc::CallbackServerContext* ctx,
                                            const pb::AcquireRequest* req) override {
    using Stream = WorkStreamReactor<pb::Lease>;
    return Stream::Serve(
        deps_.hardware != nullptr, "the hardware broker is not running",
        [&](Stream& stream, const std::shared_ptr<Stream::State>& st) {
          auto who = deps_.gate->Admit(ctx, "Hardware.Hold");
          if (!who.ok()) {
            st->writer.Close(ToGrpcStatus(who.status()));
            return;
          }
          Caller c = CallerFor(*who, ctx, "", req->session_id());
          if (auto s = LeaseLimits(c, req->ttl_s()); !s.ok()) {
            st->writer.Close(ToGrpcStatus(s));
            return;
          }
          // A revoked or expired token ends the hold as a cancel does (the
          // lease is released, not renewed again), and the stream with the
          // gate's status.
          stream.TrackAndCancel(*deps_.gate, *who, ctx);
          // One thread per held lease (it may wait for the board, then holds
          // it for hours): the shared workers stay free.
          holds_++;
          std::thread([this, st, c, r = RequestOf(*req, who->role == Role::kCi)] {
            auto held = deps_.leases->Hold(c, r, st->cancel, [&](const BoardLease& l) {
              pb::Lease p;
              ToProto(l, &p);
              st->writer.Push(std::move(p));
              Audit({{"kind", "lease_acquired"},
                     {"lease_id", l.lease_id},
                     {"board", l.board},
                     {"ttl_s", l.ttl_s},
                     {"held", true},
                     {"node", l.node}},
                    c);
            });
            if (held.released) {
              nlohmann::json rec = {{"kind", "lease_released"},
                                    {"lease_id", held.lease->lease_id},
                                    {"board", held.lease->board}};
              if (!held.transcript.is_null()) rec["serial_transcript"] = held.transcript;
              Audit(rec, c);
            }
            // The gate's status when the token went, else why it ended.
            st->writer.Close(st->Final(
                held.status.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "lease released")
                                 : ToGrpcStatus(held.status)));
            holds_--;
          }).detach();
        });
  }

  grpc::ServerUnaryReactor* Renew(grpc::CallbackServerContext* ctx, const pb::RenewRequest* req,
                                  pb::Lease* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.Renew");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp] {
      if (req->lease_id().empty()) return absl::InvalidArgumentError("lease_id: required");
      ASSIGN_OR_RETURN(BoardLease l, deps_.leases->Renew(c, req->lease_id()));
      ToProto(l, resp);
      Audit({{"kind", "lease_renewed"},
             {"lease_id", l.lease_id},
             {"board", l.board},
             {"expires_us", l.expires_us},
             {"holder", l.identity},
             {"admin_override", l.identity != c.identity}},
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
            "force: taking another holder's lease is for admins (rule: admin); ask its holder or "
            "an admin");
      }
      auto l = deps_.leases->Release(c, req->lease_id(), req->device_id(), req->force());
      if (!l.ok()) return l.status();
      const bool kick = l->identity != c.identity;
      nlohmann::json rec = {{"kind", kick ? "lease_kicked" : "lease_released"},
                            {"lease_id", l->lease_id},
                            {"board", l->board},
                            {"holder", l->identity},
                            {"holder_name", l->holder},
                            {"admin_override", kick}};
      if (auto t = deps_.leases->TakeTranscript(l->lease_id); !t.is_null())
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
      ASSIGN_OR_RETURN(BoardRef board, deps_.boards->Resolve(c, req->device_id(), req->lease_id()));
      RETURN_IF_ERROR(deps_.boards->Reset(c, board));
      nlohmann::json rec = {{"kind", "board_reset"}, {"board", board.id}};
      if (const std::string& node = board.remote ? board.node : deps_.boards->node(); !node.empty())
        rec["node"] = node;
      Audit(rec, c);
      return absl::OkStatus();
    });
  }

  static WatchRule RuleOf(const pb::WatchRuleSpec& p) {
    WatchRule r;
    r.name = p.name();
    r.board = p.board();
    r.stream = p.stream() == "uart" ? "" : p.stream();
    r.pattern = p.pattern();
    r.count = p.count() > 0 ? p.count() : 1;
    r.within_s = p.within_s();
    r.capture = p.capture();
    r.notify = p.notify();
    r.wake_session = p.wake_session();
    r.min_interval_s = p.min_interval_s();
    r.source = p.source();
    return r;
  }
  static void WatchToProto(const WatchState& w, pb::Watch* out) {
    auto* r = out->mutable_rule();
    r->set_name(w.rule.name);
    r->set_board(w.rule.board);
    r->set_stream(w.rule.stream.empty() ? "uart" : w.rule.stream);
    r->set_pattern(w.rule.pattern);
    r->set_count(w.rule.count);
    r->set_within_s(w.rule.within_s);
    r->set_capture(w.rule.capture);
    r->set_notify(w.rule.notify);
    r->set_wake_session(w.rule.wake_session);
    r->set_min_interval_s(w.rule.min_interval_s);
    r->set_source(w.rule.source);
    out->set_owner(w.owner_display);
    out->set_fired(w.fired);
    out->set_held_back(w.suppressed);
    out->set_last_fired_us(w.last_fired_us);
    out->set_last_line(w.last_line);
    out->set_last_capture(w.last_capture);
    out->set_active(w.active);
    out->set_ended(w.ended);
    out->set_lines(w.lines);
  }

  grpc::ServerUnaryReactor* AddWatch(grpc::CallbackServerContext* ctx,
                                     const pb::AddWatchRequest* req, pb::Watch* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.AddWatch", req->lease_id());
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp]() -> absl::Status {
      if (!deps_.watches) return absl::UnavailableError("this fwaid runs no watches");
      ASSIGN_OR_RETURN(WatchState w,
                       deps_.watches->Add(c, RuleOf(req->rule()), req->project_root()));
      WatchToProto(w, resp);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListWatches(grpc::CallbackServerContext* ctx,
                                        const pb::ListWatchesRequest*,
                                        pb::ListWatchesResponse* resp) override {
    auto c = CallerOf(ctx, "Hardware.ListWatches");
    if (!c.ok()) return Refuse(ctx, c.status());
    return Run(ctx, [this, c = *c, resp]() -> absl::Status {
      if (!deps_.watches) return absl::UnavailableError("this fwaid runs no watches");
      for (const auto& w : deps_.watches->List(c)) WatchToProto(w, resp->add_watches());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* RemoveWatch(grpc::CallbackServerContext* ctx,
                                        const pb::RemoveWatchRequest* req,
                                        pb::RemoveWatchResponse*) override {
    auto c = CallerOf(ctx, "Hardware.RemoveWatch");
    if (!c.ok()) return Refuse(ctx, c.status());
    return Run(ctx, [this, c = *c, req]() -> absl::Status {
      if (!deps_.watches) return absl::UnavailableError("this fwaid runs no watches");
      return deps_.watches->Remove(c, req->board(), req->name());
    });
  }

  grpc::ServerUnaryReactor* SetHealth(grpc::CallbackServerContext* ctx,
                                      const pb::SetHealthRequest* req,
                                      pb::SetHealthResponse*) override {
    auto admitted = CallerOf(ctx, "Hardware.SetHealth");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req] {
      if (req->device_id().empty()) return absl::InvalidArgumentError("device_id: required");
      ASSIGN_OR_RETURN(BoardRef board, deps_.boards->Resolve(c, req->device_id()));
      RETURN_IF_ERROR(deps_.boards->SetHealth(c, board, req->health(), req->reason()));
      Audit({{"kind", "board_health"},
             {"board", board.id},
             {"health", req->health()},
             {"reason", req->reason()}},
            c);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* SelfTest(grpc::CallbackServerContext* ctx,
                                     const pb::SelfTestRequest* req,
                                     pb::SelfTestResponse* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.SelfTest");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp] {
      ASSIGN_OR_RETURN(BoardRef board, deps_.boards->Resolve(c, req->device_id()));
      ASSIGN_OR_RETURN(std::string report, deps_.boards->SelfTest(c, board));
      resp->set_report(report);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Debug(grpc::CallbackServerContext* ctx, const pb::DebugRequest* req,
                                  pb::DebugResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Hardware.Debug");
    if (!who.ok()) return Refuse(ctx, who.status());
    // A revoked or expired token ends the session's gdb at once and the call
    // with the gate's status.
    struct Revoked {
      Mutex mu;
      std::optional<grpc::Status> why ABSL_GUARDED_BY(mu);
      CancelToken cancel;
    };
    auto revoked = std::make_shared<Revoked>();
    std::shared_ptr<Gate::Ticket> ticket =
        deps_.gate->Track(*who, ctx, [revoked](const grpc::Status& why) {
          {
            MutexLock lock(&revoked->mu);
            revoked->why = why;
          }
          revoked->cancel.Cancel();
        });
    return Run(ctx, [this, c = CallerFor(*who, ctx, req->lease_id()), req, resp, revoked, ticket] {
      std::vector<std::string> cmds(req->commands().begin(), req->commands().end());
      ASSIGN_OR_RETURN(BoardRef board, deps_.boards->Resolve(c, req->device_id(), req->lease_id()));
      auto debugged = deps_.boards->Debug(
          c, board, cmds, req->timeout_s() > 0 ? req->timeout_s() * 1000 : 10000, &revoked->cancel);
      {
        MutexLock lock(&revoked->mu);
        if (revoked->why) return absl::UnauthenticatedError(revoked->why->error_message());
      }
      ASSIGN_OR_RETURN(DebugResult r, std::move(debugged));
      for (const auto& o : r.outputs) resp->add_outputs(o);
      resp->set_result_json(r.results.dump());
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<pb::FlashProgress>* Flash(grpc::CallbackServerContext* ctx,
                                                     const pb::FlashRequest* req) override {
    auto* svc = this;
    using Stream = WorkStreamReactor<pb::FlashProgress>;
    return Stream::Serve(
        svc->deps_.hardware != nullptr, "the hardware broker is not running",
        [&](Stream& stream, const std::shared_ptr<Stream::State>& st) {
          auto who = svc->deps_.gate->Admit(ctx, "Hardware.Flash");
          if (!who.ok()) {
            st->writer.Close(ToGrpcStatus(who.status()));
            return;
          }
          // A revoked or expired token ends the stream and cancels the flash.
          stream.Track(*svc->deps_.gate, *who, ctx);
          pb::FlashRequest copy = *req;
          auto work = [st, svc, c = CallerFor(*who, ctx, req->lease_id()), copy] {
            auto board = svc->deps_.boards->Resolve(c, copy.device_id(), copy.lease_id());
            if (!board.ok()) {
              st->writer.Close(ToGrpcStatus(board.status()));
              return;
            }
            FlashOrder order;
            order.image = copy.image_path();
            order.project_root = copy.project_root();
            order.approved = copy.approved();
            order.via = "api";
            auto progress = [st](const FlashProgressUpdate& u) {
              pb::FlashProgress p;
              p.set_stage(u.stage);
              p.set_fraction(u.fraction);
              p.set_message(u.message);
              st->writer.Push(std::move(p));
            };
            auto r = svc->deps_.boards->Flash(c, *board, order, progress, &st->cancel);
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
            done.set_message(board->remote
                                 ? absl::StrCat("flashed ", board->id, " on ", board->node)
                                 : absl::StrCat("flashed ", board->id));
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
    return new SerialReactor(deps_.hardware ? deps_.boards : nullptr, std::move(hooks));
  }

 private:
  const ApiDeps deps_;
  ThreadPool workers_;
  std::atomic<int> holds_{0};
};

}  // namespace

std::unique_ptr<grpc::Service> MakeHardwareService(const ApiDeps& deps) {
  return std::make_unique<HardwareService>(deps);
}

}  // namespace fwai
