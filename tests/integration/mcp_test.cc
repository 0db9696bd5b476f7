// The MCP client against real MCP servers from the npm registry (installed
// by scripts/setup), and against processes that crash, hang or write junk.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "server/llm/http_client.h"
#include "server/mcp/mcp_client.h"
#include "server/mcp/mcp_manager.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

McpServerConfig Stdio(std::string name, std::vector<std::string> command,
                      int init_timeout_ms = 20000) {
  McpServerConfig c;
  c.name = std::move(name);
  c.command = std::move(command);
  c.init_timeout_ms = init_timeout_ms;
  return c;
}

std::string Bin(const std::string& name) {
  std::string p = std::string(FWAI_MCP_BIN_DIR) + "/" + name;
  EXPECT_TRUE(fs::exists(p)) << p << " is missing: run scripts/setup";
  return p;
}

// The model calls mcp_everything_echo with `message`; true when the tool
// answered without error and echoed it.
bool EchoThroughTheAgent(testing::FakeLlmServer& fake, testing::Daemon& d,
                         const std::string& session_id, const std::string& message) {
  testing::FakeReply call;
  call.tool_calls = {{"call_1", "mcp_everything_echo", {{"message", message}}}};
  fake.Enqueue(call);
  testing::FakeReply done;
  done.chunks = {"done"};
  fake.Enqueue(done);
  auto turn = testing::RunChat(*d.sessions(), session_id, "use the echo tool");
  if (!turn.finished) return false;
  bool echoed = false;
  for (const auto& ev : turn.events) {
    if (!ev.has_tool_call_finished()) continue;
    if (ev.tool_call_finished().is_error()) return false;
    echoed |= ev.tool_call_finished().output().find(message) != std::string::npos;
  }
  return echoed;
}

TEST(McpClientTest, EverythingServerListsAndCallsTools) {
  auto c = McpClient::Start(Stdio("everything", {Bin("mcp-server-everything")}));
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
  auto c = McpClient::Start(Stdio("everything", {Bin("mcp-server-everything")}));
  ASSERT_TRUE(c.ok()) << c.status();
  CancelToken cancel;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.Cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r =
      (*c)->CallTool("trigger-long-running-operation", {{"duration", 30}, {"steps", 5}}, &cancel);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
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
  auto c = McpClient::Start(Stdio("filesystem", {Bin("mcp-server-filesystem"), root}));
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->CallTool("read_text_file", {{"path", root + "/notes.txt"}}, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->text.find("115200"), std::string::npos) << r->text;
  auto outside = (*c)->CallTool("read_text_file", {{"path", "/etc/hostname"}}, nullptr);
  EXPECT_TRUE(!outside.ok() || outside->is_error);
  fs::remove_all(root);
}

TEST(McpClientTest, BrokenServersFailClearly) {
  auto crash = McpClient::Start(Stdio("crasher", {"node", "-e", "process.exit(3)"}, 5000));
  ASSERT_FALSE(crash.ok());
  EXPECT_EQ(crash.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(crash.status().message().find("exited with code 3"), std::string::npos)
      << crash.status();
  auto junk = McpClient::Start(Stdio(
      "junk", {"node", "-e", "console.log('this is not json'); setTimeout(()=>{}, 5000)"}, 5000));
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("not a JSON-RPC message"), std::string::npos)
      << junk.status();
  auto hang = McpClient::Start(Stdio("hang", {"node", "-e", "setInterval(()=>{}, 1000)"}, 500));
  ASSERT_FALSE(hang.ok());
  EXPECT_EQ(hang.status().code(), absl::StatusCode::kDeadlineExceeded) << hang.status();
  auto none = McpClient::Start(Stdio("none", {"/nonexistent/mcp-server"}));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  // A server that dies in the middle of a call: the call fails with the reason.
  const char* dier =
      "const rl = require('readline').createInterface({input: process.stdin});"
      "rl.on('line', l => { const m = JSON.parse(l);"
      "  if (m.method === 'initialize') console.log(JSON.stringify({jsonrpc: '2.0', id: m.id, "
      "result: {"
      "    protocolVersion: '2025-03-26', capabilities: {}, serverInfo: {name: 'dier', version: "
      "'1'}}}));"
      "  else if (m.method === 'tools/call') process.exit(7); });";
  auto c = McpClient::Start(Stdio("dier", {"node", "-e", dier}));
  ASSERT_TRUE(c.ok()) << c.status();
  auto r = (*c)->CallTool("anything", json::object(), nullptr, 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("exited with code 7"), std::string::npos) << r.status();
  EXPECT_FALSE((*c)->alive());
}

// An MCP server in streamable-HTTP mode on a free port (given as PORT):
// by default the everything server.
class HttpMcpServer {
 public:
  explicit HttpMcpServer(std::vector<std::string> argv = {},
                         std::map<std::string, std::string> env = {}) {
    if (argv.empty()) argv = {Bin("mcp-server-everything"), "streamableHttp"};
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    close(s);
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      setenv("PORT", std::to_string(port_).c_str(), 1);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    for (int i = 0; i < 200; ++i) {  // until it listens
      int c = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in b = a;
      b.sin_port = htons(port_);
      bool ok = connect(c, reinterpret_cast<sockaddr*>(&b), sizeof(b)) == 0;
      close(c);
      if (ok) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~HttpMcpServer() { Kill(); }
  void Kill() {
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/mcp"; }
  // A client of it named `name`.
  absl::StatusOr<std::unique_ptr<McpClient>> Connect(const std::string& name,
                                                     HttpClient& http) const {
    McpServerConfig cfg;
    cfg.name = name;
    cfg.url = url();
    return McpClient::Start(cfg, &http);
  }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
};

// Messages that break the protocol (found by the MCP fuzz target): each used
// to throw out of the client and take fwaid down; over either transport the
// client now reports them or reads around them.
class McpMalformedTest : public ::testing::TestWithParam<std::string> {
 protected:
  absl::StatusOr<std::unique_ptr<McpClient>> Start(const std::string& fault) {
    const std::string script = std::string(FWAI_MCP_TEST_SERVERS) + "/malformed_server.js";
    if (GetParam() == "stdio") {
      McpServerConfig c = Stdio("bad", {"node", script}, 10000);
      c.env["FAULT"] = fault;
      return McpClient::Start(c);
    }
    server_ = std::make_unique<HttpMcpServer>(std::vector<std::string>{"node", script},
                                              std::map<std::string, std::string>{{"FAULT", fault}});
    return server_->Connect("bad", *http_);
  }
  std::unique_ptr<HttpClient> http_ = MakeCurlHttpClient();
  std::unique_ptr<HttpMcpServer> server_;
};

TEST_P(McpMalformedTest, MessagesOfTheWrongShapeAreReportedNotThrown) {
  {  // initialize answered with a number: no server info, nothing else wrong
    auto c = Start("result-not-object");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ((*c)->server_info(), "{}");
  }
  {  // tools of the wrong shape are left out, fields of the wrong type dropped
    auto c = Start("tools-bad-fields");
    ASSERT_TRUE(c.ok()) << c.status();
    auto tools = (*c)->ListTools(5000);
    ASSERT_TRUE(tools.ok()) << tools.status();
    ASSERT_EQ(tools->size(), 2u);
    EXPECT_EQ((*tools)[0].name, "a");
    EXPECT_EQ((*tools)[0].description, "");
    EXPECT_EQ((*tools)[0].input_schema, json::object());
    EXPECT_EQ((*tools)[1].name, "b");
  }
  {
    auto c = Start("error-string");
    ASSERT_TRUE(c.ok()) << c.status();
    auto r = (*c)->CallTool("echo", json::object(), nullptr, 5000);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("mcp server bad: error 0: boom"), std::string::npos)
        << r.status();
  }
  {
    auto c = Start("call-result-string");
    ASSERT_TRUE(c.ok()) << c.status();
    auto r = (*c)->CallTool("echo", json::object(), nullptr, 5000);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("tools/call answer is not an object"), std::string::npos)
        << r.status();
  }
  {  // a notification whose method is a number
    auto c = Start("method-number");
    ASSERT_TRUE(c.ok()) << c.status();
    auto tools = (*c)->ListTools(5000);
    if (GetParam() == "stdio") {
      // Over stdio a message that is not JSON-RPC breaks the connection.
      ASSERT_FALSE(tools.ok());
      EXPECT_NE(tools.status().message().find("method is not a string"), std::string::npos)
          << tools.status();
      EXPECT_FALSE((*c)->alive());
    } else {
      // Over HTTP, events that are not messages are passed over.
      ASSERT_TRUE(tools.ok()) << tools.status();
      EXPECT_EQ(tools->size(), 1u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, McpMalformedTest, ::testing::Values("stdio", "http"),
                         [](const auto& info) { return info.param; });

TEST(McpClientTest, StreamableHttpTransport) {
  HttpMcpServer server;
  auto http = MakeCurlHttpClient();
  auto c = server.Connect("everything-http", *http);
  ASSERT_TRUE(c.ok()) << c.status();
  auto tools = (*c)->ListTools();
  ASSERT_TRUE(tools.ok()) << tools.status();
  EXPECT_GE(tools->size(), 10u);
  auto r = (*c)->CallTool("echo", {{"message", "over http"}}, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->text.find("over http"), std::string::npos) << r->text;
  CancelToken cancel;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.Cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto longop =
      (*c)->CallTool("trigger-long-running-operation", {{"duration", 30}, {"steps", 5}}, &cancel);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  t.join();
  EXPECT_EQ(longop.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(ms, 2500);
  server.Kill();
  auto gone = (*c)->CallTool("echo", {{"message", "x"}}, nullptr, 5000);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(gone.status().message().find("everything-http"), std::string::npos) << gone.status();
  EXPECT_FALSE((*c)->alive());
}

// Over streamable HTTP, what the server sends on its own stream (here
// notifications/tools/list_changed) reaches the client.
TEST(McpClientTest, StreamableHttpServerSaysItsToolsChanged) {
  HttpMcpServer server({"node", std::string(FWAI_MCP_TEST_SERVERS) + "/changing_tools_server.js"},
                       {{"MCP_MODULES", std::string(FWAI_MCP_BIN_DIR) + "/.."}});
  auto http = MakeCurlHttpClient();
  auto c = server.Connect("vault-http", *http);
  ASSERT_TRUE(c.ok()) << c.status();
  auto names = [&] {
    std::set<std::string> n;
    auto tools = (*c)->ListTools();
    EXPECT_TRUE(tools.ok()) << tools.status();
    if (tools.ok()) {
      for (const auto& t : *tools) n.insert(t.name);
    }
    return n;
  };
  EXPECT_EQ(names(), (std::set<std::string>{"unlock"}));
  EXPECT_FALSE((*c)->TakeToolsChanged());
  auto r = (*c)->CallTool("unlock", json::object(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  bool changed = false;
  for (int i = 0; i < 50 && !changed; ++i) {
    changed = (*c)->TakeToolsChanged();
    if (!changed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(changed);
  EXPECT_EQ(names(), (std::set<std::string>{"read_secret_register"}));
}

TEST(McpManagerTest, AKilledServerIsRestarted) {
  McpManager m({Stdio("everything", {Bin("mcp-server-everything")})});
  auto tools = m.Start();
  bool echo = false;
  for (const auto& t : tools) echo |= t.qualified == "mcp_everything_echo";
  EXPECT_TRUE(echo);
  ASSERT_TRUE(m.Call("everything", "echo", {{"message", "one"}}, nullptr).ok());
  const int first = m.pid("everything");
  ASSERT_GT(first, 0);
  kill(-first, SIGKILL);
  // While it is down, calls say so; within the backoff it comes back.
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto r = m.Call("everything", "echo", {{"message", "two"}}, nullptr);
    if (r.ok()) {
      back = r->text.find("two") != std::string::npos;
    } else {
      EXPECT_NE(r.status().message().find("everything"), std::string::npos) << r.status();
    }
  }
  EXPECT_TRUE(back);
  EXPECT_NE(m.pid("everything"), first);
  EXPECT_GE(m.restarts("everything"), 1);
  EXPECT_EQ(McpManager::QualifiedName("my.server", "read/file"), "mcp_my_server_read_file");
}

// A server that hangs while it is being restarted must not hold up calls to
// the other servers.
TEST(McpManagerTest, ARestartingServerDoesNotHoldUpTheOthers) {
  McpManager m({Stdio("everything", {Bin("mcp-server-everything")}),
                Stdio("stuck", {"sleep", "600"}, 2000)});
  auto t0 = std::chrono::steady_clock::now();
  auto tools = m.Start();
  // Both start at once: the stuck one's 2 s do not add to the other's start.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3500));
  EXPECT_FALSE(tools.empty());
  auto stuck = m.Call("stuck", "anything", json::object(), nullptr);
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(stuck.status().message().find("stuck"), std::string::npos) << stuck.status();
  // Its restart begins 1 s after the failed start and takes 2 s; call the
  // other server all through it.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  auto slowest = std::chrono::milliseconds(0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2500);
  int calls = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto c0 = std::chrono::steady_clock::now();
    auto r = m.Call("everything", "echo", {{"message", "still here"}}, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    slowest = std::max(slowest, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - c0));
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(m.restarts("stuck"), 1);
  EXPECT_LT(slowest.count(), 500) << "over " << calls << " calls";
}

TEST(McpDaemonTest, ServerToolsReachTheCatalogAndTheAgent) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(
      &fake, "mcp_servers:\n  everything:\n    command: [" + Bin("mcp-server-everything") + "]\n");
  ASSERT_TRUE(d.Start()) << d.log();
  std::string out, err;
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai",
                                   "--daemon",
                                   d.address(),
                                   "--json",
                                   "tools",
                                   "search",
                                   "-k",
                                   "3",
                                   "echo",
                                   "back",
                                   "the",
                                   "message",
                                   "I",
                                   "send"};
  ASSERT_EQ(testing::RunCommand(argv, &out, &err), 0) << err;
  auto hits = json::parse(out);
  ASSERT_FALSE(hits.empty());
  EXPECT_EQ(hits[0]["tool"]["ToolName"], "mcp_everything_echo");
  EXPECT_EQ(hits[0]["tool"]["source"], "mcp:everything");
  auto s = d.CreateSession();
  EXPECT_TRUE(EchoThroughTheAgent(fake, d, s.id(), "ping from the model")) << d.log();
  // The tool was offered to the model with an API-safe name.
  bool offered = false;
  const auto reqs = fake.requests();  // a copy: the loop must not run over a temporary
  for (const auto& t : reqs[0].body["tools"]) offered |= t["name"] == "mcp_everything_echo";
  EXPECT_TRUE(offered);
}

// A server that cannot start with fwaid comes up later: its tools join the
// catalog and the agent then.
TEST(McpDaemonTest, AServerThatComesUpLateAddsItsTools) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  const std::string flag = testing::MakeTempDir("fwai-mcp-late") + "/ready";
  testing::Daemon d(&fake, "mcp_servers:\n  everything:\n    command: [sh, -c, 'test -f " + flag +
                               " && exec " + Bin("mcp-server-everything") + "']\n");
  ASSERT_TRUE(d.Start()) << d.log();
  auto search = [&] {
    std::string out, err;
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai",
                                     "--daemon",
                                     d.address(),
                                     "--json",
                                     "tools",
                                     "search",
                                     "-k",
                                     "3",
                                     "echo",
                                     "back",
                                     "the",
                                     "message",
                                     "I",
                                     "send"};
    if (testing::RunCommand(argv, &out, &err) != 0) return std::string("error: ") + err;
    auto hits = json::parse(out);
    return hits.empty() ? std::string() : hits[0]["tool"]["ToolName"].get<std::string>();
  };
  EXPECT_NE(search(), "mcp_everything_echo");
  std::ofstream(flag) << "1";
  bool found = false;
  for (int i = 0; i < 150 && !found; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    found = search() == "mcp_everything_echo";
  }
  ASSERT_TRUE(found) << d.log();
  auto s = d.CreateSession();
  EXPECT_TRUE(EchoThroughTheAgent(fake, d, s.id(), "late but here")) << d.log();
}

// notifications/tools/list_changed, for servers of the daemon and of a
// project: the new tools reach the agent (and the catalog), the dropped ones
// leave.
class McpToolListChangeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(McpToolListChangeTest, NewToolsReachTheAgentAndDroppedOnesLeave) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  const std::string entry =
      "  vault:\n    command: [node, " + std::string(FWAI_MCP_TEST_SERVERS) +
      "/changing_tools_server.js]\n    env: {MCP_MODULES: " + std::string(FWAI_MCP_BIN_DIR) +
      "/..}\n";
  const bool daemon = GetParam() == "daemon";
  testing::Daemon d(&fake, daemon ? "mcp_servers:\n" + entry : "");
  ASSERT_TRUE(d.Start()) << d.log();
  if (!daemon) {
    std::filesystem::create_directories(d.project_dir() + "/.fwai");
    std::ofstream(d.project_dir() + "/.fwai/project.yaml") << "name: p\nmcp_servers:\n" << entry;
  }
  auto catalog = [&] {
    std::string out, err;
    std::set<std::string> n;
    std::vector<std::string> argv = {
        std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(), "--json", "tools", "ls"};
    if (testing::RunCommand(argv, &out, &err) != 0) return n;
    for (const auto& t : json::parse(out)) n.insert(t["name"].get<std::string>());
    return n;
  };
  auto s = d.CreateSession();
  std::set<std::string> offered;  // to the model, in the last call's first request
  auto call = [&](const std::string& tool) {
    const size_t before = fake.requests().size();
    testing::FakeReply c;
    c.tool_calls = {{"c-" + tool, tool, json::object()}};
    fake.Enqueue(c);
    testing::FakeReply done;
    done.chunks = {"ok"};
    fake.Enqueue(done);
    auto turn = testing::RunChat(*d.sessions(), s.id(), "use " + tool);
    const auto reqs = fake.requests();
    offered.clear();
    if (reqs.size() > before) {
      for (const auto& t : reqs[before].body["tools"]) offered.insert(t["name"].get<std::string>());
    }
    for (const auto& ev : turn.events) {
      if (ev.has_tool_call_finished() && !ev.tool_call_finished().is_error())
        return ev.tool_call_finished().output();
    }
    return std::string("(no successful call)");
  };
  if (daemon) {
    EXPECT_EQ(catalog(), (std::set<std::string>{"mcp_vault_unlock"}));
  }
  EXPECT_NE(call("mcp_vault_unlock").find("unlocked"), std::string::npos) << d.log();
  EXPECT_TRUE(offered.count("mcp_vault_unlock"));
  std::string secret;
  for (int i = 0; i < 50 && secret.find("0xC0FFEE") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    secret = call("mcp_vault_read_secret_register");
  }
  EXPECT_NE(secret.find("0xC0FFEE"), std::string::npos) << d.log();
  EXPECT_TRUE(offered.count("mcp_vault_read_secret_register"));
  EXPECT_FALSE(offered.count("mcp_vault_unlock"));
  if (daemon) {
    const std::set<std::string> now{"mcp_vault_read_secret_register"};
    for (int i = 0; i < 50 && catalog() != now; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(catalog(), now);
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, McpToolListChangeTest, ::testing::Values("daemon", "project"),
                         [](const auto& i) { return i.param; });

// fwaid's config with the everything server's 13 tools selected per call, 2 at a time.
std::string SelectingEverything() {
  return "mcp_servers:\n  everything:\n    command: [" + Bin("mcp-server-everything") +
         "]\nagent:\n  tool_threshold: 3\n  tools_top_k: 2\n";
}

// The tool names a model request offered.
std::set<std::string> OfferedIn(const json& body) {
  std::set<std::string> n;
  for (const auto& t : body["tools"]) n.insert(t["name"].get<std::string>());
  return n;
}

// With tools selected per call, a tool retrieved for the request is callable
// though not offered on that very call; plan mode must refuse it all the same.
// A session on the daemon's project, created in plan mode (no id if refused).
fwai::v1::Session PlanModeSession(testing::Daemon& d) {
  grpc::ClientContext ctx;
  fwai::v1::CreateSessionRequest req;
  req.set_project_root(d.project_dir());
  req.set_mode("plan");
  fwai::v1::Session s;
  if (!d.sessions()->Create(&ctx, req, &s).ok()) s.Clear();
  return s;
}

TEST(McpDaemonTest, PlanModeRefusesASelectedToolThatChangesThings) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(&fake, SelectingEverything());
  ASSERT_TRUE(d.Start()) << d.log();
  testing::FakeReply call;
  call.tool_calls = {{"c1", "mcp_everything_echo", {{"message", "changed"}}}};
  fake.Enqueue(call);
  testing::FakeReply done;
  done.chunks = {"ok"};
  fake.Enqueue(done);
  const fwai::v1::Session s = PlanModeSession(d);
  ASSERT_FALSE(s.id().empty()) << d.log();
  auto turn = testing::RunChat(*d.sessions(), s.id(), "echo back the words I send you");
  ASSERT_TRUE(turn.finished) << d.log();
  const auto reqs = fake.requests();
  ASSERT_FALSE(reqs.empty());
  for (const auto& t : reqs[0].body["tools"])
    EXPECT_NE(t["name"], "mcp_everything_echo") << "offered in plan mode";
  const fwai::v1::ToolCallFinished* finished = nullptr;
  for (const auto& ev : turn.events) {
    if (ev.has_tool_call_finished() && ev.tool_call_finished().call_id() == "c1")
      finished = &ev.tool_call_finished();
  }
  ASSERT_NE(finished, nullptr);
  EXPECT_TRUE(finished->is_error());
  EXPECT_NE(finished->output().find("plan mode"), std::string::npos) << finished->output();
  EXPECT_EQ(finished->output().find("changed"), std::string::npos)
      << "the tool ran: " << finished->output();
}

// Calling a tool by name is how the offer learns of it, not a way past the
// mode: in plan mode a tool that changes things, called by name again and
// again, is never offered and never runs.
TEST(McpDaemonTest, AToolCalledByNameInPlanModeIsStillNeverRun) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(&fake, SelectingEverything());
  ASSERT_TRUE(d.Start()) << d.log();
  for (const char* id : {"c1", "c2", "c3"}) {
    testing::FakeReply call;
    call.tool_calls = {{id, "mcp_everything_echo", {{"message", "ran anyway"}}}};
    fake.Enqueue(call);
  }
  testing::FakeReply done;
  done.chunks = {"ok"};
  fake.Enqueue(done);
  const fwai::v1::Session s = PlanModeSession(d);
  ASSERT_FALSE(s.id().empty()) << d.log();
  auto turn = testing::RunChat(*d.sessions(), s.id(), "add two numbers and return the sum");
  ASSERT_TRUE(turn.finished) << d.log();
  const auto reqs = fake.requests();
  ASSERT_EQ(reqs.size(), 4u);
  for (const auto& r : reqs) EXPECT_FALSE(OfferedIn(r.body).count("mcp_everything_echo"));
  int refused = 0;
  for (const auto& ev : turn.events) {
    if (!ev.has_tool_call_finished()) continue;
    const auto& f = ev.tool_call_finished();
    EXPECT_TRUE(f.is_error()) << f.call_id() << ": " << f.output();
    EXPECT_EQ(f.output().find("ran anyway"), std::string::npos) << "the tool ran: " << f.output();
    ++refused;
  }
  EXPECT_EQ(refused, 3);
}

TEST(McpDaemonTest, LargeToolSetsAreOfferedPerRequestWithToolSearch) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(&fake, SelectingEverything());
  ASSERT_TRUE(d.Start()) << d.log();
  testing::FakeReply search;
  search.tool_calls = {{"c1", "toolSearch", {{"query", "add two numbers and return the sum"}}}};
  fake.Enqueue(search);
  testing::FakeReply use;
  use.tool_calls = {{"c2", "mcp_everything_get-sum", {{"a", 2}, {"b", 3}}},
                    {"c3", "mcp_everything_get-env", json::object()}};
  fake.Enqueue(use);
  testing::FakeReply done;
  done.chunks = {"5"};
  fake.Enqueue(done);
  auto s = d.CreateSession();
  auto turn = testing::RunChat(*d.sessions(), s.id(), "echo back the words I send you");
  ASSERT_TRUE(turn.finished) << d.log();
  const auto reqs = fake.requests();
  ASSERT_EQ(reqs.size(), 3u);
  const auto names = OfferedIn;
  auto first = names(reqs[0].body);
  EXPECT_TRUE(first.count("read_file"));  // core tools stay
  EXPECT_TRUE(first.count("toolSearch"));
  EXPECT_TRUE(first.count("mcp_everything_echo")) << "retrieved for the request";
  int mcp = 0;
  for (const auto& n : first) mcp += n.rfind("mcp_", 0) == 0 ? 1 : 0;
  EXPECT_EQ(mcp, 2);  // top-k, not all 13
  EXPECT_TRUE(names(reqs[2].body).count("mcp_everything_get-sum")) << "found with toolSearch";
  std::vector<std::string> reasons;
  std::map<std::string, const fwai::v1::ToolCallFinished*> finished;
  for (const auto& ev : turn.events) {
    if (ev.has_tools_offered()) reasons.push_back(ev.tools_offered().reason());
    if (ev.has_tool_call_finished())
      finished[ev.tool_call_finished().call_id()] = &ev.tool_call_finished();
  }
  // c3 called a tool by name that was not offered: it is offered from then on.
  EXPECT_EQ(reasons, (std::vector<std::string>{"retrieved for the request", "after toolSearch",
                                               "after a wrong call"}));
  ASSERT_TRUE(finished.count("c1") && finished.count("c2") && finished.count("c3"));
  EXPECT_NE(finished["c1"]->output().find("mcp_everything_get-sum"), std::string::npos)
      << finished["c1"]->output();
  EXPECT_FALSE(finished["c2"]->is_error()) << finished["c2"]->output();
  EXPECT_NE(finished["c2"]->output().find("5"), std::string::npos);
  EXPECT_TRUE(finished["c3"]->is_error());
  EXPECT_NE(finished["c3"]->output().find("not offered"), std::string::npos)
      << finished["c3"]->output();
  // A follow-up that does not name the tool again still gets the tools the
  // session called lately.
  testing::FakeReply again;
  again.tool_calls = {{"c4", "mcp_everything_get-sum", {{"a", 4}, {"b", 5}}}};
  fake.Enqueue(again);
  testing::FakeReply nine;
  nine.chunks = {"9"};
  fake.Enqueue(nine);
  auto follow = testing::RunChat(*d.sessions(), s.id(), "and four and five?");
  ASSERT_TRUE(follow.finished) << d.log();
  const auto later = fake.requests();
  ASSERT_EQ(later.size(), 5u);
  EXPECT_TRUE(names(later[3].body).count("mcp_everything_get-sum"));
  bool nine_back = false;
  for (const auto& ev : follow.events) {
    if (ev.has_tool_call_finished()) {
      nine_back |= !ev.tool_call_finished().is_error() &&
                   ev.tool_call_finished().output().find("9") != std::string::npos;
    }
  }
  EXPECT_TRUE(nine_back);
}

// With catalog.hyde, the model names the tool for a request that names no
// command (a hypothetical tool), and the offer takes it; the request is made
// once per distinct request text.
TEST(McpDaemonTest, AHypotheticalToolBringsTheRightToolIntoTheOffer) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(&fake, SelectingEverything() + "catalog:\n  hyde: true\n");
  ASSERT_TRUE(d.Start()) << d.log();
  testing::FakeReply tool;
  tool.match = "Which command or tool would an engineer run";
  tool.chunks = {"everything server: get-sum A B\nReturns the sum of two numbers."};
  fake.Enqueue(tool);
  testing::FakeReply done;
  done.chunks = {"5"};
  fake.Enqueue(done);
  auto s = d.CreateSession();
  const std::string request = "what do 2 and 3 make together?";
  auto turn = testing::RunChat(*d.sessions(), s.id(), request);
  ASSERT_TRUE(turn.finished) << d.log();
  const auto reqs = fake.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_NE(reqs[0].body.dump().find(request), std::string::npos);
  EXPECT_TRUE(OfferedIn(reqs[1].body).count("mcp_everything_get-sum")) << reqs[1].body.dump();
  // The same words again: the hypothetical tool is not asked for twice.
  testing::FakeReply again;
  again.chunks = {"still 5"};
  fake.Enqueue(again);
  auto second = testing::RunChat(*d.sessions(), s.id(), request);
  ASSERT_TRUE(second.finished) << d.log();
  ASSERT_EQ(fake.requests().size(), 3u);
  EXPECT_TRUE(OfferedIn(fake.requests()[2].body).count("mcp_everything_get-sum"));
}

// A wrong call teaches the next offer: a made-up tool name brings the tools
// nearest to it, a real tool called before it was offered is offered, and
// each offered tool says why it is.
TEST(McpDaemonTest, AWrongToolCallChangesTheNextOfferAndSaysWhy) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(&fake, SelectingEverything());
  ASSERT_TRUE(d.Start()) << d.log();
  const std::string made_up = "mcp_everything_sumTwo_numbers";
  for (auto [id, name] :
       std::vector<std::pair<std::string, std::string>>{{"c1", made_up},
                                                        {"c2", "mcp_everything_get-sum"},
                                                        {"c3", "mcp_everything_get-env"},
                                                        {"c4", "mcp_everything_get-env"}}) {
    testing::FakeReply r;
    json input = json::object();
    if (name.find("sum") != std::string::npos) input = {{"a", 2}, {"b", 3}};
    r.tool_calls = {{id, name, input}};
    fake.Enqueue(r);
  }
  testing::FakeReply done;
  done.chunks = {"5"};
  fake.Enqueue(done);
  auto s = d.CreateSession();
  auto turn = testing::RunChat(*d.sessions(), s.id(), "echo back the words I send you");
  ASSERT_TRUE(turn.finished) << d.log();
  const auto reqs = fake.requests();
  ASSERT_EQ(reqs.size(), 5u);
  const auto names = OfferedIn;
  EXPECT_FALSE(names(reqs[0].body).count("mcp_everything_get-sum"));
  EXPECT_FALSE(names(reqs[0].body).count("mcp_everything_get-env"));
  EXPECT_TRUE(names(reqs[1].body).count("mcp_everything_get-sum")) << "nearest to the made-up name";
  EXPECT_FALSE(names(reqs[2].body).count("mcp_everything_get-env"));
  EXPECT_TRUE(names(reqs[3].body).count("mcp_everything_get-env")) << "called by name";

  std::map<std::string, const fwai::v1::ToolCallFinished*> finished;
  std::vector<const fwai::v1::ToolsOffered*> offers;
  for (const auto& ev : turn.events) {
    if (ev.has_tools_offered()) offers.push_back(&ev.tools_offered());
    if (ev.has_tool_call_finished())
      finished[ev.tool_call_finished().call_id()] = &ev.tool_call_finished();
  }
  ASSERT_EQ(finished.size(), 4u);
  EXPECT_TRUE(finished["c1"]->is_error());
  EXPECT_NE(finished["c1"]->output().find("unknown tool"), std::string::npos);
  EXPECT_NE(finished["c1"]->output().find("Offered from the next call: "), std::string::npos);
  EXPECT_NE(finished["c1"]->output().find("mcp_everything_get-sum"), std::string::npos)
      << finished["c1"]->output();
  EXPECT_FALSE(finished["c2"]->is_error()) << finished["c2"]->output();
  EXPECT_NE(finished["c2"]->output().find("5"), std::string::npos);
  EXPECT_TRUE(finished["c3"]->is_error());
  EXPECT_NE(finished["c3"]->output().find("not offered"), std::string::npos);
  EXPECT_FALSE(finished["c4"]->is_error()) << finished["c4"]->output();

  ASSERT_EQ(offers.size(), 3u);
  auto why = [](const fwai::v1::ToolsOffered& o, const std::string& name) {
    for (const auto& t : o.offered())
      if (t.name() == name) return t.why();
    return std::string("(not offered)");
  };
  EXPECT_EQ(offers[0]->reason(), "retrieved for the request");
  EXPECT_EQ(offers[0]->offered_size(), offers[0]->tools_size());
  EXPECT_EQ(why(*offers[0], "read_file"), "built in");
  EXPECT_EQ(why(*offers[0], "toolSearch"), "the agent's own");
  EXPECT_EQ(why(*offers[0], "mcp_everything_echo").rfind("retrieved for the request (#", 0), 0u)
      << why(*offers[0], "mcp_everything_echo");
  EXPECT_EQ(offers[1]->reason(), "after a wrong call");
  EXPECT_EQ(why(*offers[1], "mcp_everything_get-sum"),
            "nearest to '" + made_up + "', a tool that does not exist");
  EXPECT_EQ(offers[2]->reason(), "after a wrong call");
  EXPECT_EQ(why(*offers[2], "mcp_everything_get-env"), "called by name before it was offered");
  // fwai attach shows each offer with why its selected tools are there.
  std::string out, err;
  ASSERT_EQ(testing::RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(),
                                 "attach", s.id(), "--no-follow"},
                                &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("[tools (after a wrong call): "), std::string::npos) << out;
  EXPECT_NE(out.find("mcp_everything_get-env (called by name before it was offered)"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("read_file (built in)"), std::string::npos) << out;
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

TEST(McpDaemonTest, ProjectDeclaredServersStartForTheirProjectOnly) {
  testing::FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  testing::Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  namespace fs = std::filesystem;
  fs::create_directories(d.project_dir() + "/.fwai");
  std::ofstream(d.project_dir() + "/.fwai/project.yaml")
      << "name: p\nmcp_servers:\n  everything:\n    command: [" << Bin("mcp-server-everything")
      << "]\n";
  testing::FakeReply done;
  done.chunks = {"done"};
  auto s = d.CreateSession();
  EXPECT_TRUE(EchoThroughTheAgent(fake, d, s.id(), "from the project server")) << d.log();
  auto reqs = fake.requests();
  bool offered = false;
  for (const auto& t : reqs[0].body["tools"]) offered |= t["name"] == "mcp_everything_echo";
  EXPECT_TRUE(offered);
  // Another project does not see them.
  const std::string other = d.dir() + "/other";
  fs::create_directories(other);
  auto stub = d.sessions();
  grpc::ClientContext ctx;
  fwai::v1::CreateSessionRequest creq;
  creq.set_project_root(other);
  fwai::v1::Session s2;
  ASSERT_TRUE(stub->Create(&ctx, creq, &s2).ok());
  fake.Enqueue(done);
  auto turn = testing::RunChat(*d.sessions(), s2.id(), "hello");
  ASSERT_TRUE(turn.finished);
  reqs = fake.requests();
  for (const auto& t : reqs.back().body["tools"]) EXPECT_NE(t["name"], "mcp_everything_echo");
  // A broken section stops the project's turns with the file and line.
  std::ofstream(d.project_dir() + "/.fwai/project.yaml")
      << "name: p\nmcp_servers:\n  everything:\n    comand: [x]\n";
  turn = testing::RunChat(*d.sessions(), s.id(), "again");
  ASSERT_TRUE(turn.finished);
  bool named = false;
  for (const auto& ev : turn.events)
    named |= ev.has_error() && ev.error().message().find("project.yaml:4") != std::string::npos;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace fwai
