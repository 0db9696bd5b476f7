#include "server/agent/turn_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

namespace fwai {
namespace {

// Counts arrivals; Wait() returns once `n` have arrived (false after a long
// timeout, so a pool that cannot run them at once fails instead of hanging).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  bool ArriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (++arrived_ >= n_) cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return arrived_ >= n_; });
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return arrived_ >= n_; });
  }
  void Arrive() {
    std::lock_guard<std::mutex> lock(mu_);
    if (++arrived_ >= n_) cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
};

// Runs `n` jobs that are all running at the same moment (so on `n` distinct
// threads) and returns the threads they ran on, once all have finished.
std::set<std::thread::id> RunTogether(TurnThreads& threads, int n) {
  Barrier together(n), finished(n);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> missed{0};
  for (int i = 0; i < n; ++i) {
    threads.Run([&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      if (!together.ArriveAndWait()) ++missed;
      finished.Arrive();
    });
  }
  EXPECT_TRUE(finished.Wait()) << "the jobs did not all run at once";
  EXPECT_EQ(missed.load(), 0);
  std::lock_guard<std::mutex> lock(mu);
  return ids;
}

TEST(TurnThreadsTest, KeptThreadsExistBeforeAnyJob) {
  TurnThreads threads(6);
  EXPECT_EQ(threads.Live(), 6u);
  EXPECT_EQ(threads.Created(), 6u);
  TurnThreads none(0);
  EXPECT_EQ(none.Live(), 0u);
  EXPECT_EQ(none.Created(), 0u);
}

TEST(TurnThreadsTest, BurstOfKeptManyJobsCreatesNoThread) {
  TurnThreads threads(8);
  ASSERT_EQ(threads.Created(), 8u);
  auto ids = RunTogether(threads, 8);
  EXPECT_EQ(ids.size(), 8u);
  EXPECT_FALSE(ids.count(std::this_thread::get_id()));
  EXPECT_EQ(threads.Created(), 8u);
  EXPECT_EQ(threads.Live(), 8u);
  // The next burst runs on the same threads (once they are back waiting).
  threads.WaitUntilIdle(8);
  EXPECT_EQ(RunTogether(threads, 8), ids);
  EXPECT_EQ(threads.Created(), 8u);
}

TEST(TurnThreadsTest, JobsBeyondKeptGetNewThreads) {
  TurnThreads threads(2);
  auto ids = RunTogether(threads, 5);
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(threads.Created(), 5u);
  EXPECT_EQ(threads.Live(), 5u);
}

TEST(TurnThreadsTest, ExtraThreadsEndIdleKeptOnesStay) {
  TurnThreads threads(2, std::chrono::milliseconds(1));
  EXPECT_EQ(RunTogether(threads, 4).size(), 4u);
  EXPECT_EQ(threads.Created(), 4u);
  threads.WaitUntilLive(2);  // the two extra ones, idle, end
  threads.WaitUntilIdle(2);
  // The two kept ones are still there: a burst of two creates no thread.
  EXPECT_EQ(RunTogether(threads, 2).size(), 2u);
  EXPECT_EQ(threads.Created(), 4u);
  EXPECT_EQ(threads.Live(), 2u);
}

std::atomic<int> g_exited{0};
struct CountsExit {
  bool touched = false;
  ~CountsExit() {
    if (touched) ++g_exited;
  }
};
thread_local CountsExit t_counts_exit;

TEST(TurnThreadsTest, DestructionJoinsEveryThread) {
  g_exited = 0;
  auto threads = std::make_unique<TurnThreads>(3);
  Barrier together(5);
  for (int i = 0; i < 5; ++i) {
    threads->Run([&] {
      t_counts_exit.touched = true;
      together.ArriveAndWait();
    });
  }
  ASSERT_TRUE(together.Wait());
  // A thread's thread_local objects are destroyed as it exits: once the
  // destructor returns, every one of the five threads has exited.
  threads.reset();
  EXPECT_EQ(g_exited.load(), 5);
}

}  // namespace
}  // namespace fwai
