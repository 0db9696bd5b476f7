#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/local_account.h"
#include "common/thread_pool.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/queued_writer.h"
#include "server/api/serial_reactor.h"
#include "server/boards/boards.h"
#include "server/hardware/firmware_image.h"
#include "server/lab/etcd_client.h"
#include "server/lab/lab_leases.h"
#include "server/lab/registry.h"
#include "server/lab/stand_ins.h"
#include "server/project/policy.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;
namespace fs = std::filesystem;

constexpr size_t kMaxImage = 64 << 20;  // as for local flashes

// A unary call whose work hears of the caller's cancel (OnCancel).
class CancellableUnary final : public grpc::ServerUnaryReactor {
 public:
  const std::shared_ptr<CancelToken> cancel = std::make_shared<CancelToken>();
  void OnCancel() override { cancel->Cancel(); }
  void OnDone() override { delete this; }
};

// The caller that works on `board` for node `node` under lab lease
// `lease_id`: its stand-in lease here (server/lab/stand_ins.h).
absl::StatusOr<Caller> AdmitNode(const ApiDeps& deps, const std::string& node,
                                 const std::string& board, const std::string& lease_id,
                                 const std::string& peer) {
  if (!deps.lab_stand_ins) return absl::UnavailableError("this fwaid is not a node of a lab");
  return deps.lab_stand_ins->Admit(node, board, lease_id, peer);
}

// LabNode.Flash on the bench: the start, the image's bytes, then the flash
// under the local lease standing for the caller's lab lease.
class FlashReactor final : public grpc::ServerBidiReactor<pb::LabFlashRequest, pb::FlashProgress> {
 public:
  FlashReactor(const ApiDeps& deps, ThreadPool& workers, grpc::CallbackServerContext* ctx)
      : deps_(deps), workers_(workers), state_(std::make_shared<State>()) {
    state_->writer.Bind([this](const pb::FlashProgress* m) { StartWrite(m); },
                        [this](grpc::Status s) { Finish(std::move(s)); });
    auto p = deps_.gate->Admit(ctx, "LabNode.Flash");
    if (!p.ok()) {
      state_->writer.Close(ToGrpcStatus(p.status()));
      return;
    }
    node_ = LabNodeOf(*p);
    peer_ = p->peer;
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (ok) {
      if (in_.has_start()) {
        if (started_) return Fail(absl::InvalidArgumentError("start: sent twice"));
        start_ = in_.start();
        started_ = true;
        if (start_.size() < 0 || static_cast<size_t>(start_.size()) > kMaxImage) {
          return Fail(absl::InvalidArgumentError("start.size: 0..64 MB"));
        }
        // Refused before any byte moves when the node holds no lease.
        auto c = AdmitNode(deps_, node_, start_.device_id(), start_.lease_id(), peer_);
        if (!c.ok()) return Fail(c.status());
        caller_ = *c;
        image_.reserve(static_cast<size_t>(start_.size()));
      } else if (!started_) {
        return Fail(absl::InvalidArgumentError("send start first"));
      } else {
        image_ += in_.data();
        if (image_.size() > static_cast<size_t>(start_.size())) {
          return Fail(absl::InvalidArgumentError("more bytes than start.size"));
        }
      }
      StartRead(&in_);
      return;
    }
    if (failed_) return;
    if (!started_) return Fail(absl::InvalidArgumentError("send start first"));
    if (image_.size() != static_cast<size_t>(start_.size())) {
      // The front went away (or gave up) before the whole image came:
      // nothing was written to the board.
      const std::string why =
          absl::StrCat("the image ended after ", image_.size(), " of ", start_.size(), " bytes");
      spdlog::warn(
          "lab: flash of {} for node {} (lease {}) aborted before anything was written: {}",
          start_.device_id(), node_, start_.lease_id(), why);
      if (deps_.audit) {
        deps_.audit({{"kind", "lab_flash_aborted"},
                     {"board", start_.device_id()},
                     {"lease_id", start_.lease_id()},
                     {"by", caller_.display},
                     {"principal", caller_.user},
                     {"peer", caller_.peer},
                     {"written", false},
                     {"reason", why}});
      }
      return Fail(absl::InvalidArgumentError(why));
    }
    auto work = [st = state_, deps = &deps_, c = caller_, start = start_, node = node_,
                 image = std::move(image_)] {
      auto done = Flash(*deps, c, node, start, image, st);
      if (!done.ok()) st->writer.Close(ToGrpcStatus(done));
    };
    if (!workers_.Submit(std::move(work))) Fail(absl::UnavailableError("fwaid is shutting down"));
  }
  void OnWriteDone(bool ok) override { state_->writer.OnWriteDone(ok); }
  void OnCancel() override { state_->cancel.Cancel(); }
  void OnDone() override { delete this; }

 private:
  struct State {
    QueuedWriter<pb::FlashProgress> writer;
    CancelToken cancel;
  };

  void Fail(const absl::Status& s) {
    failed_ = true;
    state_->writer.Close(ToGrpcStatus(s));
  }

  // Once the whole image is here the flash runs to its end even if the
  // front goes away meanwhile (killed, cut off): a write stopped halfway
  // would leave the board in a state nobody asked for. The log and the
  // evidence record say whether the front was still there.
  static absl::Status Flash(const ApiDeps& deps, const Caller& c, const std::string& node,
                            const pb::LabFlashStart& start, const std::string& image,
                            const std::shared_ptr<State>& st) {
    // This bench's own policy (its organisation file) decides too.
    auto rules = LoadPolicy("", deps.config ? deps.config->policy_file : "");
    if (!rules.ok())
      return absl::FailedPreconditionError(absl::StrCat("policy: ", rules.status().message()));
    PolicyDecision d = CheckFlashPolicy(*rules, start.device_id(), start.approved());
    if (!d.allowed && d.rule.rfind("flash.allowed_boards", 0) == 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("refused by policy (", d.rule, "): ", d.reason));
    }
    const bool approved = start.approved() || !rules->flash_require_approval;
    std::string ext = fs::path(start.file_name()).extension().string();
    if (ext.find('/') != std::string::npos) ext.clear();
    const std::string dir = deps.config->data_dir + "/lab-images";
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string path = absl::StrCat(dir, "/", start.device_id(), "-", start.lease_id(), ext);
    {
      std::ofstream f(path + ".tmp", std::ios::binary | std::ios::trunc);
      f.write(image.data(), static_cast<std::streamsize>(image.size()));
      if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", path));
    }
    fs::rename(path + ".tmp", path, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot write ", path));
    // The sources are where the front is: freshness (and the toolchain) were
    // judged there. The memory budgets need this board's regions: here.
    FlashGuardPolicy guard;
    guard.check_fresh = false;
    guard.flash_max_pct = start.flash_max_pct();
    guard.ram_max_pct = start.ram_max_pct();
    guard.max_growth_bytes = start.max_growth_bytes();
    if (!start.build_record_json().empty()) {
      guard.build = nlohmann::json::parse(start.build_record_json(), nullptr, false);
      if (guard.build.is_discarded()) guard.build = nlohmann::json();
    }
    FlashOrder order;
    order.image = path;
    order.approved = approved;
    order.guard = guard;
    order.via = absl::StrCat("lab node ", node);
    BoardRef board;
    board.id = start.device_id();
    auto r = deps.boards->Flash(
        c, board, order,
        [st](const FlashProgressUpdate& u) {
          pb::FlashProgress p;
          p.set_stage(u.stage);
          p.set_fraction(u.fraction);
          p.set_message(u.message);
          st->writer.Push(std::move(p));
        },
        /*cancel=*/nullptr);
    fs::remove(path, ec);
    const bool front_gone = st->cancel.cancelled();
    if (!r.ok()) {
      spdlog::warn("lab: flash of {} for node {} (lease {}) failed{}: {}", start.device_id(), node,
                   start.lease_id(), front_gone ? " after the front went away" : "",
                   std::string(r.status().message()));
      if (deps.audit) {
        deps.audit({{"kind", "lab_flash_failed"},
                    {"board", start.device_id()},
                    {"lease_id", start.lease_id()},
                    {"by", c.display},
                    {"principal", c.user},
                    {"peer", c.peer},
                    {"front_gone", front_gone},
                    {"reason", std::string(r.status().message())}});
      }
      return r.status();
    }
    spdlog::info("lab: flash of {} for node {} (lease {}) finished{}: sha256 {}, boot line '{}'",
                 start.device_id(), node, start.lease_id(),
                 front_gone ? " after the front went away" : "", r->sha256, r->boot_line);
    if (deps.audit) {
      deps.audit({{"kind", "lab_flash"},
                  {"board", start.device_id()},
                  {"lease_id", start.lease_id()},
                  {"by", c.display},
                  {"principal", c.user},
                  {"peer", c.peer},
                  {"image_sha256", r->sha256},
                  {"boot_line", r->boot_line},
                  {"front_gone", front_gone}});
    }
    pb::FlashProgress done;
    done.set_stage("done");
    done.set_fraction(1);
    done.set_done(true);
    done.set_image_sha256(r->sha256);
    done.set_boot_line(r->boot_line);
    done.set_seconds(r->seconds);
    done.set_message(absl::StrCat("flashed ", start.device_id()));
    st->writer.Push(std::move(done));
    st->writer.Close(grpc::Status::OK);
    return absl::OkStatus();
  }

  const ApiDeps& deps_;
  ThreadPool& workers_;
  std::shared_ptr<State> state_;
  pb::LabFlashRequest in_;
  pb::LabFlashStart start_;
  bool started_ = false, failed_ = false;
  std::string image_;
  std::string node_, peer_;
  Caller caller_;
};

class LabNodeService final : public pb::LabNode::CallbackService {
 public:
  explicit LabNodeService(ApiDeps deps) : deps_(std::move(deps)), workers_(4) {}

  grpc::ServerBidiReactor<pb::LabFlashRequest, pb::FlashProgress>* Flash(
      grpc::CallbackServerContext* ctx) override {
    return new FlashReactor(deps_, workers_, ctx);
  }

  grpc::ServerBidiReactor<pb::SerialClientMessage, pb::SerialServerMessage>* Serial(
      grpc::CallbackServerContext* ctx) override {
    SerialHooks hooks;
    hooks.admit = [this, ctx](const pb::SerialOpen& o) -> absl::StatusOr<Caller> {
      auto p = deps_.gate->Admit(ctx, "LabNode.Serial");
      if (!p.ok()) return p.status();
      return AdmitNode(deps_, LabNodeOf(*p), o.device_id(), o.lease_id(), p->peer);
    };
    return new SerialReactor(deps_.hardware ? deps_.boards : nullptr, std::move(hooks));
  }

  grpc::ServerUnaryReactor* Debug(grpc::CallbackServerContext* ctx, const pb::DebugRequest* req,
                                  pb::DebugResponse* resp) override {
    // The front's cancel (its user's stop, a revoked token) ends the gdb here.
    auto* reactor = new CancellableUnary();
    return Unary(
        ctx, "LabNode.Debug", req->device_id(), req->lease_id(),
        [this, req, resp, cancel = reactor->cancel](const Caller& c) {
          std::vector<std::string> cmds(req->commands().begin(), req->commands().end());
          auto r = deps_.hardware->Debug(c, req->device_id(), cmds,
                                         req->timeout_s() > 0 ? req->timeout_s() * 1000 : 10000,
                                         cancel.get());
          if (!r.ok()) return r.status();
          for (const auto& o : r->outputs) resp->add_outputs(o);
          resp->set_result_json(r->results.dump());
          return absl::OkStatus();
        },
        reactor);
  }

  grpc::ServerUnaryReactor* Reset(grpc::CallbackServerContext* ctx, const pb::ResetRequest* req,
                                  pb::ResetResponse*) override {
    return Unary(
        ctx, "LabNode.Reset", req->device_id(), req->lease_id(),
        [this, req](const Caller& c) { return deps_.hardware->Reset(c, req->device_id()); });
  }

 private:
  // Admits the node for the board's lab lease, then runs `work` as its local lease on a worker.
  // `reactor`: the call's own (a CancellableUnary), else the default one.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const char* rpc,
                                  const std::string& board, const std::string& lease_id,
                                  std::function<absl::Status(const Caller&)> work,
                                  grpc::ServerUnaryReactor* reactor = nullptr) {
    auto* r = reactor ? reactor : ctx->DefaultReactor();
    auto p = deps_.gate->Admit(ctx, rpc);
    if (!p.ok()) {
      r->Finish(ToGrpcStatus(p.status()));
      return r;
    }
    auto run = [this, r, node = LabNodeOf(*p), peer = p->peer, board, lease_id,
                work = std::move(work)] {
      auto c = AdmitNode(deps_, node, board, lease_id, peer);
      r->Finish(ToGrpcStatus(c.ok() ? work(*c) : c.status()));
    };
    if (!workers_.Submit(std::move(run)))
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fwaid is shutting down"));
    return r;
  }

  const ApiDeps deps_;
  ThreadPool workers_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeLabNodeService(const ApiDeps& deps) {
  return std::make_unique<LabNodeService>(deps);
}

}  // namespace fwai
