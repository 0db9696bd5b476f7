// The system-wide lab daemon as deploy/ sets it up: sockets passed by systemd
// (socket activation, with the real systemd-socket-activate), and the lab's
// fwaid.yaml accepted by fwaid.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A loopback port nobody listens on right now (systemd-socket-activate takes
// no port 0); a clash is retried by the caller.
int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

class SocketActivationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("fwai-activate-");
    sock_ = dir_ + "/run/fwaid.sock";
    fs::create_directories(dir_ + "/run");
    std::ofstream(dir_ + "/fwaid.yaml")
        << "log_level: info\nhardware: {default_simulated_board: false}\n";
  }
  void TearDown() override {
    activator_.reset();
    fs::remove_all(dir_);
  }

  // systemd-socket-activate listening on `listen` (each -l), running fwaid
  // once the first connection comes. True once it listens.
  bool Activate(const std::vector<std::string>& listen) {
    std::vector<std::string> argv = {"/usr/bin/systemd-socket-activate"};
    for (const auto& l : listen) argv.insert(argv.end(), {"-l", l});
    argv.insert(argv.end(), {std::string(FWAI_BIN_DIR) + "/fwaid", "--config", dir_ + "/fwaid.yaml",
                             "--data-dir", dir_ + "/data"});
    activator_ = std::make_unique<BackgroundCommand>(argv);
    return activator_->WaitForOutput("Listening on " + listen.back(), 30);
  }

  int Fwai(const std::string& daemon, std::vector<std::string> args, std::string* out,
           std::string* err, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", daemon};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, env);
  }

  std::string dir_, sock_;
  std::unique_ptr<BackgroundCommand> activator_;
};

TEST_F(SocketActivationTest, ClientsConnectThroughTheSocketsSystemdPassed) {
  int port = 0;
  for (int attempt = 0; attempt < 5 && port == 0; ++attempt) {
    port = FreePort();
    if (!Activate({sock_, "127.0.0.1:" + std::to_string(port)})) port = 0;
  }
  ASSERT_GT(port, 0) << (activator_ ? activator_->err() : "");
  const std::string tcp = "tcp:127.0.0.1:" + std::to_string(port);
  // Nothing runs yet; the first connection starts fwaid, which serves it on
  // the socket it was passed (the client waits in the socket's backlog).
  std::string out, err;
  int rc = 1;
  for (int i = 0; i < 30 && rc != 0; ++i)
    rc = Fwai("unix:" + sock_, {"--json", "whoami"}, &out, &err);
  ASSERT_EQ(rc, 0) << err << activator_->out() << activator_->err();
  EXPECT_EQ(json::parse(out).value("principal", ""), "uid:0") << out;
  EXPECT_NE(activator_->out().find("fwaid: listening on unix:" + sock_ + " (socket from systemd)"),
            std::string::npos)
      << activator_->out();
  EXPECT_NE(activator_->out().find("fwaid: listening on tcp:127.0.0.1:" + std::to_string(port) +
                                   " (socket from systemd)"),
            std::string::npos)
      << activator_->out();
  // TCP through the passed socket: a token is still required, and works.
  EXPECT_EQ(Fwai(tcp, {"whoami"}, &out, &err), 1) << "refused (1), not unreachable (3): " << err;
  ASSERT_EQ(
      Fwai("unix:" + sock_, {"--json", "token", "create", "ci-runner", "--role", "ci"}, &out, &err),
      0)
      << err;
  const std::string token = json::parse(out).value("token", "");
  ASSERT_FALSE(token.empty()) << out;
  ASSERT_EQ(Fwai(tcp, {"--json", "whoami"}, &out, &err, {"FWAI_TOKEN=" + token}), 0) << err;
  EXPECT_EQ(json::parse(out).value("principal", ""), "user:ci-runner") << out;
  // A refusal by the access table is recorded with the client's own
  // address, not the relay's.
  EXPECT_EQ(Fwai(tcp, {"token", "ls"}, &out, &err, {"FWAI_TOKEN=" + token}), 1) << out;
  ASSERT_EQ(Fwai("unix:" + sock_, {"--json", "evidence", "ls"}, &out, &err), 0) << err;
  bool named = false;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j["record"].value("kind", "") == "refusal" &&
        j["record"].value("principal", "") == "user:ci-runner") {
      named |= std::regex_search(j["record"].value("peer", ""),
                                 std::regex("^ipv4:127\\.0\\.0\\.1:\\d+ \\(relayed\\)$"));
    }
  }
  EXPECT_TRUE(named) << out;
  // Stopping leaves the socket file to its owner (systemd), unlike a socket
  // fwaid bound itself.
  kill(activator_->pid(), SIGTERM);
  EXPECT_EQ(activator_->Wait(30), 0) << activator_->err();
  struct stat st {};
  EXPECT_EQ(stat(sock_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

TEST_F(SocketActivationTest, APassedSocketOffLoopbackWithoutTlsIsRefused) {
  int port = 0;
  for (int attempt = 0; attempt < 5 && port == 0; ++attempt) {
    port = FreePort();
    if (!Activate({"0.0.0.0:" + std::to_string(port)})) port = 0;
  }
  ASSERT_GT(port, 0);
  std::string out, err;
  Fwai("tcp:127.0.0.1:" + std::to_string(port), {"whoami"}, &out, &err);  // starts fwaid
  EXPECT_EQ(activator_->Wait(60), 1);
  EXPECT_NE(activator_->err().find("0.0.0.0 is not a loopback address"), std::string::npos)
      << activator_->err();
  EXPECT_NE(activator_->err().find("(passed by systemd)"), std::string::npos) << activator_->err();
}

// fwaid-lab.socket as systemd would apply it: its listeners (the unix
// socket moved under a temp dir, the TCP port to a free loopback one) passed
// by the real systemd-socket-activate, the socket file given the unit's
// SocketMode and SocketGroup (nogroup standing for fwai). A member of the
// group (nobody, group nogroup) is served as itself; the same uid outside
// the group cannot connect at all.
TEST_F(SocketActivationTest, TheLabSocketUnitServesItsGroupAndNobodyElse) {
  const std::string unit = Read(std::string(FWAI_DEPLOY_DIR) + "/fwaid-lab.socket");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(unit, m, std::regex("\nSocketMode=(0[0-7]+)\n"))) << unit;
  const mode_t mode = static_cast<mode_t>(std::stoul(m[1].str(), nullptr, 8));
  ASSERT_TRUE(std::regex_search(unit, m, std::regex("\nSocketGroup=(\\S+)\n"))) << unit;
  EXPECT_EQ(m[1].str(), "fwai");
  std::vector<std::string> streams;
  const std::regex listen("\nListenStream=(\\S+)");
  for (std::sregex_iterator it(unit.begin(), unit.end(), listen), end; it != end; ++it)
    streams.push_back((*it)[1].str());
  ASSERT_EQ(streams.size(), 2u) << unit;
  ASSERT_EQ(streams[0], "/run/fwai/fwaid.sock");
  int port = 0;
  for (int attempt = 0; attempt < 5 && port == 0; ++attempt) {
    port = FreePort();
    if (!Activate({sock_, "127.0.0.1:" + std::to_string(port)})) port = 0;
  }
  ASSERT_GT(port, 0) << (activator_ ? activator_->err() : "");
  // What systemd does with SocketMode, SocketGroup and DirectoryMode=0755.
  ASSERT_EQ(chmod(sock_.c_str(), mode), 0);
  ASSERT_EQ(chown(sock_.c_str(), 0, 65534), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  ASSERT_EQ(chmod((dir_ + "/run").c_str(), 0755), 0);
  // The CLI, where another uid may run it.
  fs::create_directories(dir_ + "/bin");
  fs::copy_file(std::string(FWAI_BIN_DIR) + "/fwai", dir_ + "/bin/fwai");
  ASSERT_EQ(chmod((dir_ + "/bin").c_str(), 0755), 0);
  ASSERT_EQ(chmod((dir_ + "/bin/fwai").c_str(), 0755), 0);
  auto as_nobody = [&](const std::string& group, std::string* out, std::string* err) {
    return RunCommand({"/usr/sbin/runuser", "-u", "nobody", "-g", group, "--", dir_ + "/bin/fwai",
                       "--daemon", "unix:" + sock_, "--json", "whoami"},
                      out, err, {"HOME=/nonexistent", "PATH=/usr/bin:/bin"});
  };
  std::string out, err;
  int rc = 1;
  for (int i = 0; i < 30 && rc != 0; ++i) rc = as_nobody("nogroup", &out, &err);
  ASSERT_EQ(rc, 0) << err << activator_->out() << activator_->err();
  EXPECT_EQ(json::parse(out).value("principal", ""), "uid:65534") << out;
  // Outside the group: the socket's mode refuses the connection itself.
  EXPECT_NE(as_nobody("daemon", &out, &err), 0) << out;
  EXPECT_NE(err.find("ermission denied"), std::string::npos) << err;
  EXPECT_EQ(out.find("uid:65534"), std::string::npos) << out;
  kill(activator_->pid(), SIGTERM);
  EXPECT_EQ(activator_->Wait(30), 0) << activator_->err();
}

// The system units as installed (their ExecStart pointing at this build's
// fwaid) pass `systemd-analyze verify` without a word: no unknown key, no bad value.
TEST(DeployTest, TheSystemUnitsPassSystemdAnalyzeVerify) {
  const std::string dir = MakeTempDir("fwai-units-");
  const std::string fwaid = std::string(FWAI_BIN_DIR) + "/fwaid";
  for (const char* unit : {"fwaid-lab.socket", "fwaid-lab.service", "fwaid.service"}) {
    std::string text = Read(std::string(FWAI_DEPLOY_DIR) + "/" + unit);
    ASSERT_FALSE(text.empty()) << unit;
    text =
        std::regex_replace(text, std::regex("/usr/local/bin/fwaid|%h/\\.local/bin/fwaid"), fwaid);
    std::ofstream(dir + "/" + unit) << text;
  }
  for (const std::vector<std::string>& units :
       {std::vector<std::string>{"fwaid-lab.socket", "fwaid-lab.service"}, {"fwaid.service"}}) {
    std::vector<std::string> argv = {"/usr/bin/systemd-analyze", "verify"};
    for (const auto& u : units) argv.push_back(dir + "/" + u);
    std::string out, err;
    EXPECT_EQ(RunCommand(argv, &out, &err, {"SYSTEMD_LOG_COLOR=0"}), 0) << err;
    EXPECT_EQ(out + err, "") << units[0];
  }
  fs::remove_all(dir);
}

// deploy/fwaid-lab.yaml, with its TLS files made by `fwaid tls init` where it
// expects them: fwaid starts with it, serves TLS with the users it names.
TEST(DeployTest, TheLabConfigIsAcceptedAndServes) {
  const std::string dir = MakeTempDir("fwai-lab-");
  std::string yaml = Read(std::string(FWAI_DEPLOY_DIR) + "/fwaid-lab.yaml");
  ASSERT_FALSE(yaml.empty());
  ASSERT_NE(yaml.find("/etc/fwai/tls/"), std::string::npos);
  yaml = std::regex_replace(yaml, std::regex("/etc/fwai/tls/"), dir + "/tls/");
  // The socket's group is the host's (the README has `groupadd fwai`); this one exists everywhere.
  ASSERT_NE(yaml.find("group: fwai}"), std::string::npos);
  yaml = std::regex_replace(yaml, std::regex("group: fwai\\}"), "group: nogroup}");
  std::ofstream(dir + "/fwaid.yaml") << yaml;
  std::string out, err;
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "tls", "init", dir + "/tls", "--host",
                        "localhost"},
                       &out, &err),
            0)
      << err;
  BackgroundCommand fwaid({std::string(FWAI_BIN_DIR) + "/fwaid", "--config", dir + "/fwaid.yaml",
                           "--data-dir", dir + "/data", "--listen", "unix:" + dir + "/fwaid.sock",
                           "--listen", "tls:127.0.0.1:0"});
  ASSERT_TRUE(fwaid.WaitForOutput("fwaid: ready", 60)) << fwaid.out() << fwaid.err();
  std::smatch m;
  const std::string log = fwaid.out();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("listening on tls:127\\.0\\.0\\.1:(\\d+)")))
      << log;
  const std::string tls = "tls:localhost:" + m[1].str();
  const std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  // The config's users and roles are the daemon's.
  ASSERT_EQ(RunCommand({fwai, "--daemon", "unix:" + dir + "/fwaid.sock", "--json", "token",
                        "create", "ci-runner", "--role", "ci"},
                       &out, &err),
            0)
      << err;
  const std::string token = json::parse(out).value("token", "");
  ASSERT_EQ(
      RunCommand({fwai, "--daemon", tls, "--ca-cert", dir + "/tls/ca.pem", "--json", "whoami"},
                 &out, &err, {"FWAI_TOKEN=" + token}),
      0)
      << err;
  auto who = json::parse(out);
  EXPECT_EQ(who.value("principal", ""), "user:ci-runner") << out;
  EXPECT_EQ(who.value("role", ""), "ci") << out;
  kill(fwaid.pid(), SIGTERM);
  EXPECT_EQ(fwaid.Wait(30), 0) << fwaid.err();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fwai::testing
