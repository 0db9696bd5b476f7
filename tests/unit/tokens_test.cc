// Bearer tokens on a clock the test moves: a token is valid until the
// moment it expires (and not after, also across a restart); revoking says
// when; a secret that does not match says nothing about the token.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/clock.h"
#include "server/auth/token_store.h"
#include "server/storage/storage.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

constexpr int64_t kSecond = 1000000;

TEST(TokenStoreTest, ATokenIsValidUntilItsTtlRunsOutAlsoAfterARestart) {
  const std::string dir = testing::MakeTempDir("fwai-tokens-");
  ManualClock clock;
  std::string secret, id;
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    auto tokens = TokenStore::Open(**db, &clock);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    auto made = (*tokens)->Create("bob", Role::kUser, 60, "admin", "ci");
    ASSERT_TRUE(made.ok()) << made.status();
    secret = made->token;
    id = made->info.id;
    EXPECT_EQ(made->info.expires_us, made->info.created_us + 60 * kSecond);
    clock.Advance(59 * kSecond);
    auto v = (*tokens)->Verify(secret);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->user, "bob");
    EXPECT_EQ(v->last_used_us, clock.NowMicros());
  }
  // fwaid restarts; the last second passes.
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  auto tokens = TokenStore::Open(**db, &clock);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  clock.Advance(kSecond - 1);
  EXPECT_TRUE((*tokens)->Verify(secret).ok());
  EXPECT_TRUE((*tokens)->Valid(id).ok());
  clock.Advance(1);
  auto late = (*tokens)->Verify(secret);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(late.status().message().find("expired at"), std::string::npos) << late.status();
  EXPECT_EQ((*tokens)->Valid(id).status().code(), absl::StatusCode::kUnauthenticated);
  // Without a TTL it never expires.
  auto forever = (*tokens)->Create("carol", Role::kCi, 0, "admin", "");
  ASSERT_TRUE(forever.ok());
  EXPECT_EQ(forever->info.expires_us, 0);
  clock.Advance(10LL * 365 * 24 * 3600 * kSecond);
  EXPECT_TRUE((*tokens)->Verify(forever->token).ok());
}

TEST(TokenStoreTest, ARevokedTokenSaysWhenAndAWrongSecretSaysNothingOfTheToken) {
  const std::string dir = testing::MakeTempDir("fwai-tokens-");
  ManualClock clock(1700000000LL * kSecond);
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  auto tokens = TokenStore::Open(**db, &clock);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto made = (*tokens)->Create("dave", Role::kAdmin, 0, "root", "");
  ASSERT_TRUE(made.ok()) << made.status();
  // The right id with another secret (same length): refused like any
  // unknown token, naming neither the id nor its state.
  std::string wrong = made->token;
  wrong.back() = wrong.back() == 'A' ? 'B' : 'A';
  auto refused = (*tokens)->Verify(wrong);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(refused.status().message(), "the token is not valid");
  clock.Advance(5 * kSecond);
  const int64_t revoked_at = clock.NowMicros();
  ASSERT_TRUE((*tokens)->Revoke(made->info.id).ok());
  clock.Advance(5 * kSecond);
  ASSERT_TRUE((*tokens)->Revoke(made->info.id).ok());  // again: nothing changes
  auto listed = (*tokens)->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].revoked_us, revoked_at);
  auto v = (*tokens)->Verify(made->token);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(v.status().message().find("was revoked at"), std::string::npos) << v.status();
  EXPECT_EQ((*tokens)->Verify(wrong).status().message(), "the token is not valid");
  EXPECT_EQ((*tokens)->Revoke("tk-nonesuch00").code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace fwai
