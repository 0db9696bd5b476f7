// The daemon's own process-level pieces: the data directory lock.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

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
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "a serving daemon is not waited for";
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another fwaid (pid " + std::to_string(getpid()) + ")"),
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

}  // namespace
}  // namespace fwai
