// Watches on a board's serial port: a match fires, a boot loop is counted
// in its window, a rule firing too often is held back and says how often,
// and a rule ends with its owner's lease. The board is a physical one on a
// pseudo-terminal; the clock is a ManualClock.

#include "server/boards/watches.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "common/clock.h"
#include "common/config.h"
#include "server/boards/boards.h"
#include "server/boards/local_boards.h"
#include "server/hardware/broker.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class WatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fwai-watches-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    char name[128];
    ASSERT_EQ(openpty(&master_, &slave_, name, nullptr, nullptr), 0);
    HardwareConfig hw;
    hw.default_simulated_board = false;
    BoardConfig b;
    b.id = "bench";
    b.serial = name;
    hw.boards.push_back(b);
    auto db = Storage::Open((dir_ / "db").string());
    ASSERT_TRUE(db.ok());
    db_ = std::move(*db);
    broker_ = std::make_unique<HardwareBroker>(hw, *db_, (dir_ / "run").string());
    ASSERT_TRUE(broker_->Start().ok());
    local_ = std::make_unique<LocalBoards>(*broker_);
    boards_ = std::make_unique<Boards>(*local_, nullptr, "");
    alice_.identity = "uid:1000";
    alice_.display = "alice (uid 1000)";
    alice_.uid = 1000;
    bob_.identity = "uid:1001";
    bob_.display = "bob (uid 1001)";
    Watches::Hooks hooks;
    hooks.record = [this](const json& r) {
      std::lock_guard lock(mu_);
      records_.push_back(r);
      cv_.notify_all();
    };
    hooks.notify = [this](const std::string& board, const std::string& rule,
                          const std::string& text) {
      std::lock_guard lock(mu_);
      notices_.push_back(board + " " + rule + ": " + text);
      return 1;
    };
    watches_ = std::make_unique<Watches>(*boards_, hooks, &clock_);
  }
  void TearDown() override {
    watches_.reset();
    boards_.reset();
    local_.reset();
    broker_.reset();
    db_.reset();
    close(master_);
    close(slave_);
    fs::remove_all(dir_);
  }
  void Lease(const Caller& c) {
    auto l = broker_->Acquire(c, "bench", {}, 600, 0, [] { return false; });
    ASSERT_TRUE(l.ok()) << l.status();
    lease_ = l->lease_id;
  }
  void Say(const std::string& line) {
    const std::string text = line + "\n";
    ASSERT_EQ(write(master_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  // The records of `kind` once there are `n` of them (waits for the rule's thread).
  std::vector<json> Records(const std::string& kind, size_t n) {
    std::unique_lock lock(mu_);
    std::vector<json> got;
    cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      got.clear();
      for (const auto& r : records_)
        if (r.value("kind", "") == kind) got.push_back(r);
      return got.size() >= n;
    });
    return got;
  }
  // Waits until the rule's reader has read `n` lines in all: what came
  // before has been matched (or not), so the clock may move.
  void Seen(const std::string& rule, int64_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      for (const auto& w : watches_->List(alice_))
        if (w.rule.name == rule && w.lines >= n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL() << "the rule never read " << n << " lines";
  }

  fs::path dir_;
  int master_ = -1, slave_ = -1;
  std::unique_ptr<Storage> db_;
  std::unique_ptr<HardwareBroker> broker_;
  std::unique_ptr<LocalBoards> local_;
  std::unique_ptr<Boards> boards_;
  ManualClock clock_;
  std::unique_ptr<Watches> watches_;
  Caller alice_, bob_;
  std::string lease_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<json> records_;
  std::vector<std::string> notices_;  // what the sessions' hook was given
};

TEST_F(WatchesTest, ALineThatMatchesFiresAndTooManyAreHeldBackAndCounted) {
  WatchRule r;
  r.name = "hardfault";
  r.pattern = "^FAULT";
  r.min_interval_s = 60;
  EXPECT_EQ(watches_->Add(alice_, r, "").status().code(), absl::StatusCode::kFailedPrecondition)
      << "no lease, no watch";
  Lease(alice_);
  auto added = watches_->Add(alice_, r, "");
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(added->rule.board, "bench");
  EXPECT_EQ(watches_->Add(alice_, r, "").status().code(), absl::StatusCode::kAlreadyExists);
  Say("booting");
  Say("FAULT: hard fault at pc=0x08000282");
  auto fired = Records("watch_fired", 1);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].value("line", ""), "FAULT: hard fault at pc=0x08000282");
  EXPECT_EQ(fired[0].value("rule", ""), "hardfault");
  EXPECT_EQ(fired[0].value("held_back", -1), 0);
  // Within the minute: held back, counted.
  Say("FAULT: again");
  Say("FAULT: and again");
  Seen("hardfault", 4);
  clock_.Advance(61'000'000);
  Say("FAULT: later");
  fired = Records("watch_fired", 2);
  ASSERT_EQ(fired.size(), 2u);
  EXPECT_EQ(fired[1].value("line", ""), "FAULT: later");
  EXPECT_EQ(fired[1].value("held_back", -1), 2);
  // Only its owner (or an admin) removes it.
  EXPECT_EQ(watches_->Remove(bob_, "", "hardfault").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(watches_->List(bob_).empty());
  ASSERT_TRUE(watches_->Remove(alice_, "", "hardfault").ok());
  EXPECT_TRUE(watches_->List(alice_).empty());
}

TEST_F(WatchesTest, ABootLoopIsCountedInItsWindowAndTheRuleEndsWithTheLease) {
  Lease(alice_);
  WatchRule r;
  r.name = "boot-loop";
  r.pattern = "booted";
  r.count = 3;
  r.within_s = 10;
  r.min_interval_s = 0;
  ASSERT_TRUE(watches_->Add(alice_, r, "").ok());
  // Three boots, each 6 s apart: never three within 10 s.
  for (int i = 1; i <= 3; ++i) {
    Say("blinky booted");
    Seen("boot-loop", i);
    clock_.Advance(6'000'000);
  }
  EXPECT_TRUE(Records("watch_fired", 0).empty());
  // Three within 2 s: a boot loop.
  for (int i = 4; i <= 6; ++i) {
    Say("blinky booted");
    Seen("boot-loop", i);
    clock_.Advance(1'000'000);
  }
  auto fired = Records("watch_fired", 1);
  ASSERT_EQ(fired.size(), 1u);
  // The lease ends: so does the rule, saying why.
  ASSERT_TRUE(broker_->Release(alice_, lease_, "", false).ok());
  auto ended = Records("watch_ended", 1);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_NE(ended[0].value("reason", "").find("ended"), std::string::npos) << ended[0].dump();
  auto listed = watches_->List(alice_);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].active);
}

TEST_F(WatchesTest, ANoticeReachesTheBoardsReadersAndIsNeverMatchedAsTheBoardsLine) {
  Lease(alice_);
  WatchRule assert_rule;
  assert_rule.name = "assert";
  assert_rule.pattern = "ASSERT";
  assert_rule.notify = true;
  ASSERT_TRUE(watches_->Add(alice_, assert_rule, "").ok());
  // A second rule whose pattern the notice's words match: a notice is fwaid's
  // word, not the board's line, so it never fires it.
  WatchRule echo = assert_rule;
  echo.name = "echo";
  echo.pattern = "fired";
  ASSERT_TRUE(watches_->Add(alice_, echo, "").ok());
  // Bob holds nothing and reads: he sees the line, then the notice.
  auto ref = boards_->Resolve(bob_, "bench");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto reader = boards_->OpenSerial(bob_, *ref, false);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Say("ASSERT failed: len > 0 at src/main.c:88");
  SerialLine l;
  ASSERT_EQ((*reader)->Wait(l, 20000), SerialReader::Next::kLine);
  EXPECT_FALSE(l.notice);
  EXPECT_GT(l.seq, 0u);
  ASSERT_EQ((*reader)->Wait(l, 20000), SerialReader::Next::kLine);
  EXPECT_TRUE(l.notice);
  EXPECT_EQ(l.seq, 0u);
  EXPECT_EQ(l.text, "watch 'assert' fired on bench: ASSERT failed: len > 0 at src/main.c:88");
  auto fired = Records("watch_fired", 1);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0]["notified"], json({{"readers", 1}, {"sessions", 1}})) << fired[0].dump();
  Say("next");
  Seen("echo", 2);
  Seen("assert", 2);
  EXPECT_EQ(Records("watch_fired", 1).size(), 1u) << "a notice fired a rule";
  std::lock_guard lock(mu_);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_EQ(notices_[0], "bench assert: " + l.text);
  // The notice is not in the board's history.
  auto history = boards_->SerialHistory(bob_, *ref, 100);
  ASSERT_TRUE(history.ok());
  for (const auto& h : *history) EXPECT_FALSE(h.notice) << h.text;
  EXPECT_EQ(history->size(), 2u);
}

}  // namespace
}  // namespace fwai
