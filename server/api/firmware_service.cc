// Firmware: the memory report (regions, sections, symbols, stack, the change
// since the previous build), the SBOM of a run or an image, and the register
// check of a project's sources against its SVD.
#include <grpcpp/grpcpp.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "fwai/v1/firmware.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/firmware/memory.h"
#include "server/firmware/register_tools.h"
#include "server/firmware/reports.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;

class FirmwareService final : public pb::Firmware::CallbackService {
 public:
  explicit FirmwareService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* Memory(grpc::CallbackServerContext* ctx, const pb::MemoryRequest* req,
                                   pb::FirmwareReport* resp) override {
    return Offload(
        ctx, "Firmware.Memory", {req->project_root(), req->image(), req->diff()},
        [this, req, resp] {
          auto root = CanonicalProjectRoot(req->project_root());
          if (!root.ok()) return root.status();
          auto r = MemoryReportFor(*deps_.firmware, *root, req->image(), req->diff());
          if (!r.ok()) return r.status();
          resp->set_json(r->dump());
          resp->set_text(MemorySummaryText((*r)["report"], r->value("diff", nlohmann::json()), 10));
          return absl::OkStatus();
        });
  }

  grpc::ServerUnaryReactor* Sbom(grpc::CallbackServerContext* ctx, const pb::SbomRequest* req,
                                 pb::FirmwareReport* resp) override {
    return Offload(ctx, "Firmware.Sbom", {req->project_root(), req->run_or_image()},
                   [this, req, resp] {
                     auto root = CanonicalProjectRoot(req->project_root());
                     if (!root.ok()) return root.status();
                     auto r = SbomFor(*deps_.firmware, *root, req->run_or_image(), req->format());
                     if (!r.ok()) return r.status();
                     resp->set_json(r->dump(2));
                     return absl::OkStatus();
                   });
  }

  // Every file (the project's settings, its sources, an SVD it names) is read
  // as the caller's account; a path outside the project is named in
  // "skipped", never read.
  grpc::ServerUnaryReactor* CheckRegisters(grpc::CallbackServerContext* ctx,
                                           const pb::CheckRegistersRequest* req,
                                           pb::FirmwareReport* resp) override {
    auto who = deps_.gate->Admit(ctx, "Firmware.CheckRegisters");
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(
        ctx, deps_.pool, deps_.svd_catalog != nullptr, "register checks are not available",
        [this, account = *who->account, req, resp]() -> absl::Status {
          auto root = CanonicalProjectRoot(req->project_root());
          if (!root.ok()) return root.status();
          RegisterCheckRequest r;
          r.project_root = *root;
          r.paths.assign(req->paths().begin(), req->paths().end());
          r.svd = req->svd();
          r.target = req->target();
          auto report = CheckProjectRegisters(*deps_.svd_catalog, &account, std::move(r));
          if (!report.ok()) return report.status();
          resp->set_json(report->dump());
          resp->set_text(RegisterFindingsText(*report));
          return absl::OkStatus();
        });
  }

 private:
  // Admits the call; the caller's account must be able to read the project
  // and every path the request names, so nobody reads (through a report) an
  // image they could not read themselves.
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                    std::vector<std::string> paths,
                                    std::function<absl::Status()> work) {
    auto who = deps_.gate->Admit(ctx, rpc);
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(
        ctx, deps_.pool, deps_.firmware != nullptr, "firmware reports are not available",
        [account = *who->account, paths = std::move(paths), work = std::move(work)] {
          // paths[0] is the project root; the others are relative to it.
          const std::string root = paths.empty() ? "" : paths[0];
          if (auto s = AccountCanRead(account, root, paths); !s.ok()) return s;
          return work();
        });
  }
  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeFirmwareService(const ApiDeps& deps) {
  return std::make_unique<FirmwareService>(deps);
}

}  // namespace fwai
