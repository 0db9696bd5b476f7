// Rate limits on a clock the test moves: the request bucket refuses past its
// burst, says how long to wait, and lets the next request through exactly
// then; the hourly ingest budget frees room as the oldest ingest leaves the
// window. One principal's use is not another's.
#include "server/auth/quotas.h"

#include <gtest/gtest.h>

#include <string>

#include "common/clock.h"
#include "common/security_config.h"

namespace fwai {
namespace {

constexpr int64_t kMs = 1000, kMinute = 60 * 1000 * kMs;

TEST(QuotasTest, RequestsPastTheBurstWaitForTheRateAndAreToldHowLong) {
  ManualClock clock;
  Quotas quotas(clock);
  LimitsConfig l;
  l.requests_per_second = 2;
  l.burst = 3;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(quotas.Request("alice", l).ok()) << i;
  auto refused = quotas.Request("alice", l);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("limit requests_per_second (2, bursts of 3) reached; retry in "
                                   "500 ms"),
            std::string::npos)
      << refused;
  // Bob's bucket is his own.
  EXPECT_TRUE(quotas.Request("bob", l).ok());
  // Half a second brings one request back, not before.
  clock.Advance(250 * kMs);
  refused = quotas.Request("alice", l);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("retry in 250 ms"), std::string::npos) << refused;
  clock.Advance(250 * kMs);
  EXPECT_TRUE(quotas.Request("alice", l).ok());
  EXPECT_FALSE(quotas.Request("alice", l).ok());
  // A long pause refills up to the burst, no more.
  clock.Advance(60 * 1000 * kMs);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(quotas.Request("alice", l).ok()) << i;
  EXPECT_FALSE(quotas.Request("alice", l).ok());
}

TEST(QuotasTest, IngestPastTheHourlyBudgetWaitsForTheOldestToLeaveTheWindow) {
  ManualClock clock;
  Quotas quotas(clock);
  LimitsConfig l;
  l.ingest_mb_per_hour = 1;
  constexpr int64_t kKb = 1024;
  ASSERT_TRUE(quotas.Ingest("alice", 600 * kKb, l).ok());
  clock.Advance(20 * kMinute);
  ASSERT_TRUE(quotas.Ingest("alice", 300 * kKb, l).ok());
  // 900 KB of 1 MB used: 200 KB more needs the first ingest gone (40 min).
  auto refused = quotas.Ingest("alice", 200 * kKb, l);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("limit ingest_mb_per_hour (1 MB) reached"), std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("retry in 40 min"), std::string::npos) << refused;
  EXPECT_TRUE(quotas.Ingest("bob", 1024 * kKb, l).ok()) << "bob's budget is his own";
  clock.Advance(40 * kMinute - 1);
  EXPECT_FALSE(quotas.Ingest("alice", 200 * kKb, l).ok()) << "room came back early";
  clock.Advance(1);
  EXPECT_TRUE(quotas.Ingest("alice", 200 * kKb, l).ok());
}

}  // namespace
}  // namespace fwai
