// Evidence: list and show run records, verify the log, export it.
#include <grpcpp/grpcpp.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/thread_pool.h"
#include "fwai/v1/evidence.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/api/share_subject.h"
#include "server/evidence/evidence_log.h"
#include "server/evidence/export.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;
using json = nlohmann::json;

void ToProto(const EvidenceRecord& r, pb::RunRecord* out) {
  out->set_run_id(r.run_id);
  out->set_index(r.index);
  out->set_record_json(r.bytes);
  out->set_hash(ToHex(r.leaf));
}

// Whether a record of a session is one its sharers may read: what happened
// in it, not whom its owner shares it with (nor an admin's look at it).
bool ForSharers(const json& j) {
  const std::string kind = j.value("kind", "");
  return kind != "session_shared" && kind != "session_unshared" && kind != "admin_override";
}

// Whose a record is: the principal that made it (or the session's owner),
// and the users that session is shared with (a watcher sees the evidence of
// what it watches). Records that name nobody are for admins.
bool Visible(const Principal& p, const EvidenceRecord& r, const SessionShares* shares) {
  if (p.admin()) return true;
  auto j = json::parse(r.bytes, nullptr, false);
  if (!j.is_object()) return false;
  if (const auto s = j.find("session_id"); s != j.end() && s->is_string() && ForSharers(j) &&
                                           HasShareOf(shares, p, s->get<std::string>())) {
    return true;
  }
  // What the caller did, or what happened to something of theirs (an
  // admin's turn in their session, say).
  for (const char* field : {"principal", "owner"}) {
    const auto it = j.find(field);
    if (it != j.end() && it->is_string() && !it->get<std::string>().empty() &&
        p.Owns(it->get<std::string>())) {
      return true;
    }
  }
  return false;
}

std::vector<EvidenceRecord> VisibleOnly(const Principal& p, std::vector<EvidenceRecord> all,
                                        const SessionShares* shares) {
  if (p.admin()) return all;
  std::vector<EvidenceRecord> out;
  for (auto& r : all) {
    if (Visible(p, r, shares)) out.push_back(std::move(r));
  }
  return out;
}

std::string CsvField(std::string s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  return "\"" + absl::StrReplaceAll(s, {{"\"", "\"\""}}) + "\"";
}

class EvidenceService final : public pb::Evidence::CallbackService {
 public:
  explicit EvidenceService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx,
                                     const pb::ListRunsRequest* req,
                                     pb::ListRunsResponse* resp) override {
    return Offload(ctx, "Evidence.ListRuns", [this, req, resp](const Principal& who) {
      // The newest `limit` of the caller's own records.
      auto list = deps_.evidence->List(
          who.admin() && req->limit() > 0 ? static_cast<size_t>(req->limit()) : 0);
      if (!list.ok()) return list.status();
      auto mine = VisibleOnly(who, *std::move(list), deps_.shares);
      const size_t skip = req->limit() > 0 && mine.size() > static_cast<size_t>(req->limit())
                              ? mine.size() - static_cast<size_t>(req->limit())
                              : 0;
      for (size_t i = skip; i < mine.size(); ++i) ToProto(mine[i], resp->add_runs());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* ctx, const pb::GetRunRequest* req,
                                   pb::RunRecord* resp) override {
    return Offload(ctx, "Evidence.GetRun", [this, req, resp](const Principal& who) {
      if (req->run_id().empty()) return absl::InvalidArgumentError("run_id: required");
      auto r = deps_.evidence->Get(req->run_id());
      if (!r.ok()) return r.status();
      if (!Visible(who, *r, deps_.shares))
        return absl::NotFoundError(absl::StrCat("no record for run ", req->run_id()));
      ToProto(*r, resp);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* ctx, const pb::VerifyRequest*,
                                   pb::VerifyResponse* resp) override {
    return Offload(ctx, "Evidence.Verify", [this, resp](const Principal&) {
      auto r = deps_.evidence->Verify();
      resp->set_ok(r.ok);
      resp->set_records(r.records);
      resp->set_first_bad(r.first_bad);
      resp->set_detail(r.detail);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Export(grpc::CallbackServerContext* ctx, const pb::ExportRequest* req,
                                   pb::ExportResponse* resp) override {
    return Offload(ctx, "Evidence.Export", [this, req, resp](const Principal& who) {
      const std::string fmt = req->format().empty() ? "json" : req->format();
      auto all = deps_.evidence->List(0);
      if (!all.ok()) return all.status();
      // Only the caller's own records (admins: all).
      auto list = std::make_optional(VisibleOnly(who, *std::move(all), deps_.shares));
      if (fmt == "json") {
        json out = {{"public_key_ed25519", deps_.evidence->public_key_hex()},
                    {"records", json::array()}};
        for (const auto& r : *list) {
          out["records"].push_back({{"index", r.index},
                                    {"run_id", r.run_id},
                                    {"leaf_hash", ToHex(r.leaf)},
                                    {"record", json::parse(r.bytes, nullptr, false)},
                                    {"bytes", r.bytes}});
        }
        resp->set_data(out.dump(1));
        resp->set_content_type("application/json");
        return absl::OkStatus();
      }
      if (fmt == "csv") {
        std::string csv =
            "index,run_id,kind,time_us,session_id,board,model,stop_reason,leaf_hash\n";
        for (const auto& r : *list) {
          auto j = json::parse(r.bytes, nullptr, false);
          auto f = [&](const char* k) {
            if (!j.is_object() || !j.contains(k)) return std::string();
            return j[k].is_string() ? j[k].get<std::string>() : j[k].dump();
          };
          absl::StrAppend(&csv, r.index, ",", CsvField(r.run_id), ",", CsvField(f("kind")), ",",
                          f("time_us"), ",", CsvField(f("session_id")), ",", CsvField(f("board")),
                          ",", CsvField(f("model")), ",", CsvField(f("stop_reason")), ",",
                          ToHex(r.leaf), "\n");
        }
        resp->set_data(csv);
        resp->set_content_type("text/csv");
        return absl::OkStatus();
      }
      // The tree head over exactly the records exported.
      std::vector<Hash> leaves;
      for (const auto& r : *list) leaves.push_back(r.leaf);
      const std::string root = ToHex(TreeHead(leaves, leaves.size()));
      if (fmt == "sarif") {
        resp->set_data(ExportSarif(*list, deps_.version));
        resp->set_content_type("application/sarif+json");
        return absl::OkStatus();
      }
      if (fmt == "html") {
        resp->set_data(
            ExportHtml(*list, deps_.evidence->Verify(), deps_.evidence->public_key_hex(), root));
        resp->set_content_type("text/html");
        return absl::OkStatus();
      }
      if (fmt == "in-toto") {
        EvidenceLog* log = deps_.evidence;
        auto env = ExportInToto(*list, root, log->public_key_hex(),
                                [log](std::string_view m) { return log->Sign(m); });
        if (!env.ok()) return env.status();
        resp->set_data(*env);
        resp->set_content_type("application/vnd.dsse.envelope+json");
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(
          absl::StrCat("format: '", fmt, "' (expected json, csv, sarif, html or in-toto)"));
    });
  }

 private:
  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                    std::function<absl::Status(const Principal&)> work) {
    auto who = deps_.gate->Admit(ctx, rpc);
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.evidence != nullptr, "the evidence log is not open",
                        [who = *who, work = std::move(work)] { return work(who); });
  }
  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeEvidenceService(const ApiDeps& deps) {
  return std::make_unique<EvidenceService>(deps);
}

}  // namespace fwai
