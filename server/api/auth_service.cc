#include <grpcpp/grpcpp.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "fwai/v1/auth.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/auth/token_store.h"
#include "server/boards/leases.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

void ToProto(const TokenInfo& t, pb::TokenInfo* out) {
  out->set_id(t.id);
  out->set_user(t.user);
  out->set_role(RoleName(t.role));
  out->set_created_us(t.created_us);
  out->set_expires_us(t.expires_us);
  out->set_revoked_us(t.revoked_us);
  out->set_created_by(t.created_by);
  out->set_note(t.note);
  out->set_last_used_us(t.last_used_us);
}

class AuthService final : public pb::Auth::CallbackService {
 public:
  explicit AuthService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* ctx, const pb::WhoAmIRequest*,
                                   pb::WhoAmIResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Auth.WhoAmI");
    if (!who.ok()) return Refuse(ctx, who.status());
    resp->set_principal(who->id);
    resp->set_user(who->user);
    resp->set_role(RoleName(who->role));
    resp->set_verified_by(who->verified_by);
    resp->set_peer(who->peer);
    resp->set_token_id(who->token_id);
    resp->set_token_expires_us(who->token_expires_us);
    resp->set_file_access(who->account.has_value());
    if (who->account) resp->set_local_account(who->account->name);
    resp->set_no_file_access_reason(who->no_account_reason);
    for (const auto& a : who->aliases) resp->add_aliases(a);
    if (!who->admin()) {
      const LimitsConfig l = deps_.gate->identities().LimitsOf(*who);
      auto* out = resp->mutable_limits();
      out->set_sessions(l.sessions);
      out->set_running_turns(l.running_turns);
      out->set_running_runs(l.running_runs);
      out->set_leases(l.leases);
      out->set_lease_ttl_max_s(l.lease_ttl_max_s);
      out->set_ingest_mb_per_hour(l.ingest_mb_per_hour);
      out->set_requests_per_second(l.requests_per_second);
      out->set_burst(l.burst);
    }
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* CreateToken(grpc::CallbackServerContext* ctx,
                                        const pb::CreateTokenRequest* req,
                                        pb::CreateTokenResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Auth.CreateToken");
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, true, "", [this, who = *who, req, resp]() -> absl::Status {
      Role role = Role::kUser;
      if (!req->role().empty() && !ParseRole(req->role(), &role)) {
        return absl::InvalidArgumentError(
            absl::StrCat("role: '", req->role(), "'; expected admin, user or ci"));
      }
      auto t = deps_.gate->identities().tokens().Create(req->user(), role, req->expires_in_s(),
                                                        who.id, req->note());
      if (!t.ok()) return t.status();
      resp->set_token(t->token);
      ToProto(t->info, resp->mutable_info());
      if (deps_.audit) {
        deps_.audit({{"kind", "token_created"},
                     {"token_id", t->info.id},
                     {"user", t->info.user},
                     {"role", RoleName(t->info.role)},
                     {"expires_us", t->info.expires_us},
                     {"principal", who.id},
                     {"peer", who.peer}});
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListTokens(grpc::CallbackServerContext* ctx,
                                       const pb::ListTokensRequest*,
                                       pb::ListTokensResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Auth.ListTokens");
    if (!who.ok()) return Refuse(ctx, who.status());
    for (const auto& t : deps_.gate->identities().tokens().List()) ToProto(t, resp->add_tokens());
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* RevokeToken(grpc::CallbackServerContext* ctx,
                                        const pb::RevokeTokenRequest* req,
                                        pb::RevokeTokenResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Auth.RevokeToken");
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, true, "", [this, who = *who, req, resp]() -> absl::Status {
      if (req->id().empty())
        return absl::InvalidArgumentError("id: required (fwai token ls lists them)");
      auto s = deps_.gate->identities().tokens().Revoke(req->id());
      if (!s.ok()) return s;
      deps_.gate->Invalidate();
      // Its streams first, so that they end saying the token was revoked;
      // then the leases the token took end with it (nobody may renew or
      // release them with it any more) and the boards go to whoever waits.
      deps_.gate->Sweep();
      nlohmann::json ended = nlohmann::json::array();
      if (deps_.leases) {
        const std::string why = absl::StrCat("token ", req->id(), " was revoked");
        for (const BoardLease& l : deps_.leases->EndTakenWith(req->id(), why)) {
          auto* e = resp->add_leases_ended();
          e->set_lease_id(l.lease_id);
          e->set_device_id(l.board);
          e->set_holder(l.holder);
          e->set_node(l.node);
          ended.push_back({{"lease_id", l.lease_id},
                           {"board", l.board},
                           {"holder", l.identity},
                           {"node", l.node}});
        }
      }
      if (deps_.audit) {
        deps_.audit({{"kind", "token_revoked"},
                     {"token_id", req->id()},
                     {"principal", who.id},
                     {"peer", who.peer},
                     {"leases_ended", ended}});
      }
      return absl::OkStatus();
    });
  }

 private:
  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeAuthService(const ApiDeps& deps) {
  return std::make_unique<AuthService>(deps);
}

}  // namespace fwai
