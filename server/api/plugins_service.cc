// Plugins: install, list, remove, verify, search the marketplaces.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "fwai/v1/plugins.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/plugins/plugin_store.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;
using json = nlohmann::json;

constexpr char kUnavailable[] = "plugins are not available";

void Fill(const InstalledPlugin& p, pb::PluginInfo* out) {
  out->set_name(p.name);
  out->set_version(p.manifest.version);
  const auto& m = p.manifest;
  json mcp = json::array();
  for (const auto& [n, e] : m.mcp_servers) mcp.push_back(n);
  json j = {{"name", p.name},
            {"version", m.version},
            {"description", m.description},
            {"dir", p.dir},
            {"skills", m.skills},
            {"agents", m.agents},
            {"tools", m.tools},
            {"templates", m.templates},
            {"mcp_servers", mcp},
            {"capabilities",
             {{"build", m.capabilities.build},
              {"flash", m.capabilities.flash},
              {"boards", m.capabilities.boards},
              {"network", m.capabilities.network}}},
            {"installed", p.record}};
  out->set_json(j.dump());
}

class PluginsService final : public pb::Plugins::CallbackService {
 public:
  explicit PluginsService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* Install(grpc::CallbackServerContext* ctx,
                                    const pb::InstallPluginRequest* req,
                                    pb::PluginInfo* resp) override {
    auto admitted = AdmitCaller(deps_, ctx, "Plugins.Install");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    Caller caller = *admitted;
    return OffloadUnary(ctx, deps_.pool, deps_.plugins != nullptr, kUnavailable,
                        [this, req, resp, caller] {
                          if (req->source().empty())
                            return absl::InvalidArgumentError(
                                "source: required (a directory, a tarball, or git+URL@COMMIT)");
                          auto r = deps_.plugins->Install(req->source(), req->replace(), caller);
                          if (!r.ok()) return r.status();
                          for (const auto& p : deps_.plugins->Installed()) {
                            if (p.name == r->value("name", "")) Fill(p, resp);
                          }
                          return absl::OkStatus();
                        });
  }

  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const pb::ListPluginsRequest*,
                                 pb::ListPluginsResponse* resp) override {
    if (auto who = deps_.gate->Admit(ctx, "Plugins.List"); !who.ok())
      return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.plugins != nullptr, kUnavailable, [this, resp] {
      for (const auto& p : deps_.plugins->Installed()) Fill(p, resp->add_plugins());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Remove(grpc::CallbackServerContext* ctx,
                                   const pb::RemovePluginRequest* req,
                                   pb::RemovePluginResponse* resp) override {
    auto admitted = AdmitCaller(deps_, ctx, "Plugins.Remove");
    if (!admitted.ok()) return Refuse(ctx, admitted.status());
    Caller caller = *admitted;
    return OffloadUnary(ctx, deps_.pool, deps_.plugins != nullptr, kUnavailable,
                        [this, req, resp, caller] {
                          if (req->name().empty())
                            return absl::InvalidArgumentError("name: required");
                          auto r = deps_.plugins->Remove(req->name(), caller);
                          if (!r.ok()) return r.status();
                          resp->set_json(r->dump());
                          return absl::OkStatus();
                        });
  }

  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* ctx,
                                   const pb::VerifyPluginRequest* req,
                                   pb::PluginInfo* resp) override {
    if (auto who = deps_.gate->Admit(ctx, "Plugins.Verify"); !who.ok())
      return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.plugins != nullptr, kUnavailable, [this, req, resp] {
      if (req->name().empty()) return absl::InvalidArgumentError("name: required");
      auto r = deps_.plugins->Verify(req->name());
      if (!r.ok()) return r.status();
      resp->set_name(req->name());
      resp->set_version(r->value("version", ""));
      resp->set_json(r->dump());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* ctx,
                                   const pb::SearchPluginsRequest* req,
                                   pb::SearchPluginsResponse* resp) override {
    if (auto who = deps_.gate->Admit(ctx, "Plugins.Search"); !who.ok())
      return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.plugins != nullptr, kUnavailable, [this, req, resp] {
      auto r = deps_.plugins->Search(req->query(), req->marketplace());
      if (!r.ok()) return r.status();
      resp->set_json(r->dump());
      return absl::OkStatus();
    });
  }

 private:
  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakePluginsService(const ApiDeps& deps) {
  return std::make_unique<PluginsService>(deps);
}

}  // namespace fwai
