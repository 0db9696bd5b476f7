#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "fwai/v1/tool_catalog.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/catalog/tool_catalog.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

class ToolCatalogService final : public pb::ToolCatalog::CallbackService {
 public:
  explicit ToolCatalogService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const pb::RegisterToolsRequest* req,
                                     pb::RegisterToolsResponse* resp) override {
    return Offload(ctx, "ToolCatalog.Register", [this, req, resp]() -> absl::Status {
      if (req->tool_json().empty())
        return absl::InvalidArgumentError("tool_json: at least one tool");
      std::vector<std::string> docs(req->tool_json().begin(), req->tool_json().end());
      if (req->validate_only()) return ToolCatalogStore::Validate(docs);
      auto uuids = deps_.catalog->Register(docs);
      if (!uuids.ok()) return uuids.status();
      for (const auto& u : *uuids) resp->add_uuids(u);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const pb::ListToolsRequest*,
                                 pb::ListToolsResponse* resp) override {
    return Offload(ctx, "ToolCatalog.List", [this, resp]() -> absl::Status {
      auto tools = deps_.catalog->List();
      if (!tools.ok()) return tools.status();
      for (const auto& t : *tools) {
        auto* e = resp->add_tools();
        e->set_uuid(t.uuid);
        e->set_name(t.name);
        e->set_document_json(t.document_json);
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Remove(grpc::CallbackServerContext* ctx,
                                   const pb::RemoveToolRequest* req,
                                   pb::RemoveToolResponse*) override {
    return Offload(ctx, "ToolCatalog.Remove", [this, req]() -> absl::Status {
      if (req->name().empty()) return absl::InvalidArgumentError("name: required");
      return deps_.catalog->Remove(req->name());
    });
  }

  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* ctx,
                                   const pb::ToolSearchRequest* req,
                                   pb::ToolSearchResponse* resp) override {
    return Offload(ctx, "ToolCatalog.Search", [this, req, resp]() -> absl::Status {
      const auto t0 = std::chrono::steady_clock::now();
      CatalogMode mode = CatalogMode::kSlicesRerank;
      if (req->mode() == "slices") {
        mode = CatalogMode::kSlices;
      } else if (req->mode() == "whole-lexical") {
        mode = CatalogMode::kWholeLexical;
      } else if (!req->mode().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("mode: '", req->mode(), "'; expected slices or whole-lexical"));
      }
      auto hits = deps_.catalog->Search(req->query(), req->top_k() == 0 ? 5 : req->top_k(), mode);
      if (!hits.ok()) return hits.status();
      for (const auto& h : *hits) {
        auto* o = resp->add_results();
        o->set_rank(h.rank);
        o->set_score(h.score);
        o->mutable_tool()->set_uuid(h.tool.uuid);
        o->mutable_tool()->set_name(h.tool.name);
        o->mutable_tool()->set_document_json(h.tool.document_json);
      }
      resp->set_took_ms(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      return absl::OkStatus();
    });
  }

 private:
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                    std::function<absl::Status()> work) {
    auto who = deps_.gate->Admit(ctx, rpc);
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.catalog != nullptr,
                        "the tool catalog is not available", std::move(work));
  }

  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeToolCatalogService(const ApiDeps& deps) {
  return std::make_unique<ToolCatalogService>(deps);
}

}  // namespace fwai
