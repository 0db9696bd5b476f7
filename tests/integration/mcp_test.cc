// The MCP client against real MCP servers from the npm registry (installed
// by scripts/setup), and against processes that crash, hang or write junk.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/mcp/mcp_client.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Bin(const std::string& name) {
  std::string p = std::string(FWAI_MCP_BIN_DIR) + "/" + name;
  EXPECT_TRUE(fs::exists(p)) << p << " is missing: run scripts/setup";
  return p;
}

TEST(McpClientTest, EverythingServerListsAndCallsTools) {
  auto c = McpClient::Start({"everything", {Bin("mcp-server-everything")}, {}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*c)->server_info().find("everything"), std::string::npos) << (*c)->server_info();
  auto tools = (*c)->ListTools();
  ASSERT_TRUE(tools.ok()) << tools.status();
  bool echo = false, sum = false;
  for (const auto& t : *tools) {
    echo |= t.name == "echo";
    sum |= t.name == "get-sum" && t.input_schema["properties"].contains("a");
  }
  EXPECT_TRUE(echo);
  EXPECT_TRUE(sum);
  auto r = (*c)->CallTool("echo", {{"message", "hello fwai"}}, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->text.find("hello fwai"), std::string::npos) << r->text;
  EXPECT_FALSE(r->is_error);
  auto s = (*c)->CallTool("get-sum", {{"a", 2}, {"b", 40}}, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_NE(s->text.find("42"), std::string::npos) << s->text;
  auto missing = (*c)->CallTool("no-such-tool", json::object(), nullptr);
  EXPECT_TRUE(!missing.ok() || missing->is_error);
}

TEST(McpClientTest, CancellationStopsALongCall) {
  auto c = McpClient::Start({"everything", {Bin("mcp-server-everything")}, {}});
  ASSERT_TRUE(c.ok()) << c.status();
  CancelToken cancel;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.Cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = (*c)->CallTool("trigger-long-running-operation", {{"duration", 30}, {"steps", 5}}, &cancel);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  t.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(ms, 2000);
  // The server is still usable.
  auto e = (*c)->CallTool("echo", {{"message", "after"}}, nullptr);
  ASSERT_TRUE(e.ok()) << e.status();
}

TEST(McpClientTest, FilesystemServerStaysInItsRoot) {
  std::string root = testing::MakeTempDir("fwai-mcp-fs-");
  std::ofstream(root + "/notes.txt") << "UART at 115200 baud\n";
  auto c = McpClient::Start({"filesystem", {Bin("mcp-server-filesystem"), root}, {}});
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->CallTool("read_text_file", {{"path", root + "/notes.txt"}}, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->text.find("115200"), std::string::npos) << r->text;
  auto outside = (*c)->CallTool("read_text_file", {{"path", "/etc/hostname"}}, nullptr);
  EXPECT_TRUE(!outside.ok() || outside->is_error);
  fs::remove_all(root);
}

TEST(McpClientTest, BrokenServersFailClearly) {
  auto crash = McpClient::Start({"crasher", {"node", "-e", "process.exit(3)"}, {}, 5000});
  ASSERT_FALSE(crash.ok());
  EXPECT_EQ(crash.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(crash.status().message().find("exited with code 3"), std::string::npos) << crash.status();
  auto junk = McpClient::Start({"junk", {"node", "-e", "console.log('this is not json'); setTimeout(()=>{}, 5000)"}, {}, 5000});
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("not a JSON-RPC message"), std::string::npos) << junk.status();
  auto hang = McpClient::Start({"hang", {"node", "-e", "setInterval(()=>{}, 1000)"}, {}, 500});
  ASSERT_FALSE(hang.ok());
  EXPECT_EQ(hang.status().code(), absl::StatusCode::kDeadlineExceeded) << hang.status();
  auto none = McpClient::Start({"none", {"/nonexistent/mcp-server"}, {}});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  // A server that dies in the middle of a call: the call fails with the reason.
  const char* dier =
      "const rl = require('readline').createInterface({input: process.stdin});"
      "rl.on('line', l => { const m = JSON.parse(l);"
      "  if (m.method === 'initialize') console.log(JSON.stringify({jsonrpc: '2.0', id: m.id, result: {"
      "    protocolVersion: '2025-03-26', capabilities: {}, serverInfo: {name: 'dier', version: '1'}}}));"
      "  else if (m.method === 'tools/call') process.exit(7); });";
  auto c = McpClient::Start({"dier", {"node", "-e", dier}, {}});
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->CallTool("anything", json::object(), nullptr, 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("exited with code 7"), std::string::npos) << r.status();
  EXPECT_FALSE((*c)->alive());
}

}  // namespace
}  // namespace fwai
