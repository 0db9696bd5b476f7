// Session shares on a clock the test moves: a share reaches exactly its
// grantee (by id, alias or role) until the microsecond it expires, the
// highest of several roles wins, removal and a deleted session end it, and
// all of it survives a restart; a damaged record is refused naming its key.
#include "server/session/shares.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/clock.h"
#include "server/storage/storage.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

constexpr int64_t kSecond = 1000000;

SessionShare Share(const std::string& session, const std::string& grantee, ShareRole role,
                   int64_t expires_us = 0) {
  SessionShare s;
  s.session_id = session;
  s.grantee = grantee;
  s.user = grantee.substr(grantee.find(':') + 1);
  s.role = role;
  s.expires_us = expires_us;
  s.created_by = "uid:1000";
  return s;
}

const ShareSubject kBob{{"user:bob", "uid:1001"}, "user"};
const ShareSubject kCarol{{"user:carol"}, "user"};
const ShareSubject kCiJob{{"user:build-7"}, "ci"};

TEST(SessionSharesTest, AShareReachesItsGranteeUntilItExpiresAlsoAfterARestart) {
  const std::string dir = testing::MakeTempDir("fwai-shares-");
  ManualClock clock;
  const int64_t expires = clock.NowMicros() + 3600 * kSecond;
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    auto shares = SessionShares::Open(**db, &clock);
    ASSERT_TRUE(shares.ok()) << shares.status();
    ASSERT_TRUE((*shares)->Put(Share("s-1", "uid:1001", ShareRole::kAnswer, expires)).ok());
    // Bob through his alias; Carol has nothing; another session has nothing.
    EXPECT_EQ((*shares)->RoleFor("s-1", kBob), ShareRole::kAnswer);
    EXPECT_EQ((*shares)->RoleFor("s-1", kCarol), std::nullopt);
    EXPECT_EQ((*shares)->RoleFor("s-2", kBob), std::nullopt);
    clock.Advance(3599 * kSecond);
  }
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  auto shares = SessionShares::Open(**db, &clock);
  ASSERT_TRUE(shares.ok()) << shares.status();
  clock.Advance(kSecond - 1);
  EXPECT_EQ((*shares)->RoleFor("s-1", kBob), ShareRole::kAnswer);
  EXPECT_EQ((*shares)->SharedWith(kBob).size(), 1u);
  clock.Advance(1);
  EXPECT_EQ((*shares)->RoleFor("s-1", kBob), std::nullopt);
  EXPECT_TRUE((*shares)->SharedWith(kBob).empty());
  // Still listed for the owner, with its expiry.
  auto of = (*shares)->OfSession("s-1");
  ASSERT_EQ(of.size(), 1u);
  EXPECT_EQ(of[0].expires_us, expires);
  // A share that has already expired is not made.
  EXPECT_EQ((*shares)->Put(Share("s-1", "user:carol", ShareRole::kWatch, clock.NowMicros())).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SessionSharesTest, TheHighestRoleWinsAndARoleShareReachesEveryoneOfIt) {
  const std::string dir = testing::MakeTempDir("fwai-shares-");
  ManualClock clock;
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  auto shares = SessionShares::Open(**db, &clock);
  ASSERT_TRUE(shares.ok()) << shares.status();
  ASSERT_TRUE((*shares)->Put(Share("s-1", "role:user", ShareRole::kWatch)).ok());
  ASSERT_TRUE((*shares)->Put(Share("s-1", "user:bob", ShareRole::kDrive)).ok());
  EXPECT_EQ((*shares)->RoleFor("s-1", kBob), ShareRole::kDrive);
  EXPECT_EQ((*shares)->RoleFor("s-1", kCarol), ShareRole::kWatch);
  EXPECT_EQ((*shares)->RoleFor("s-1", kCiJob), std::nullopt);
  // A second share for the same grantee replaces the first.
  ASSERT_TRUE((*shares)->Put(Share("s-1", "user:bob", ShareRole::kAnswer)).ok());
  EXPECT_EQ((*shares)->RoleFor("s-1", kBob), ShareRole::kAnswer);
  EXPECT_EQ((*shares)->OfSession("s-1").size(), 2u);
}

TEST(SessionSharesTest, RemovedAndDeletedSharesAreGoneAlsoAfterARestart) {
  const std::string dir = testing::MakeTempDir("fwai-shares-");
  ManualClock clock;
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    auto shares = SessionShares::Open(**db, &clock);
    ASSERT_TRUE(shares.ok()) << shares.status();
    ASSERT_TRUE((*shares)->Put(Share("s-1", "user:bob", ShareRole::kWatch)).ok());
    ASSERT_TRUE((*shares)->Put(Share("s-1", "user:carol", ShareRole::kWatch)).ok());
    ASSERT_TRUE((*shares)->Put(Share("s-2", "user:bob", ShareRole::kWatch)).ok());
    ASSERT_TRUE((*shares)->Put(Share("s-10", "user:bob", ShareRole::kWatch)).ok());
    ASSERT_TRUE((*shares)->Remove("s-1", "user:bob").ok());
    EXPECT_EQ((*shares)->Remove("s-1", "user:bob").code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE((*shares)->DeleteSession("s-1").ok());
  }
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  auto shares = SessionShares::Open(**db, &clock);
  ASSERT_TRUE(shares.ok()) << shares.status();
  EXPECT_TRUE((*shares)->OfSession("s-1").empty());
  EXPECT_EQ((*shares)->RoleFor("s-1", kCarol), std::nullopt);
  // A session whose id starts like the deleted one keeps its share.
  EXPECT_EQ((*shares)->RoleFor("s-10", kBob), ShareRole::kWatch);
  EXPECT_EQ((*shares)->SharedWith(kBob).size(), 2u);
}

TEST(SessionSharesTest, ADamagedRecordIsRefusedNamingItsKey) {
  const std::string dir = testing::MakeTempDir("fwai-shares-");
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Put(Cf::kMeta, "share/s-1/user:bob", "{not json", true).ok());
  }
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  auto shares = SessionShares::Open(**db);
  ASSERT_FALSE(shares.ok());
  EXPECT_EQ(shares.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(shares.status().message().find("share/s-1/user:bob"), std::string::npos)
      << shares.status();
}

}  // namespace
}  // namespace fwai
