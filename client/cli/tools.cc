#include "client/cli/tools.h"

#include <cctype>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/lib/client.h"
#include "fwai/v1/tool_catalog.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;

ToolsCommands::ToolsCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* tools =
      app.add_subcommand("tools", "The tool catalog: retrieval over many tool definitions");
  tools->require_subcommand(1);
  add_ = tools->add_subcommand("add", "Register tools from JSON files (an array or JSON lines)");
  add_->add_option("files", files_)->required();
  ls_ = tools->add_subcommand("ls", "List the catalog");
  rm_ = tools->add_subcommand("rm", "Remove tools by name");
  rm_->add_option("names", names_)->required();
  search_ = tools->add_subcommand("search", "Find the tools for a request");
  search_->add_option("query", query_words_, "The request");
  search_->add_option("--top-k,-k", top_k_, "1..100 (default 5)");
  search_->add_option("--mode", mode_, "slices (no rerank) or whole-lexical (for evaluation)")
      ->check(CLI::IsMember({"slices", "whole-lexical"}));
  search_->add_option("--batch", batch_,
                      "JSON lines with a \"query\" field; one JSON line out per query");
}

std::optional<int> ToolsCommands::RunIfParsed() {
  if (add_->parsed()) return Add();
  if (ls_->parsed()) return Ls();
  if (rm_->parsed()) return Rm();
  if (search_->parsed()) return Search();
  return std::nullopt;
}

int ToolsCommands::Add() {
  std::vector<std::string> docs;
  std::vector<std::string> origins;  // where each document came from, for errors
  auto add = [&](const json& j, std::string where) {
    if (j.is_object()) {
      for (const char* k : {"ToolName", "name"}) {
        if (j.contains(k) && j[k].is_string()) {
          absl::StrAppend(&where, " (", j[k].get<std::string>(), ")");
          break;
        }
      }
    }
    docs.push_back(j.dump());
    origins.push_back(std::move(where));
  };
  for (const auto& f : files_) {
    std::ifstream in(f);
    if (!in) return Fail(g_, kExitError, absl::StrCat(f, ": cannot open"));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    json whole = json::parse(text, nullptr, false);
    if (whole.is_array()) {
      for (size_t i = 0; i < whole.size(); ++i) add(whole[i], absl::StrCat(f, ": tool ", i + 1));
    } else if (whole.is_object()) {
      add(whole, f);
    } else {
      std::istringstream lines(text);
      std::string line;
      int n = 0;
      while (std::getline(lines, line)) {
        ++n;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        json j = json::parse(line, nullptr, false);
        if (!j.is_object())
          return Fail(g_, kExitError, absl::StrCat(f, ":", n, ": not a JSON object"));
        add(j, absl::StrCat(f, ":", n));
      }
    }
  }
  if (docs.empty()) return Fail(g_, kExitError, "no tool documents in the given files");
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::ToolCatalog::NewStub(*ch);
  // Requests of at most 500 tools. With more than one, every request is
  // checked first, so a bad tool anywhere registers nothing.
  constexpr size_t kBatch = 500;
  const bool check_first = docs.size() > kBatch;
  int added = 0;
  for (int pass = check_first ? 0 : 1; pass < 2; ++pass) {
    for (size_t i = 0; i < docs.size(); i += kBatch) {
      grpc::ClientContext ctx;
      pb::RegisterToolsRequest req;
      for (size_t k = i; k < docs.size() && k < i + kBatch; ++k) req.add_tool_json(docs[k]);
      req.set_validate_only(pass == 0);
      pb::RegisterToolsResponse resp;
      auto st = stub->Register(&ctx, req, &resp);
      if (st.ok()) {
        added += resp.uuids_size();
        continue;
      }
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE) return FailGrpc(g_, st);
      // "tool #N: ..." counts within the request; say which file and line.
      std::string msg = st.error_message();
      size_t n = 0, pos = 0;
      if (msg.rfind("tool #", 0) == 0) {
        pos = 6;
        while (pos < msg.size() && std::isdigit(static_cast<unsigned char>(msg[pos])))
          n = n * 10 + (msg[pos++] - '0');
      }
      if (n >= 1 && i + n - 1 < docs.size() && msg.compare(pos, 2, ": ") == 0) {
        msg = absl::StrCat(origins[i + n - 1], ": ", msg.substr(pos + 2));
      }
      return Fail(g_, kExitError, absl::StrCat(msg, added > 0 ? "" : " (nothing registered)"));
    }
  }
  if (g_.json) {
    std::cout << json({{"registered", added}}).dump() << std::endl;
  } else {
    std::cout << "registered " << added << " tools" << std::endl;
  }
  return kExitOk;
}

int ToolsCommands::Ls() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::ListToolsResponse resp;
  auto st = pb::ToolCatalog::NewStub(*ch)->List(&ctx, pb::ListToolsRequest(), &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    json arr = json::array();
    for (const auto& t : resp.tools()) {
      arr.push_back({{"uuid", t.uuid()},
                     {"name", t.name()},
                     {"tool", json::parse(t.document_json(), nullptr, false)}});
    }
    std::cout << arr.dump() << std::endl;
    return kExitOk;
  }
  for (const auto& t : resp.tools()) {
    json d = json::parse(t.document_json(), nullptr, false);
    std::string desc = d.is_object() ? d.value("ToolDescription", "") : "";
    if (desc.size() > 80) desc = desc.substr(0, 77) + "...";
    std::printf("%-40s %s\n", t.name().c_str(), desc.c_str());
  }
  std::fprintf(stderr, "(%d tools)\n", resp.tools_size());
  return kExitOk;
}

int ToolsCommands::Rm() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::ToolCatalog::NewStub(*ch);
  int rc = kExitOk;
  for (const auto& n : names_) {
    grpc::ClientContext ctx;
    pb::RemoveToolRequest req;
    req.set_name(n);
    pb::RemoveToolResponse resp;
    auto st = stub->Remove(&ctx, req, &resp);
    if (!st.ok()) {
      rc = FailGrpc(g_, st);
    } else if (!g_.json) {
      std::cout << "removed " << n << std::endl;
    }
  }
  return rc;
}

int ToolsCommands::Search() {
  const std::string query = absl::StrJoin(query_words_, " ");
  if (batch_.empty() && query.empty())
    return Fail(g_, kExitUsage, "tools search: give a QUERY or --batch FILE");
  if (top_k_ < 1 || top_k_ > 100)
    return Fail(g_, kExitUsage, absl::StrCat("--top-k ", top_k_, ": expected 1..100"));
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::ToolCatalog::NewStub(*ch);
  auto run = [&](const std::string& q, pb::ToolSearchResponse* resp) {
    grpc::ClientContext ctx;
    pb::ToolSearchRequest req;
    req.set_query(q);
    req.set_top_k(top_k_);
    req.set_mode(mode_);
    return stub->Search(&ctx, req, resp);
  };
  auto hits_json = [](const pb::ToolSearchResponse& resp) {
    json arr = json::array();
    for (const auto& h : resp.results()) {
      arr.push_back({{"rank", h.rank()},
                     {"score", h.score()},
                     {"tool", json::parse(h.tool().document_json(), nullptr, false)},
                     {"uuid", h.tool().uuid()}});
    }
    return arr;
  };
  if (!batch_.empty()) {
    return RunBatch(g_, batch_, [&](const std::string& q) -> absl::StatusOr<json> {
      pb::ToolSearchResponse resp;
      auto st = run(q, &resp);
      if (!st.ok())
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
      return json{{"took_ms", resp.took_ms()}, {"results", hits_json(resp)}};
    });
  }
  pb::ToolSearchResponse resp;
  auto st = run(query, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << hits_json(resp).dump() << std::endl;
    return kExitOk;
  }
  for (const auto& h : resp.results()) {
    json d = json::parse(h.tool().document_json(), nullptr, false);
    std::string desc = d.is_object() ? d.value("ToolDescription", "") : "";
    if (desc.size() > 100) desc = desc.substr(0, 97) + "...";
    std::printf("%2d. %.3f  %s\n    %s\n", h.rank(), h.score(), h.tool().name().c_str(),
                desc.c_str());
  }
  std::fprintf(stderr, "(%d tools in %.1f ms)\n", resp.results_size(), resp.took_ms());
  return kExitOk;
}

}  // namespace fwai
