#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "fwai/v1/daemon.grpc.pb.h"
#include "fwai/v1/evidence.grpc.pb.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "fwai/v1/projects.grpc.pb.h"
#include "fwai/v1/sessions.grpc.pb.h"
#include "fwai/v1/tool_catalog.grpc.pb.h"
#include "server/agent/turn_manager.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/event_pump.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/api/rewind.h"
#include "server/api/share_subject.h"
#include "server/llm/provider.h"
#include "server/session/session_manager.h"
#include "server/session/shares.h"
#include "server/tools/project_fs.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

void ToProto(const SessionInfo& s, bool running, pb::Session* out) {
  out->set_id(s.id);
  out->set_title(s.title);
  out->set_owner(s.owner);
  out->set_project_root(s.project_root);
  out->set_created_us(s.created_us);
  out->set_updated_us(s.updated_us);
  out->set_provider(s.provider);
  out->set_model(s.model);
  out->set_mode(s.mode);
  out->set_last_seq(s.last_seq);
  out->set_turn_running(running);
  out->set_auto_approve_plan(s.auto_approve_plan);
  out->set_ask_before_edits(s.ask_before_edits);
  out->mutable_usage()->set_input_tokens(s.input_tokens);
  out->mutable_usage()->set_output_tokens(s.output_tokens);
  out->mutable_usage()->set_cost_usd(s.cost_usd);
  out->set_temperature(s.temperature);
  out->set_max_tokens(s.max_tokens);
  out->set_account(s.account);
  auto todos = nlohmann::json::parse(s.todos_json, nullptr, false);
  if (todos.is_array()) {
    for (const auto& t : todos) {
      auto* o = out->add_todos();
      o->set_id(t.value("id", ""));
      o->set_content(t.value("content", ""));
      o->set_status(t.value("status", ""));
      o->set_parent_id(t.value("parent_id", ""));
    }
  }
}

// The owner's name as people say it: a unix account's name, a user's name.
std::string UserOfOwner(const std::string& owner) {
  uint32_t uid = 0;
  if (absl::StartsWith(owner, "uid:") && absl::SimpleAtoi(owner.substr(4), &uid)) {
    if (auto a = LookupAccount(uid); a.ok()) return a->name;
  }
  const auto colon = owner.find(':');
  return colon == std::string::npos ? owner : owner.substr(colon + 1);
}

void ToProto(const SessionShare& s, int64_t now_us, pb::SessionShare* out) {
  out->set_session_id(s.session_id);
  out->set_grantee(s.grantee);
  out->set_user(s.user);
  out->set_role(ShareRoleName(s.role));
  out->set_created_us(s.created_us);
  out->set_expires_us(s.expires_us);
  out->set_created_by(s.created_by);
  out->set_expired(s.expires_us != 0 && s.expires_us <= now_us);
}

// What the caller is to a session: its owner (admins too), or the role of
// a share.
SessionNeed StandingOf(ShareRole r) { return static_cast<SessionNeed>(static_cast<int>(r)); }

// A principal sees its own sessions, and those shared with it as far as the
// share's role goes (SessionRules); admins see all. A session that is
// neither its own nor shared with it is NOT_FOUND: its existence is not
// revealed. An admin's use of another's session (`action`) is an evidence
// record (an admin override).
class Access {
 public:
  struct Granted {
    SessionInfo info;
    SessionNeed standing = SessionNeed::kOwner;
  };
  explicit Access(const ApiDeps& d) : d_(d) {}
  absl::StatusOr<SessionInfo> Session(const Principal& p, const std::string& id,
                                      std::string_view action) const {
    auto g = Check(p, id, action);
    if (!g.ok()) return g.status();
    return std::move(g->info);
  }
  absl::StatusOr<Granted> Check(const Principal& p, const std::string& id,
                                std::string_view action) const {
    if (id.empty()) return absl::InvalidArgumentError("session_id: required");
    auto s = d_.sessions->Get(id);
    if (!s.ok()) return s.status();
    Granted g{*std::move(s), SessionNeed::kOwner};
    if (!p.Owns(g.info.owner)) {
      if (p.admin()) {
        Override(p, g.info, action);
      } else {
        auto role = Standing(p, id);
        if (!role) return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
        g.standing = *role;
      }
    }
    RETURN_IF_ERROR(Allows(g.standing, id, action));
    return g;
  }
  // The share role `p` has on session `id` now, if any.
  std::optional<SessionNeed> Standing(const Principal& p, const std::string& id) const {
    if (d_.shares == nullptr) return std::nullopt;
    auto r = d_.shares->RoleFor(id, SubjectOf(p));
    if (!r) return std::nullopt;
    return StandingOf(*r);
  }
  // OK when `standing` is enough for `action`; PERMISSION_DENIED naming both.
  static absl::Status Allows(SessionNeed standing, const std::string& id, std::string_view action) {
    const SessionNeed need = SessionNeedOf(action);
    if (standing >= need) return absl::OkStatus();
    const std::string what(action);
    if (need == SessionNeed::kOwner) {
      return absl::PermissionDeniedError(absl::StrCat(what, ": only the owner of session ", id,
                                                      " may (it is shared with you to ",
                                                      SessionNeedName(standing), ")"));
    }
    return absl::PermissionDeniedError(absl::StrCat(what, " on session ", id, " needs the role ",
                                                    SessionNeedName(need), "; yours is ",
                                                    SessionNeedName(standing)));
  }

 private:
  void Override(const Principal& p, const SessionInfo& s, std::string_view action) const {
    if (!d_.audit) return;
    d_.audit({{"kind", "admin_override"},
              {"rpc", std::string(action)},
              {"session_id", s.id},
              {"owner", s.owner},
              {"principal", p.id},
              {"peer", p.peer}});
  }

  const ApiDeps& d_;
};

// A message Chat or Attach read as bytes (they are raw methods: events go
// out as they were stored), parsed as an `M`; INVALID_ARGUMENT naming `what`
// and the message it must be if it is not one. `bytes` is consumed.
template <typename M>
absl::Status ParseMessage(grpc::ByteBuffer* bytes, M* out, const std::string& what) {
  const bool parsed = grpc::SerializationTraits<M>::Deserialize(bytes, out).ok();
  bytes->Clear();
  if (parsed) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": not a ", M::descriptor()->full_name()));
}

// Chat: the first client message opens the session; then user messages,
// cancels. Deletes itself in OnDone.
class ChatReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ChatReactor(const ApiDeps& deps, grpc::CallbackServerContext* ctx)
      : deps_(deps), access_(deps), ctx_(ctx), pump_(this) {
    auto who = deps_.gate->Admit(ctx, "Sessions.Chat");
    if (!who.ok()) {
      pump_.Finish(ToGrpcStatus(who.status()));
      return;
    }
    who_ = *std::move(who);
    caller_ = who_.id;
    caller_display_ = CallerFor(who_, ctx).display;
    ticket_ = deps_.gate->Track(who_, ctx, [this](const grpc::Status& s) { pump_.Finish(s); });
    StartRead(&in_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed (or went away): it wants no more events.
      pump_.Finish(grpc::Status::OK);
      return;
    }
    absl::Status s = ParseMessage(&in_bytes_, &in_, "client event");
    if (s.ok()) s = Handle();
    if (!s.ok() && s.code() == absl::StatusCode::kFailedPrecondition &&
        (in_.has_answer() || in_.has_plan_decision())) {
      // Another client answered first: this one is told so ("plan p-1:
      // already approved by alice"), sees question_answered / plan_decided
      // on its stream and goes on.
      pb::ServerEvent told;
      told.set_session_id(session_id_);
      told.mutable_error()->set_code(absl::StatusCodeToString(s.code()));
      told.mutable_error()->set_message(std::string(s.message()));
      pump_.Inject(std::move(told));
      s = absl::OkStatus();
    }
    if (!s.ok()) {
      pump_.Finish(ToGrpcStatus(s));
      return;
    }
    StartRead(&in_bytes_);
  }

  void OnWriteDone(bool ok) override { pump_.OnWriteDone(ok); }
  void OnCancel() override { pump_.Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }
  void OnDone() override {
    ticket_.reset();
    pump_.Detach(deps_.sessions);
    delete this;
  }

 private:
  // Turns running in the caller's sessions, against its limit.
  // The limit checked and the turn started as one step: turns one principal
  // starts at the same moment cannot all slip under the limit.
  absl::Status StartWithinLimit(TurnRequest req) {
    static Mutex starting;
    MutexLock lock(&starting);
    if (auto l = CheckTurnLimit(); !l.ok()) return l;
    return deps_.turns->Start(std::move(req));
  }

  absl::Status CheckTurnLimit() {
    const LimitsConfig limits = deps_.gate->identities().LimitsOf(who_);
    const size_t running =
        deps_.turns->RunningOwnedBy([this](const std::string& owner) { return who_.Owns(owner); });
    if (static_cast<int64_t>(running) >= limits.running_turns) {
      return absl::ResourceExhaustedError(
          absl::StrCat("limit running_turns (", limits.running_turns,
                       ") reached: retry when one of your turns has finished"));
    }
    return absl::OkStatus();
  }

  // A user the session is shared with: the stream ends within a sweep of
  // the gate once the share does (removed, expired).
  void FollowShare() {
    ticket_ = deps_.gate->Track(
        who_, ctx_, [this](const grpc::Status& s) { pump_.Finish(s); },
        [this]() -> absl::Status {
          if (access_.Standing(who_, session_id_)) return absl::OkStatus();
          return absl::PermissionDeniedError(
              absl::StrCat("session ", session_id_, " is no longer shared with you"));
        });
  }

  // What this message asks of the caller's standing, looked at again for a
  // user the session is shared with (the share may have ended or changed).
  absl::Status Permit() {
    const auto* field = pb::ClientEvent::descriptor()->FindFieldByNumber(in_.kind_case());
    if (field == nullptr || session_id_.empty()) return absl::OkStatus();  // Handle says why
    std::string action = "Sessions.Chat." + field->name();
    if (standing_ == SessionNeed::kOwner) return absl::OkStatus();
    // Accepting an edit is approving it.
    if (in_.has_answer() && deps_.turns->AwaitsApproval(session_id_)) {
      action = "Sessions.Chat.approval";
    }
    auto now = access_.Standing(who_, session_id_);
    if (!now) {
      return absl::PermissionDeniedError(
          absl::StrCat("session ", session_id_, " is no longer shared with you"));
    }
    standing_ = *now;
    return Access::Allows(standing_, session_id_, action);
  }

  absl::Status Handle() {
    if (in_.kind_case() != pb::ClientEvent::kOpen) RETURN_IF_ERROR(Permit());
    switch (in_.kind_case()) {
      case pb::ClientEvent::kOpen: {
        if (!session_id_.empty())
          return absl::InvalidArgumentError("open: the chat is already open");
        auto g = access_.Check(who_, in_.open().session_id(), "Sessions.Chat.open");
        if (!g.ok()) return g.status();
        session_id_ = g->info.id;
        standing_ = g->standing;
        // Who this stream's messages come from, as verified: never a field
        // the client sends.
        author_ = Author{who_.id, who_.user, who_.Owns(g->info.owner)};
        if (standing_ != SessionNeed::kOwner) FollowShare();
        // The stream is accepted: the client hears so at once (its headers),
        // not only with the next event, which may be long in coming.
        pump_.SendHeaders();
        auto sub =
            deps_.sessions->Subscribe(session_id_, in_.open().after_seq(), in_.open().replay(),
                                      /*follow=*/true, pump_.NotifyFn());
        if (!sub.ok()) return sub.status();
        pump_.SetSubscriber(*std::move(sub));
        return absl::OkStatus();
      }
      case pb::ClientEvent::kMessage: {
        if (session_id_.empty()) {
          return absl::InvalidArgumentError("message: send `open` with a session_id first");
        }
        TurnRequest req;
        req.session_id = session_id_;
        req.text = in_.message().text();
        req.provider = in_.message().provider();
        req.model = in_.message().model();
        req.turn_id = in_.message().turn_id();
        req.sender = caller_;
        req.author = author_;
        req.owner = who_.id;
        req.peer = who_.peer;
        return StartWithinLimit(std::move(req));
      }
      case pb::ClientEvent::kCancel:
        if (session_id_.empty()) return absl::InvalidArgumentError("cancel: no chat is open");
        deps_.turns->Cancel(session_id_, author_);
        return absl::OkStatus();
      case pb::ClientEvent::kAnswer: {
        if (session_id_.empty()) return absl::InvalidArgumentError("answer: no chat is open");
        Interaction reply;
        reply.id = in_.answer().question_id();
        reply.selected.assign(in_.answer().selected().begin(), in_.answer().selected().end());
        reply.text = in_.answer().text();
        reply.by = caller_display_;
        reply.by_user = who_.user;
        reply.author = author_;
        return deps_.turns->Reply(session_id_, std::move(reply));
      }
      case pb::ClientEvent::kPlanDecision: {
        if (session_id_.empty())
          return absl::InvalidArgumentError("plan_decision: no chat is open");
        Interaction reply;
        reply.id = in_.plan_decision().plan_id();
        reply.approve = in_.plan_decision().approve();
        reply.edited_plan = in_.plan_decision().edited_plan();
        reply.text = in_.plan_decision().feedback();
        reply.is_plan = true;
        reply.by = caller_display_;
        reply.by_user = who_.user;
        reply.author = author_;
        return deps_.turns->Reply(session_id_, std::move(reply));
      }
      case pb::ClientEvent::kCompact: {
        if (session_id_.empty()) return absl::InvalidArgumentError("compact: no chat is open");
        TurnRequest req;
        req.session_id = session_id_;
        req.text = "/compact";
        req.compact_only = true;
        req.turn_id = in_.compact().turn_id();
        req.sender = caller_;
        req.author = author_;
        req.owner = who_.id;
        req.peer = who_.peer;
        return StartWithinLimit(std::move(req));
      }
      case pb::ClientEvent::kSetMode: {
        if (session_id_.empty()) return absl::InvalidArgumentError("set_mode: no chat is open");
        return deps_.turns->SetMode(session_id_, in_.set_mode().mode(), "set by " + caller_,
                                    author_);
      }
      case pb::ClientEvent::kSetEditApproval: {
        if (session_id_.empty())
          return absl::InvalidArgumentError("set_edit_approval: no chat is open");
        return deps_.turns->SetEditApproval(session_id_, in_.set_edit_approval().ask_before_edits(),
                                            caller_display_, author_);
      }
      case pb::ClientEvent::KIND_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("client event: empty");
  }

  const ApiDeps& deps_;
  Access access_;
  grpc::CallbackServerContext* const ctx_;
  EventPump<ChatReactor> pump_;
  Principal who_;
  std::string caller_;
  std::unique_ptr<Gate::Ticket> ticket_;
  std::string caller_display_;  // "alice (uid 1000) via vscode"
  grpc::ByteBuffer in_bytes_;   // the client's message as read
  pb::ClientEvent in_;          // ... and parsed
  std::string session_id_;
  SessionNeed standing_ = SessionNeed::kOwner;  // set by `open`
  Author author_;                               // set by `open`
};

// Attach: stored events after `after_seq`, then (unless no_follow) the live tail.
class AttachReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  AttachReactor(const ApiDeps& deps, grpc::CallbackServerContext* ctx,
                const grpc::ByteBuffer* request)
      : deps_(deps), pump_(this) {
    auto who = deps_.gate->Admit(ctx, "Sessions.Attach");
    if (!who.ok()) {
      pump_.Finish(ToGrpcStatus(who.status()));
      return;
    }
    grpc::ByteBuffer bytes(*request);  // ParseMessage consumes it
    pb::AttachRequest req;
    if (auto parsed = ParseMessage(&bytes, &req, "attach request"); !parsed.ok()) {
      pump_.Finish(ToGrpcStatus(parsed));
      return;
    }
    const Access access(deps);
    auto g = access.Check(*who, req.session_id(), "Sessions.Attach");
    if (!g.ok()) {
      pump_.Finish(ToGrpcStatus(g.status()));
      return;
    }
    std::function<absl::Status()> recheck;
    if (g->standing != SessionNeed::kOwner) {
      // Shared with the caller: the stream ends once the share does.
      recheck = [&deps, who = *who, id = g->info.id]() -> absl::Status {
        if (Access(deps).Standing(who, id)) return absl::OkStatus();
        return absl::PermissionDeniedError(
            absl::StrCat("session ", id, " is no longer shared with you"));
      };
    }
    ticket_ = deps_.gate->Track(
        *who, ctx, [this](const grpc::Status& st) { pump_.Finish(st); }, std::move(recheck));
    auto sub = deps_.sessions->Subscribe(g->info.id, req.after_seq(), /*replay=*/true,
                                         /*follow=*/!req.no_follow(), pump_.NotifyFn());
    if (!sub.ok()) {
      pump_.Finish(ToGrpcStatus(sub.status()));
      return;
    }
    pump_.SetSubscriber(*std::move(sub));
  }
  void OnWriteDone(bool ok) override { pump_.OnWriteDone(ok); }
  void OnCancel() override { pump_.Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")); }
  void OnDone() override {
    ticket_.reset();
    pump_.Detach(deps_.sessions);
    delete this;
  }

 private:
  const ApiDeps& deps_;
  EventPump<AttachReactor> pump_;
  std::unique_ptr<Gate::Ticket> ticket_;
};

// Sessions' callback service, with Chat and Attach taking and sending bytes:
// a stored event is written to a client as it was stored.
using svc = pb::Sessions;
using SessionsBase = svc::WithCallbackMethod_Create<svc::WithCallbackMethod_List<
    svc::WithCallbackMethod_Get<svc::WithCallbackMethod_Delete<svc::WithRawCallbackMethod_Chat<
        svc::WithRawCallbackMethod_Attach<svc::WithCallbackMethod_History<
            svc::WithCallbackMethod_ListCheckpoints<svc::WithCallbackMethod_Rewind<
                svc::WithCallbackMethod_ReadCheckpointFile<svc::WithCallbackMethod_Share<
                    svc::WithCallbackMethod_Unshare<svc::Service>>>>>>>>>>>>;

class SessionsService final : public SessionsBase {
 public:
  explicit SessionsService(ApiDeps deps) : deps_(std::move(deps)), access_(deps_) {}

  grpc::ServerUnaryReactor* Create(grpc::CallbackServerContext* ctx,
                                   const pb::CreateSessionRequest* req,
                                   pb::Session* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.Create");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(CreateSession(*who, *req, resp)));
    return r;
  }

  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx,
                                 const pb::ListSessionsRequest* req,
                                 pb::ListSessionsResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.List");
    if (!who.ok()) return Refuse(ctx, who.status());
    if (req->all() && !who->admin()) {
      return Refuse(ctx, absl::PermissionDeniedError(
                             "all: listing every user's sessions is for admins (rule: admin)"));
    }
    auto list = deps_.sessions->List("");
    if (list.ok()) {
      std::map<std::string, ShareRole> shared;
      if (req->shared_with_me() && deps_.shares != nullptr) {
        for (const auto& sh : deps_.shares->SharedWith(SubjectOf(*who))) {
          auto& best = shared.try_emplace(sh.session_id, sh.role).first->second;
          best = std::max(best, sh.role);
        }
      }
      for (const auto& s : *list) {
        const bool own = req->all() || who->Owns(s.owner);
        auto sh = shared.find(s.id);
        if (!own && sh == shared.end()) continue;
        auto* out = resp->add_sessions();
        ToProto(s, deps_.turns->Running(s.id), out);
        Describe(*who, s, own ? SessionNeed::kOwner : StandingOf(sh->second), out);
      }
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(list.status()));
    return r;
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const pb::GetSessionRequest* req,
                                pb::Session* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.Get");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto g = access_.Check(*who, req->session_id(), "Sessions.Get");
    if (g.ok()) {
      ToProto(g->info, deps_.turns->Running(g->info.id), resp);
      Describe(*who, g->info, g->standing, resp);
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(g.status()));
    return r;
  }

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx,
                                   const pb::DeleteSessionRequest* req,
                                   pb::DeleteSessionResponse*) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.Delete");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto s = access_.Session(*who, req->session_id(), "Sessions.Delete");
    if (!s.ok()) return Refuse(ctx, s.status());
    deps_.turns->Cancel(s->id);
    if (deps_.on_session_deleted) deps_.on_session_deleted(s->id);
    absl::Status st = deps_.sessions->Delete(s->id);
    if (st.ok() && deps_.audit) {
      deps_.audit({{"kind", "session_deleted"},
                   {"session_id", s->id},
                   {"owner", s->owner},
                   {"principal", who->id},
                   {"peer", who->peer},
                   {"admin_override", !who->Owns(s->owner)}});
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(st));
    return r;
  }

  grpc::ServerUnaryReactor* History(grpc::CallbackServerContext* ctx, const pb::HistoryRequest* req,
                                    pb::HistoryResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.History");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto s = access_.Session(*who, req->session_id(), "Sessions.History");
    if (!s.ok()) return Refuse(ctx, s.status());
    auto h = deps_.sessions->LoadHistory(s->id);
    if (h.ok()) {
      for (const auto& e : *h) {
        auto* m = resp->add_messages();
        m->set_role(e.role);
        m->set_content_json(e.content_json);
      }
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(h.status()));
    return r;
  }

  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const pb::ListCheckpointsRequest* req,
                                            pb::ListCheckpointsResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.ListCheckpoints");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto s = access_.Session(*who, req->session_id(), "Sessions.ListCheckpoints");
    if (!s.ok()) return Refuse(ctx, s.status());
    return OffloadUnary(ctx, deps_.pool, true, "",
                        [this, s = *s, resp] { return ListSessionCheckpoints(deps_, s, resp); });
  }

  grpc::ServerUnaryReactor* Rewind(grpc::CallbackServerContext* ctx, const pb::RewindRequest* req,
                                   pb::RewindResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.Rewind");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto s = access_.Session(*who, req->session_id(), "Sessions.Rewind");
    if (!s.ok()) return Refuse(ctx, s.status());
    Caller caller = CallerFor(*who, ctx, "", s->id);
    return OffloadUnary(ctx, deps_.pool, true, "",
                        [this, caller = std::move(caller), s = *s, req, resp] {
                          return RewindSession(deps_, caller, s, *req, resp);
                        });
  }

  grpc::ServerUnaryReactor* ReadCheckpointFile(grpc::CallbackServerContext* ctx,
                                               const pb::ReadCheckpointFileRequest* req,
                                               pb::ReadCheckpointFileResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.ReadCheckpointFile");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto s = access_.Session(*who, req->session_id(), "Sessions.ReadCheckpointFile");
    if (!s.ok()) return Refuse(ctx, s.status());
    return OffloadUnary(ctx, deps_.pool, true, "", [this, s = *s, req, resp] {
      return fwai::ReadCheckpointFile(deps_, s, *req, resp);
    });
  }

  grpc::ServerUnaryReactor* Share(grpc::CallbackServerContext* ctx,
                                  const pb::ShareSessionRequest* req,
                                  pb::SessionShare* resp) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.Share");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(ShareSession(*who, *req, resp)));
    return r;
  }

  grpc::ServerUnaryReactor* Unshare(grpc::CallbackServerContext* ctx,
                                    const pb::UnshareSessionRequest* req,
                                    pb::UnshareSessionResponse*) override {
    auto who = deps_.gate->Admit(ctx, "Sessions.Unshare");
    if (!who.ok()) return Refuse(ctx, who.status());
    auto* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(UnshareSession(*who, *req)));
    return r;
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Chat(
      grpc::CallbackServerContext* ctx) override {
    return new ChatReactor(deps_, ctx);
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Attach(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req) override {
    return new AttachReactor(deps_, ctx, req);
  }

 private:
  // What the caller is to the session, and (for its owner) whom it is
  // shared with.
  void Describe(const Principal& who, const SessionInfo& s, SessionNeed standing,
                pb::Session* out) {
    out->set_owner_user(UserOfOwner(s.owner));
    out->set_my_role(SessionNeedName(standing));
    if (standing != SessionNeed::kOwner || deps_.shares == nullptr) return;
    const int64_t now = NowMicros();
    for (const auto& sh : deps_.shares->OfSession(s.id)) ToProto(sh, now, out->add_shares());
  }

  absl::Status ShareSession(const Principal& who, const pb::ShareSessionRequest& req,
                            pb::SessionShare* resp) {
    if (deps_.shares == nullptr) return absl::UnavailableError("sessions cannot be shared here");
    ASSIGN_OR_RETURN(auto g, access_.Check(who, req.session_id(), "Sessions.Share"));
    SessionShare share;
    if (!ParseShareRole(req.role(), &share.role)) {
      return absl::InvalidArgumentError(
          absl::StrCat("role: '", req.role(), "' is not one of watch, answer, approve, drive"));
    }
    if (req.expires_in_s() < 0) return absl::InvalidArgumentError("expires: must not be negative");
    if (req.user().empty()) return absl::InvalidArgumentError("user: required");
    ASSIGN_OR_RETURN(share.grantee, deps_.gate->identities().GranteeOf(req.user()));
    if (g.info.owner == share.grantee || who.Owns(share.grantee)) {
      return absl::InvalidArgumentError(
          absl::StrCat("user: ", req.user(), " owns session ", g.info.id, " already"));
    }
    share.session_id = g.info.id;
    share.user = req.user();
    share.created_us = NowMicros();
    share.expires_us = req.expires_in_s() > 0 ? share.created_us + req.expires_in_s() * 1000000 : 0;
    share.created_by = who.id;
    RETURN_IF_ERROR(deps_.shares->Put(share));
    // A downgrade takes effect on open streams at once.
    deps_.gate->Sweep();
    Record("session_shared", who, g.info, share);
    ToProto(share, share.created_us, resp);
    return absl::OkStatus();
  }

  absl::Status UnshareSession(const Principal& who, const pb::UnshareSessionRequest& req) {
    if (deps_.shares == nullptr) return absl::UnavailableError("sessions cannot be shared here");
    ASSIGN_OR_RETURN(auto g, access_.Check(who, req.session_id(), "Sessions.Unshare"));
    // As shared (a user whose token has gone since is still named), or by
    // the identity it reaches.
    std::optional<SessionShare> found;
    for (const auto& sh : deps_.shares->OfSession(g.info.id)) {
      if (sh.user == req.user() || sh.grantee == req.user()) found = sh;
    }
    if (!found) {
      auto grantee = deps_.gate->identities().GranteeOf(req.user());
      for (const auto& sh : deps_.shares->OfSession(g.info.id)) {
        if (grantee.ok() && sh.grantee == *grantee) found = sh;
      }
    }
    if (!found) {
      return absl::NotFoundError(
          absl::StrCat("session ", g.info.id, " is not shared with ", req.user()));
    }
    RETURN_IF_ERROR(deps_.shares->Remove(g.info.id, found->grantee));
    // That user's open streams of the session end now, not at the next sweep.
    deps_.gate->Sweep();
    Record("session_unshared", who, g.info, *found);
    return absl::OkStatus();
  }

  void Record(const char* kind, const Principal& who, const SessionInfo& s,
              const SessionShare& share) {
    if (!deps_.audit) return;
    deps_.audit({{"kind", kind},
                 {"session_id", s.id},
                 {"owner", s.owner},
                 {"grantee", share.grantee},
                 {"user", share.user},
                 {"role", ShareRoleName(share.role)},
                 {"expires_us", share.expires_us},
                 {"principal", who.id},
                 {"peer", who.peer}});
  }

  absl::Status CreateSession(const Principal& who, const pb::CreateSessionRequest& req,
                             pb::Session* resp) {
    if (!req.provider().empty() && deps_.providers->Find(req.provider()) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("provider: '", req.provider(), "' is not configured"));
    }
    const LimitsConfig limits = deps_.gate->identities().LimitsOf(who);
    // Counted and created as one step: creates at the same moment cannot all
    // slip under the limit.
    MutexLock creating(&create_mu_);
    auto counted =
        deps_.sessions->CountOwned([&](const std::string& owner) { return who.Owns(owner); });
    if (!counted.ok()) return counted.status();
    const int64_t owned = *counted;
    if (owned >= limits.sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("limit sessions (", limits.sessions, ") reached: you have ", owned,
                       "; delete some (fwai sessions rm ID...) and retry"));
    }
    NewSession ns{req.title(),
                  req.project_root(),
                  req.provider(),
                  req.model(),
                  req.mode(),
                  req.auto_approve_plan(),
                  req.has_temperature() ? req.temperature() : -1.0,
                  req.max_tokens()};
    ns.ask_before_edits = req.ask_before_edits();
    std::string no_project;
    if (!who.account) {
      // No local account: chat, knowledge and hardware only.
      ns.without_project = true;
      no_project = who.no_account_reason;
    } else if (!req.project_root().empty()) {
      if (req.project_root()[0] != '/') {
        return absl::InvalidArgumentError(
            absl::StrCat("project_root: '", req.project_root(), "' is not an absolute path"));
      }
      // The project root must be one the account itself can use: checked
      // as that account, not as fwaid.
      ns.account = who.account->name;
      ScopedFsIdentity as(*who.account);
      if (!as.status().ok()) return as.status();
      auto fs = ProjectFs::Open(req.project_root());
      if (absl::IsInvalidArgument(fs.status())) return fs.status();
      if (!fs.ok()) {
        return absl::PermissionDeniedError(absl::StrCat("project_root: ", who.account->name,
                                                        " cannot use ", req.project_root(), ": ",
                                                        fs.status().message()));
      }
    }
    auto s = deps_.sessions->Create(who.id, std::move(ns));
    if (!s.ok()) return s.status();
    ToProto(*s, false, resp);
    resp->set_no_project_reason(no_project);
    if (deps_.audit) {
      deps_.audit({{"kind", "session_created"},
                   {"session_id", s->id},
                   {"owner", s->owner},
                   {"project_root", s->project_root},
                   {"account", s->account},
                   {"principal", who.id},
                   {"peer", who.peer}});
    }
    return absl::OkStatus();
  }

  const ApiDeps deps_;
  const Access access_;
  Mutex create_mu_;  // a session limit's count and the create, together
};

class DaemonService final : public pb::Daemon::CallbackService {
 public:
  explicit DaemonService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const pb::DaemonStatusRequest*,
                                   pb::DaemonStatus* resp) override {
    auto who = deps_.gate->Admit(ctx, "Daemon.Status");
    if (!who.ok()) return Refuse(ctx, who.status());
    resp->set_version(deps_.version);
    resp->set_pid(getpid());
    resp->set_started_us(deps_.started_us);
    resp->set_caller(who->id);
    resp->set_running_turns(deps_.turns->RunningCount());
    resp->set_default_provider(deps_.providers->default_name);
    for (const auto& [name, p] : deps_.providers->providers) {
      const auto& c = p->config();
      auto* pi = resp->add_providers();
      pi->set_name(name);
      pi->set_kind(c.kind);
      pi->set_model(c.model);
      pi->set_has_key(!ResolveApiKey(c).empty());
      // Where the daemon keeps things, and how it reaches providers, is for admins.
      if (who->admin()) {
        pi->set_base_url(c.base_url);
        pi->set_key_env(c.api_key_env);
      }
    }
    if (who->admin()) {
      resp->set_data_dir(deps_.config->data_dir);
      for (const auto& l : deps_.config->listen) resp->add_listen(l);
      resp->set_config_file(deps_.config->source);
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx, const pb::ShutdownRequest*,
                                     pb::ShutdownResponse*) override {
    auto who = deps_.gate->Admit(ctx, "Daemon.Shutdown");
    if (!who.ok()) return Refuse(ctx, who.status());
    if (deps_.audit)
      deps_.audit({{"kind", "daemon_shutdown"}, {"principal", who->id}, {"peer", who->peer}});
    deps_.request_shutdown();
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* ReloadConfig(grpc::CallbackServerContext* ctx,
                                         const pb::ReloadConfigRequest*,
                                         pb::ReloadConfigResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Daemon.ReloadConfig");
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, true, "", [this, who = *who, resp]() -> absl::Status {
      auto users = deps_.reload_config(who.id, who.peer);
      if (!users.ok()) return users.status();
      resp->set_users(*users);
      resp->set_config_file(deps_.config->source);
      return absl::OkStatus();
    });
  }

 private:
  const ApiDeps deps_;
};

// Services whose domain is not built yet answer UNIMPLEMENTED (the generated
// defaults) but are registered so reflection lists the whole API.
}  // namespace

std::vector<std::unique_ptr<grpc::Service>> MakeServices(const ApiDeps& deps) {
  std::vector<std::unique_ptr<grpc::Service>> out;
  out.push_back(std::make_unique<SessionsService>(deps));
  out.push_back(std::make_unique<DaemonService>(deps));
  out.push_back(MakeKnowledgeService(deps));
  out.push_back(MakeToolCatalogService(deps));
  out.push_back(MakeHardwareService(deps));
  out.push_back(MakeLabNodeService(deps));
  out.push_back(MakeProjectsService(deps));
  out.push_back(MakeSkillsService(deps));
  out.push_back(MakeEvidenceService(deps));
  out.push_back(MakeAuthService(deps));
  out.push_back(MakeFirmwareService(deps));
  out.push_back(MakeOtaService(deps));
  out.push_back(MakePluginsService(deps));
  return out;
}

}  // namespace fwai
