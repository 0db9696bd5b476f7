#include "server/api/gate.h"

#include <grpcpp/support/server_interceptor.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "fwai/v1/auth.pb.h"
#include "fwai/v1/daemon.pb.h"
#include "fwai/v1/evidence.pb.h"
#include "fwai/v1/firmware.pb.h"
#include "fwai/v1/hardware.pb.h"
#include "fwai/v1/knowledge.pb.h"
#include "fwai/v1/lab.pb.h"
#include "fwai/v1/ota.pb.h"
#include "fwai/v1/plugins.pb.h"
#include "fwai/v1/projects.pb.h"
#include "fwai/v1/sessions.pb.h"
#include "fwai/v1/tool_catalog.pb.h"
#include "server/api/api.h"

namespace fwai {

std::string LabNodeOf(const Principal& p) {
  return p.id.rfind("node:", 0) == 0 ? p.id.substr(5) : "";
}

const std::vector<RpcRule>& RpcRules() {
  static const std::vector<RpcRule> kRules = {
      // Sessions and their streams belong to their owner and the users it
      // shares them with, as far as SessionRules says (NOT_FOUND for others).
      {"Sessions.Create", Need::kAnyone},
      {"Sessions.List", Need::kAnyone},
      {"Sessions.Get", Need::kAnyone},
      {"Sessions.Delete", Need::kAnyone},
      {"Sessions.Chat", Need::kAnyone},
      {"Sessions.Attach", Need::kAnyone},
      {"Sessions.History", Need::kAnyone},
      {"Sessions.ListCheckpoints", Need::kAnyone},
      {"Sessions.Rewind", Need::kAnyone},
      {"Sessions.ReadCheckpointFile", Need::kAnyone},
      {"Sessions.Share", Need::kAnyone},
      {"Sessions.Unshare", Need::kAnyone},
      {"Daemon.Status", Need::kAnyone},
      {"Daemon.Shutdown", Need::kAdmin},
      {"Daemon.ReloadConfig", Need::kAdmin},
      {"Auth.WhoAmI", Need::kAnyone},
      {"Auth.CreateToken", Need::kAdmin},
      {"Auth.ListTokens", Need::kAdmin},
      {"Auth.RevokeToken", Need::kAdmin},
      // The shared knowledge base is readable by all; writes are checked
      // against knowledge_writers, personal collections against their owner.
      {"Knowledge.Ingest", Need::kAnyone},
      {"Knowledge.ListDocuments", Need::kAnyone},
      {"Knowledge.DeleteDocument", Need::kAnyone},
      {"Knowledge.Search", Need::kAnyone},
      {"Knowledge.Stats", Need::kAnyone},
      // The retrieval log: each caller lists and corrects its own searches.
      {"Knowledge.ListSearches", Need::kAnyone},
      {"Knowledge.Feedback", Need::kAnyone},
      {"ToolCatalog.Register", Need::kAdmin},
      {"ToolCatalog.List", Need::kAnyone},
      {"ToolCatalog.Remove", Need::kAdmin},
      {"ToolCatalog.Search", Need::kAnyone},
      // Boards: a lease's holder (or an admin, recorded) acts on it; the
      // broker checks the lease on every write, flash and debug command.
      {"Hardware.ListDevices", Need::kAnyone},
      {"Hardware.Acquire", Need::kAnyone},
      {"Hardware.Hold", Need::kAnyone},
      {"Hardware.Renew", Need::kAnyone},
      {"Hardware.Release", Need::kAnyone},
      {"Hardware.Flash", Need::kAnyone},
      {"Hardware.Serial", Need::kAnyone},
      {"Hardware.Debug", Need::kAnyone},
      {"Hardware.Reset", Need::kAnyone},
      {"Hardware.SetHealth", Need::kAdmin},
      {"Hardware.SelfTest", Need::kAdmin},
      {"Hardware.Who", Need::kAnyone},
      // Watches: on a board the caller holds; each lists and removes its own.
      {"Hardware.AddWatch", Need::kAnyone},
      {"Hardware.ListWatches", Need::kAnyone},
      {"Hardware.RemoveWatch", Need::kAnyone},
      // Another node of the lab forwarding work on a board it holds the lab
      // lease of; the service checks the node certificate and the lease.
      {"LabNode.Flash", Need::kLabNode},
      {"LabNode.Serial", Need::kLabNode},
      {"LabNode.Debug", Need::kLabNode},
      {"LabNode.Reset", Need::kLabNode},
      // A project is read and built as its owner's account.
      {"Projects.Init", Need::kLocalAccount},
      {"Projects.GetConfig", Need::kLocalAccount},
      {"Projects.Doctor", Need::kLocalAccount},
      {"Projects.PolicyCheck", Need::kLocalAccount},
      {"Skills.List", Need::kLocalAccount},
      {"Skills.Run", Need::kLocalAccount},
      {"Skills.Resolve", Need::kLocalAccount},
      // Records are listed and exported for their owner (admins: all).
      {"Evidence.ListRuns", Need::kAnyone},
      {"Evidence.GetRun", Need::kAnyone},
      {"Evidence.Verify", Need::kAnyone},
      {"Evidence.Export", Need::kAnyone},
      // Reports read the project's images as its owner's account.
      {"Firmware.Memory", Need::kLocalAccount},
      {"Firmware.Sbom", Need::kLocalAccount},
      {"Firmware.CheckRegisters", Need::kLocalAccount},
      // A rollout reads its image as the caller's account; anyone may watch.
      {"Ota.Rollout", Need::kLocalAccount},
      {"Ota.ListRollouts", Need::kAnyone},
      {"Ota.GetRollout", Need::kAnyone},
      {"Ota.Boards", Need::kAnyone},
      // A plugin is code fwaid runs: only an admin installs or removes one.
      {"Plugins.Install", Need::kAdmin},
      {"Plugins.Remove", Need::kAdmin},
      {"Plugins.List", Need::kAnyone},
      {"Plugins.Verify", Need::kAnyone},
      {"Plugins.Search", Need::kAnyone},
  };
  return kRules;
}

const char* SessionNeedName(SessionNeed n) {
  switch (n) {
    case SessionNeed::kWatch:
      return "watch";
    case SessionNeed::kAnswer:
      return "answer";
    case SessionNeed::kApprove:
      return "approve";
    case SessionNeed::kDrive:
      return "drive";
    case SessionNeed::kOwner:
      return "owner";
  }
  return "owner";
}

const std::vector<SessionRule>& SessionRules() {
  static const std::vector<SessionRule> kRules = {
      // Watching: the session, its stream and its record.
      {"Sessions.Get", SessionNeed::kWatch},
      {"Sessions.Attach", SessionNeed::kWatch},
      {"Sessions.History", SessionNeed::kWatch},
      {"Sessions.Chat", SessionNeed::kWatch},
      {"Sessions.Chat.open", SessionNeed::kWatch},
      // Answering the agent's questions; deciding its plans and approvals
      // (an answer to a question asking leave to edit is
      // "Sessions.Chat.approval").
      {"Sessions.Chat.answer", SessionNeed::kAnswer},
      {"Sessions.Chat.approval", SessionNeed::kApprove},
      {"Sessions.Chat.plan_decision", SessionNeed::kApprove},
      // Driving: what the agent does next.
      {"Sessions.Chat.message", SessionNeed::kDrive},
      {"Sessions.Chat.cancel", SessionNeed::kDrive},
      {"Sessions.Chat.set_mode", SessionNeed::kDrive},
      {"Sessions.Chat.compact", SessionNeed::kDrive},
      {"Sessions.Chat.set_edit_approval", SessionNeed::kDrive},
      // The owner's alone: its files, its boards, who else may use it.
      {"Sessions.Delete", SessionNeed::kOwner},
      {"Sessions.ListCheckpoints", SessionNeed::kOwner},
      {"Sessions.Rewind", SessionNeed::kOwner},
      {"Sessions.ReadCheckpointFile", SessionNeed::kOwner},
      {"Sessions.Share", SessionNeed::kOwner},
      {"Sessions.Unshare", SessionNeed::kOwner},
  };
  return kRules;
}

SessionNeed SessionNeedOf(std::string_view action) {
  for (const auto& r : SessionRules()) {
    if (action == r.action) return r.need;
  }
  return SessionNeed::kOwner;
}

std::vector<std::string> SessionActionsWithoutRules() {
  std::set<std::string> named;
  for (const auto& r : SessionRules()) named.insert(r.action);
  std::vector<std::string> missing;
  const auto* file = fwai::v1::CreateSessionRequest::descriptor()->file();
  const auto* service = file->FindServiceByName("Sessions");
  for (int m = 0; service != nullptr && m < service->method_count(); ++m) {
    const auto* method = service->method(m);
    const bool names_session = method->input_type()->FindFieldByName("session_id") != nullptr;
    const std::string rpc = "Sessions." + method->name();
    if ((names_session || method->client_streaming()) && !named.count(rpc)) missing.push_back(rpc);
  }
  const auto* kind = fwai::v1::ClientEvent::descriptor()->FindOneofByName("kind");
  for (int f = 0; kind != nullptr && f < kind->field_count(); ++f) {
    const std::string action = "Sessions.Chat." + kind->field(f)->name();
    if (!named.count(action)) missing.push_back(action);
  }
  return missing;
}

std::vector<std::string> RpcsWithoutRules() {
  std::set<std::string> named;
  for (const auto& r : RpcRules()) named.insert(r.rpc);
  std::vector<std::string> missing;
  // One message of each API file brings its services' descriptors.
  for (const auto* file :
       {fwai::v1::CreateSessionRequest::descriptor()->file(),
        fwai::v1::DaemonStatusRequest::descriptor()->file(),
        fwai::v1::WhoAmIRequest::descriptor()->file(),
        fwai::v1::SearchRequest::descriptor()->file(),
        fwai::v1::ToolSearchRequest::descriptor()->file(),
        fwai::v1::AcquireRequest::descriptor()->file(), fwai::v1::InitRequest::descriptor()->file(),
        fwai::v1::ListRunsRequest::descriptor()->file(),
        fwai::v1::MemoryRequest::descriptor()->file(),
        fwai::v1::RolloutRequest::descriptor()->file(),
        fwai::v1::InstallPluginRequest::descriptor()->file(),
        fwai::v1::LabFlashRequest::descriptor()->file()}) {
    for (int i = 0; i < file->service_count(); ++i) {
      const auto* service = file->service(i);
      for (int m = 0; m < service->method_count(); ++m) {
        const std::string rpc = service->name() + "." + service->method(m)->name();
        if (!named.count(rpc)) missing.push_back(rpc);
      }
    }
  }
  return missing;
}

namespace {

std::map<std::string, Need, std::less<>> RuleMap() {
  std::map<std::string, Need, std::less<>> m;
  for (const auto& r : RpcRules()) m[r.rpc] = r.need;
  return m;
}

std::string Prop(const grpc::AuthContext& a, const char* name) {
  auto v = a.FindPropertyValues(name);
  return v.empty() ? std::string() : std::string(v.front().data(), v.front().size());
}

}  // namespace

struct Gate::Tracked {
  Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
  // Set by Track before the stream is tracked, read-only after.
  std::string token_id;
  grpc::CallbackServerContext* ctx = nullptr;
  std::function<void(const grpc::Status&)> end;
  std::function<absl::Status()> recheck;  // called under `mu` while alive
  bool ended ABSL_GUARDED_BY(mu) = false;
};

Gate::Gate(Identities& identities, Quotas& quotas, const PeerRegistry& peers,
           std::function<void(const nlohmann::json&)> audit)
    : ids_(identities),
      quotas_(quotas),
      peers_(peers),
      audit_(std::move(audit)),
      rules_(RuleMap()) {
  sweeper_ = std::thread([this] {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      Sweep();
    }
  });
}

Gate::~Gate() {
  stop_ = true;
  if (sweeper_.joinable()) sweeper_.join();
}

absl::StatusOr<Principal> Gate::Identify(grpc::CallbackServerContext* ctx) {
  const std::string peer = peers_.Real(ctx->peer());
  std::string key;
  int64_t uid = peers_.Uid(peer);
  std::string token_id, subject, cn;
  if (uid >= 0) {
    key = absl::StrCat("uid:", uid);
  } else {
    auto auth = ctx->auth_context();
    if (auth) {
      token_id = Prop(*auth, "fwai_token");
      subject = Prop(*auth, "fwai_subject");
      cn = Prop(*auth, GRPC_X509_CN_PROPERTY_NAME);
    }
    if (!token_id.empty()) {
      key = token_id;
    } else if (!subject.empty()) {
      key = "cert:" + subject;
    } else {
      return absl::UnauthenticatedError("this connection carries no verified identity");
    }
  }
  if (!token_id.empty()) {
    // A token is checked on every call: it may have been revoked or expired.
    auto p = ids_.ForTokenId(token_id, peer);
    if (!p.ok()) return p.status();
    return p;
  }
  {
    MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      Principal p = it->second;
      p.peer = peer;
      return p;
    }
  }
  absl::StatusOr<Principal> p = uid >= 0 ? ids_.ForUnixPeer(static_cast<uint32_t>(uid), peer)
                                         : ids_.ForCertificate(subject, cn, peer);
  if (!p.ok()) return p.status();
  MutexLock lock(&mu_);
  cache_[key] = *p;
  return p;
}

absl::StatusOr<Principal> Gate::Admit(grpc::CallbackServerContext* ctx, std::string_view rpc) {
  auto p = Identify(ctx);
  if (!p.ok()) {
    RecordRefusal(std::string(rpc), "", peers_.Real(ctx->peer()), p.status());
    return p.status();
  }
  auto rule = rules_.find(rpc);
  if (rule == rules_.end()) {
    // Fails closed: an RPC without a rule is nobody's.
    spdlog::error("no access rule for {}: refused", rpc);
    return absl::PermissionDeniedError(
        absl::StrCat(std::string(rpc), ": refused (no access rule)"));
  }
  absl::Status refused;
  const std::string lab_node = LabNodeOf(*p);
  if (!lab_node.empty() && rule->second != Need::kLabNode) {
    // A node certificate forwards board work; it is nobody's account.
    refused = absl::PermissionDeniedError(
        absl::StrCat(std::string(rpc), ": refused for node certificate ", lab_node,
                     " (rule: node certificates call LabNode only)"));
  }
  switch (refused.ok() ? rule->second : Need::kAnyone) {
    case Need::kAnyone:
      break;
    case Need::kLabNode:
      if (lab_node.empty()) {
        refused = absl::PermissionDeniedError(absl::StrCat(
            std::string(rpc), " is for the nodes of a lab (rule: lab node certificate); you are ",
            p->id));
      }
      break;
    case Need::kAdmin:
      if (!p->admin()) {
        refused = absl::PermissionDeniedError(
            absl::StrCat(std::string(rpc), " is for admins (rule: admin); you are ", p->id,
                         " with role ", RoleName(p->role)));
      }
      break;
    case Need::kLocalAccount:
      if (!p->account) {
        refused = absl::PermissionDeniedError(
            absl::StrCat(std::string(rpc), " works on a project's files (rule: local account); ",
                         p->no_account_reason));
      }
      break;
  }
  if (refused.ok() && !p->admin()) refused = quotas_.Request(p->id, ids_.LimitsOf(*p));
  if (!refused.ok()) {
    RecordRefusal(std::string(rpc), p->id, p->peer, refused);
    return refused;
  }
  return p;
}

void Gate::RecordRefusal(const std::string& rpc, const std::string& who, const std::string& peer,
                         const absl::Status& why) {
  if (!audit_) return;
  const int64_t now = NowMicros();
  {
    // A flood of refusals leaves one record a second per peer and RPC (the
    // gate's refusal and the call's PERMISSION_DENIED are one record).
    MutexLock lock(&mu_);
    if (last_refusal_us_.size() > 10000) {
      // Peers change with every connection: forget those past their second.
      std::erase_if(last_refusal_us_, [now](const auto& kv) { return now - kv.second >= 1000000; });
    }
    int64_t& last = last_refusal_us_[peer + " " + rpc];
    if (now - last < 1000000) return;
    last = now;
  }
  audit_({{"kind", "refusal"},
          {"rpc", rpc},
          {"principal", who},
          {"peer", peer},
          {"code", absl::StatusCodeToString(why.code())},
          {"reason", std::string(why.message())}});
}

namespace {

// "/fwai.v1.Hardware/Renew" -> "Hardware.Renew".
std::string RpcName(const char* method) {
  std::string m = method ? method : "";
  if (absl::StartsWith(m, "/fwai.v1.")) m = m.substr(9);
  if (auto slash = m.find('/'); slash != std::string::npos) m[slash] = '.';
  return m;
}

class RefusalInterceptor final : public grpc::experimental::Interceptor {
 public:
  RefusalInterceptor(grpc::experimental::ServerRpcInfo* info, Gate* gate)
      : info_(info), gate_(gate) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status st = methods->GetSendStatus();
      if (st.error_code() == grpc::StatusCode::PERMISSION_DENIED) Record(st);
    }
    methods->Proceed();
  }

 private:
  void Record(const grpc::Status& st) {
    std::string who, peer;
    if (auto* ctx = dynamic_cast<grpc::CallbackServerContext*>(info_->server_context())) {
      auto p = gate_->Identify(ctx);
      if (p.ok()) {
        who = p->id;
        peer = p->peer;
      } else {
        peer = ctx->peer();
      }
    }
    gate_->RecordRefusal(RpcName(info_->method()), who, peer,
                         absl::PermissionDeniedError(st.error_message()));
  }

  grpc::experimental::ServerRpcInfo* const info_;
  Gate* const gate_;
};

class RefusalInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RefusalInterceptorFactory(Gate* gate) : gate_(gate) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RefusalInterceptor(info, gate_);
  }

 private:
  Gate* const gate_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> Gate::RefusalRecorder() {
  return std::make_unique<RefusalInterceptorFactory>(this);
}

void Gate::Invalidate() {
  MutexLock lock(&mu_);
  cache_.clear();
}

std::unique_ptr<Gate::Ticket> Gate::Track(const Principal& p, grpc::CallbackServerContext* ctx,
                                          std::function<void(const grpc::Status&)> end,
                                          std::function<absl::Status()> recheck) {
  auto t = std::make_shared<Tracked>();
  t->token_id = p.token_id;
  t->ctx = ctx;
  t->end = std::move(end);
  t->recheck = std::move(recheck);
  if (!t->token_id.empty() || t->recheck) {
    MutexLock lock(&mu_);
    tracked_[t.get()] = t;
  }
  return std::make_unique<Ticket>(this, t);
}

Gate::Ticket::~Ticket() {
  {
    MutexLock lock(&t_->mu);
    t_->alive = false;
  }
  MutexLock lock(&gate_->mu_);
  gate_->tracked_.erase(t_.get());
}

void Gate::Sweep() {
  std::vector<std::shared_ptr<Tracked>> all;
  {
    MutexLock lock(&mu_);
    for (const auto& [raw, t] : tracked_) all.push_back(t);
  }
  for (const auto& t : all) {
    grpc::Status why;
    if (!t->token_id.empty()) {
      auto valid = ids_.tokens().Valid(t->token_id);
      if (!valid.ok()) {
        why =
            grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(valid.status().message()));
      }
    }
    MutexLock lock(&t->mu);
    if (!t->alive || t->ended) continue;
    if (why.ok() && t->recheck) why = ToGrpcStatus(t->recheck());
    if (why.ok()) continue;
    t->ended = true;
    if (t->end) {
      t->end(why);
    } else {
      t->ctx->TryCancel();
    }
  }
}

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  auto* r = ctx->DefaultReactor();
  r->Finish(ToGrpcStatus(status));
  return r;
}

}  // namespace fwai
