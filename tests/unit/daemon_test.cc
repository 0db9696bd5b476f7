// The daemon's own process-level pieces: the data directory lock.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "server/daemon/data_dir_lock.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

TEST(DataDirLockTest, ASecondDaemonOnAServingDataDirIsRefusedAtOnce) {
  std::string dir = testing::MakeTempDir("fwai-lock-");
  auto first = DataDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  const auto t0 = std::chrono::steady_clock::now();
  auto second = DataDirLock::Acquire(dir, 60000);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
      << "a serving daemon is not waited for";
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another fwaid (pid " +
                                           std::to_string(getpid()) + ")"),
            std::string::npos)
      << second.status();
  std::filesystem::remove_all(dir);
}

TEST(DataDirLockTest, ADaemonThatIsStoppingIsWaitedFor) {
  std::string dir = testing::MakeTempDir("fwai-lock-");
  std::optional<DataDirLock> first;
  {
    auto l = DataDirLock::Acquire(dir);
    ASSERT_TRUE(l.ok()) << l.status();
    first.emplace(std::move(*l));
  }
  first->MarkStopping();
  std::atomic<bool> released{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    released = true;
    first.reset();  // the old process exits
  });
  auto second = DataDirLock::Acquire(dir, 60000);
  EXPECT_TRUE(released.load()) << "the lock was taken while the other daemon still held it";
  EXPECT_TRUE(second.ok()) << second.status();
  stopper.join();
  std::filesystem::remove_all(dir);
}

TEST(DataDirLockTest, WaitingForAStoppingDaemonHasALimit) {
  std::string dir = testing::MakeTempDir("fwai-lock-");
  auto first = DataDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok());
  first->MarkStopping();
  auto second = DataDirLock::Acquire(dir, 100);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDeadlineExceeded) << second.status();
  EXPECT_NE(second.status().message().find("still stopping"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// A daemon killed while serving (its line still says "running") whose lock
// the kernel has not let go yet: the next one waits, saying so, instead of
// refusing in the name of a dead process.
TEST(DataDirLockTest, ADaemonKilledWhileServingIsWaitedForNotNamedAsRunning) {
  std::string dir = testing::MakeTempDir("fwai-lock-");
  // A process that takes the lock, says it serves, and is killed; its
  // lock's file stays open in a child it left behind (as a kernel still
  // tearing a process down keeps it) until that child is let go.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const std::string path = dir + "/fwaid.lock";
  pid_t holder = fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    // As DataDirLock does, with system calls only (this process has threads).
    int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
    char line[33];
    int n = snprintf(line, sizeof line, "pid %d running", static_cast<int>(getpid()));
    memset(line + n, ' ', sizeof line - 1 - n);
    line[31] = '\n';
    if (pwrite(fd, line, 32, 0) != 32) _exit(1);
    if (fork() == 0) {  // keeps the lock's descriptor until the pipe closes
      char c;
      close(go[1]);
      (void)read(go[0], &c, 1);
      _exit(0);
    }
    _exit(0);  // "running" in the file, and gone
  }
  int rc = 0;
  ASSERT_EQ(waitpid(holder, &rc, 0), holder);
  ASSERT_EQ(WEXITSTATUS(rc), 0);
  close(go[0]);
  std::vector<std::string> said;
  std::atomic<bool> waiting{false};
  std::thread release([&] {
    // Once the waiter has said it waits, the last descriptor goes.
    for (int i = 0; i < 3000 && !waiting; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    close(go[1]);
  });
  auto second = DataDirLock::Acquire(dir, 60000, [&](const std::string& why) {
    said.push_back(why);
    waiting = true;
  });
  release.join();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("fwaid pid " + std::to_string(holder) + ", which held data dir"),
            std::string::npos)
      << said[0];
  EXPECT_NE(said[0].find("has exited; waiting"), std::string::npos) << said[0];
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fwai

#include <set>

#include "server/api/gate.h"

namespace fwai {
namespace {

// An RPC added without a rule would be refused to everyone: the table must
// name every RPC of the API, and nothing else.
TEST(AccessRulesTest, EveryRpcHasExactlyOneRule) {
  EXPECT_TRUE(RpcsWithoutRules().empty()) << RpcsWithoutRules().front();
  std::set<std::string> seen;
  for (const auto& r : RpcRules()) EXPECT_TRUE(seen.insert(r.rpc).second) << r.rpc << " twice";
  EXPECT_GE(seen.size(), 45u);
}

// A session RPC or Chat message added without a session rule would be the
// owner's only; the table must name each once. The rules that keep a
// sharer out of the owner's files, boards and shares are written out: one
// loosened fails here.
TEST(AccessRulesTest, EverySessionActionHasOneRuleAndTheOwnersStayTheOwners) {
  EXPECT_TRUE(SessionActionsWithoutRules().empty()) << SessionActionsWithoutRules().front();
  std::set<std::string> seen;
  for (const auto& r : SessionRules()) {
    EXPECT_TRUE(seen.insert(r.action).second) << r.action << " twice";
  }
  for (const char* owners : {"Sessions.Delete", "Sessions.Rewind", "Sessions.ListCheckpoints",
                             "Sessions.ReadCheckpointFile", "Sessions.Share", "Sessions.Unshare"}) {
    EXPECT_EQ(SessionNeedOf(owners), SessionNeed::kOwner) << owners;
  }
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.message"), SessionNeed::kDrive);
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.cancel"), SessionNeed::kDrive);
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.set_mode"), SessionNeed::kDrive);
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.plan_decision"), SessionNeed::kApprove);
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.answer"), SessionNeed::kAnswer);
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.approval"), SessionNeed::kApprove);
  EXPECT_EQ(SessionNeedOf("Sessions.Attach"), SessionNeed::kWatch);
  // Fails closed: what the table does not name is the owner's.
  EXPECT_EQ(SessionNeedOf("Sessions.Chat.something_new"), SessionNeed::kOwner);
}

}  // namespace
}  // namespace fwai

#include <map>
#include <regex>

namespace fwai {
namespace {

// The security-relevant part of the table, written out: issue 15's
// admin-only operations (tokens, config, board health, shutdown, plugins and
// the tool catalog), the lab nodes' RPCs, and everything that reads project
// files or runs commands as the caller's local account. A rule here that is
// loosened, or changed to another kind, fails; an RPC not listed is left to
// the general checks below.
const std::map<std::string, Need>& PinnedRules() {
  static const std::map<std::string, Need> kPinned = {
      // Admin only.
      {"Daemon.Shutdown", Need::kAdmin},
      {"Daemon.ReloadConfig", Need::kAdmin},
      {"Auth.CreateToken", Need::kAdmin},
      {"Auth.ListTokens", Need::kAdmin},
      {"Auth.RevokeToken", Need::kAdmin},
      {"Hardware.SetHealth", Need::kAdmin},
      {"Hardware.SelfTest", Need::kAdmin},
      {"ToolCatalog.Register", Need::kAdmin},
      {"ToolCatalog.Remove", Need::kAdmin},
      {"Plugins.Install", Need::kAdmin},
      {"Plugins.Remove", Need::kAdmin},
      // Node certificates, and nothing else.
      {"LabNode.Flash", Need::kLabNode},
      {"LabNode.Serial", Need::kLabNode},
      {"LabNode.Debug", Need::kLabNode},
      {"LabNode.Reset", Need::kLabNode},
      // Project files and commands, as the caller's local account. kAdmin is
      // no substitute: an admin from a token may have no local account.
      {"Projects.Init", Need::kLocalAccount},
      {"Projects.GetConfig", Need::kLocalAccount},
      {"Projects.Doctor", Need::kLocalAccount},
      {"Projects.PolicyCheck", Need::kLocalAccount},
      {"Skills.List", Need::kLocalAccount},
      {"Skills.Run", Need::kLocalAccount},
      {"Skills.Resolve", Need::kLocalAccount},
      {"Firmware.Memory", Need::kLocalAccount},
      {"Firmware.Sbom", Need::kLocalAccount},
      {"Ota.Rollout", Need::kLocalAccount},
  };
  return kPinned;
}

// Services whose every RPC, present or future, works on a project's files or
// runs commands, or is a lab node's.
const std::map<std::string, Need>& ServiceFloors() {
  static const std::map<std::string, Need> kFloors = {{"LabNode", Need::kLabNode},
                                                      {"Projects", Need::kLocalAccount},
                                                      {"Skills", Need::kLocalAccount},
                                                      {"Firmware", Need::kLocalAccount}};
  return kFloors;
}

// Names that say an RPC is an admin's business: open to anyone, they are
// flagged, whatever the RPC (a new one included).
const std::regex& SensitiveName() {
  static const std::regex kSensitive("Token|Config|Health|SelfTest|Kick|Shutdown|Reload|Install");
  return kSensitive;
}

const char* NeedName(Need n) {
  switch (n) {
    case Need::kAnyone:
      return "kAnyone";
    case Need::kLocalAccount:
      return "kLocalAccount";
    case Need::kAdmin:
      return "kAdmin";
    case Need::kLabNode:
      return "kLabNode";
  }
  return "?";
}

// Every way `rules` breaks the pins, one line each (empty: none).
std::vector<std::string> Violations(const std::vector<RpcRule>& rules) {
  std::vector<std::string> out;
  std::map<std::string, Need> actual;
  for (const auto& r : rules) actual[r.rpc] = r.need;
  for (const auto& [rpc, need] : PinnedRules()) {
    auto it = actual.find(rpc);
    if (it == actual.end()) {
      out.push_back(rpc + ": pinned as " + NeedName(need) + " but has no rule");
    } else if (it->second != need) {
      out.push_back(rpc + ": pinned as " + NeedName(need) + ", is " + NeedName(it->second));
    }
  }
  for (const auto& [rpc, need] : actual) {
    const std::string service = rpc.substr(0, rpc.find('.'));
    if (auto f = ServiceFloors().find(service); f != ServiceFloors().end() && need != f->second) {
      out.push_back(rpc + ": every " + service + " RPC needs " + NeedName(f->second) + ", is " +
                    NeedName(need));
    }
    if (need == Need::kLabNode && service != "LabNode")
      out.push_back(rpc + ": kLabNode outside the LabNode service");
    if (need == Need::kAnyone && std::regex_search(rpc, SensitiveName())) {
      out.push_back(rpc + ": open to anyone, but its name says it is sensitive");
    }
  }
  return out;
}

std::string JoinLines(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += "  " + l + "\n";
  return s;
}

TEST(AccessRulesTest, SecurityRelevantRulesArePinned) {
  const auto v = Violations(RpcRules());
  EXPECT_TRUE(v.empty()) << "the access table was loosened:\n" << JoinLines(v);
}

// The pins themselves bite: loosened copies of today's table are caught.
TEST(AccessRulesTest, PinsCatchALoosenedOrNewSensitiveRule) {
  auto with = [](const char* rpc, Need need) {
    std::vector<RpcRule> rules = RpcRules();
    bool found = false;
    for (auto& r : rules) {
      if (std::string(r.rpc) == rpc) {
        r.need = need;
        found = true;
      }
    }
    if (!found) rules.push_back({rpc, need});
    return rules;
  };
  EXPECT_FALSE(Violations(with("Auth.CreateToken", Need::kAnyone)).empty());
  EXPECT_FALSE(Violations(with("Hardware.SetHealth", Need::kLocalAccount)).empty());
  EXPECT_FALSE(Violations(with("Skills.Run", Need::kAnyone)).empty());
  EXPECT_FALSE(Violations(with("Projects.Init", Need::kAdmin)).empty());
  EXPECT_FALSE(Violations(with("LabNode.Flash", Need::kAdmin)).empty());
  EXPECT_FALSE(Violations(with("Hardware.Flash", Need::kLabNode)).empty());
  // New RPCs, not in the pinned list.
  EXPECT_FALSE(Violations(with("Hardware.KickLease", Need::kAnyone)).empty());
  EXPECT_FALSE(Violations(with("Daemon.GetConfig", Need::kAnyone)).empty());
  EXPECT_FALSE(Violations(with("Auth.RotateToken", Need::kAnyone)).empty());
  EXPECT_FALSE(Violations(with("Projects.ReadFile", Need::kAnyone)).empty());
  EXPECT_TRUE(Violations(with("Hardware.KickLease", Need::kAdmin)).empty());
  EXPECT_TRUE(Violations(with("Knowledge.Summarize", Need::kAnyone)).empty());
}

}  // namespace
}  // namespace fwai
