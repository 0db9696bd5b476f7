#include "common/start_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace fwai {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLongBudget{std::chrono::minutes(10)};

TEST(StartGateTest, AtMostSlotsInsideAndTheRestEnterInOrder) {
  StartGate gate(2, kLongBudget);
  std::optional<StartGate::Hold> a(gate.Enter());
  std::optional<StartGate::Hold> b(gate.Enter());
  EXPECT_EQ(gate.Inside(), 2u);

  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> waiters;
  // Three waiters, queued one after the other so their order is known.
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] {
      StartGate::Hold h = gate.Enter();
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
    gate.WaitUntilWaiting(static_cast<size_t>(i) + 1);
  }
  EXPECT_EQ(gate.Inside(), 2u);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(order.empty()) << "a waiter entered while both slots were held";
  }
  a.reset();  // one slot frees: the waiters go through it one by one, in order
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(gate.Inside(), 1u);  // b still holds its slot
  b.reset();
  EXPECT_EQ(gate.Inside(), 0u);
  EXPECT_EQ(gate.Waiting(), 0u);
}

TEST(StartGateTest, LeaveHeldGivesTheSlotUpOnceBeforeTheHoldEnds) {
  StartGate gate(1, kLongBudget);
  StartGate::Hold mine = gate.Enter();
  std::thread other([&] {
    StartGate::Hold h = gate.Enter();
    EXPECT_EQ(gate.Inside(), 1u);
  });
  gate.WaitUntilWaiting(1);
  StartGate::LeaveHeld();  // as the HTTP client does before it waits on the network
  other.join();            // the waiter got the slot while `mine` still lives
  StartGate::LeaveHeld();  // nothing held any more: no effect
  EXPECT_EQ(gate.Inside(), 0u);

  // The ended hold leaves nothing behind: the next one enters at once and
  // counts, and this thread's hold is the one LeaveHeld gives up.
  StartGate::Hold next = gate.Enter();
  EXPECT_EQ(gate.Inside(), 1u);
  StartGate::LeaveHeld();
  EXPECT_EQ(gate.Inside(), 0u);
}

TEST(StartGateTest, AHolderPastItsBudgetNoLongerHoldsTheOthersBack) {
  const milliseconds budget(50);
  StartGate gate(1, budget);
  StartGate::Hold slow = gate.Enter();  // never leaves during the test
  const auto asked = std::chrono::steady_clock::now();
  std::thread other([&] { StartGate::Hold h = gate.Enter(); });
  other.join();  // would hang if the slow holder kept counting
  EXPECT_GE(std::chrono::steady_clock::now() - asked, budget);
  EXPECT_EQ(gate.Inside(), 0u);
}

TEST(StartGateTest, ACancelledWaiterStopsWaitingAndTakesNoSlot) {
  StartGate gate(1, kLongBudget);
  StartGate::Hold first = gate.Enter();
  CancelToken cancel;
  std::thread cancelled([&] {
    StartGate::Hold h = gate.Enter(&cancel);  // returns on the cancel, not on a slot
  });
  CancelToken never;
  std::thread later([&] { StartGate::Hold h = gate.Enter(&never); });
  gate.WaitUntilWaiting(2);
  cancel.Cancel();
  cancelled.join();               // would hang until `first` leaves if the cancel did not wake it
  EXPECT_EQ(gate.Inside(), 1u);   // still only `first`
  EXPECT_EQ(gate.Waiting(), 1u);  // `later` waits on, now first in line
  StartGate::LeaveHeld();         // `first` gives its slot up: `later` enters
  later.join();
  EXPECT_EQ(gate.Inside(), 0u);
  // Already cancelled: no wait at all.
  StartGate::Hold again = gate.Enter();
  std::thread at_once([&] { StartGate::Hold h = gate.Enter(&cancel); });
  at_once.join();
  EXPECT_EQ(gate.Inside(), 1u);
}

// A burst of starts behind one slot: each leave wakes the next in line
// only, not every waiter to look and sleep again (hundreds of turns at once
// would cost hundreds of wakeups per start).
TEST(StartGateTest, ALeaveWakesOnlyTheNextInLine) {
  StartGate gate(1, kLongBudget);
  std::optional<StartGate::Hold> first(gate.Enter());
  constexpr size_t kWaiters = 60;
  std::atomic<size_t> entered{0};
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      StartGate::Hold h = gate.Enter();
      entered.fetch_add(1);
    });
  }
  gate.WaitUntilWaiting(kWaiters);
  EXPECT_LT(gate.Wakeups(), kWaiters / 2) << "a waiter arriving woke the others";
  first.reset();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(entered.load(), kWaiters);
  // One wakeup per waiter, with room for the odd spurious one; waking all
  // of them at every leave makes it about kWaiters * kWaiters / 2.
  EXPECT_LE(gate.Wakeups(), 2 * kWaiters);
  EXPECT_EQ(gate.Inside(), 0u);
}

TEST(StartGateTest, NoSlotsMeansNoLimit) {
  StartGate gate(0, kLongBudget);
  std::vector<StartGate::Hold> holds;
  for (int i = 0; i < 100; ++i) holds.push_back(gate.Enter());
  EXPECT_EQ(gate.Inside(), 0u);
  EXPECT_EQ(gate.Waiting(), 0u);
  StartGate::LeaveHeld();
}

}  // namespace
}  // namespace fwai
