#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
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
#include "server/api/lab_forward.h"
#include "server/api/queued_writer.h"
#include "server/api/serial_reactor.h"
#include "server/hardware/firmware_image.h"
#include "server/lab/etcd_client.h"
#include "server/lab/registry.h"
#include "server/project/policy.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;
namespace fs = std::filesystem;

constexpr size_t kMaxImage = 64 << 20;  // as for local flashes
constexpr size_t kChunk = 64 << 10;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(what, " ", path, ": cannot read it"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The image at `path`, read as the caller's account (as a local flash copies it).
absl::StatusOr<std::string> ReadImageAs(const Caller& caller, const std::string& path) {
  if (!caller.account) {
    return absl::PermissionDeniedError(absl::StrCat("flash guard (image): reading ", path,
                                                    " needs a local account; ", caller.display,
                                                    " has none"));
  }
  ScopedFsIdentity as(*caller.account);
  if (!as.status().ok()) return as.status();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", path,
                     fs::exists(path, ec) ? " is not a regular file" : " does not exist"));
  }
  if (fs::file_size(path, ec) > kMaxImage) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", path, " is over 64 MB"));
  }
  auto bytes = ReadFile(path, "flash guard (image):");
  if (!bytes.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", path, ": ", caller.account->name, " cannot read it"));
  }
  return bytes;
}

// The front's part of the flash guard (see FrontFlashGuard): the image as
// read, its freshness and its toolchain. Returns the image's build record
// (null when none) for the bench's memory rules.
absl::StatusOr<nlohmann::json> CheckAtFront(const Caller& caller, const std::string& path,
                                            const std::string& bytes,
                                            const FrontFlashGuard& guard) {
  const bool elf = bytes.size() >= 4 && bytes.compare(0, 4,
                                                      "\x7f"
                                                      "ELF") == 0;
  if (elf && guard.policy.check_fresh) {
    auto img = ParseFirmwareImage(bytes, path);
    if (!img.ok())
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (image): ", img.status().message()));
    {
      ScopedFsIdentity as(*caller.account);  // ReadImageAs made sure there is one
      if (!as.status().ok()) return as.status();
      struct stat st;
      if (stat(path.c_str(), &st) != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("flash guard (image): ", path, " is gone"));
      }
      img->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    }
    const std::string root =
        guard.project_root.empty() ? FindProjectRoot(path) : guard.project_root;
    if (auto s = CheckImageFresh(*img, root); !s.ok()) return s;
  }
  const std::string sha = BytesSha256Hex(bytes);
  nlohmann::json build =
      BuildRecordMadeImage(guard.policy.build, sha) ? guard.policy.build : nlohmann::json();
  if (build.is_null() && guard.build_record) build = guard.build_record(sha);
  if (guard.policy.require_verified_toolchain) {
    if (auto s = CheckToolchainRecord(build, path, sha); !s.ok()) return s;
  }
  return build;
}

// Local leases of this bench standing for lab leases that other nodes took:
// one per lab lease, taken when the node first works on the board and ended
// as soon as the lab lease is gone from etcd (released, expired, kicked) —
// which ends its serial streams and debug session as a local lease's end
// does. A stand-in lasts exactly what etcd last confirmed of its lab lease
// (the lease's time to live, read every half second): work on the board
// does not extend it, so while etcd cannot be reached it ends when the lab
// lease's TTL, counted from its last confirmed renewal, runs out.
class LabMirrors {
 public:
  explicit LabMirrors(const ApiDeps& deps) : deps_(deps) {
    if (deps_.lab_leases && deps_.lab_etcd && deps_.hardware)
      thread_ = std::thread([this] { Run(); });
  }
  ~LabMirrors() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The caller that works on `board` for node `node` under lab lease
  // `lease_id`: PERMISSION_DENIED unless that node holds that lease now.
  absl::StatusOr<Caller> Admit(const std::string& node, const std::string& board,
                               const std::string& lease_id, const std::string& peer) {
    if (!deps_.lab_leases || !deps_.lab_etcd || !deps_.hardware)
      return absl::UnavailableError("this fwaid is not a node of a lab");
    if (board.empty() || lease_id.empty()) {
      return absl::InvalidArgumentError("device_id and lease_id (the lab lease) are required");
    }
    bool here = false;
    for (const auto& d : deps_.hardware->List()) here = here || d.id == board;
    if (!here)
      return absl::NotFoundError(absl::StrCat("no board ", board, " on node ", deps_.lab_node));
    auto holder = deps_.lab_leases->Holder(board);
    if (!holder.ok()) return holder.status();
    const auto refused = [&] {
      return absl::PermissionDeniedError(absl::StrCat("node ", node, " holds no lab lease ",
                                                      lease_id, " on board ", board,
                                                      " (rule: a valid lab lease)"));
    };
    if (!holder->has_value() || (*holder)->lease_id != lease_id || (*holder)->via != node) {
      return refused();
    }
    const lab::LabLease& l = **holder;
    // How long etcd still gives the lab lease: the stand-in lasts that long.
    auto left = deps_.lab_etcd->LeaseTimeToLive(l.etcd_lease);
    if (absl::IsNotFound(left.status()) || (left.ok() && *left <= 0)) return refused();
    if (!left.ok()) return left.status();
    const int64_t confirmed_us = NowMicros();
    std::lock_guard lock(mu_);
    if (auto it = mirrors_.find(lease_id); it != mirrors_.end()) {
      if (deps_.hardware
              ->SetLeaseExpiry(it->second.caller.lease_id, Until(confirmed_us, *left),
                               ExpiryReason(it->second, confirmed_us))
              .ok()) {
        return it->second.caller;
      }
      mirrors_.erase(it);  // its stand-in ran out meanwhile: a new one
    }
    // A mirror of an earlier lab lease on this board that has ended.
    for (auto it = mirrors_.begin(); it != mirrors_.end();) {
      if (it->second.board == board) {
        (void)deps_.hardware->Release(it->second.caller, it->second.caller.lease_id, "", false);
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
    auto local = deps_.hardware->Acquire(m.caller, board, {}, ttl, 0, nullptr);
    if (!local.ok()) return local.status();
    m.caller.lease_id = local->lease_id;
    if (auto s = deps_.hardware->SetLeaseExpiry(local->lease_id, Until(confirmed_us, *left),
                                                ExpiryReason(m, confirmed_us));
        !s.ok()) {
      (void)deps_.hardware->Release(m.caller, local->lease_id, "", false);
      return s;
    }
    spdlog::info("lab: lease {} of node {} on {} is local lease {}", lease_id, node, board,
                 local->lease_id);
    mirrors_[lease_id] = m;
    return m.caller;
  }

 private:
  struct Mirror {
    std::string board, lab_lease_id, node, holder;
    int ttl_s = 0;
    Caller caller;
  };

  int MaxTtl(int ttl_s) const { return deps_.config ? deps_.config->hardware.max_ttl_s : ttl_s; }
  // The stand-in's end: what etcd said was left of the lab lease at `confirmed_us`.
  int64_t Until(int64_t confirmed_us, int64_t left_s) const {
    return confirmed_us + std::min<int64_t>(left_s, MaxTtl(static_cast<int>(left_s))) * 1000000;
  }
  // Why the stand-in ends if nothing confirms the lab lease again.
  static std::string ExpiryReason(const Mirror& m, int64_t confirmed_us,
                                  const absl::Status& etcd = absl::OkStatus()) {
    std::string why = absl::StrCat(
        "lab lease ", m.lab_lease_id, " of ", m.holder, " via ", m.node, " expired: its ", m.ttl_s,
        " s TTL ran out after the last renewal etcd confirmed (", FormatUtc(confirmed_us), ")");
    if (!etcd.ok()) absl::StrAppend(&why, "; etcd unreachable: ", etcd.message());
    return why;
  }

  void Run() {
    std::map<std::string, int64_t> confirmed;  // lab lease id -> when etcd last confirmed it
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(500));
      if (stop_) break;
      auto copy = mirrors_;
      lock.unlock();
      std::vector<std::string> ended;
      for (const auto& [lease_id, m] : copy) {
        const int64_t now = NowMicros();
        if (!confirmed.count(lease_id)) confirmed[lease_id] = now;
        auto holder = deps_.lab_leases->Holder(m.board);
        absl::Status unreachable;
        if (!holder.ok()) {
          unreachable = holder.status();
        } else if (holder->has_value() && (*holder)->lease_id == lease_id) {
          auto left = deps_.lab_etcd->LeaseTimeToLive((*holder)->etcd_lease);
          if (left.ok() && *left > 0) {
            confirmed[lease_id] = now;
            if (deps_.hardware
                    ->SetLeaseExpiry(m.caller.lease_id, Until(now, *left), ExpiryReason(m, now))
                    .ok()) {
              continue;
            }
          } else if (!left.ok() && !absl::IsNotFound(left.status())) {
            unreachable = left.status();
          }
        }
        if (!unreachable.ok()) {
          // etcd cannot say: the stand-in runs out on what it last confirmed.
          if (deps_.hardware
                  ->SetLeaseExpiry(m.caller.lease_id, std::nullopt,
                                   ExpiryReason(m, confirmed[lease_id], unreachable))
                  .ok()) {
            continue;
          }
        }
        (void)deps_.hardware->Release(m.caller, m.caller.lease_id, "", false);
        spdlog::info("lab: lease {} on {} ended in the lab; local lease {} released", lease_id,
                     m.board, m.caller.lease_id);
        ended.push_back(lease_id);
      }
      for (const auto& id : ended) confirmed.erase(id);
      lock.lock();
      for (const auto& id : ended) mirrors_.erase(id);
    }
  }

  const ApiDeps& deps_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, Mirror> mirrors_;  // lab lease id -> its local lease
  std::thread thread_;
};

// LabNode.Flash on the bench: the start, the image's bytes, then the flash
// under the local lease standing for the caller's lab lease.
class FlashReactor final : public grpc::ServerBidiReactor<pb::LabFlashRequest, pb::FlashProgress> {
 public:
  FlashReactor(const ApiDeps& deps, LabMirrors& mirrors, ThreadPool& workers,
               grpc::CallbackServerContext* ctx)
      : deps_(deps), mirrors_(mirrors), workers_(workers), state_(std::make_shared<State>()) {
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
        auto c = mirrors_.Admit(node_, start_.device_id(), start_.lease_id(), peer_);
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
      const std::string why = absl::StrCat("the image ended after ", image_.size(), " of ",
                                           start_.size(), " bytes");
      spdlog::warn("lab: flash of {} for node {} (lease {}) aborted before anything was written: {}",
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
    auto r = deps.hardware->Flash(
        c, start.device_id(), path, approved, "",
        [st](const FlashProgressUpdate& u) {
          pb::FlashProgress p;
          p.set_stage(u.stage);
          p.set_fraction(u.fraction);
          p.set_message(u.message);
          st->writer.Push(std::move(p));
        },
        /*cancel=*/nullptr, guard);
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
  LabMirrors& mirrors_;
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
  explicit LabNodeService(ApiDeps deps) : deps_(std::move(deps)), mirrors_(deps_), workers_(4) {}

  grpc::ServerBidiReactor<pb::LabFlashRequest, pb::FlashProgress>* Flash(
      grpc::CallbackServerContext* ctx) override {
    return new FlashReactor(deps_, mirrors_, workers_, ctx);
  }

  grpc::ServerBidiReactor<pb::SerialClientMessage, pb::SerialServerMessage>* Serial(
      grpc::CallbackServerContext* ctx) override {
    SerialHooks hooks;
    hooks.admit = [this, ctx](const pb::SerialOpen& o) -> absl::StatusOr<Caller> {
      auto p = deps_.gate->Admit(ctx, "LabNode.Serial");
      if (!p.ok()) return p.status();
      return mirrors_.Admit(LabNodeOf(*p), o.device_id(), o.lease_id(), p->peer);
    };
    return new SerialReactor(deps_.hardware, std::move(hooks));
  }

  grpc::ServerUnaryReactor* Debug(grpc::CallbackServerContext* ctx, const pb::DebugRequest* req,
                                  pb::DebugResponse* resp) override {
    return Unary(ctx, "LabNode.Debug", req->device_id(), req->lease_id(),
                 [this, req, resp](const Caller& c) {
                   std::vector<std::string> cmds(req->commands().begin(), req->commands().end());
                   auto r = deps_.hardware->Debug(
                       c, req->device_id(), cmds,
                       req->timeout_s() > 0 ? req->timeout_s() * 1000 : 10000);
                   if (!r.ok()) return r.status();
                   for (const auto& o : r->outputs) resp->add_outputs(o);
                   resp->set_result_json(r->results.dump());
                   return absl::OkStatus();
                 });
  }

  grpc::ServerUnaryReactor* Reset(grpc::CallbackServerContext* ctx, const pb::ResetRequest* req,
                                  pb::ResetResponse*) override {
    return Unary(
        ctx, "LabNode.Reset", req->device_id(), req->lease_id(),
        [this, req](const Caller& c) { return deps_.hardware->Reset(c, req->device_id()); });
  }

 private:
  // Admits the node for the board's lab lease, then runs `work` as its local lease on a worker.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const char* rpc,
                                  const std::string& board, const std::string& lease_id,
                                  std::function<absl::Status(const Caller&)> work) {
    auto* r = ctx->DefaultReactor();
    auto p = deps_.gate->Admit(ctx, rpc);
    if (!p.ok()) {
      r->Finish(ToGrpcStatus(p.status()));
      return r;
    }
    auto run = [this, r, node = LabNodeOf(*p), peer = p->peer, board, lease_id,
                work = std::move(work)] {
      auto c = mirrors_.Admit(node, board, lease_id, peer);
      r->Finish(ToGrpcStatus(c.ok() ? work(*c) : c.status()));
    };
    if (!workers_.Submit(std::move(run)))
      r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fwaid is shutting down"));
    return r;
  }

  const ApiDeps deps_;
  LabMirrors mirrors_;
  ThreadPool workers_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> LabLinks::ChannelTo(const std::string& node) {
  if (!deps_.lab_etcd || !deps_.config)
    return absl::UnavailableError("this fwaid is not a node of a lab");
  auto view = lab::ReadLab(*deps_.lab_etcd);
  if (!view.ok()) return view.status();
  std::string address;
  for (const auto& n : view->nodes) {
    if (n.node == node) address = n.advertise;
  }
  if (address.rfind("tls:", 0) != 0) {
    return absl::UnavailableError(
        absl::StrCat("node ", node, " is not in the lab now, or advertises no tls: address"));
  }
  address = address.substr(4);
  std::lock_guard lock(mu_);
  if (auto it = channels_.find(node); it != channels_.end() && it->second.first == address)
    return it->second.second;
  const LabConfig& lab = deps_.config->lab;
  const TlsConfig& tls = deps_.config->security.tls;
  const std::string cert = lab.cert.empty() ? tls.cert : lab.cert;
  const std::string key = lab.key.empty() ? tls.key : lab.key;
  const std::string ca = lab.ca.empty() ? tls.client_ca : lab.ca;
  if (cert.empty() || key.empty() || ca.empty()) {
    return absl::FailedPreconditionError(
        "this node has no node certificate for the lab: set lab.cert, lab.key and lab.ca in "
        "fwaid.yaml "
        "(fwaid tls issue DIR --user NODE --host NAME makes one)");
  }
  grpc::SslCredentialsOptions o;
  for (auto [file, out] : {std::pair<const std::string*, std::string*>{&ca, &o.pem_root_certs},
                           {&cert, &o.pem_cert_chain},
                           {&key, &o.pem_private_key}}) {
    auto text = ReadFile(*file, "lab:");
    if (!text.ok()) return text.status();
    *out = *std::move(text);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, grpc::SslCredentials(o), args);
  channels_[node] = {address, channel};
  return channel;
}

absl::StatusOr<ForwardedFlash> ForwardFlash(
    LabLinks& links, const lab::LabLease& lease, const Caller& caller, const std::string& path,
    bool approved, const std::function<void(const FlashProgressUpdate&)>& progress,
    CancelToken* cancel, const FrontFlashGuard& guard) {
  auto image = ReadImageAs(caller, path);
  if (!image.ok()) return image.status();
  auto build = CheckAtFront(caller, path, *image, guard);
  if (!build.ok()) return build.status();
  progress({"guard", 0.05,
            absl::StrCat("the front's guard passed: image (", image->size(), " bytes)",
                         guard.policy.check_fresh ? ", fresh" : ", freshness waived by policy",
                         guard.policy.require_verified_toolchain ? ", toolchain verified" : "",
                         "; the bench checks the rest")});
  auto channel = links.ChannelTo(lease.node);
  if (!channel.ok()) return channel.status();
  auto stub = pb::LabNode::NewStub(*channel);
  // Held by the cancel callback too, which may run after this returns.
  auto ctx = std::make_shared<grpc::ClientContext>();
  if (cancel) cancel->OnCancel([ctx] { ctx->TryCancel(); });
  auto stream = stub->Flash(ctx.get());
  pb::LabFlashRequest start;
  auto* s = start.mutable_start();
  s->set_device_id(lease.board);
  s->set_lease_id(lease.lease_id);
  s->set_file_name(fs::path(path).filename().string());
  s->set_size(static_cast<int64_t>(image->size()));
  s->set_approved(approved);
  s->set_holder(caller.display);
  s->set_flash_max_pct(guard.policy.flash_max_pct);
  s->set_ram_max_pct(guard.policy.ram_max_pct);
  s->set_max_growth_bytes(guard.policy.max_growth_bytes);
  if (build->is_object()) s->set_build_record_json(build->dump());
  bool sent = stream->Write(start);
  for (size_t at = 0; sent && at < image->size(); at += kChunk) {
    pb::LabFlashRequest chunk;
    chunk.set_data(image->substr(at, kChunk));
    sent = stream->Write(chunk);
  }
  if (sent) stream->WritesDone();
  ForwardedFlash out;
  pb::FlashProgress p;
  while (stream->Read(&p)) {
    if (p.done()) {
      out.sha256 = p.image_sha256();
      out.boot_line = p.boot_line();
      out.seconds = p.seconds();
      out.message = p.message();
      continue;
    }
    FlashProgressUpdate u;
    u.stage = p.stage();
    u.fraction = p.fraction();
    u.message = p.message();
    progress(u);
  }
  grpc::Status st = stream->Finish();
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("the bench ", lease.node, " of board ", lease.board, ": ",
                                     st.error_message()));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ForwardDebug(LabLinks& links, const lab::LabLease& lease,
                                                      const std::vector<std::string>& commands,
                                                      int timeout_s, std::string* result_json) {
  auto channel = links.ChannelTo(lease.node);
  if (!channel.ok()) return channel.status();
  pb::DebugRequest req;
  req.set_device_id(lease.board);
  req.set_lease_id(lease.lease_id);
  for (const auto& c : commands) req.add_commands(c);
  req.set_timeout_s(timeout_s);
  pb::DebugResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = pb::LabNode::NewStub(*channel)->Debug(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("the bench ", lease.node, " of board ", lease.board, ": ",
                                     st.error_message()));
  }
  *result_json = resp.result_json();
  return std::vector<std::string>(resp.outputs().begin(), resp.outputs().end());
}

absl::Status ForwardReset(LabLinks& links, const lab::LabLease& lease) {
  auto channel = links.ChannelTo(lease.node);
  if (!channel.ok()) return channel.status();
  pb::ResetRequest req;
  req.set_device_id(lease.board);
  req.set_lease_id(lease.lease_id);
  pb::ResetResponse resp;
  grpc::ClientContext ctx;
  grpc::Status st = pb::LabNode::NewStub(*channel)->Reset(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("the bench ", lease.node, " of board ", lease.board, ": ",
                                     st.error_message()));
  }
  return absl::OkStatus();
}

std::unique_ptr<grpc::Service> MakeLabNodeService(const ApiDeps& deps) {
  return std::make_unique<LabNodeService>(deps);
}

}  // namespace fwai
