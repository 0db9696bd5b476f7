#include "common/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

namespace fwai {
namespace {

// Whether another thread can take `mu` right now (a thread may not try a
// std::mutex it holds itself).
bool FreeToAnotherThread(Mutex& mu) {
  bool took = false;
  std::thread t([&] {
    if (mu.TryLock()) {
      took = true;
      mu.Unlock();
    }
  });
  t.join();
  return took;
}

TEST(MutexTest, MutexLockMakesIncrementsFromManyThreadsExact) {
  Mutex mu;
  long n = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        MutexLock lock(&mu);
        ++n;
      }
    });
  }
  for (auto& t : threads) t.join();
  MutexLock lock(&mu);
  EXPECT_EQ(n, 80000);
}

TEST(MutexTest, AScopeThatUnlocksGivesTheLockUpAndTakesItBack) {
  Mutex mu;
  {
    MutexLock lock(&mu);
    EXPECT_FALSE(FreeToAnotherThread(mu));
    lock.Unlock();
    EXPECT_TRUE(FreeToAnotherThread(mu));
    lock.Lock();
    EXPECT_FALSE(FreeToAnotherThread(mu));
  }
  EXPECT_TRUE(FreeToAnotherThread(mu));
}

TEST(MutexTest, AScopeLeftUnlockedDoesNotUnlockTwice) {
  Mutex mu;
  {
    MutexLock lock(&mu);
    lock.Unlock();
    mu.Lock();  // someone else's hold, taken inside the released scope
  }
  // The scope's end did not release the hold it no longer owned.
  EXPECT_FALSE(FreeToAnotherThread(mu));
  mu.Unlock();
  EXPECT_TRUE(FreeToAnotherThread(mu));
}

TEST(MutexTest, ReadersShareASharedMutexAndAWriterHasItAlone) {
  SharedMutex mu;
  int value = 0;
  // Both readers must be inside at once to pass the barrier: exclusive
  // readers would deadlock here (and the test time out).
  std::barrier both_inside(2);
  std::vector<std::thread> readers;
  std::atomic<int> seen{0};
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      ReaderMutexLock lock(&mu);
      both_inside.arrive_and_wait();
      seen += value;
    });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(seen.load(), 0);

  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        WriterMutexLock lock(&mu);
        ++value;
      }
    });
  }
  for (auto& t : writers) t.join();
  ReaderMutexLock lock(&mu);
  EXPECT_EQ(value, 40000);
}

TEST(MutexTest, CondVarWakesAWaiterWhenTheConditionIsSignalled) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  bool timed_out = false;
  std::thread waiter([&] {
    MutexLock lock(&mu);
    while (!ready) {
      if (cv.WaitWithTimeout(&mu, std::chrono::minutes(10))) {
        timed_out = true;
        break;
      }
    }
  });
  {
    MutexLock lock(&mu);
    ready = true;
    cv.SignalAll();
  }
  waiter.join();
  EXPECT_FALSE(timed_out);
}

TEST(MutexTest, CondVarWaitsReportATimeoutWhenNobodySignals) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  EXPECT_TRUE(cv.WaitWithDeadline(&mu, std::chrono::steady_clock::now() - std::chrono::seconds(1)));
  const auto before = std::chrono::steady_clock::now();
  bool timed_out = false;
  while (!timed_out) timed_out = cv.WaitWithTimeout(&mu, std::chrono::milliseconds(5));
  EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(5));
  // The lock is held again after a wait, timed out or not.
  EXPECT_FALSE(FreeToAnotherThread(mu));
}

}  // namespace
}  // namespace fwai
