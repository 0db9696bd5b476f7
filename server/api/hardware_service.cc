// Hardware: devices, leases, flash, serial fan-out, debug. Long operations
// (waiting acquires, flashing, GDB) run on the service's own threads so they
// never hold up the shared pool.
#include <grpcpp/grpcpp.h>
#include <pwd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/thread_pool.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/tools/project_fs.h"
#include "common/paths.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include "server/api/queued_writer.h"
#include "server/evidence/evidence_log.h"
#include "server/hardware/broker.h"
#include "server/hardware/firmware_image.h"
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

  // A new lease must fit the caller's limits: leases held and their TTL.
  absl::Status LeaseLimits(const Caller& c, int ttl_s) const {
    Principal p;
    p.id = c.identity;
    p.user = c.user;
    const LimitsConfig limits = deps_.gate->identities().LimitsOf(p);
    if (ttl_s > limits.lease_ttl_max_s) {
      return absl::ResourceExhaustedError(absl::StrCat("limit lease_ttl_max_s (", limits.lease_ttl_max_s,
                                                       " s): ask for a shorter ttl and renew it (fwai hw lease --hold)"));
    }
    int64_t held = 0;
    for (const auto& l : deps_.hardware->Leases()) held += l.identity == c.identity;
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
      for (const auto& d : deps_.hardware->List()) {
        auto* o = resp->add_devices();
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
        o->set_state(d.state.empty() ? (d.running ? "running" : "stopped") : d.state);
        o->set_pid(d.pid > 0 ? d.pid : 0);
        o->set_ota_version(d.ota_version);
      }
      for (const auto& l : deps_.hardware->Leases()) ToProto(l, resp->add_leases());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Who(grpc::CallbackServerContext* ctx, const pb::WhoRequest*,
                                pb::WhoResponse* resp) override {
    auto c = CallerOf(ctx, "Hardware.Who");
    if (!c.ok()) return Refuse(ctx, c.status());
    return Run(ctx, [this, resp] {
      for (const auto& l : deps_.hardware->Leases()) ToProto(l, resp->add_leases());
      for (const auto& w : deps_.hardware->Waiters()) {
        auto* o = resp->add_waiters();
        o->set_holder(w.holder);
        o->set_wants(w.wants);
        for (const auto& id : w.candidates) o->add_device_ids(id);
        o->set_position(w.position);
        o->set_since_us(w.since_us);
        o->set_until_us(w.until_us);
        o->set_session_id(w.session_id);
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req,
                                    pb::Lease* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.Acquire", "", req->session_id());
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp, ctx] {
      if (auto s = LeaseLimits(c, req->ttl_s()); !s.ok()) return s;
      std::vector<std::string> tags;
      for (const auto& t : req->tags()) tags.push_back(t.value().empty() ? t.key() : t.key() + ":" + t.value());
      auto l = deps_.hardware->Acquire(c, req->device_id(), tags, req->ttl_s(), req->wait_s(),
                                       [ctx] { return ctx->IsCancelled(); });
      if (!l.ok()) return l.status();
      ToProto(*l, resp);
      Audit({{"kind", "lease_acquired"}, {"lease_id", l->lease_id}, {"board", l->device_id}, {"ttl_s", l->ttl_s}}, c);
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
      };
      Reactor(HardwareService* svc, grpc::CallbackServerContext* ctx, const pb::AcquireRequest* req)
          : state_(std::make_shared<State>()) {
        state_->writer.Bind([this](const pb::Lease* m) { StartWrite(m); }, [this](grpc::Status s) { Finish(std::move(s)); });
        if (!svc->deps_.hardware) {
          state_->writer.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the hardware broker is not running"));
          return;
        }
        auto admitted = svc->CallerOf(ctx, "Hardware.Hold", "", req->session_id());
        if (!admitted.ok()) {
          state_->writer.Close(ToGrpcStatus(admitted.status()));
          return;
        }
        Caller c = *admitted;
        if (auto s = svc->LeaseLimits(c, req->ttl_s()); !s.ok()) {
          state_->writer.Close(ToGrpcStatus(s));
          return;
        }
        pb::AcquireRequest copy = *req;
        // One thread per held lease: it may wait for the board, then renews
        // until the stream ends and releases at once.
        svc->holds_++;
        std::thread([st = state_, svc, c, copy] {
          struct Done {
            HardwareService* svc;
            ~Done() { svc->holds_--; }
          } done{svc};
          std::vector<std::string> tags;
          for (const auto& t : copy.tags()) tags.push_back(t.value().empty() ? t.key() : t.key() + ":" + t.value());
          auto l = svc->deps_.hardware->Acquire(c, copy.device_id(), tags, copy.ttl_s(), copy.wait_s(),
                                                [st] { return st->gone.load(); });
          if (!l.ok()) {
            st->writer.Close(ToGrpcStatus(l.status()));
            return;
          }
          pb::Lease out;
          ToProto(*l, &out);
          st->writer.Push(out);
          svc->Audit({{"kind", "lease_acquired"}, {"lease_id", l->lease_id}, {"board", l->device_id}, {"ttl_s", l->ttl_s},
                      {"held", true}},
                     c);
          const auto period = std::chrono::milliseconds(std::max(200, l->ttl_s * 1000 / 3));
          std::unique_lock lock(st->mu);
          while (!st->gone) {
            st->cv.wait_for(lock, period);
            if (st->gone) break;
            if (!svc->deps_.hardware->Renew(c, l->lease_id).ok()) break;  // ended by someone else
          }
          lock.unlock();
          if (svc->deps_.hardware->Release(c, l->lease_id, "", false).ok()) {
            nlohmann::json rec = {
                {"kind", "lease_released"}, {"lease_id", l->lease_id}, {"board", l->device_id}};
            if (auto t = svc->deps_.hardware->TakeTranscript(l->lease_id); !t.is_null())
              rec["serial_transcript"] = t;
            svc->Audit(rec, c);
          }
          st->writer.Close(grpc::Status(grpc::StatusCode::CANCELLED, "lease released"));
        }).detach();
      }
      void OnWriteDone(bool ok) override { state_->writer.OnWriteDone(ok); }
      void OnCancel() override {
        std::lock_guard lock(state_->mu);
        state_->gone = true;
        state_->cv.notify_all();
      }
      void OnDone() override { delete this; }

     private:
      std::shared_ptr<State> state_;
    };
    return new Reactor(this, ctx, req);
  }

  grpc::ServerUnaryReactor* Renew(grpc::CallbackServerContext* ctx, const pb::RenewRequest* req,
                                  pb::Lease* resp) override {
    auto admitted = CallerOf(ctx, "Hardware.Renew");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    return Run(ctx, [this, c = *admitted, req, resp] {
      if (req->lease_id().empty()) return absl::InvalidArgumentError("lease_id: required");
      auto l = deps_.hardware->Renew(c, req->lease_id());
      if (!l.ok()) return l.status();
      ToProto(*l, resp);
      Audit({{"kind", "lease_renewed"}, {"lease_id", l->lease_id}, {"board", l->device_id}, {"expires_us", l->expires_us}},
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
      auto l = deps_.hardware->Release(c, req->lease_id(), req->device_id(), req->force());
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
      auto board = deps_.hardware->ResolveBoard(req->device_id(), c);
      if (!board.ok()) return board.status();
      std::vector<std::string> cmds(req->commands().begin(), req->commands().end());
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
    return Stream::Serve(svc->deps_.hardware != nullptr, "the hardware broker is not running", [&](const std::shared_ptr<Stream::State>& st) {
      auto admitted = svc->CallerOf(ctx, "Hardware.Flash", req->lease_id());
      if (!admitted.ok()) {
        st->writer.Close(ToGrpcStatus(admitted.status()));
        return;
      }
      pb::FlashRequest copy = *req;
      auto work = [st, svc, c = *admitted, copy] {
        auto board = svc->deps_.hardware->ResolveBoard(copy.device_id(), c);
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
        FlashGuardPolicy guard;
        guard.check_fresh = rules->flash_require_fresh;
        guard.require_verified_toolchain = rules->flash_require_verified_toolchain;
        guard.flash_max_pct = rules->memory_flash_max_pct;
        guard.ram_max_pct = rules->memory_ram_max_pct;
        guard.max_growth_bytes = rules->memory_max_growth_bytes;
        auto r = svc->deps_.hardware->Flash(
            c, *board, copy.image_path(), approved, copy.project_root(),
            [st](const FlashProgressUpdate& u) {
              pb::FlashProgress p;
              p.set_stage(u.stage);
              p.set_fraction(u.fraction);
              p.set_message(u.message);
              st->writer.Push(std::move(p));
            },
            &st->cancel, guard);
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
    class Reactor final : public grpc::ServerBidiReactor<pb::SerialClientMessage, pb::SerialServerMessage> {
     public:
      Reactor(HardwareService* svc, grpc::CallbackServerContext* ctx) : svc_(svc), ctx_(ctx) {
        writer_.Bind([this](const pb::SerialServerMessage* m) { StartWrite(m); },
                     [this](grpc::Status s) { Finish(std::move(s)); });
        if (!svc->deps_.hardware) {
          writer_.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the hardware broker is not running"));
          return;
        }
        StartRead(&in_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          // The client half-closed or went away: stop reading; keep writing
          // until it cancels (a reader may half-close right away).
          return;
        }
        if (in_.has_open()) {
          if (reader_) {
            Error("the stream is already open");
          } else {
            Open(in_.open());
          }
        } else if (!reader_) {
          Error("send open first");
        } else if (in_.kind_case() == pb::SerialClientMessage::kWrite) {
          if (auto s = svc_->deps_.hardware->SerialWrite(caller_, board_, in_.write()); !s.ok()) Error(std::string(s.message()));
        } else if (in_.kind_case() == pb::SerialClientMessage::kSendLine) {
          if (auto s = svc_->deps_.hardware->SerialSendLine(caller_, board_, in_.send_line()); !s.ok()) {
            Error(std::string(s.message()));
          }
        }
        if (!writer_.done()) StartRead(&in_);
      }
      void OnWriteDone(bool ok) override { writer_.OnWriteDone(ok); }
      void OnCancel() override { stop_ = true; }
      void OnDone() override {
        stop_ = true;
        if (pump_.joinable()) {
          if (pump_.get_id() == std::this_thread::get_id()) {
            pump_.detach();
          } else {
            pump_.join();
          }
        }
        if (reader_) svc_->deps_.hardware->CloseSerial(board_, reader_);
        delete this;
      }

     private:
      void Error(const std::string& msg) {
        pb::SerialServerMessage m;
        m.set_error(msg);
        writer_.Push(std::move(m));
      }
      void Open(const pb::SerialOpen& o) {
        auto admitted = svc_->CallerOf(ctx_, "Hardware.Serial", o.lease_id());
        if (!admitted.ok()) {
          writer_.Close(ToGrpcStatus(admitted.status()));
          return;
        }
        caller_ = *admitted;
        auto board = svc_->deps_.hardware->ResolveBoard(o.device_id(), caller_);
        if (!board.ok()) {
          writer_.Close(ToGrpcStatus(board.status()));
          return;
        }
        board_ = *board;
        auto r = svc_->deps_.hardware->OpenSerial(caller_, board_, o.from_history());
        if (!r.ok()) {
          writer_.Close(ToGrpcStatus(r.status()));
          return;
        }
        reader_ = *r;
        pb::SerialServerMessage hello;
        hello.set_opened(board_);
        writer_.Push(std::move(hello));
        pump_ = std::thread([this] {
          // Backpressure: lines wait in the reader's bounded queue (oldest
          // dropped past its limit) while this client is slow; whatever has
          // piled up goes out as one batch.
          uint64_t reported_drops = 0;
          while (writer_.WaitBelow(2, stop_)) {
            SerialLine l;
            auto n = reader_->Wait(l, 200);
            if (n == SerialReader::Next::kTimeout) continue;
            pb::SerialServerMessage m;
            if (n == SerialReader::Next::kEnded) {
              m.set_end_of_stream(true);
              m.set_reason(reader_->end_reason());
              writer_.Push(std::move(m));
              writer_.Close(grpc::Status::OK);
              return;
            }
            auto add = [&m](SerialLine& x) {
              auto* o = m.add_lines();
              o->set_time_us(x.time_us);
              o->set_line(std::move(x.text));
              o->set_seq(x.seq);
            };
            add(l);
            while (m.lines_size() < 512 && reader_->Wait(l, 0) == SerialReader::Next::kLine) add(l);
            if (uint64_t d = reader_->dropped(); d != reported_drops) {
              m.set_dropped(d - reported_drops);
              reported_drops = d;
            }
            writer_.Push(std::move(m));
          }
          writer_.Close(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        });
      }

      HardwareService* svc_;
      grpc::CallbackServerContext* ctx_;
      pb::SerialClientMessage in_;
      QueuedWriter<pb::SerialServerMessage> writer_;
      std::shared_ptr<SerialReader> reader_;
      Caller caller_;
      std::string board_;
      std::atomic<bool> stop_{false};
      std::thread pump_;
    };
    return new Reactor(this, ctx);
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
