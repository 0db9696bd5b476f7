// The hardware loop through the CLI and a real fwaid with the simulated
// STM32VLDISCOVERY (QEMU): lease, flash behind the guard, serial, GDB, fault
// decode; contention, lapsed leases, fan-out, unplug, bad ports.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/integration/daemon_fixture.h"

extern char** environ;

namespace fwai::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class HwTest : public ::testing::Test {
 protected:
  void StartDaemon(const std::string& extra_yaml = "") {
    d_ = std::make_unique<Daemon>(nullptr, extra_yaml);
    ASSERT_TRUE(d_->Start()) << d_->log();
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr,
           int timeout_s = 60) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                     d_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string o, e;
    int rc = RunCommand(argv, &o, &e, {}, timeout_s);
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  }

  // Copies the example into a temp project and builds it with make.
  std::string BuildExample() {
    project_ = d_->dir() + "/blinky";
    fs::copy(BLINKY_SRC_DIR, project_, fs::copy_options::recursive);
    fs::remove_all(project_ + "/build");
    fs::remove_all(project_ + "/.fwai");  // the test makes its own
    std::string out, err;
    int rc = RunCommand({"/usr/bin/make", "-s", "-C", project_}, &out, &err, {}, 120);
    EXPECT_EQ(rc, 0) << out << err;
    return project_ + "/build/blinky.elf";
  }

  json Device(const std::string& id) {
    std::string out;
    EXPECT_EQ(Fwai({"--json", "hw", "ls"}, &out), 0);
    std::istringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("id", "") == id) return j;
    }
    return json();
  }

  // The records of `kind` in the evidence log.
  std::vector<json> RecordsOf(const std::string& kind) {
    std::string out, err;
    EXPECT_EQ(Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0) << err;
    std::vector<json> found;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j["record"].value("kind", "") == kind) found.push_back(j["record"]);
    }
    return found;
  }

  pid_t Spawn(std::vector<std::string> args) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon",
                                     d_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }

  std::unique_ptr<Daemon> d_;
  std::string project_;
};

TEST_F(HwTest, LeaseFlashSerialDebugFaultReleaseThroughTheCli) {
  StartDaemon();
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("sim-stm32vl"), std::string::npos) << out;
  EXPECT_NE(out.find("good"), std::string::npos) << out;

  // The guard: no lease, then no approval.
  EXPECT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 33);  // config
  EXPECT_NE(err.find("flash guard (lease)"), std::string::npos) << err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("leased sim-stm32vl"), std::string::npos) << out;
  EXPECT_EQ(Fwai({"flash", "sim-stm32vl", elf}, &out, &err), 33);
  EXPECT_NE(err.find("flash guard (approval)"), std::string::npos) << err;

  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << out << err << d_->log();
  EXPECT_NE(out.find("booted: stm32vl-blinky 1.0.0 booted"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("sha256 ([0-9a-f]{64})"))) << out;
  const std::string sha = m[1];
  json dev = Device("sim-stm32vl");
  EXPECT_EQ(dev.value("image_sha256", ""), sha) << dev.dump();
  EXPECT_TRUE(dev.value("running", false));

  // Serial: the banner is in the history; commands answer.
  ASSERT_EQ(Fwai({"monitor", "--history", "--until", "booted", "--timeout", "5"}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("stm32vl-blinky 1.0.0 booted"), std::string::npos);
  ASSERT_EQ(Fwai({"monitor", "--send", "ping", "--until", "^pong$", "--timeout", "5"}, &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("pong"), std::string::npos);
  ASSERT_EQ(
      Fwai({"monitor", "--send", "led on", "--until", "GPIOC_ODR", "--timeout", "5"}, &out, &err),
      0)
      << err;
  EXPECT_NE(out.find("led on GPIOC_ODR=0x"), std::string::npos) << out;

  // GDB reads the counter twice; it counts.
  ASSERT_EQ(Fwai({"debug", "print counter"}, &out, &err), 0) << err;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("counter = (\\d+)"))) << out;
  const long first = std::stol(m[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ASSERT_EQ(Fwai({"--json", "debug", "sim-stm32vl", "print counter", "bt"}, &out, &err), 0) << err;
  std::istringstream lines(out);
  std::string l1, l2;
  std::getline(lines, l1);
  std::getline(lines, l2);
  auto p = json::parse(l1);
  EXPECT_GT(std::stol(p.value("value", "0")), first) << l1;
  auto bt = json::parse(l2);
  ASSERT_TRUE(bt.contains("frames")) << l2;
  EXPECT_EQ(bt["frames"].back().value("func", ""), "main") << l2;

  // GDB runs as fwaid: a command that would act on the host as fwaid (a
  // script, a program, a file written) is refused before GDB sees it.
  const std::string marker = project_ + "/gdb-wrote-this";
  for (const std::string& attack :
       {"python open('" + marker + "', 'w').close()", "print $_shell(\"touch " + marker + "\")",
        "print 1\npython open('" + marker + "', 'w').close()", "pipe bt | touch " + marker,
        "dump memory " + marker + " 0x20000000 0x20000010"}) {
    EXPECT_EQ(Fwai({"debug", attack}, &out, &err), 1) << attack << "\n" << out << err;
    EXPECT_NE((out + err).find("rule: debug commands act on the target only"), std::string::npos)
        << attack << ": " << out << err;
    EXPECT_FALSE(fs::exists(marker)) << attack;
  }

  // A fault, decoded into words.
  ASSERT_EQ(Fwai({"monitor", "--send", "fault", "--until", "FAULT", "--timeout", "5"}, &out, &err),
            0)
      << err;
  ASSERT_EQ(Fwai({"debug", "fault"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("HardFault"), std::string::npos) << out;
  EXPECT_NE(out.find("precise data bus error"), std::string::npos) << out;
  EXPECT_NE(out.find("trigger_fault"), std::string::npos) << out;
  EXPECT_NE(out.find("0x3ffffff0"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"--json", "debug", "fault"}, &out, &err), 0) << err;
  auto f = json::parse(out);
  EXPECT_EQ(f["fault"]["cfsr"], "0x00008200");
  EXPECT_EQ(f["fault"]["hfsr"], "0x40000000");
  EXPECT_EQ(f["fault"]["frame"]["pc"].get<std::string>().substr(0, 6), "0x0800");

  // Reset brings it back to a fresh boot.
  ASSERT_EQ(Fwai({"hw", "reset"}, &out, &err), 0) << err;
  ASSERT_EQ(
      Fwai({"monitor", "--send", "version", "--until", "^version", "--timeout", "5"}, &out, &err),
      0)
      << err;
  EXPECT_NE(out.find("version 1.0.0"), std::string::npos);

  // A stale image is refused and the board keeps what it runs.
  fs::last_write_time(project_ + "/src/main.c",
                      fs::file_time_type::clock::now() + std::chrono::seconds(2));
  EXPECT_EQ(Fwai({"flash", "--yes", elf}, &out, &err), 33);
  EXPECT_NE(err.find("flash guard (fresh)"), std::string::npos) << err;
  EXPECT_NE(err.find("main.c"), std::string::npos) << err;
  EXPECT_EQ(Device("sim-stm32vl").value("image_sha256", ""), sha);

  ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
  // Released, the simulated board is paused: it uses no CPU.
  {
    std::string pids;
    RunCommand({"/usr/bin/pgrep", "-f", d_->dir() + "/data/run/qmp"}, &pids, &err);
    ASSERT_FALSE(pids.empty());
    auto cpu_ticks = [&] {
      std::ifstream stat("/proc/" + std::to_string(std::stoi(pids)) + "/stat");
      std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
      std::istringstream fields(s.substr(s.rfind(')') + 2));
      std::string f;
      long utime = 0, stime = 0;
      for (int i = 3; i <= 15 && fields >> f; ++i) {
        if (i == 14) utime = std::stol(f);
        if (i == 15) stime = std::stol(f);
      }
      return utime + stime;
    };
    const long before = cpu_ticks();
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    EXPECT_LT(cpu_ticks() - before, 10) << "a released simulated board kept running";
    EXPECT_FALSE(Device("sim-stm32vl").value("running", true));
    EXPECT_EQ(Device("sim-stm32vl").value("state", ""), "paused");
  }
  EXPECT_EQ(Fwai({"debug", "print counter"}, &out, &err), 1);
  EXPECT_NE(err.find("not leased"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"monitor", "--send", "ping", "--timeout", "2"}, &out, &err), 1);
  EXPECT_NE(err.find("needs the lease"), std::string::npos) << err;
}

TEST_F(HwTest, ContendersWaitAndLapsedHoldersLoseTheirLease) {
  StartDaemon();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "alice"}, &out, &err), 0) << err;
  // Fail at once, naming the holder.
  EXPECT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "bob"}, &out, &err), 1);
  EXPECT_NE(err.find("held by"), std::string::npos) << err;
  EXPECT_NE(err.find("since"), std::string::npos) << err;
  // Wait: bob gets it once alice releases.
  int bob_rc = -1;
  std::string bob_out, bob_err;
  std::atomic<bool> bob_done{false};
  std::thread bob([&] {
    bob_rc = Fwai({"hw", "lease", "sim-stm32vl", "--session", "bob", "--wait", "90"}, &bob_out,
                  &bob_err, /*timeout_s=*/150);
    bob_done = true;
  });
  // Once bob is queued (`hw who` lists him waiting), alice lets go. No clock
  // here: bob's own --wait bounds the loop, however slow the machine.
  std::string polls;  // how long each look took, for a failure's message
  do {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0);
    absl::StrAppend(
        &polls, " ",
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
  } while (out.find("\"waiting\":true") == std::string::npos && !bob_done);
  EXPECT_NE(out.find("\"waiting\":true"), std::string::npos)
      << "bob never queued: " << out << "\nbob: " << bob_err << "\nlooks (ms):" << polls;
  EXPECT_NE(out.find("\"session_id\":\"alice\""), std::string::npos) << out;
  ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
  bob.join();
  EXPECT_EQ(bob_rc, 0) << bob_err;
  ASSERT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0);
  EXPECT_NE(out.find("\"session_id\":\"bob\""), std::string::npos) << out;
  ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;

  // A lease held by a running client (--hold) is renewed while it runs and
  // released the moment the client dies.
  pid_t holder =
      Spawn({"hw", "lease", "sim-stm32vl", "--ttl", "2", "--hold", "--session", "carol"});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    Fwai({"--json", "hw", "who"}, &out, &err);
    if (out.find("carol") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(out.find("carol"), std::string::npos);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  Fwai({"--json", "hw", "who"}, &out, &err);
  EXPECT_NE(out.find("carol"), std::string::npos)
      << "keepalive did not keep the lease past its TTL";
  kill(holder, SIGKILL);
  waitpid(holder, nullptr, 0);
  auto gone_within = [&](const std::string& who, double limit_s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(limit_s + 3)) {
      Fwai({"--json", "hw", "who"}, &out, &err);
      if (out.find(who) == std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(out.find(who), std::string::npos) << who << " still holds it";
    EXPECT_LE(s, limit_s) << who << "'s lease outlived its limit";
  };
  gone_within("carol", 1.0);
  // A lease nobody renews lapses after its TTL, not before (fwaid's clock is
  // moved, not waited for).
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--ttl", "5", "--session", "erin"}, &out, &err), 0)
      << err;
  d_->AdvanceClock(2'000'000);
  ASSERT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("erin"), std::string::npos) << "erin's lease lapsed before its TTL: " << out;
  d_->AdvanceClock(4'000'000);
  gone_within("erin", 1.0);
  // By tags: any free board that has them.
  ASSERT_EQ(Fwai({"hw", "lease", "--tag", "simulated", "--tag", "stm32f1", "--session", "tagged"},
                 &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("leased sim-stm32vl"), std::string::npos) << out;
  EXPECT_EQ(Fwai({"hw", "lease", "--tag", "esp32"}, &out, &err), 1);
  EXPECT_NE(err.find("no board has tags esp32"), std::string::npos) << err;
  ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
  // A lease bound to a session ends when the session is deleted.
  auto session = d_->CreateSession();
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", session.id()}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"sessions", "rm", session.id()}, &out, &err), 0) << err;
  gone_within(session.id(), 1.0);
  // Leases survive a daemon restart.
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "dave"}, &out, &err), 0);
  EXPECT_EQ(d_->Stop(), 0);
  ASSERT_TRUE(d_->Start()) << d_->log();
  ASSERT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0);
  EXPECT_NE(out.find("dave"), std::string::npos) << out;
}

// Waiting is a first-come first-served queue: three callers that queue for
// a held board get it in the order they came, one that gives up (its client
// dies) leaves the queue, and `fwai hw who` shows holders and waiters with
// their place in line.
TEST_F(HwTest, WaitersAreServedInTheOrderTheyCameAndWhoShowsThem) {
  StartDaemon();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "first"}, &out, &err), 0) << err;
  // The waiters, one line each from `hw who --json`, earliest first.
  auto waiters = [&] {
    std::vector<json> w;
    EXPECT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0) << err;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("waiting", false)) w.push_back(j);
    }
    return w;
  };
  auto holder = [&] {
    EXPECT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0) << err;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("device_id", "") == "sim-stm32vl")
        return j.value("session_id", "");
    }
    return std::string();
  };
  auto wait_for_waiters = [&](size_t n) {
    for (int i = 0; i < 600 && waiters().size() != n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return waiters().size() == n;
  };
  const std::string bin = std::string(FWAI_BIN_DIR) + "/fwai";
  auto waiter = [&](const std::string& session, const std::vector<std::string>& what) {
    std::vector<std::string> argv = {bin, "--daemon", d_->address(), "hw", "lease"};
    argv.insert(argv.end(), what.begin(), what.end());
    argv.insert(argv.end(), {"--session", session, "--wait", "120"});
    return std::make_unique<BackgroundCommand>(argv);
  };
  std::vector<std::unique_ptr<BackgroundCommand>> queued;
  queued.push_back(waiter("w1", {"sim-stm32vl"}));
  ASSERT_TRUE(wait_for_waiters(1));
  auto quitter = waiter("quitter", {"sim-stm32vl"});
  ASSERT_TRUE(wait_for_waiters(2));
  queued.push_back(waiter("w2", {"--tag", "simulated"}));
  ASSERT_TRUE(wait_for_waiters(3));
  queued.push_back(waiter("w3", {"sim-stm32vl"}));
  ASSERT_TRUE(wait_for_waiters(4));
  // The quitter's client dies: it leaves the queue, the others move up.
  kill(quitter->pid(), SIGKILL);
  quitter->Wait(10);
  ASSERT_TRUE(wait_for_waiters(3));
  auto w = waiters();
  ASSERT_EQ(w.size(), 3u);
  const std::vector<std::string> order = {"w1", "w2", "w3"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(w[i].value("session_id", ""), order[i]) << w[i].dump();
    EXPECT_EQ(w[i].value("position", 0), static_cast<int>(i + 1)) << w[i].dump();
    EXPECT_GT(w[i].value("since_us", int64_t{0}), 0) << w[i].dump();
    EXPECT_NE(w[i].value("holder", "").find("uid 0"), std::string::npos) << w[i].dump();
    EXPECT_EQ(w[i].value("node", ""), "") << w[i].dump();
  }
  EXPECT_EQ(w[1].value("wants", ""), "tags simulated");
  EXPECT_EQ(w[0].value("wants", ""), "sim-stm32vl");
  // A caller that does not wait cannot jump the queue, even while the board
  // is between two holders.
  EXPECT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "jumper"}, &out, &err), 1);
  EXPECT_NE(err.find("3 callers wait before you"), std::string::npos) << err;
  // The text form shows both tables.
  ASSERT_EQ(Fwai({"hw", "who"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("first"), std::string::npos) << out;
  EXPECT_NE(out.find("WAITING"), std::string::npos) << out;
  EXPECT_NE(out.find("tags simulated"), std::string::npos) << out;
  // Each release hands the board to the next in line.
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
    ASSERT_TRUE(queued[i]->WaitForOutput("leased sim-stm32vl", 60))
        << order[i] << ": " << queued[i]->err();
    EXPECT_EQ(queued[i]->Wait(10), 0);
    EXPECT_EQ(holder(), order[i]);
    EXPECT_EQ(waiters().size(), 2 - i);
  }
  ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
}

// hardware.keep_serial_transcripts: the serial output of a lease is kept
// with the record of its release (its SHA-256 in the record, its bytes in the
// data dir), and a lease that lapses gets a lease_ended record with its own.
// Without the setting, nothing is kept.
TEST_F(HwTest, SerialTranscriptsAreKeptWithTheLeasesRecord) {
  for (const bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "kept" : "not kept");
    StartDaemon(keep ? "hardware:\n  keep_serial_transcripts: true\n" : "");
    const std::string elf = BuildExample();
    std::string out, err;
    ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
    ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << out << err;
    ASSERT_EQ(
        Fwai({"monitor", "--send", "ping", "--until", "^pong$", "--timeout", "10"}, &out, &err), 0)
        << err;
    ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
    // A second lease that lapses (TTL 3 s, fwaid's clock moved past it) after
    // its own line.
    ASSERT_EQ(
        Fwai({"hw", "lease", "sim-stm32vl", "--ttl", "3", "--session", "lapsing"}, &out, &err), 0)
        << err;
    ASSERT_EQ(
        Fwai({"monitor", "--send", "ping", "--until", "^pong$", "--timeout", "10"}, &out, &err), 0)
        << err;
    d_->AdvanceClock(4'000'000);
    json released, lapsed;
    for (int i = 0; i < 200 && lapsed.is_null(); ++i) {
      ASSERT_EQ(Fwai({"--json", "evidence", "ls"}, &out, &err), 0) << err;
      std::istringstream lines(out);
      for (std::string line; std::getline(lines, line);) {
        auto j = json::parse(line, nullptr, false);
        if (!j.is_object()) continue;
        const json& rec = j["record"];
        if (rec.value("kind", "") == "lease_released") released = rec;
        if (rec.value("kind", "") == "lease_ended") lapsed = rec;
      }
      if (!keep) {
        // Nothing to wait for: the lapse is seen in who.
        ASSERT_EQ(Fwai({"--json", "hw", "who"}, &out, &err), 0) << err;
        if (out.find("lapsing") == std::string::npos) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_FALSE(released.is_null()) << out;
    const std::string dir = d_->data_dir() + "/artifacts/serial";
    if (!keep) {
      EXPECT_FALSE(released.contains("serial_transcript")) << released.dump();
      EXPECT_TRUE(lapsed.is_null()) << lapsed.dump();
      EXPECT_FALSE(fs::exists(dir));
      break;
    }
    ASSERT_TRUE(released.contains("serial_transcript")) << released.dump();
    const json t = released["serial_transcript"];
    const std::string sha = t.value("sha256", "");
    ASSERT_EQ(sha.size(), 64u) << t.dump();
    EXPECT_EQ(t.value("path", ""), dir + "/" + sha + ".log");
    std::ifstream in(dir + "/" + sha + ".log", std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string text = bytes.str();
    EXPECT_NE(text.find("stm32vl-blinky 1.0.0 booted"), std::string::npos) << text;
    EXPECT_NE(text.find("pong"), std::string::npos) << text;
    EXPECT_EQ(t.value("bytes", size_t{0}), text.size());
    EXPECT_EQ(t.value("lost_lines", 1), 0);
    std::string hash_out;
    ASSERT_EQ(RunCommand({"/usr/bin/sha256sum", dir + "/" + sha + ".log"}, &hash_out, &err), 0);
    EXPECT_EQ(hash_out.substr(0, 64), sha) << "the record's hash is the kept bytes' hash";
    struct stat st {};
    ASSERT_EQ(stat((dir + "/" + sha + ".log").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // The lapsed lease: its record, its transcript, which has only its own lines.
    ASSERT_FALSE(lapsed.is_null()) << "no lease_ended record";
    EXPECT_NE(lapsed.value("reason", "").find("TTL"), std::string::npos) << lapsed.dump();
    const json t2 = lapsed["serial_transcript"];
    std::ifstream in2(t2.value("path", ""), std::ios::binary);
    std::stringstream bytes2;
    bytes2 << in2.rdbuf();
    EXPECT_NE(bytes2.str().find("pong"), std::string::npos) << t2.dump();
    EXPECT_EQ(bytes2.str().find("booted"), std::string::npos)
        << "the earlier lease's lines: " << bytes2.str();
    ASSERT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << out << err;
    d_.reset();
  }
}

// The firmware's RTT channels through fwai, read while the board runs: the
// boot line from rtt:0's history, a command on the down-channel answered,
// a UART command logged on rtt:0, the trace on rtt:1; a channel the
// firmware lacks named; writing without the lease refused.
TEST_F(HwTest, RttChannelsAreMonitoredLikeTheSerialPort) {
  StartDaemon();
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << out << err;
  ASSERT_EQ(Fwai({"monitor", "sim-stm32vl", "--rtt", "--history", "--until",
                  "^rtt: stm32vl-blinky 1.0.0 booted$", "--timeout", "20"},
                 &out, &err),
            0)
      << out << err << d_->log();
  ASSERT_EQ(Fwai({"monitor", "sim-stm32vl", "--rtt", "0", "--send", "ping", "--until", "^pong$",
                  "--timeout", "20"},
                 &out, &err),
            0)
      << out << err;
  ASSERT_EQ(Fwai({"monitor", "sim-stm32vl", "--send", "version", "--until", "^version", "--timeout",
                  "20"},
                 &out, &err),
            0)
      << err;
  ASSERT_EQ(Fwai({"monitor", "sim-stm32vl", "--rtt", "0", "--history", "--until",
                  "^uart cmd: version$", "--timeout", "20"},
                 &out, &err),
            0)
      << out << err;
  ASSERT_EQ(Fwai({"monitor", "sim-stm32vl", "--rtt", "1", "--until", "^tick counter=[0-9]+$",
                  "--timeout", "20"},
                 &out, &err),
            0)
      << out << err;
  EXPECT_NE(Fwai({"monitor", "sim-stm32vl", "--rtt", "5", "--timeout", "5"}, &out, &err), 0);
  EXPECT_NE(err.find("RTT up-channels 0 to 1, not rtt:5"), std::string::npos) << err;
  json dev = Device("sim-stm32vl");
  EXPECT_TRUE(dev.value("running", false)) << dev.dump();
  // The listing names what can be read, as the firmware names its channels.
  EXPECT_EQ(dev["streams"], json::parse(R"([{"id": "uart", "name": ""},
      {"id": "rtt:0", "name": "Terminal"}, {"id": "rtt:1", "name": "Trace"}])"))
      << dev.dump();

  ASSERT_EQ(Fwai({"hw", "release", "sim-stm32vl"}, &out, &err), 0) << err;
  EXPECT_NE(
      Fwai({"monitor", "sim-stm32vl", "--rtt", "--send", "ping", "--timeout", "5"}, &out, &err), 0);
  EXPECT_NE(err.find("writing to rtt:0 needs the lease"), std::string::npos) << err;
}

// A board with semihosting: the firmware's semihosting console is a stream
// like the UART, and its QEMU runs sandboxed. The firmware, as an attacker
// would, asks the host for files through semihosting: a system file is
// read (its file calls work), a file of the machine's user and /etc/passwd
// are not there for it. RTT and gdb still work on the sandboxed QEMU.
TEST_F(HwTest, SemihostingIsAStreamAndItsFileCallsSeeNothingOfTheHost) {
  const std::string secret_dir = MakeTempDir("fwai-s-");
  const std::string secret = secret_dir + "/secret";
  std::ofstream(secret) << "TOPSECRET-semihosting-must-not-read-this\n";
  StartDaemon(
      "hardware:\n  boards:\n"
      "    - {id: semi, kind: simulated, machine: stm32vldiscovery, boot_pattern: booted, "
      "semihosting: true}\n"
      "    - {id: plain, kind: simulated, machine: lm3s6965evb}\n");
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "semi"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "semi", elf}, &out, &err), 0) << out << err << d_->log();
  ASSERT_EQ(Fwai({"monitor", "semi", "--send", "semihost hello", "--until", "^semihost: written$",
                  "--timeout", "20"},
                 &out, &err),
            0)
      << out << err;
  ASSERT_EQ(Fwai({"monitor", "semi", "--semihosting", "--history", "--until",
                  "^semihosting: hello$", "--timeout", "20"},
                 &out, &err),
            0)
      << out << err << d_->log();
  auto cat = [&](const std::string& path) {
    EXPECT_EQ(Fwai({"monitor", "semi", "--send", "semihost-cat " + path, "--until",
                    "^semihost-cat:", "--timeout", "20"},
                   &out, &err),
              0)
        << out << err;
    return out;
  };
  EXPECT_NE(cat("/usr/share/common-licenses/Apache-2.0").find("Apache Licens"), std::string::npos)
      << out;
  // (The firmware's command line holds 63 characters.)
  ASSERT_LT(d_->config_path().size(), 50u) << d_->config_path();
  for (const std::string& path : {secret, std::string("/etc/passwd"), d_->config_path()}) {
    const std::string said = cat(path);
    EXPECT_NE(said.find("semihost-cat: open failed"), std::string::npos) << path << ": " << said;
    EXPECT_EQ(said.find("TOPSECRET"), std::string::npos) << said;
    EXPECT_EQ(said.find("root:"), std::string::npos) << said;
  }
  // RTT (the sandboxed QEMU's memory) and gdb (its socket) as on any board.
  ASSERT_EQ(Fwai({"monitor", "semi", "--rtt", "--history", "--until", "^rtt: .*booted$",
                  "--timeout", "20"},
                 &out, &err),
            0)
      << out << err;
  ASSERT_EQ(Fwai({"debug", "semi", "print counter"}, &out, &err), 0) << out << err;
  EXPECT_NE(out.find("counter = "), std::string::npos) << out;
  json dev = Device("semi");
  EXPECT_NE(dev["streams"].dump().find("semihosting"), std::string::npos) << dev.dump();
  // A board without it says how to have it.
  EXPECT_NE(Fwai({"monitor", "plain", "--semihosting", "--timeout", "5"}, &out, &err), 0);
  EXPECT_NE(err.find("semihosting: true in its configuration"), std::string::npos) << err;
  fs::remove_all(secret_dir);
}

TEST_F(HwTest, ThreeReadersSeeTheSameLinesAndUnplugEndsThemCleanly) {
  StartDaemon();
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", elf}, &out, &err), 0) << out << err;
  // Three readers from the history on, until the answer to `count`.
  std::vector<std::string> seen(3);
  std::vector<int> rcs(3, -1);
  std::vector<std::thread> readers;
  for (int i = 0; i < 3; ++i) {
    readers.emplace_back([&, i] {
      rcs[i] = Fwai({"monitor", "--history", "--until", "^counter", "--timeout", "20"}, &seen[i],
                    nullptr);
    });
  }
  ASSERT_EQ(Fwai({"monitor", "--send", "ping", "--send", "version", "--send", "count", "--until",
                  "^counter", "--timeout", "10"},
                 &out, &err),
            0)
      << err;
  for (auto& t : readers) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rcs[i], 0);
    EXPECT_EQ(seen[i], seen[0]) << "reader " << i;
  }
  const auto pong = seen[0].find("pong"), ver = seen[0].find("version 1.0.0"),
             cnt = seen[0].find("counter ");
  ASSERT_NE(pong, std::string::npos) << seen[0];
  EXPECT_LT(pong, ver);
  EXPECT_LT(ver, cnt);

  // The holder's own reader is bound to the lease: releasing ends it, with why.
  int held_rc = -1;
  std::string held_out, held_err;
  std::thread held([&] { held_rc = Fwai({"monitor", "--timeout", "30"}, &held_out, &held_err); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ASSERT_EQ(Fwai({"hw", "release"}, &out, &err), 0) << err;
  held.join();
  EXPECT_EQ(held_rc, 1);
  EXPECT_NE(held_err.find("ended: released by its holder"), std::string::npos) << held_err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;

  // Unplug: QEMU dies under a reader.
  int mon_rc = -1;
  std::string mon_out, mon_err;
  std::thread mon([&] { mon_rc = Fwai({"monitor", "--timeout", "30"}, &mon_out, &mon_err); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  std::string pids;
  RunCommand({"/usr/bin/pgrep", "-f", d_->dir() + "/data/run/qmp"}, &pids, &err);
  ASSERT_FALSE(pids.empty()) << "no QEMU found";
  kill(std::stoi(pids), SIGKILL);
  mon.join();
  EXPECT_EQ(mon_rc, 1);
  EXPECT_NE(mon_err.find("serial stream ended"), std::string::npos) << mon_err;
  EXPECT_NE(mon_err.find("closed"), std::string::npos) << mon_err;
  json dev = Device("sim-stm32vl");
  EXPECT_EQ(dev.value("health", ""), "bad") << dev.dump();
  EXPECT_FALSE(dev.value("running", true));
  // fwaid is fine; its holder brings it back by flashing again.
  ASSERT_EQ(Fwai({"flash", "--yes", elf}, &out, &err), 0) << err;
  EXPECT_EQ(Device("sim-stm32vl").value("health", ""), "good");
  // Dead again and released: a bad board is not handed out, until its
  // self-test passes.
  RunCommand({"/usr/bin/pgrep", "-f", d_->dir() + "/data/run/qmp"}, &pids, &err);
  ASSERT_FALSE(pids.empty());
  kill(std::stoi(pids), SIGKILL);
  for (int i = 0; i < 50 && Device("sim-stm32vl").value("health", "") != "bad"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(Fwai({"hw", "release"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "other"}, &out, &err), 1);
  EXPECT_NE(err.find("is bad"), std::string::npos) << err;
  ASSERT_EQ(Fwai({"hw", "test", "sim-stm32vl"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("booted"), std::string::npos) << out;
  EXPECT_EQ(Device("sim-stm32vl").value("health", ""), "good");
  EXPECT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", "other"}, &out, &err), 0) << err;
}

TEST_F(HwTest, AgentToolsUseTheSessionOwnersLease) {
  FakeLlmServer fake;
  fake.Start();
  d_ = std::make_unique<Daemon>(&fake);
  ASSERT_TRUE(d_->Start()) << d_->log();
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", elf}, &out, &err), 0) << err;

  FakeReply calls;
  calls.tool_calls = {{"c1", "serialSendCommand", {{"command", "ping"}, {"wait_for", "^pong"}}},
                      {"c2", "gdb", {{"commands", {"print counter", "bt"}}}},
                      {"c3", "serialReadHistory", {{"lines", 50}, {"filter", "booted"}}},
                      {"c4", "serialMonitor", {{"seconds", 10}, {"until", "^version"}}}};
  fake.Enqueue(calls);
  FakeReply done;
  done.chunks = {"all good"};
  fake.Enqueue(done);
  auto session = d_->CreateSession();
  // Something for serialMonitor to see while it watches.
  std::thread poke([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::string o, e;
    Fwai({"monitor", "--send", "version", "--until", "^version", "--timeout", "5"}, &o, &e);
  });
  auto turn = RunChat(*d_->sessions(), session.id(), "check the board", 60);
  poke.join();
  ASSERT_TRUE(turn.finished) << d_->log();
  std::map<std::string, const fwai::v1::ToolCallFinished*> results;
  for (const auto& ev : turn.events) {
    if (ev.has_tool_call_finished())
      results[ev.tool_call_finished().call_id()] = &ev.tool_call_finished();
  }
  ASSERT_EQ(results.size(), 4u);
  EXPECT_FALSE(results["c1"]->is_error()) << results["c1"]->output();
  EXPECT_NE(results["c1"]->output().find("pong"), std::string::npos) << results["c1"]->output();
  EXPECT_FALSE(results["c2"]->is_error()) << results["c2"]->output();
  EXPECT_NE(results["c2"]->output().find("counter = "), std::string::npos)
      << results["c2"]->output();
  EXPECT_NE(results["c2"]->output().find("in main"), std::string::npos) << results["c2"]->output();
  EXPECT_NE(results["c3"]->output().find("stm32vl-blinky 1.0.0 booted"), std::string::npos)
      << results["c3"]->output();
  EXPECT_FALSE(results["c4"]->is_error()) << results["c4"]->output();
  EXPECT_NE(results["c4"]->output().find("version 1.0.0"), std::string::npos)
      << results["c4"]->output();

  // Without the lease, writes and debugging are refused to the model in words.
  ASSERT_EQ(Fwai({"hw", "release"}, &out, &err), 0) << err;
  FakeReply again;
  again.tool_calls = {{"c5", "serialSendCommand", {{"command", "led on"}}},
                      {"c6", "gdb", {{"commands", {"reset"}}}}};
  fake.Enqueue(again);
  fake.Enqueue(done);
  turn = RunChat(*d_->sessions(), session.id(), "turn the led on", 60);
  ASSERT_TRUE(turn.finished);
  results.clear();
  for (const auto& ev : turn.events) {
    if (ev.has_tool_call_finished())
      results[ev.tool_call_finished().call_id()] = &ev.tool_call_finished();
  }
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results["c5"]->is_error());
  EXPECT_NE(results["c5"]->output().find("needs the lease"), std::string::npos)
      << results["c5"]->output();
  EXPECT_TRUE(results["c6"]->is_error());
  EXPECT_NE(results["c6"]->output().find("not leased"), std::string::npos)
      << results["c6"]->output();

  // Every turn and the flash left a record in the evidence log, which verifies,
  // also after a restart (a checkpoint is signed at shutdown).
  ASSERT_EQ(Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0) << err;
  int flashes = 0, turns = 0;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = json::parse(line);
    const auto& rec = j["record"];
    if (rec["kind"] == "flash") {
      ++flashes;
      EXPECT_EQ(rec["image_sha256"].get<std::string>().size(), 64u);
      EXPECT_TRUE(rec["booted"].get<bool>());
    }
    if (rec["kind"] == "agent_turn") {
      ++turns;
      EXPECT_EQ(rec["session_id"], session.id());
      EXPECT_FALSE(rec["tools"].empty());
    }
  }
  EXPECT_EQ(flashes, 1);
  EXPECT_EQ(turns, 2);
  const int records = static_cast<int>(std::count(out.begin(), out.end(), '\n'));
  EXPECT_GE(records, 3);  // and the lease changes, which are recorded too
  ASSERT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("evidence verified: " + std::to_string(records) + " records"),
            std::string::npos)
      << out;
  ASSERT_EQ(Fwai({"evidence", "export", "--format", "csv"}, &out, &err), 0) << err;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), records + 1);  // header + the records
  EXPECT_EQ(d_->Stop(), 0);
  ASSERT_TRUE(d_->Start());
  ASSERT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("1 signed checkpoints"), std::string::npos) << out;
  EXPECT_EQ(Fwai({"evidence", "export", "--format", "pdf"}, &out, &err), 2);  // CLI11 refuses it
}

TEST_F(HwTest, PhysicalBoardFlashesThroughItsCommandTemplate) {
  int master = -1, slave = -1;
  char name[128];
  termios raw{};
  cfmakeraw(&raw);
  ASSERT_EQ(openpty(&master, &slave, name, &raw, nullptr), 0);
  fcntl(master, F_SETFD, FD_CLOEXEC);
  fcntl(slave, F_SETFD, FD_CLOEXEC);
  const std::string outdir = MakeTempDir("fwai-flashcmd-");
  StartDaemon(
      std::string("hardware:\n  boards:\n") + "    - id: bench\n      serial: " + name +
      "\n      machine: \"\"\n      target: stm32f100rb\n      boot_pattern: \"^APP READY\"\n" +
      "      flash_command: \"cp {bin} " + outdir + "/flashed.bin && echo {port} > " + outdir +
      "/port\"\n");
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "bench"}, &out, &err), 0) << err << d_->log();
  // The "board" boots when the flash command has run: the test plays it.
  std::thread board([&] {
    for (int i = 0; i < 100 && !fs::exists(outdir + "/port"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string banner = "APP READY v1\r\n";
    EXPECT_EQ(write(master, banner.data(), banner.size()), static_cast<ssize_t>(banner.size()));
  });
  int rc = Fwai({"flash", "--yes", "bench", elf}, &out, &err);
  board.join();
  ASSERT_EQ(rc, 0) << out << err;
  EXPECT_NE(out.find("booted: APP READY v1"), std::string::npos) << out;
  std::string port;
  std::ifstream(outdir + "/port") >> port;
  EXPECT_EQ(port, name);
  // {bin} is the raw image: its size is the image's loadable bytes.
  EXPECT_EQ(fs::file_size(outdir + "/flashed.bin"), fs::file_size(project_ + "/build/blinky.bin"));
  close(slave);
  close(master);
}

TEST_F(HwTest, SecondSimulatedBoardProbeBoardWithPowerAndOpenOcd) {
  const std::string tmp = MakeTempDir("fwai-hwcfg-");
  // A fixture sysfs with an ST-Link V2-1.
  const fs::path stl = fs::path(tmp) / "sys/devices/usb1/1-2";
  fs::create_directories(stl);
  std::ofstream(stl / "idVendor") << "0483\n";
  std::ofstream(stl / "idProduct") << "374b\n";
  std::ofstream(stl / "serial") << "0671FF383133\n";
  std::ofstream(stl / "manufacturer") << "STMicroelectronics\n";
  fs::create_directories(fs::path(tmp) / "sys/bus/usb/devices");
  fs::create_directory_symlink(stl, fs::path(tmp) / "sys/bus/usb/devices/1-2");
  fs::create_directories(fs::path(tmp) / "dev");
  // OpenOCD stand-in that records how it was called.
  fs::create_directories(fs::path(tmp) / "bin");
  std::ofstream(fs::path(tmp) / "bin/openocd")
      << "#!/bin/sh\nprintf '%s|' \"$@\" > " << tmp << "/openocd.args\nexit 0\n";
  fs::permissions(fs::path(tmp) / "bin/openocd", fs::perms::owner_all);
  const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", (tmp + "/bin:" + old_path).c_str(), 1);
  StartDaemon("hardware:\n  sysfs_root: " + tmp + "/sys\n  dev_root: " + tmp + "/dev\n  boards:\n" +
              "    - {id: lm3s, kind: simulated, machine: lm3s6965evb, boot_pattern: booted, "
              "rtt: off}\n" +
              "    - id: f1-bench\n      probe: 0671FF383133\n      target: stm32f100rb\n" +
              "      openocd_config: [interface/stlink.cfg, target/stm32f1x.cfg]\n" +
              "      power_on: \"echo on >> " + tmp + "/power\"\n      power_off: \"echo off >> " +
              tmp + "/power\"\n");
  setenv("PATH", old_path.c_str(), 1);
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("probe:0671FF383133"), std::string::npos) << out;
  EXPECT_NE(out.find("ST-Link V2-1"), std::string::npos) << out;
  json probe = Device("probe:0671FF383133");
  EXPECT_EQ(probe.value("vid_pid", ""), "0483:374b");
  EXPECT_NE(probe.dump().find("f1-bench"), std::string::npos) << probe.dump();

  // The LM3S6965 board runs its own example.
  const std::string hello_dir = d_->dir() + "/hello";
  fs::copy(std::string(BLINKY_SRC_DIR) + "/../lm3s6965-hello", hello_dir,
           fs::copy_options::recursive);
  fs::remove_all(hello_dir + "/build");
  ASSERT_EQ(RunCommand({"/usr/bin/make", "-s", "-C", hello_dir}, &out, &err, {}, 120), 0) << err;
  const std::string blinky = BuildExample();
  ASSERT_EQ(Fwai({"hw", "lease", "lm3s"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"flash", "--yes", "lm3s", blinky}, &out, &err), 33);  // an STM32 image: config
  EXPECT_NE(err.find("flash guard ("), std::string::npos) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "lm3s", hello_dir + "/build/hello.elf"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("lm3s6965-hello 1.0.0 booted"), std::string::npos) << out;
  ASSERT_EQ(
      Fwai({"monitor", "lm3s", "--send", "ping", "--until", "^pong", "--timeout", "5"}, &out, &err),
      0)
      << err;
  // Its RTT is configured off: asked for, it says so.
  EXPECT_NE(Fwai({"monitor", "lm3s", "--rtt", "--timeout", "5"}, &out, &err), 0);
  EXPECT_NE(err.find("RTT is off (rtt: off in its configuration)"), std::string::npos) << err;
  ASSERT_EQ(Fwai({"hw", "release", "lm3s"}, &out, &err), 0) << err;

  // The probe board: powered on lease, flashed through OpenOCD, off on release.
  ASSERT_EQ(Fwai({"hw", "lease", "f1-bench"}, &out, &err), 0) << err;
  std::string power;
  std::getline(std::ifstream(tmp + "/power"), power);
  EXPECT_EQ(power, "on");
  ASSERT_EQ(Fwai({"flash", "--yes", "f1-bench", blinky}, &out, &err), 0) << err;
  std::string args;
  std::getline(std::ifstream(tmp + "/openocd.args"), args);
  // OpenOCD programs fwaid's own copy of the image, read as the caller.
  const std::string copy = d_->data_dir() + "/run/images/f1-bench.elf";
  EXPECT_EQ(
      args,
      "-f|interface/stlink.cfg|-f|target/stm32f1x.cfg|-c|adapter serial 0671FF383133|-c|program " +
          copy + " verify reset exit|");
  EXPECT_EQ(ReadFile(copy), ReadFile(blinky)) << "the flashed copy is not the image";
  ASSERT_EQ(Fwai({"hw", "release", "f1-bench"}, &out, &err), 0) << err;
  std::ifstream pf(tmp + "/power");
  std::string l1, l2;
  std::getline(pf, l1);
  std::getline(pf, l2);
  EXPECT_EQ(l2, "off");
  fs::remove_all(tmp);
}

// Whose failure a flash was, said by its exit code and words: a boot pattern
// that never came is the firmware's (30), the simulator killed while the
// board boots the lab's (31), a guard refusal the request's (33). Three lab
// failures in a row quarantine the board, across a restart, until an admin
// returns it.
TEST_F(HwTest, FlashVerdictsTellTheLabFromTheFirmwareAndQuarantineABadBoard) {
  const std::string tmp = MakeTempDir("fwai-verdict-");
  // The bench's broken simulator: it dies as it starts.
  fs::create_directories(tmp + "/bin");
  std::ofstream(tmp + "/bin/qemu-dead")
      << "#!/bin/sh\necho 'qemu-system-arm: cannot set up guest memory' >&2\nexit 1\n";
  fs::permissions(tmp + "/bin/qemu-dead", fs::perms::owner_all);
  StartDaemon(
      "hardware:\n  quarantine_after: 3\n  boards:\n"
      "    - {id: sim-fw, kind: simulated, machine: stm32vldiscovery, boot_pattern: 'never "
      "printed', boot_timeout_s: 2}\n"
      "    - {id: sim-kill, kind: simulated, machine: stm32vldiscovery, boot_pattern: 'never "
      "printed', boot_timeout_s: 600}\n"
      "    - {id: sim-dead, kind: simulated, machine: stm32vldiscovery, tags: [dead], qemu: " +
      tmp + "/bin/qemu-dead}\n");
  const std::string blinky = BuildExample();
  std::string out, err;
  for (const char* b : {"sim-fw", "sim-kill", "sim-dead"})
    ASSERT_EQ(Fwai({"hw", "lease", b}, &out, &err), 0) << err;

  // The firmware never says it booted: the firmware's failure.
  EXPECT_EQ(Fwai({"flash", "--yes", "sim-fw", blinky}, &out, &err), 30) << err;
  EXPECT_NE(err.find("verdict firmware"), std::string::npos) << err;
  EXPECT_NE(err.find("did not appear on the serial port within 2 s"), std::string::npos) << err;
  // An image that is not there: the request's.
  EXPECT_EQ(Fwai({"--json", "flash", "--yes", "sim-fw", tmp + "/missing.elf"}, &out, &err), 33)
      << err;
  EXPECT_EQ(json::parse(out.substr(0, out.find('\n')), nullptr, false).value("verdict", ""),
            "config")
      << out;

  // The simulator killed while the board boots: the lab's, at once.
  const pid_t flash = Spawn({"flash", "--yes", "sim-kill", blinky});
  int qemu = 0;
  for (int i = 0; i < 600 && qemu <= 0; ++i) {
    qemu = Device("sim-kill").value("pid", 0);
    if (qemu <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(qemu, 0) << "sim-kill's simulator never started";
  ASSERT_EQ(kill(qemu, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(flash, &status, 0), flash);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 31) << d_->log();
  EXPECT_EQ(Device("sim-kill").value("health", ""), "bad");

  // A broken bench, flashed three times: quarantined, and recorded so.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Fwai({"flash", "--yes", "sim-dead", blinky}, &out, &err), 31) << err;
    EXPECT_NE(err.find("verdict lab"), std::string::npos) << err;
  }
  json dead = Device("sim-dead");
  EXPECT_EQ(dead.value("health", ""), "quarantined");
  EXPECT_NE(dead.value("health_reason", "").find("3 lab failures in a row"), std::string::npos)
      << dead.dump();
  auto quarantined = RecordsOf("board_quarantined");
  ASSERT_EQ(quarantined.size(), 1u);
  EXPECT_EQ(quarantined[0].value("board", ""), "sim-dead");
  EXPECT_EQ(quarantined[0]["failures"].size(), 3u);
  // sim-fw failed only by its firmware, sim-kill once by the lab: neither is quarantined.
  EXPECT_EQ(Device("sim-fw").value("health", ""), "good");
  // Released, it is not handed out again, by tag or by name, across a restart.
  ASSERT_EQ(Fwai({"hw", "release", "sim-dead"}, &out, &err), 0) << err;
  ASSERT_EQ(d_->Stop(), 0);
  ASSERT_TRUE(d_->Start()) << d_->log();
  EXPECT_EQ(Device("sim-dead").value("health", ""), "quarantined");
  EXPECT_NE(Fwai({"hw", "lease", "--tag", "dead"}, &out, &err), 0);
  EXPECT_NE(err.find("sim-dead is quarantined"), std::string::npos) << err;
  EXPECT_NE(Fwai({"hw", "test", "sim-dead"}, &out, &err), 0);
  EXPECT_NE(err.find("is quarantined"), std::string::npos) << err;
  // The admin (here: fwaid's own user) returns it.
  ASSERT_EQ(Fwai({"hw", "health", "sim-dead", "good", "--reason", "simulator fixed"}, &out, &err),
            0)
      << err;
  EXPECT_EQ(Device("sim-dead").value("health", ""), "good");
  auto returned = RecordsOf("board_health");
  ASSERT_EQ(returned.size(), 1u);
  EXPECT_EQ(returned[0].value("health", ""), "good");
  EXPECT_EQ(returned[0].value("reason", ""), "simulator fixed");
  ASSERT_EQ(Fwai({"hw", "lease", "--tag", "dead"}, &out, &err), 0) << err;
  fs::remove_all(tmp);
}

// A fault captured on the board decodes later with no board and no fwaid:
// the same fault and line as the live decode, the backtrace with its locals,
// the serial lines before it; tied to the image by its SHA-256. A capture cut
// short, a file of another kind, or a capture whose image is not at hand is
// refused saying what is wrong (the last: which SHA-256 it needs).
TEST_F(HwTest, AFaultCaptureDecodesOfflineToItsLineAfterFwaidStops) {
  StartDaemon();
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"monitor", "--send", "fault", "--until", "FAULT", "--timeout", "5"}, &out, &err),
            0)
      << err;
  ASSERT_EQ(Fwai({"--json", "debug", "fault"}, &out, &err), 0) << err;
  const std::string live = json::parse(out)["fault"].value("location", "");
  ASSERT_NE(live.find("trigger_fault at "), std::string::npos) << out;
  ASSERT_NE(live.find("main.c:"), std::string::npos) << out;
  const std::string capture = project_ + "/fault.fwcap";
  ASSERT_EQ(Fwai({"debug", "sim-stm32vl", "fault", "--save", capture}, &out, &err), 0) << err;
  EXPECT_NE(out.find("saved the capture to " + capture), std::string::npos) << out;
  EXPECT_EQ(fs::status(capture).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // Its record names the image by the hash the flash record gave it.
  auto captured = RecordsOf("fault_capture");
  auto flashed = RecordsOf("flash");
  ASSERT_EQ(captured.size(), 1u) << captured.back().dump();
  ASSERT_FALSE(flashed.empty());
  EXPECT_EQ(captured[0].value("image_sha256", ""), flashed.back().value("image_sha256", ""));
  ASSERT_EQ(RunCommand({"/usr/bin/sha256sum", capture}, &out, &err), 0) << err;
  EXPECT_EQ(captured[0].value("capture_sha256", ""), out.substr(0, 64));
  ASSERT_EQ(d_->Stop(), 0);

  // Decoded with fwaid gone, the image given: the live decode's fault and line.
  ASSERT_EQ(Fwai({"fault", "decode", capture, "--image", elf}, &out, &err), 0) << err;
  EXPECT_NE(out.find("HardFault"), std::string::npos) << out;
  EXPECT_NE(out.find("in " + live), std::string::npos) << out;
  EXPECT_NE(out.find("precise data bus error"), std::string::npos) << out;
  EXPECT_NE(out.find("0x3ffffff0"), std::string::npos) << out;
  EXPECT_NE(out.find("FAULT"), std::string::npos) << "the serial lines before it\n" << out;
  ASSERT_EQ(Fwai({"--json", "fault", "decode", capture, "--image", elf}, &out, &err), 0) << err;
  json decoded = json::parse(out);
  bool in_trigger = false, in_main = false;
  for (const auto& f : decoded["frames"]) {
    if (f.value("func", "") == "trigger_fault") {
      in_trigger = true;
      EXPECT_EQ(live, "trigger_fault at " + f.value("file", "") + ":" + f.value("line", ""));
      ASSERT_FALSE(f["locals"].empty()) << f.dump();
      EXPECT_EQ(f["locals"][0].value("name", ""), "bad");
      EXPECT_EQ(f["locals"][0].value("value", "").find("0x3ffffff0"), 0u) << f.dump();
    }
    in_main |= f.value("func", "") == "main";
  }
  EXPECT_TRUE(in_trigger) << out;
  EXPECT_TRUE(in_main) << "the backtrace reaches main\n" << out;

  // Bad input: cut short, another kind of file, another image.
  const std::string text = ReadFile(capture);
  const std::string cut = project_ + "/cut.fwcap";
  std::ofstream(cut) << text.substr(0, text.size() / 2);
  EXPECT_EQ(Fwai({"fault", "decode", cut, "--image", elf}, &out, &err), 1);
  EXPECT_NE(err.find(cut + " is not a fault capture: it is cut short"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"fault", "decode", elf}, &out, &err), 1);
  EXPECT_NE(err.find("is not a fault capture: it is not JSON"), std::string::npos) << err;
  const std::string other = project_ + "/other.json";
  std::ofstream(other) << R"({"format": "something-else", "version": 1})";
  EXPECT_EQ(Fwai({"fault", "decode", other}, &out, &err), 1);
  EXPECT_NE(err.find("its format is 'something-else'"), std::string::npos) << err;
  const std::string sha = captured[0].value("image_sha256", "");
  const std::string changed = project_ + "/changed.elf";
  std::ofstream(changed, std::ios::binary) << ReadFile(elf) << "x";
  EXPECT_EQ(Fwai({"fault", "decode", capture, "--image", changed}, &out, &err), 1);
  EXPECT_NE(err.find("needs the image with sha256 " + sha), std::string::npos) << err;
  // Without --image it finds fwaid's copy; once that is gone it says which it needs.
  ASSERT_EQ(Fwai({"fault", "decode", capture}, &out, &err), 0) << err;
  fs::remove(d_->data_dir() + "/run/images/sim-stm32vl.elf");
  EXPECT_EQ(Fwai({"fault", "decode", capture}, &out, &err), 1);
  EXPECT_NE(err.find("needs the image with sha256 " + sha), std::string::npos) << err;
  EXPECT_NE(err.find("--image"), std::string::npos) << err;
}

// A watch on a held board: the HardFault banner fires it, the capture it
// takes is kept in the project and decodes offline after fwaid restarts to
// the fault's line; a pattern RE2 refuses is said before anything runs.
TEST_F(HwTest, AWatchCapturesAHardFaultThatDecodesOfflineAfterARestart) {
  StartDaemon();
  const std::string elf = BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"--project", project_, "watch", "add", "--name", "bad", "--pattern", "a(b"}, &out,
                 &err),
            2);
  EXPECT_NE(err.find("fwai watch add: pattern: 'a(b' is not a pattern fwai runs: missing )"),
            std::string::npos)
      << err;
  ASSERT_EQ(Fwai({"--project", project_, "watch", "add", "--name", "hardfault", "--pattern",
                  "^FAULT", "--capture"},
                 &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("watching sim-stm32vl  hardfault"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"monitor", "--send", "fault", "--until", "FAULT", "--timeout", "5"}, &out, &err),
            0)
      << err;
  std::vector<json> fired;
  for (int i = 0; i < 600 && fired.empty(); ++i) {
    fired = RecordsOf("watch_fired");
    if (fired.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(fired.size(), 1u) << d_->log();
  EXPECT_EQ(fired[0].value("rule", ""), "hardfault");
  EXPECT_EQ(fired[0]["line"].get<std::string>().rfind("FAULT", 0), 0u);
  const std::string rel = fired[0]["capture"].value("path", "");
  ASSERT_EQ(rel.rfind(".fwai/captures/sim-stm32vl-", 0), 0u) << fired[0].dump();
  EXPECT_NE(fired[0]["capture"].value("fault", "").find("trigger_fault at "), std::string::npos);
  ASSERT_EQ(Fwai({"watch", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("fired 1"), std::string::npos) << out;
  ASSERT_EQ(d_->Stop(), 0);
  ASSERT_TRUE(d_->Start()) << d_->log();
  ASSERT_EQ(Fwai({"fault", "decode", project_ + "/" + rel, "--image", elf}, &out, &err), 0) << err;
  EXPECT_TRUE(std::regex_search(out, std::regex("in trigger_fault at src/main\\.c:\\d+"))) << out;
}

// A watch that wakes a session: its turn starts from the evidence (the
// matched line and the capture's decode), not from a paraphrase. Its notice
// reaches the board's reader (`fwai monitor` says it) and the session the
// lease is bound to (an event in its history).
TEST_F(HwTest, AWatchWakesItsOwnersSessionWithTheCaptureAndNotifiesItsReaders) {
  FakeLlmServer fake;
  fake.Start();
  d_ = std::make_unique<Daemon>(&fake);
  ASSERT_TRUE(d_->Start()) << d_->log();
  const std::string elf = BuildExample();
  auto session = d_->CreateSession();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", session.id()}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << err;
  FakeReply done;
  done.chunks = {"looking at the fault"};
  fake.Enqueue(done);
  ASSERT_EQ(Fwai({"--project", project_, "watch", "add", "--name", "hardfault", "--pattern",
                  "^FAULT", "--capture", "--wake", session.id()},
                 &out, &err),
            0)
      << err;
  // The holder's reader sends the command that faults and reads on: it is
  // open when the banner comes, and ends when the lease does.
  int mon_rc = -1;
  std::string mon_out, mon_err;
  std::thread mon([&] {
    mon_rc = Fwai({"monitor", "--send", "fault", "--timeout", "60"}, &mon_out, &mon_err);
  });
  std::vector<json> fired;
  for (int i = 0; i < 600 && fired.empty(); ++i) {
    fired = RecordsOf("watch_fired");
    if (fired.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int i = 0; i < 600 && fake.request_count() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(Fwai({"hw", "release"}, &out, &err), 0) << err;
  mon.join();
  ASSERT_EQ(fired.size(), 1u) << d_->log();
  EXPECT_TRUE(fired[0]["wake"].value("ok", false)) << fired[0].dump();
  EXPECT_EQ(fired[0]["notified"], json({{"readers", 1}, {"sessions", 1}})) << fired[0].dump();
  // The capture was taken (its error, and fwaid's log, say why if not).
  EXPECT_TRUE(fired[0].contains("capture")) << fired[0].dump() << "\n" << d_->log();
  ASSERT_EQ(fake.request_count(), 1u) << d_->log();
  const std::string asked = fake.requests()[0].body.dump();
  EXPECT_NE(asked.find("watch 'hardfault' fired on sim-stm32vl: FAULT"), std::string::npos)
      << asked;
  EXPECT_TRUE(std::regex_search(asked, std::regex("in trigger_fault at src/main\\.c:\\d+")))
      << asked;
  EXPECT_NE(asked.find("precise data bus error"), std::string::npos) << asked;
  // The monitor: the banner on stdout, fwaid's notice on stderr.
  EXPECT_NE(mon_out.find("FAULT"), std::string::npos) << mon_out;
  EXPECT_EQ(mon_out.find("fired"), std::string::npos) << mon_out;
  EXPECT_NE(mon_err.find("fwai: watch 'hardfault' fired on sim-stm32vl: FAULT"), std::string::npos)
      << mon_err;
  // The session: the notice is an event of its own.
  ASSERT_EQ(Fwai({"attach", session.id(), "--no-follow"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("[sim-stm32vl] watch 'hardfault' fired on sim-stm32vl: FAULT"),
            std::string::npos)
      << out;
}

// A session whose turn edits the firmware with bash and builds it (a
// checkpoint before the turn, another before the build), its
// board then flashed with the new image, rewound to before that turn: the
// files as they were, the board running the image it ran (its sha256 read
// back from fwaid), the rewind in the session's events and undoable. A
// rewind the caller cannot finish (the board not theirs) changes nothing.
TEST_F(HwTest, ARewindRestoresTheFilesAndTheBoardsImage) {
  FakeLlmServer fake;
  fake.Start();
  d_ = std::make_unique<Daemon>(&fake);
  ASSERT_TRUE(d_->Start()) << d_->log();
  const std::string elf = BuildExample();
  fwai::v1::Session session;
  {
    grpc::ClientContext ctx;
    fwai::v1::CreateSessionRequest req;
    req.set_project_root(project_);
    ASSERT_TRUE(d_->sessions()->Create(&ctx, req, &session).ok());
  }
  const std::string id = session.id();
  std::string out, err;
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", id}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << err;
  const std::string src_then = ReadFile(project_ + "/src/main.c");
  const std::string elf_then = ReadFile(elf);
  const std::string sha_then = Device("sim-stm32vl").value("image_sha256", "");
  ASSERT_EQ(sha_then.size(), 64u);
  FakeReply edit;
  edit.tool_calls = {{"b1", "bash", {{"command", "sed -i 's/booted/rebooted/' src/main.c"}}}};
  fake.Enqueue(edit);
  FakeReply build;
  build.tool_calls = {{"b2", "build", json::object()}};
  fake.Enqueue(build);
  FakeReply done;
  done.chunks = {"edited and built"};
  fake.Enqueue(done);
  ASSERT_TRUE(RunChat(*d_->sessions(), id, "say rebooted at boot", 120).finished) << d_->log();
  ASSERT_NE(ReadFile(project_ + "/src/main.c").find("rebooted"), std::string::npos)
      << fake.requests().back().body.dump();
  ASSERT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", elf}, &out, &err), 0) << err;
  const std::string sha_now = Device("sim-stm32vl").value("image_sha256", "");
  ASSERT_NE(sha_now, sha_then);
  // What it would do, first: nothing changes.
  ASSERT_EQ(Fwai({"rewind", id, "--list"}, &out, &err), 0) << err;
  EXPECT_EQ(out.rfind("1  ", 0), 0u) << out;
  EXPECT_NE(out.find("before turn "), std::string::npos) << out;
  EXPECT_NE(out.find("boards sim-stm32vl=" + sha_then.substr(0, 12)), std::string::npos) << out;
  EXPECT_NE(out.find("\n2  "), std::string::npos) << out;
  EXPECT_NE(out.find("before skill build"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"rewind", id, "--to", "1", "--dry-run"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("restore  src/main.c"), std::string::npos) << out;
  EXPECT_NE(out.find("restore  build/blinky.elf"), std::string::npos) << out;
  EXPECT_NE(
      out.find("flash  sim-stm32vl  " + sha_now.substr(0, 12) + " -> " + sha_then.substr(0, 12)),
      std::string::npos)
      << out;
  EXPECT_NE(ReadFile(project_ + "/src/main.c").find("rebooted"), std::string::npos);
  // Without the board: refused, nothing changed.
  ASSERT_EQ(Fwai({"hw", "release"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"rewind", id, "--to", "1", "--yes"}, &out, &err), 1);
  EXPECT_NE(err.find("board sim-stm32vl: "), std::string::npos) << err;
  EXPECT_NE(err.find("nothing was changed"), std::string::npos) << err;
  EXPECT_NE(ReadFile(project_ + "/src/main.c").find("rebooted"), std::string::npos);
  // Held again: rewound.
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl", "--session", id}, &out, &err), 0) << err;
  ASSERT_EQ(Fwai({"rewind", id, "--to", "1", "--yes", "--conversation"}, &out, &err), 0)
      << err << "\n"
      << d_->log();
  EXPECT_NE(out.find("1 boards flashed"), std::string::npos) << out;
  EXPECT_EQ(ReadFile(project_ + "/src/main.c"), src_then);
  EXPECT_EQ(ReadFile(elf), elf_then);
  EXPECT_EQ(Device("sim-stm32vl").value("image_sha256", ""), sha_then);
  ASSERT_EQ(Fwai({"attach", id, "--no-follow"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("[rewound to checkpoint 1"), std::string::npos) << out;
  {
    grpc::ClientContext ctx;
    fwai::v1::HistoryRequest req;
    req.set_session_id(id);
    fwai::v1::HistoryResponse h;
    ASSERT_TRUE(d_->sessions()->History(&ctx, req, &h).ok());
    EXPECT_EQ(h.messages_size(), 0) << "the conversation is cut back to before the turn";
  }
  // The files as the rewind found them were kept: undone.
  ASSERT_EQ(Fwai({"rewind", id, "--list"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("\n3  "), std::string::npos) << out;
  EXPECT_NE(out.find("before rewind"), std::string::npos) << out;
  ASSERT_EQ(Fwai({"rewind", id, "--to", "3", "--files", "--yes"}, &out, &err), 0) << err;
  EXPECT_NE(ReadFile(project_ + "/src/main.c").find("rebooted"), std::string::npos);
}

TEST_F(HwTest, InitDetectsTheExampleAndDoctorChecksTheMachine) {
  StartDaemon();
  BuildExample();
  std::string out, err;
  ASSERT_EQ(Fwai({"init", "--yes", "--embedder-md", project_}, &out, &err), 0) << err;
  std::ifstream in(project_ + "/.fwai/project.yaml");
  std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(yaml.find("build_system: make"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("target: stm32f100rb"), std::string::npos) << yaml;
  EXPECT_TRUE(fs::exists(project_ + "/EMBEDDER.md"));
  EXPECT_EQ(Fwai({"init", "--yes", project_}, &out, &err), 1);  // not overwritten without --force
  EXPECT_NE(err.find("--force"), std::string::npos) << err;
  ASSERT_EQ(
      Fwai({"init", "--yes", "--force", "--set", "board=stm32vldiscovery", project_}, &out, &err),
      0)
      << err;
  EXPECT_NE(out.find("board: stm32vldiscovery"), std::string::npos) << out;
  // Undetectable fields without a terminal: a clear error naming them.
  const std::string empty = d_->dir() + "/empty";
  fs::create_directories(empty);
  EXPECT_EQ(Fwai({"init", empty}, &out, &err), 1);
  EXPECT_NE(err.find("could not detect"), std::string::npos) << err;
  // Doctor: the toolchains of this machine, devices, the project config.
  Fwai({"--json", "doctor", project_}, &out, &err);
  std::map<std::string, json> checks;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object()) checks[j.value("name", "")] = j;
  }
  for (const char* name :
       {"daemon", "devices", "arm-none-eabi-gcc", "gdb", "qemu-system-arm", "project config"}) {
    ASSERT_TRUE(checks.count(name)) << name << "\n" << out;
    EXPECT_TRUE(checks[name].value("ok", false)) << name << ": " << checks[name].dump();
  }
  EXPECT_FALSE(checks["providers"].value("ok", true));  // no key here
  EXPECT_NE(checks["providers"].value("fix", "").find("ANTHROPIC_API_KEY"), std::string::npos);
  std::ofstream(project_ + "/.fwai/project.yaml") << "name: x\nserial:\n  baud: fast\n";
  Fwai({"doctor", project_}, &out, &err);
  EXPECT_NE(out.find("project.yaml:3"), std::string::npos) << out;
}

TEST_F(HwTest, MissingAndBusyPortsAreReportedNotFatal) {
  int master = -1, slave = -1;
  char name[128];
  ASSERT_EQ(openpty(&master, &slave, name, nullptr, nullptr), 0);
  int other = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  ASSERT_EQ(flock(other, LOCK_EX | LOCK_NB), 0);  // another program holds it
  StartDaemon(std::string("hardware:\n  boards:\n") +
              "    - {id: gone, serial: /dev/fwai-test-no-such-port, baud: 115200}\n" +
              "    - {id: busy, serial: " + name + "}\n");
  json gone = Device("gone"), busy = Device("busy");
  EXPECT_EQ(gone.value("health", ""), "bad");
  EXPECT_NE(gone.value("health_reason", "").find("no such device"), std::string::npos)
      << gone.dump();
  EXPECT_EQ(busy.value("health", ""), "bad");
  EXPECT_NE(busy.value("health_reason", "").find("in use by another program"), std::string::npos)
      << busy.dump();
  std::string out, err;
  EXPECT_EQ(Fwai({"hw", "lease", "gone"}, &out, &err), 1);
  EXPECT_NE(err.find("not handed out"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"hw", "lease", "nosuchboard"}, &out, &err), 1);
  EXPECT_NE(err.find("no board or device 'nosuchboard'"), std::string::npos) << err;
  // The other program lets go: the broker picks the port up by itself.
  close(other);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (Device("busy").value("health", "") != "good" &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(Device("busy").value("health", ""), "good") << Device("busy").dump();
  close(slave);
  close(master);
}

}  // namespace
}  // namespace fwai::testing
