// The fwai CLI as a user runs it, against a real fwaid and the fake provider.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

std::vector<nlohmann::json> JsonLines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
    if (!j.is_discarded()) lines.push_back(j);
  }
  return lines;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(fake_.Start(), 0);
    daemon_ = std::make_unique<Daemon>(&fake_);
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }
  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                     daemon_->address(), "--project", daemon_->project_dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string e;
    int rc = RunCommand(argv, out, &e);
    if (err) *err = e;
    return rc;
  }
  FakeLlmServer fake_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(CliTest, ChatJsonStreamsTypedEventsAndExitsZero) {
  FakeReply r;
  r.chunks = {"Hello", " engineer"};
  r.tool_calls = {{"call_1", "list_dir", nlohmann::json::object()}};
  fake_.Enqueue(r);
  FakeReply r2;
  r2.chunks = {"done"};
  fake_.Enqueue(r2);
  std::string out, err;
  int rc = Fwai({"--json", "chat", "list", "the", "project"}, &out, &err);
  ASSERT_EQ(rc, 0) << err << out;
  auto lines = JsonLines(out);
  ASSERT_FALSE(lines.empty());
  std::vector<std::string> types;
  std::string text;
  for (const auto& j : lines) {
    types.push_back(j["type"]);
    EXPECT_TRUE(j.contains("seq"));
    EXPECT_TRUE(j.contains("session_id"));
    if (j["type"] == "text_delta") text += j["text"].get<std::string>();
    if (j["type"] == "tool_call_started") {
      EXPECT_EQ(j["tool"], "list_dir");
      EXPECT_EQ(j["call_id"], "call_1");
      EXPECT_TRUE(j.contains("parent_call_id"));
    }
  }
  EXPECT_EQ(text, "Hello engineerdone");
  EXPECT_EQ(types.front(), "user_message");
  EXPECT_EQ(types.back(), "turn_finished");
  EXPECT_NE(std::find(types.begin(), types.end(), "tool_call_finished"), types.end());
  EXPECT_EQ(lines.back()["usage"]["input_tokens"], 24);

  // The session is listed, shown, attached to and removed through the CLI.
  const std::string sid = lines.front()["session_id"];
  ASSERT_EQ(Fwai({"--json", "sessions", "ls"}, &out), 0);
  auto list = nlohmann::json::parse(out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["id"], sid);
  ASSERT_EQ(Fwai({"--json", "sessions", "show", sid}, &out), 0);
  auto show = nlohmann::json::parse(out);
  EXPECT_EQ(show["history"].size(), 4u);
  ASSERT_EQ(Fwai({"--json", "attach", sid, "--no-follow", "--after", "2"}, &out), 0);
  auto replay = JsonLines(out);
  ASSERT_EQ(replay.size(), lines.size() - 2);
  EXPECT_EQ(replay.front()["seq"], 3);
  ASSERT_EQ(Fwai({"sessions", "rm", sid}, &out), 0);
  ASSERT_EQ(Fwai({"--json", "sessions", "ls"}, &out), 0);
  EXPECT_EQ(nlohmann::json::parse(out).size(), 0u);
}

TEST_F(CliTest, HumanOutputShowsTextToolsAndUsage) {
  FakeReply r;
  r.chunks = {"Reading."};
  r.tool_calls = {{"call_1", "glob", {{"pattern", "*.c"}}}};
  fake_.Enqueue(r);
  FakeReply r2;
  r2.chunks = {"No C files."};
  fake_.Enqueue(r2);
  std::string out, err;
  ASSERT_EQ(Fwai({"chat", "find", "C", "files"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("Reading."), std::string::npos) << out;
  EXPECT_NE(out.find("glob"), std::string::npos) << out;
  EXPECT_NE(out.find("No C files."), std::string::npos) << out;
  EXPECT_NE(err.find("out tokens"), std::string::npos) << err;
  EXPECT_NE(err.find("session s-"), std::string::npos) << err;
}

TEST_F(CliTest, ContinueUsesTheProjectsLatestSession) {
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "chat", "one"}, &out), 0);
  std::string sid = JsonLines(out).front()["session_id"];
  ASSERT_EQ(Fwai({"--json", "chat", "--continue", "two"}, &out), 0);
  EXPECT_EQ(JsonLines(out).front()["session_id"], sid);
  ASSERT_EQ(Fwai({"--json", "chat", "--session", sid, "three"}, &out), 0);
  EXPECT_EQ(JsonLines(out).front()["session_id"], sid);
}

// The REPL as a person types into it: commands before any session, a
// message that makes the session (in the mode chosen before it), commands
// on that session, a new session, an unknown command; Ctrl-D ends it.
TEST_F(CliTest, TheReplRunsCommandsAndMakesTheSessionWithItsFirstMessage) {
  FakeReply r;
  r.chunks = {"Hello from the agent"};
  fake_.Enqueue(r);
  const std::string input = daemon_->project_dir() + "/../repl-input.txt";
  {
    std::ofstream in(input);
    in << "/session\n/mode\n/plan\n/mode\n/todos\n/bogus\n\nsay hello to the engineer\n"
          "/session\n/mode\n/todos\n/new\n/session\n";
  }
  const std::string home = daemon_->project_dir() + "/../repl-home";
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                   daemon_->address(), "--project", daemon_->project_dir()};
  std::string out, err;
  ASSERT_EQ(
      RunCommand(argv, &out, &err, {"HOME=" + home, "XDG_DATA_HOME=" + home + "/data"}, 60, input),
      0)
      << err << out;
  auto after = [&](const std::string& what, size_t from) {
    size_t at = out.find(what, from);
    EXPECT_NE(at, std::string::npos) << "no '" << what << "' after " << from << " in:\n" << out;
    return at == std::string::npos ? from : at + what.size();
  };
  size_t at = after("(none yet)", 0);
  at = after("act", at);
  at = after("(the next session starts in plan mode)", at);
  at = after("plan", at);
  at = after("(no todos yet)", at);
  at = after("unknown command /bogus (/help)", at);
  at = after("Hello from the agent", at);
  // The session the message made: its id on stderr, the same by /session,
  // in plan mode.
  const size_t sid_at = err.find("session s-");
  ASSERT_NE(sid_at, std::string::npos) << err;
  const std::string sid = err.substr(sid_at + 8, err.find_first_of(" \n", sid_at + 8) - sid_at - 8);
  at = after(sid, at);
  at = after("plan", at);
  at = after("(no todos)", at);
  at = after("(a new session starts with the next message)", at);
  after("(none yet)", at);
  EXPECT_EQ(fake_.requests().size(), 1u);
  // The history is kept in the person's data dir (libedit's format: a
  // space is \040).
  std::ifstream history(home + "/data/fwai/repl_history");
  std::stringstream h;
  h << history.rdbuf();
  EXPECT_NE(h.str().find("/bogus"), std::string::npos) << h.str();
  EXPECT_NE(h.str().find("the\\040engineer"), std::string::npos) << h.str();
}

TEST_F(CliTest, ExitCodes) {
  std::string out, err;
  // 4: the turn failed.
  FakeReply bad;
  bad.status = 400;
  bad.error_type = "invalid_request_error";
  bad.error_message = "prompt is too long";
  fake_.Enqueue(bad);
  EXPECT_EQ(Fwai({"chat", "hello"}, &out, &err), 4);
  EXPECT_NE(err.find("prompt is too long"), std::string::npos) << err;
  // 2: usage.
  EXPECT_EQ(Fwai({"chat"}, &out, &err), 2);
  EXPECT_EQ(Fwai({"no-such-command"}, &out, &err), 2);
  // 1: an error from the daemon.
  EXPECT_EQ(Fwai({"sessions", "show", "s-missing"}, &out, &err), 1);
  EXPECT_NE(err.find("not found"), std::string::npos) << err;
  // 3: no daemon there (an explicit address is never auto-started).
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                   "unix:" + daemon_->dir() + "/nobody.sock", "sessions", "ls"};
  EXPECT_EQ(RunCommand(argv, &out, &err), 3);
  EXPECT_NE(err.find("not running"), std::string::npos) << err;
}

TEST_F(CliTest, DaemonStatusAndStop) {
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "daemon", "status"}, &out, &err), 0) << err;
  auto st = nlohmann::json::parse(out);
  EXPECT_EQ(st["running"], true);
  EXPECT_EQ(st["pid"], daemon_->pid());
  EXPECT_EQ(st["default_provider"], "anthropic");
  ASSERT_EQ(Fwai({"daemon", "stop"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("stopped"), std::string::npos);
  EXPECT_EQ(Fwai({"daemon", "status"}, &out, &err), 3);
}

// `daemon stop` used to return when the socket stopped accepting, before the
// process let go of its data directory; a `start` right after then failed on
// RocksDB's LOCK.
TEST_F(CliTest, DaemonStopReturnsOnlyWhenTheProcessHasExited) {
  FakeReply slow;
  for (int i = 0; i < 400; ++i) slow.chunks.push_back("tick ");
  slow.chunk_delay_ms = 20;
  fake_.Enqueue(slow);
  auto session = daemon_->CreateSession();
  ASSERT_FALSE(session.id().empty());
  auto stub = daemon_->sessions();
  grpc::ClientContext chat_ctx;
  auto chat = OpenChat(*stub, &chat_ctx, session.id(), "count");
  fwai::v1::ServerEvent ev;
  while (chat->Read(&ev) && !ev.has_text_delta()) {
  }
  ASSERT_TRUE(ev.has_text_delta()) << "the turn never started streaming";
  // A second fwaid on a data dir in use is refused at once, naming the holder.
  std::string out, err;
  const std::string fwaid = std::string(FWAI_BIN_DIR) + "/fwaid";
  EXPECT_EQ(RunCommand({fwaid, "--data-dir", daemon_->data_dir(), "--listen",
                        "unix:" + daemon_->dir() + "/other.sock"},
                       &out, &err),
            1);
  EXPECT_NE(err.find("in use by another fwaid (pid " + std::to_string(daemon_->pid()) + ")"),
            std::string::npos)
      << err;
  const pid_t pid = daemon_->pid();
  ASSERT_EQ(Fwai({"--json", "daemon", "stop"}, &out, &err), 0) << err;
  EXPECT_EQ(nlohmann::json::parse(out)["pid"], pid);
  EXPECT_TRUE(daemon_->Exited()) << "fwai daemon stop returned while fwaid was still running";
  chat_ctx.TryCancel();
  chat.reset();
  // The next daemon starts on the same data directory straight away.
  ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  ASSERT_EQ(Fwai({"--json", "sessions", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find(session.id()), std::string::npos);
}

// A turn cut by fwaid dying: the chat client says fwaid went away (not that
// the turn goes on), a follower waits for fwaid, sees the interrupted end and
// exits, and the next command says how the turn ended.
TEST_F(CliTest, ATurnCutByACrashEndsVisiblyForEveryClient) {
  FakeReply slow;
  for (int i = 0; i < 500; ++i) slow.chunks.push_back("w" + std::to_string(i) + " ");
  slow.chunk_delay_ms = 10;
  fake_.Enqueue(slow);
  auto session = daemon_->CreateSession();
  ASSERT_FALSE(session.id().empty());
  const std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  // The CLI's own notes live under XDG_DATA_HOME: keep them in the test's dir.
  const std::vector<std::string> env = {"XDG_DATA_HOME=" + daemon_->dir() + "/client-data"};
  std::vector<std::string> base = {fwai, "--daemon", daemon_->address(), "--project",
                                   daemon_->project_dir()};
  auto with = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  };
  BackgroundCommand chat(with({"chat", "--session", session.id(), "count"}), env);
  ASSERT_TRUE(chat.WaitForOutput("w3 ")) << chat.err();
  BackgroundCommand follower(with({"attach", session.id()}), env);
  ASSERT_TRUE(follower.WaitForOutput("w20 ")) << follower.err();
  daemon_->Kill9();
  EXPECT_EQ(chat.Wait(), 3) << chat.err();
  EXPECT_NE(chat.err().find("fwaid went away during the turn"), std::string::npos) << chat.err();
  EXPECT_EQ(chat.err().find("goes on"), std::string::npos) << chat.err();
  ASSERT_TRUE(follower.WaitForOutput("waiting for it to come back")) << follower.err();
  ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  EXPECT_EQ(follower.Wait(), 4) << follower.err();
  EXPECT_NE(follower.err().find("was interrupted"), std::string::npos) << follower.err();
  // The next command says how the turn ended, once.
  std::string out, err;
  ASSERT_EQ(RunCommand(with({"sessions", "ls"}), &out, &err, env), 0) << err;
  EXPECT_NE(err.find("ended while fwai was away: interrupted"), std::string::npos) << err;
  ASSERT_EQ(RunCommand(with({"--json", "sessions", "show", session.id()}), &out, &err, env), 0)
      << err;
  EXPECT_EQ(err.find("ended while fwai was away"), std::string::npos) << err;
  auto shown = nlohmann::json::parse(out);
  ASSERT_EQ(shown["turns"].size(), 1u) << out;
  EXPECT_EQ(shown["turns"][0]["stop_reason"], "interrupted");
  // The session takes a new turn normally.
  ASSERT_EQ(RunCommand(with({"chat", "--session", session.id(), "again"}), &out, &err, env), 0)
      << err;
}

// The connection breaking while fwaid lives is not a crash: the turn goes on.
TEST_F(CliTest, AConnectionLostWhileFwaidLivesSaysTheTurnGoesOn) {
  FakeReply slow;
  for (int i = 0; i < 300; ++i) slow.chunks.push_back("v" + std::to_string(i) + " ");
  slow.chunk_delay_ms = 20;
  fake_.Enqueue(slow);
  auto session = daemon_->CreateSession();
  // The client reaches fwaid through a relay (socat forks a child per
  // connection); killing the child cuts that connection, fwaid lives on.
  const std::string relay = daemon_->dir() + "/relay.sock";
  BackgroundCommand proxy({"/usr/bin/socat", "UNIX-LISTEN:" + relay + ",fork",
                           "UNIX-CONNECT:" + daemon_->socket_path()});
  for (int i = 0; i < 500 && !std::filesystem::exists(relay); ++i) usleep(10000);
  BackgroundCommand chat(
      {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", "unix:" + relay, "--project",
       daemon_->project_dir(), "chat", "--session", session.id(), "count"},
      {"XDG_DATA_HOME=" + daemon_->dir() + "/client-data"});
  ASSERT_TRUE(chat.WaitForOutput("v3 ")) << chat.err();
  std::string children;
  ASSERT_EQ(RunCommand({"/usr/bin/pkill", "-KILL", "-P", std::to_string(proxy.pid())}, &children,
                       &children),
            0);
  EXPECT_EQ(chat.Wait(), 3) << chat.err();
  EXPECT_NE(chat.err().find("lost the connection to fwaid during the turn"), std::string::npos)
      << chat.err();
  EXPECT_NE(chat.err().find("fwai attach " + session.id()), std::string::npos) << chat.err();
}

TEST(CliAutostartTest, StartsTheDaemonOnTheDefaultSocket) {
  std::string dir = MakeTempDir("fwai-autostart-");
  std::vector<std::string> env = {"XDG_RUNTIME_DIR=" + dir + "/run",
                                  "XDG_DATA_HOME=" + dir + "/data",
                                  "XDG_CONFIG_HOME=" + dir + "/config",
                                  "FWAI_DAEMON=",
                                  "ANTHROPIC_API_KEY=",
                                  "OPENAI_API_KEY="};
  std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  std::string out, err;
  ASSERT_EQ(RunCommand({fwai, "--json", "sessions", "ls"}, &out, &err, env), 0) << err;
  EXPECT_EQ(out, "[]\n");
  ASSERT_EQ(RunCommand({fwai, "--json", "daemon", "status"}, &out, &err, env), 0) << err;
  auto st = nlohmann::json::parse(out);
  EXPECT_EQ(st["listen"][0], "unix:" + dir + "/run/fwai/fwaid.sock");
  EXPECT_EQ(st["data_dir"], dir + "/data/fwai");
  // Without a provider a chat ends with the how-to and exit code 4.
  EXPECT_EQ(RunCommand({fwai, "chat", "hi"}, &out, &err, env), 4);
  EXPECT_NE(err.find("no LLM provider is configured"), std::string::npos) << err;
  ASSERT_EQ(RunCommand({fwai, "daemon", "stop"}, &out, &err, env), 0) << err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fwai::testing

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

namespace fwai::testing {
namespace {

TEST_F(CliTest, CtrlCDuringChatCancelsTheTurn) {
  FakeReply r;
  for (int i = 0; i < 300; ++i) r.chunks.push_back("tick ");
  r.chunk_delay_ms = 20;
  fake_.Enqueue(r);
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    close(out_pipe[0]);
    close(out_pipe[1]);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    std::string bin = std::string(FWAI_BIN_DIR) + "/fwai";
    execl(bin.c_str(), bin.c_str(), "--daemon", daemon_->address().c_str(), "--project",
          daemon_->project_dir().c_str(), "--json", "chat", "go", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  std::string out;
  char buf[4096];
  bool interrupted = false;
  ssize_t n;
  while ((n = read(out_pipe[0], buf, sizeof(buf))) > 0) {
    out.append(buf, n);
    if (!interrupted && out.find("text_delta") != std::string::npos) {
      kill(pid, SIGINT);
      interrupted = true;
    }
  }
  close(out_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 4);
  auto lines = JsonLines(out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["type"], "turn_finished");
  EXPECT_EQ(lines.back()["stop_reason"], "cancelled");
}

}  // namespace
}  // namespace fwai::testing

namespace fwai::testing {
namespace {

TEST(CliPlanTest, PlanModeWithAutoApproveRunsThePlanAndShowsTheTree) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  auto fwai = [&](std::vector<std::string> args, std::string* out, std::string* err) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(),
                                     "--project", d.project_dir()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err);
  };
  // The model tries to change something in plan mode: refused in code.
  FakeReply r1;
  r1.tool_calls = {{"b1", "bash", {{"command", "touch nope"}}}};
  fake.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"stopping here"};
  fake.Enqueue(r2);
  std::string out, err;
  int rc = fwai({"chat", "--plan", "--auto-approve", "add", "a", "driver"}, &out, &err);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("(plan mode)"), std::string::npos) << err;
  EXPECT_NE(out.find("plan mode: 'bash' changes things"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(d.project_dir() + "/nope"));
  auto reqs = fake.requests();
  ASSERT_GE(reqs.size(), 1u);
  const std::string system =
      reqs[0].body.contains("system") ? reqs[0].body["system"].dump() : reqs[0].body.dump();
  EXPECT_NE(system.find("PLAN mode"), std::string::npos);
}

}  // namespace
}  // namespace fwai::testing
