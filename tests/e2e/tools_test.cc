// fwai tools through the CLI and a real fwaid.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

using json = nlohmann::json;

TEST(ToolsCliTest, AddListSearchBatchRemove) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  auto fwai = [&](std::vector<std::string> args, std::string* out, std::string* err = nullptr) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string e;
    int rc = RunCommand(argv, out, &e);
    if (err) *err = e;
    return rc;
  };
  // A JSON array of MCP tools and a JSON-lines file of native documents.
  std::ofstream(d.dir() + "/mcp.json") << R"([
    {"name":"read_text_file","description":"Read the complete contents of a file as text","inputSchema":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}},
    {"name":"create_issue","description":"Create a new issue in a GitHub repository","inputSchema":{"type":"object","properties":{"title":{"type":"string"},"body":{"type":"string"}}}}
  ])";
  std::ofstream(d.dir() + "/native.jsonl")
      << R"({"ToolName":"openocd.flash_erase_sector","ToolDescription":"Erase sectors in bank num, starting at sector first up to and including last.","Args":[{"ArgName":"num","ArgDescription":"bank"}]})"
         "\n"
      << R"({"ToolName":"gdb.backtrace","ToolDescription":"Print backtrace of all stack frames.","Args":[]})"
         "\n";
  std::string out, err;
  ASSERT_EQ(fwai({"tools", "add", d.dir() + "/mcp.json", d.dir() + "/native.jsonl"}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("registered 4 tools"), std::string::npos) << out;
  ASSERT_EQ(fwai({"--json", "tools", "ls"}, &out), 0);
  EXPECT_EQ(json::parse(out).size(), 4u);
  ASSERT_EQ(fwai({"--json", "tools", "search", "-k", "2", "show", "the", "call", "stack", "of",
                  "the", "crash"},
                 &out),
            0);
  auto hits = json::parse(out);
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0]["tool"]["ToolName"], "gdb.backtrace");
  EXPECT_EQ(hits[0]["rank"], 1);
  EXPECT_TRUE(hits[0]["score"].is_number());
  EXPECT_EQ(hits[0]["uuid"].get<std::string>().size(), 36u);
  std::ofstream(d.dir() + "/q.jsonl") << R"({"query":"open an issue about the bug"})"
                                         "\n"
                                      << R"({"query":"wipe sectors 2 to 5 of flash bank 0"})"
                                         "\n";
  ASSERT_EQ(fwai({"tools", "search", "--batch", d.dir() + "/q.jsonl", "-k", "3"}, &out), 0);
  std::istringstream lines(out);
  std::string l1, l2;
  std::getline(lines, l1);
  std::getline(lines, l2);
  auto b1 = json::parse(l1), b2 = json::parse(l2);
  EXPECT_TRUE(b1["took_ms"].is_number());
  EXPECT_EQ(b1["results"][0]["tool"]["ToolName"], "create_issue");
  EXPECT_EQ(b2["results"][0]["tool"]["ToolName"], "openocd.flash_erase_sector");
  ASSERT_EQ(fwai({"tools", "rm", "gdb.backtrace"}, &out), 0);
  EXPECT_EQ(fwai({"tools", "rm", "gdb.backtrace"}, &out, &err), 1);
  EXPECT_NE(err.find("not in the catalog"), std::string::npos) << err;
  std::ofstream(d.dir() + "/bad.json") << R"([{"description":"no name"}])";
  EXPECT_EQ(fwai({"tools", "add", d.dir() + "/bad.json"}, &out, &err), 1);
  EXPECT_NE(err.find("bad.json: tool 1: expected ToolName"), std::string::npos) << err;
  EXPECT_EQ(fwai({"tools", "search", "-k", "0", "x"}, &out, &err), 2);
  EXPECT_NE(err.find("--top-k 0"), std::string::npos) << err;
}

// A file larger than one request is checked whole before anything is
// registered; the error names the file and line of the bad tool.
TEST(ToolsCliTest, ABadToolInALargeFileRegistersNothing) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  auto fwai = [&](std::vector<std::string> args, std::string* out, std::string* err) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err);
  };
  {
    std::ofstream f(d.dir() + "/many.jsonl");
    for (int i = 1; i <= 1200; ++i) {
      json t = {{"ToolName", "t" + std::to_string(i)},
                {"ToolDescription", "tool number " + std::to_string(i)},
                {"Args", json::array()}};
      if (i == 1100) t["Args"] = "none";
      f << t.dump() << "\n";
    }
  }
  std::string out, err;
  ASSERT_EQ(fwai({"tools", "add", d.dir() + "/many.jsonl"}, &out, &err), 1) << out;
  EXPECT_NE(err.find("many.jsonl:1100 (t1100): Args: expected an array (nothing registered)"),
            std::string::npos)
      << err;
  ASSERT_EQ(fwai({"--json", "tools", "ls"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out).size(), 0u);
}

// catalog.reranker: a rerank service orders the candidates by their whole
// documents (the fake scores the share of the query's words in a passage).
TEST(ToolsCliTest, ARerankServiceOrdersTheCandidates) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake,
           "catalog:\n  reranker: {kind: tei, base_url: '" + fake.anthropic_base_url() + "'}\n");
  ASSERT_TRUE(d.Start()) << d.log();
  auto fwai = [&](std::vector<std::string> args, std::string* out) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string err;
    int rc = RunCommand(argv, out, &err);
    if (rc != 0) *out += err;
    return rc;
  };
  std::ofstream(d.dir() + "/tools.jsonl")
      << R"({"ToolName":"gdb.backtrace","ToolDescription":"Print backtrace of all stack frames.","Args":[{"ArgName":"full","ArgDescription":"also print the values of the local variables"}]})"
         "\n"
      << R"({"ToolName":"gdb.frame","ToolDescription":"Select and print a stack frame.","Args":[]})"
         "\n";
  std::string out;
  ASSERT_EQ(fwai({"tools", "add", d.dir() + "/tools.jsonl"}, &out), 0) << out;
  // Only the argument's description says "local variables": the service sees
  // whole documents, and its scores are the ones returned.
  ASSERT_EQ(fwai({"--json", "tools", "search", "-k", "2", "stack", "local", "variables"}, &out), 0)
      << out;
  auto hits = json::parse(out);
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0]["tool"]["ToolName"], "gdb.backtrace");
  EXPECT_NEAR(hits[0]["score"].get<double>(), 1.0, 1e-9);
  EXPECT_NEAR(hits[1]["score"].get<double>(), 1.0 / 3, 1e-9);
  bool asked = false;
  for (const auto& r : fake.requests()) {
    if (r.path != "/rerank") continue;
    asked = true;
    EXPECT_EQ(r.body["query"], "stack local variables");
    ASSERT_EQ(r.body["texts"].size(), 2u);
    EXPECT_NE(r.body["texts"].dump().find("also print the values of the local variables"),
              std::string::npos)
        << r.body;
  }
  EXPECT_TRUE(asked);
}

}  // namespace
}  // namespace fwai::testing
