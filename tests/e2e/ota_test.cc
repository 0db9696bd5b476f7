// Over-the-air rollouts through the CLI and a real fwaid with five simulated
// STM32VLDISCOVERY boards (QEMU), each with two MCUboot slots: a good image
// goes to all five; a bad one (boots, then fails its health check) is
// reverted on the first stage and the other boards never see it; a board
// whose simulator is killed mid-update comes back on the old slot; a
// downgrade is refused; a physical board gets an image only after it passed
// on simulated ones. Images are checked by an independent reader (Node).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/integration/daemon_fixture.h"

extern char** environ;

namespace fwai::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The full path of a program on $PATH (RunCommand does not search it).
std::string Which(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string p = dir + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return name;
}

class OtaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    keys_ = MakeTempDir("fwai-ota-keys-");
    std::string out, err;
    ASSERT_EQ(RunCommand({"/usr/bin/openssl", "genpkey", "-algorithm", "ed25519", "-out",
                          keys_ + "/key.pem"},
                         &out, &err),
              0)
        << err;
    ASSERT_EQ(RunCommand({"/usr/bin/openssl", "pkey", "-in", keys_ + "/key.pem", "-pubout", "-out",
                          keys_ + "/pub.pem"},
                         &out, &err),
              0)
        << err;
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(keys_);
  }

  void StartDaemon(int boards, const std::string& extra = "", bool tcp = false) {
    std::string yaml = "hardware:\n  boards:\n";
    for (int i = 1; i <= boards; ++i) {
      yaml += absl_format(
          "    - {id: sim-%d, kind: simulated, machine: stm32vldiscovery, tags: [simulated, "
          "fleet], "
          "boot_pattern: booted}\n",
          i);
    }
    yaml += extra;
    yaml += "ota:\n  keys: [" + keys_ + "/pub.pem]\n";
    d_ = std::make_unique<Daemon>(nullptr, yaml);
    if (tcp) d_->AddListen("tcp:127.0.0.1:0");
    ASSERT_TRUE(d_->Start()) << d_->log();
  }

  static std::string absl_format(const char* fmt, int i) {
    char buf[512];
    std::snprintf(buf, sizeof buf, fmt, i);
    return buf;
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr,
           int timeout_s = 120) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(),
                                     "--project", project_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string o, e;
    int rc = RunCommand(argv, &o, &e, {}, timeout_s);
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  }

  // The example built at `version`; `break_ping` makes a release that boots
  // and then answers "ping" wrongly (a regression the health check finds).
  std::string BuildFirmware(const std::string& version, bool break_ping = false) {
    const std::string dir = d_->dir() + "/fw-" + version;
    fs::copy(BLINKY_SRC_DIR, dir, fs::copy_options::recursive);
    fs::remove_all(dir + "/build");
    if (break_ping) {
      std::ifstream in(dir + "/src/main.c");
      std::stringstream ss;
      ss << in.rdbuf();
      std::string src = ss.str();
      auto at = src.find("con_puts(\"pong\\n\");");
      EXPECT_NE(at, std::string::npos);
      src.replace(at, std::string("con_puts(\"pong\\n\");").size(), "con_puts(\"pang\\n\");");
      std::ofstream(dir + "/src/main.c") << src;
    }
    std::string out, err;
    EXPECT_EQ(
        RunCommand({"/usr/bin/make", "-s", "-C", dir, "VERSION=" + version}, &out, &err, {}, 120),
        0)
        << out << err;
    return dir + "/build/blinky.elf";
  }

  std::string Package(const std::string& elf, const std::string& version,
                      std::vector<std::string> extra = {}) {
    const std::string out_path = d_->dir() + "/blinky-" + version + ".signed.bin";
    std::vector<std::string> args = {"ota",   "package",          elf,  "--version", version,
                                     "--key", keys_ + "/key.pem", "-o", out_path};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string out, err;
    EXPECT_EQ(Fwai(args, &out, &err), 0) << out << err;
    return out_path;
  }

  // Factory programming: the image into each board's primary slot, confirmed.
  void Provision(int boards, const std::string& image) {
    for (int i = 1; i <= boards; ++i) {
      const std::string b = "sim-" + std::to_string(i);
      std::string out, err;
      ASSERT_EQ(Fwai({"hw", "lease", b}, &out, &err), 0) << err;
      ASSERT_EQ(Fwai({"flash", "--yes", b, image}, &out, &err), 0) << out << err << d_->log();
      ASSERT_EQ(Fwai({"hw", "release", b}, &out, &err), 0) << err;
    }
  }

  void WriteSkill(const std::string& name, const std::string& yaml) {
    fs::create_directories(project_ + "/.fwai/skills");
    std::ofstream(project_ + "/.fwai/skills/" + name + ".yaml") << yaml;
  }

  std::map<std::string, json> Boards() {
    std::string out, err;
    EXPECT_EQ(Fwai({"--json", "ota", "status"}, &out, &err), 0) << err;
    std::map<std::string, json> m;
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object()) m[j.value("board", "")] = j;
    }
    return m;
  }

  // Runs `fwai --json ota rollout ...`, calling `on_event` for each event as
  // it arrives; returns the exit code and every event.
  int Rollout(std::vector<std::string> args, std::vector<json>* events,
              const std::function<void(const json&)>& on_event = nullptr,
              const std::string& daemon = "", const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai",
                                     "--daemon",
                                     daemon.empty() ? d_->address() : daemon,
                                     "--project",
                                     project_,
                                     "--json",
                                     "ota",
                                     "rollout"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    int pipefd[2];
    EXPECT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    pid_t pid = -1;
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
    envs.insert(envs.end(), env.begin(), env.end());
    std::vector<char*> cenv;
    for (auto& e : envs) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), cenv.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    std::string buf;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{pipefd[0], POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) continue;
      char chunk[4096];
      ssize_t n = read(pipefd[0], chunk, sizeof chunk);
      if (n <= 0) break;
      buf.append(chunk, static_cast<size_t>(n));
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        auto j = json::parse(buf.substr(0, nl), nullptr, false);
        buf.erase(0, nl + 1);
        if (!j.is_object()) continue;
        events->push_back(j);
        if (on_event) on_event(j);
      }
    }
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  static std::vector<std::string> StatesOf(const std::vector<json>& events,
                                           const std::string& board) {
    std::vector<std::string> out;
    for (const auto& e : events) {
      if (e.value("type", "") == "board" && e.value("board", "") == board)
        out.push_back(e.value("state", ""));
    }
    return out;
  }

  std::string Pid(const std::string& board) {
    std::string out, err;
    EXPECT_EQ(Fwai({"--json", "hw", "ls"}, &out, &err), 0);
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("id", "") == board) return std::to_string(j.value("pid", -1));
    }
    return "-1";
  }

  std::unique_ptr<Daemon> d_;
  std::string keys_;
  std::string project_ = "/";
};

TEST_F(OtaTest, PackagedImageIsWhatMcubootReads) {
  StartDaemon(1);
  const std::string elf = BuildFirmware("1.2.3");
  const std::string img = Package(elf, "1.2.3+4", {"--security-counter", "auto"});
  std::string out, err;
  // The independent reader agrees: header, protected TLVs, hash, key hash, signature.
  ASSERT_EQ(RunCommand({Which("node"), std::string(FWAI_TEST_SCRIPTS) + "/verify_mcuboot.mjs", img,
                        keys_ + "/pub.pem"},
                       &out, &err),
            0)
      << out << err;
  auto r = json::parse(out);
  EXPECT_EQ(r.value("version", ""), "1.2.3+4");
  EXPECT_EQ(r.value("header_size", 0), 0x200);
  EXPECT_EQ(r.value("security_counter", 0), (1 << 24) | (2 << 16) | 3);
  // The payload is the ELF's flat binary, as objcopy makes it.
  const std::string bin = d_->dir() + "/objcopy.bin";
  ASSERT_EQ(RunCommand({Which("arm-none-eabi-objcopy"), "-O", "binary", elf, bin}, &out, &err), 0)
      << err;
  EXPECT_EQ(r.value("image_size", 0u), fs::file_size(bin));
  // Padded to a slot with a trailer, confirmed.
  const std::string padded = d_->dir() + "/padded.bin";
  ASSERT_EQ(Fwai({"ota", "package", elf, "--version", "1.2.3", "--key", keys_ + "/key.pem",
                  "--slot-size", "64K", "--confirm", "-o", padded},
                 &out, &err),
            0)
      << err;
  ASSERT_EQ(RunCommand({Which("node"), std::string(FWAI_TEST_SCRIPTS) + "/verify_mcuboot.mjs",
                        padded, keys_ + "/pub.pem", "--slot-size", "65536"},
                       &out, &err),
            0)
      << out << err;
  r = json::parse(out);
  EXPECT_EQ(r.value("image_ok", ""), "set");
  EXPECT_TRUE(r.value("erased_between", false));
  // fwai ota verify: good, then a flipped payload byte and another key.
  ASSERT_EQ(Fwai({"ota", "verify", img, "--key", keys_ + "/pub.pem"}, &out, &err), 0) << out << err;
  EXPECT_NE(out.find("signature: valid"), std::string::npos) << out;
  std::string bytes;
  {
    std::ifstream in(img, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  bytes[0x200 + 64] ^= 0x01;
  const std::string bad = d_->dir() + "/flipped.bin";
  std::ofstream(bad, std::ios::binary) << bytes;
  EXPECT_EQ(Fwai({"ota", "verify", bad, "--key", keys_ + "/pub.pem"}, &out, &err), 1);
  EXPECT_NE(out.find("DOES NOT MATCH"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({Which("node"), std::string(FWAI_TEST_SCRIPTS) + "/verify_mcuboot.mjs", bad,
                        keys_ + "/pub.pem"},
                       &out, &err),
            1);
  ASSERT_EQ(RunCommand({"/usr/bin/openssl", "genpkey", "-algorithm", "ed25519", "-out",
                        keys_ + "/other.pem"},
                       &out, &err),
            0);
  EXPECT_EQ(Fwai({"ota", "verify", img, "--key", keys_ + "/other.pem"}, &out, &err), 1);
  EXPECT_NE(out.find("signed by another key"), std::string::npos) << out;
}

TEST_F(OtaTest, GoodImageRollsOutToFiveSimulatedBoards) {
  StartDaemon(5);
  project_ = d_->dir();
  WriteSkill("health",
             "name: health\nsteps:\n  - {name: ping, tool: monitor, send: ping, expect: "
             "\"^pong$\", since: now, timeout: 5s}\n");
  const std::string v1 = Package(BuildFirmware("1.0.0"), "1.0.0");
  const std::string v2 = Package(BuildFirmware("1.1.0"), "1.1.0");
  Provision(5, v1);
  std::vector<json> events;
  int rc =
      Rollout({v2, "--boards", "fleet", "--stages", "1,25%,100%", "--health", "health"}, &events);
  ASSERT_EQ(rc, 0) << events.back().dump() << d_->log();
  EXPECT_EQ(events.back().value("state", ""), "completed");
  int stages = 0;
  for (const auto& e : events) stages += e.value("type", "") == "stage_started";
  EXPECT_EQ(stages, 3);  // 1, then 2 (25% of 5), then all 5
  auto boards = Boards();
  for (int i = 1; i <= 5; ++i) {
    const std::string b = "sim-" + std::to_string(i);
    EXPECT_EQ(StatesOf(events, b), (std::vector<std::string>{"staging", "testing", "confirmed"}))
        << b;
    EXPECT_EQ(boards[b].value("running", ""), "1.1.0") << boards[b].dump();
    EXPECT_EQ(boards[b]["primary"].value("image_ok", ""), "set") << boards[b].dump();
    EXPECT_EQ(boards[b]["secondary"].value("version", ""), "1.0.0") << boards[b].dump();
  }
  // The firmware that answers is the new one.
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-3"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"monitor", "sim-3", "--send", "version", "--until", "^version", "--timeout", "5"},
                 &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("version 1.1.0"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"hw", "release", "sim-3"}, &out, &err), 0);
  // Every state change is in the evidence log, and the log verifies.
  ASSERT_EQ(Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0) << err;
  int confirmed = 0;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j["record"].value("kind", "") == "ota" &&
        j["record"].value("state", "") == "confirmed")
      confirmed++;
  }
  EXPECT_EQ(confirmed, 5);
  ASSERT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << out << err;
  // The same image again changes nothing; an older one is a downgrade.
  events.clear();
  ASSERT_EQ(Rollout({v2, "--boards", "sim-1"}, &events), 0);
  EXPECT_EQ(StatesOf(events, "sim-1"), (std::vector<std::string>{"skipped"}));
  events.clear();
  EXPECT_EQ(Rollout({v1, "--boards", "fleet"}, &events), 1);
  EXPECT_NE(events.back().value("text", "").find("downgrade refused"), std::string::npos)
      << events.back().dump();
  events.clear();
  ASSERT_EQ(Rollout({v1, "--boards", "sim-5", "--force"}, &events), 0) << events.back().dump();
  EXPECT_EQ(Boards()["sim-5"].value("running", ""), "1.0.0");
}

TEST_F(OtaTest, BadImageIsRevertedOnItsFirstStageAndTheRestNeverSeeIt) {
  StartDaemon(5);
  project_ = d_->dir();
  WriteSkill("health",
             "name: health\nsteps:\n  - {name: ping, tool: monitor, send: ping, expect: "
             "\"^pong$\", since: now, timeout: 3s}\n");
  const std::string v1 = Package(BuildFirmware("1.0.0"), "1.0.0");
  const std::string bad = Package(BuildFirmware("1.2.0", /*break_ping=*/true), "1.2.0");
  Provision(5, v1);
  std::vector<json> events;
  int rc =
      Rollout({bad, "--boards", "fleet", "--stages", "1,25%,100%", "--health", "health"}, &events);
  EXPECT_EQ(rc, 5) << d_->log();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().value("state", ""), "stopped") << events.back().dump();
  EXPECT_EQ(StatesOf(events, "sim-1"),
            (std::vector<std::string>{"staging", "testing", "reverting", "reverted"}));
  // It booted the bad image (the boot line is its own), then went back.
  for (const auto& e : events) {
    if (e.value("board", "") == "sim-1" && e.value("state", "") == "testing") {
      EXPECT_NE(e.value("text", "").find("1.2.0 booted"), std::string::npos) << e.dump();
    }
    if (e.value("board", "") == "sim-1" && e.value("state", "") == "reverted") {
      EXPECT_EQ(e["record"].value("swap", ""), "revert") << e.dump();
      EXPECT_EQ(e["record"].value("running", ""), "1.0.0") << e.dump();
    }
  }
  auto boards = Boards();
  EXPECT_EQ(boards["sim-1"].value("running", ""), "1.0.0");
  EXPECT_EQ(boards["sim-1"]["primary"].value("image_ok", ""), "set");
  for (int i = 2; i <= 5; ++i) {
    const std::string b = "sim-" + std::to_string(i);
    EXPECT_TRUE(StatesOf(events, b).empty()) << b;
    EXPECT_EQ(boards[b].value("running", ""), "1.0.0") << boards[b].dump();
    EXPECT_FALSE(boards[b]["secondary"].value("has_image", true))
        << b << " saw the image: " << boards[b].dump();
  }
  std::string out, err;
  ASSERT_EQ(Fwai({"ota", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("stopped"), std::string::npos) << out;
}

TEST_F(OtaTest, BoardThatLosesPowerMidUpdateComesBackOnTheOldSlot) {
  StartDaemon(2);
  project_ = d_->dir();
  // A health check that waits long: the board loses power before it ends.
  WriteSkill("soak",
             "name: soak\nsteps:\n  - {name: soak, tool: monitor, expect: \"never printed\", "
             "since: now, timeout: 60s}\n");
  const std::string v1 = Package(BuildFirmware("1.0.0"), "1.0.0");
  const std::string v2 = Package(BuildFirmware("1.1.0"), "1.1.0");
  Provision(2, v1);
  std::vector<json> events;
  std::string killed_pid;
  const auto t0 = std::chrono::steady_clock::now();
  int rc = Rollout({v2, "--boards", "sim-1", "--health", "soak"}, &events, [&](const json& e) {
    if (e.value("board", "") == "sim-1" && e.value("state", "") == "testing") {
      killed_pid = Pid("sim-1");
      ASSERT_GT(std::stoi(killed_pid), 0);
      kill(std::stoi(killed_pid), SIGKILL);  // power lost while the new image runs unconfirmed
    }
  });
  EXPECT_EQ(rc, 5) << d_->log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0,
            std::chrono::seconds(45));  // not the soak's 60 s
  ASSERT_FALSE(killed_pid.empty());
  EXPECT_EQ(StatesOf(events, "sim-1"),
            (std::vector<std::string>{"staging", "testing", "reverting", "reverted"}));
  auto boards = Boards();
  EXPECT_EQ(boards["sim-1"].value("running", ""), "1.0.0") << boards["sim-1"].dump();
  EXPECT_EQ(boards["sim-1"]["primary"].value("image_ok", ""), "set");
  EXPECT_EQ(boards["sim-1"]["secondary"].value("version", ""), "1.1.0");
  EXPECT_NE(Pid("sim-1"), killed_pid);
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-1"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"monitor", "sim-1", "--send", "version", "--until", "^version", "--timeout", "5"},
                 &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("version 1.0.0"), std::string::npos) << out;
  // The untouched board kept running.
  EXPECT_EQ(boards["sim-2"].value("running", ""), "1.0.0");
}

// A rollout ends with the token that started it: revoked while the new
// image is on trial (a 60 s health check under way), the stream ends at once
// and the rollout stops as a cancel does: the board goes back to the image it
// ran.
TEST_F(OtaTest, ARolloutStopsWhenItsTokenIsRevoked) {
  StartDaemon(1, "users:\n  ci: {role: user, local_user: root}\n", /*tcp=*/true);
  project_ = d_->dir();
  WriteSkill("soak",
             "name: soak\nsteps:\n  - {name: soak, tool: monitor, expect: \"never printed\", "
             "since: now, timeout: 60s}\n");
  const std::string v1 = Package(BuildFirmware("1.0.0"), "1.0.0");
  const std::string v2 = Package(BuildFirmware("1.1.0"), "1.1.0");
  Provision(1, v1);
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "token", "create", "ci", "--role", "user"}, &out, &err), 0) << err;
  const json token = json::parse(out);
  std::vector<json> events;
  std::chrono::steady_clock::time_point revoked;
  const int rc = Rollout(
      {v2, "--boards", "sim-1", "--health", "soak"}, &events,
      [&](const json& e) {
        if (e.value("board", "") == "sim-1" && e.value("state", "") == "testing") {
          std::string o, er;
          EXPECT_EQ(Fwai({"token", "revoke", token.value("id", "")}, &o, &er), 0) << er;
          revoked = std::chrono::steady_clock::now();
        }
      },
      "tcp:127.0.0.1:" + std::to_string(d_->TcpPort()), {"FWAI_TOKEN=" + token.value("token", "")});
  ASSERT_NE(revoked, std::chrono::steady_clock::time_point()) << "never on trial: " << d_->log();
  EXPECT_NE(rc, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - revoked, std::chrono::seconds(10))
      << "the stream outlived its token";
  // The rollout stopped: the board is back on 1.0.0 well before the soak's 60 s.
  std::string running;
  for (auto until = revoked + std::chrono::seconds(40); std::chrono::steady_clock::now() < until;) {
    running = Boards()["sim-1"].value("running", "");
    if (running == "1.0.0") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(running, "1.0.0") << d_->log();
  EXPECT_EQ(Boards()["sim-1"]["secondary"].value("version", ""), "1.1.0");
}

TEST_F(OtaTest, PhysicalBoardsGetOnlyAnImageThatPassedOnSimulatedOnes) {
  const std::string out_dir = MakeTempDir("fwai-ota-bench-");
  StartDaemon(1,
              "    - id: bench-1\n      probe: 0671FF383133\n      target: stm32f100rb\n      "
              "tags: [bench]\n"
              "      ota_upload: \"cp {image} " +
                  out_dir +
                  "/uploaded.bin\"\n"
                  "      ota_reset: \"echo reset >> " +
                  out_dir +
                  "/log\"\n"
                  "      ota_confirm: \"echo confirm >> " +
                  out_dir + "/log\"\n");
  project_ = d_->dir();
  const std::string v1 = Package(BuildFirmware("1.0.0"), "1.0.0");
  const std::string v2 = Package(BuildFirmware("1.1.0"), "1.1.0");
  Provision(1, v1);
  std::vector<json> events;
  EXPECT_EQ(Rollout({v2, "--boards", "bench-1"}, &events), 1);
  EXPECT_NE(events.back().value("text", "").find("promotion refused"), std::string::npos)
      << events.back().dump();
  EXPECT_FALSE(fs::exists(out_dir + "/uploaded.bin"));
  events.clear();
  ASSERT_EQ(Rollout({v2, "--boards", "sim-1"}, &events), 0) << events.back().dump();
  events.clear();
  ASSERT_EQ(Rollout({v2, "--boards", "bench-1"}, &events), 0) << events.back().dump() << d_->log();
  EXPECT_EQ(StatesOf(events, "bench-1"),
            (std::vector<std::string>{"staging", "testing", "confirmed"}));
  std::string uploaded, original, out, err;
  ASSERT_EQ(RunCommand({"/usr/bin/cmp", v2, out_dir + "/uploaded.bin"}, &out, &err), 0)
      << out << err;
  std::ifstream log(out_dir + "/log");
  std::stringstream ss;
  ss << log.rdbuf();
  EXPECT_EQ(ss.str(), "reset\nconfirm\n");
  EXPECT_EQ(Boards()["bench-1"].value("running", ""), "1.1.0");
  fs::remove_all(out_dir);
}

}  // namespace
}  // namespace fwai::testing
