#include "client/cli/evidence.h"

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "fwai/v1/evidence.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;

EvidenceCommands::EvidenceCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* ev = app.add_subcommand("evidence", "The tamper-evident record of agent turns and flashes");
  ev->require_subcommand(1);
  ls_ = ev->add_subcommand("ls", "Recent run records");
  ls_->add_option("--limit,-n", limit_, "How many (default 20; 0 = all)");
  show_ = ev->add_subcommand("show", "One run record, as stored");
  show_->add_option("run", run_id_)->required();
  verify_ = ev->add_subcommand(
      "verify", "Recompute the chain, the Merkle tree, proofs and checkpoint signatures");
  export_ = ev->add_subcommand("export", "Export the log");
  export_
      ->add_option("--format", format_,
                   "json | csv | sarif (build diagnostics) | html (a report) | in-toto (a "
                   "DSSE-signed statement)")
      ->check(CLI::IsMember({"json", "csv", "sarif", "html", "in-toto"}));
  export_->add_option("--output,-o", output_, "File (default: standard output)");
}

std::optional<int> EvidenceCommands::RunIfParsed() {
  if (!ls_->parsed() && !show_->parsed() && !verify_->parsed() && !export_->parsed())
    return std::nullopt;
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Evidence::NewStub(*ch);
  grpc::ClientContext ctx;
  if (ls_->parsed()) {
    pb::ListRunsRequest req;
    req.set_limit(limit_);
    pb::ListRunsResponse resp;
    auto st = stub->ListRuns(&ctx, req, &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    for (const auto& r : resp.runs()) {
      json j = json::parse(r.record_json(), nullptr, false);
      if (g_.json) {
        std::cout << json{{"index", r.index()},
                          {"run_id", r.run_id()},
                          {"hash", r.hash()},
                          {"record", j}}
                         .dump()
                  << "\n";
        continue;
      }
      std::string what = j.value("kind", "?");
      if (what == "agent_turn") {
        absl::StrAppend(&what, " ", j.value("session_id", ""), " ", j.value("model", ""), " ",
                        j.contains("tools") ? j["tools"].size() : 0, " tool calls, ",
                        j.value("stop_reason", ""));
      } else if (what == "flash") {
        absl::StrAppend(&what, " ", j.value("board", ""), " ",
                        j.value("image_sha256", "").substr(0, 12),
                        j.value("booted", false) ? " booted" : "");
      }
      std::printf("%5llu  %-24s %s\n", static_cast<unsigned long long>(r.index()),
                  r.run_id().c_str(), what.c_str());
    }
    return kExitOk;
  }
  if (show_->parsed()) {
    pb::GetRunRequest req;
    req.set_run_id(run_id_);
    pb::RunRecord r;
    auto st = stub->GetRun(&ctx, req, &r);
    if (!st.ok()) return FailGrpc(g_, st);
    if (g_.json) {
      std::cout << r.record_json() << std::endl;
    } else {
      std::cout << "run " << r.run_id() << "  (record " << r.index() << ", leaf hash " << r.hash()
                << ")\n"
                << json::parse(r.record_json(), nullptr, false).dump(2) << std::endl;
    }
    return kExitOk;
  }
  if (verify_->parsed()) {
    pb::VerifyResponse resp;
    auto st = stub->Verify(&ctx, pb::VerifyRequest(), &resp);
    if (!st.ok()) return FailGrpc(g_, st);
    if (g_.json) {
      std::cout << json{{"ok", resp.ok()},
                        {"records", resp.records()},
                        {"first_bad", resp.first_bad()},
                        {"detail", resp.detail()}}
                       .dump()
                << std::endl;
    } else if (resp.ok()) {
      std::cout << "evidence verified: " << resp.detail() << std::endl;
    } else {
      std::cerr << "evidence FAILED verification at " << resp.first_bad() << ": " << resp.detail()
                << std::endl;
    }
    return resp.ok() ? kExitOk : kExitError;
  }
  pb::ExportRequest req;
  req.set_format(format_);
  pb::ExportResponse resp;
  auto st = stub->Export(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (output_.empty()) {
    std::cout << resp.data();
    if (!resp.data().empty() && resp.data().back() != '\n') std::cout << "\n";
  } else {
    std::ofstream out(output_, std::ios::binary);
    out << resp.data();
    if (!out) return Fail(g_, kExitError, absl::StrCat(output_, ": cannot write"));
    std::cerr << "wrote " << resp.data().size() << " bytes to " << output_ << std::endl;
  }
  return kExitOk;
}

}  // namespace fwai
