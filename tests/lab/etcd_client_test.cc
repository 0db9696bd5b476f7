// The etcd client against a real three-member etcd cluster on loopback.
#include "server/lab/etcd_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "tests/lab/etcd_cluster.h"

namespace fwai::lab {
namespace {

using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;

class LabEtcdClient : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    auto c = EtcdClient::Connect(cluster_.Options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  std::unique_ptr<EtcdClient> NewClient() { return *EtcdClient::Connect(cluster_.Options()); }

  EtcdCluster cluster_{3};
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(LabEtcdClient, PutGetPrefixAndDelete) {
  auto r1 = client_->Put("/t/a", "1");
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = client_->Put("/t/b", "2");
  ASSERT_TRUE(r2.ok());
  EXPECT_GT(*r2, *r1);
  ASSERT_TRUE(client_->Put("/u/c", "3").ok());
  auto a = client_->Get("/t/a");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "1");
  EXPECT_EQ((*a)->mod_revision, *r1);
  auto missing = client_->Get("/t/zzz");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  auto range = client_->GetPrefix("/t/");
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "/t/a");
  EXPECT_EQ(range->kvs[1].value, "2");
  EXPECT_GE(range->revision, *r2);
  auto deleted = client_->Delete("/t/a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  EXPECT_EQ(*client_->DeletePrefix("/t/"), 1);
  EXPECT_TRUE(client_->GetPrefix("/t/")->kvs.empty());
  EXPECT_EQ(client_->GetPrefix("/u/")->kvs.size(), 1u);
}

TEST_F(LabEtcdClient, CreateIfAbsentHasExactlyOneWinnerAmongRacers) {
  constexpr int kRacers = 12;
  std::vector<std::unique_ptr<EtcdClient>> clients;
  for (int i = 0; i < kRacers; ++i) clients.push_back(NewClient());
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  std::vector<int> created(kRacers, -1);
  std::vector<std::string> seen(kRacers);
  for (int i = 0; i < kRacers; ++i) {
    threads.emplace_back([&, i] {
      ready++;
      while (ready < kRacers) std::this_thread::yield();
      auto r = clients[i]->CreateIfAbsent("/race/board", "holder-" + std::to_string(i), 0);
      if (!r.ok()) return;
      created[i] = r->created ? 1 : 0;
      seen[i] = r->current.value;
    });
  }
  for (auto& t : threads) t.join();
  int winners = 0, winner = -1;
  for (int i = 0; i < kRacers; ++i) {
    ASSERT_NE(created[i], -1) << "racer " << i << " got an error";
    if (created[i] == 1) {
      ++winners;
      winner = i;
    }
  }
  ASSERT_EQ(winners, 1);
  for (int i = 0; i < kRacers; ++i) EXPECT_EQ(seen[i], "holder-" + std::to_string(winner)) << i;
  // Only the winner's value deletes it.
  EXPECT_FALSE(
      *client_->DeleteIfValue("/race/board", "holder-" + std::to_string((winner + 1) % kRacers)));
  EXPECT_TRUE(*client_->DeleteIfValue("/race/board", "holder-" + std::to_string(winner)));
  EXPECT_FALSE(client_->Get("/race/board")->has_value());
}

// A transaction whose answer was lost (a member timed out after applying
// it) is sent again, as is, to the next member: the second sending must not
// apply it again, and must tell the caller it won. Here the same request is
// sent twice, as the client's retry does.
TEST_F(LabEtcdClient, ATransactionSentAgainAfterALostAnswerAppliesOnceAndIsStillAWin) {
  auto lease = client_->LeaseGrant(30);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("/queue/me", "waiting", *lease).ok());
  auto waiter = client_->Get("/queue/me");
  ASSERT_TRUE(waiter.ok() && waiter->has_value());
  EtcdClient::GuardedCreate g;
  g.key = "/leases/b1";
  g.value = R"({"lease_id":"lab-1","holder":"alice"})";
  g.lease = *lease;
  g.consume_key = "/queue/me";
  g.consume_create_revision = (*waiter)->create_revision;
  auto first = client_->CreateGuarded(g);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->created);
  EXPECT_FALSE(client_->Get("/queue/me")->has_value()) << "the waiter was consumed with the create";
  auto again = client_->CreateGuarded(g);  // the retry
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->created) << "a retry finds its own write: the caller won";
  EXPECT_EQ(again->current.mod_revision, first->current.mod_revision) << "applied twice";
  EXPECT_EQ(again->current.version, 1);
  // Another caller's request for the same board is no win.
  EtcdClient::GuardedCreate other = g;
  other.value = R"({"lease_id":"lab-2","holder":"bob"})";
  auto lost = client_->CreateGuarded(other);
  ASSERT_TRUE(lost.ok());
  EXPECT_FALSE(lost->created);
  EXPECT_EQ(lost->current.value, g.value);
  // A release sent twice deletes once; the second finds nothing of its own.
  EXPECT_TRUE(*client_->DeleteIfValue(g.key, g.value));
  EXPECT_FALSE(*client_->DeleteIfValue(g.key, g.value));
  EXPECT_FALSE(client_->Get(g.key)->has_value());
}

TEST_F(LabEtcdClient, KeysOfALeaseLiveWhileKeptAliveAndGoWhenItExpiresOrIsRevoked) {
  auto lease = client_->LeaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("/l/kept", "x", *lease).ok());
  EXPECT_EQ((*client_->Get("/l/kept"))->lease, *lease);
  // Kept alive across two TTLs: still there.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (std::chrono::steady_clock::now() < until) {
    auto ttl = client_->LeaseKeepAlive(*lease);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  EXPECT_TRUE(client_->Get("/l/kept")->has_value());
  // Left alone: gone once its TTL has passed, and the lease with it.
  EXPECT_TRUE(
      Eventually([&] { return !client_->Get("/l/kept")->has_value(); }, std::chrono::seconds(5)));
  auto again = client_->LeaseKeepAlive(*lease);
  EXPECT_TRUE(absl::IsNotFound(again.status())) << again.status();
  EXPECT_TRUE(absl::IsNotFound(client_->LeaseTimeToLive(*lease).status()));

  auto revoked = client_->LeaseGrant(60);
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE(client_->Put("/l/revoked", "y", *revoked).ok());
  auto left = client_->LeaseTimeToLive(*revoked);
  ASSERT_TRUE(left.ok());
  EXPECT_GT(*left, 50);
  ASSERT_TRUE(client_->LeaseRevoke(*revoked).ok());
  EXPECT_FALSE(client_->Get("/l/revoked")->has_value());
  EXPECT_TRUE(client_->LeaseRevoke(*revoked).ok())
      << "revoking a lease already gone is not an error";
}

struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> events;  // "put KEY=VALUE" | "delete KEY"
  bool WaitFor(size_t n) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(20), [&] { return events.size() >= n; });
  }
  std::function<void(const std::vector<WatchEvent>&, int64_t)> Sink() {
    return [this](const std::vector<WatchEvent>& evs, int64_t) {
      std::lock_guard lock(mu);
      for (const auto& e : evs) {
        events.push_back(e.type == WatchEvent::kPut ? "put " + e.kv.key + "=" + e.kv.value
                                                    : "delete " + e.kv.key);
      }
      cv.notify_all();
    };
  }
};

TEST_F(LabEtcdClient, WatchSeesPutsAndDeletesInOrderFromARevision) {
  auto before = client_->Put("/w/old", "0");
  ASSERT_TRUE(before.ok());
  Collected got;
  // From the revision of the first write: that write is seen too.
  auto watch = client_->Watch("/w/", *before, got.Sink());
  ASSERT_TRUE(client_->Put("/w/a", "1").ok());
  ASSERT_TRUE(client_->Put("/other", "x").ok());
  ASSERT_TRUE(client_->Delete("/w/old").ok());
  ASSERT_TRUE(got.WaitFor(3));
  watch->Cancel();
  std::lock_guard lock(got.mu);
  EXPECT_EQ(got.events, (std::vector<std::string>{"put /w/old=0", "put /w/a=1", "delete /w/old"}));
}

TEST_F(LabEtcdClient, OneMemberStoppedChangesNothingForRequestsOrWatches) {
  auto first = client_->Put("/f/1", "a");
  ASSERT_TRUE(first.ok()) << first.status();
  Collected got;
  // From the first write's revision: it is seen however late the watch
  // takes hold (a watch from "now" may start after a write made at once).
  auto watch = client_->Watch("/f/", *first, got.Sink());
  ASSERT_TRUE(got.WaitFor(1));
  // The client talks to member 0 first: stop exactly that one.
  cluster_.StopMember(0);
  for (int i = 2; i <= 5; ++i) {
    auto r = client_->Put("/f/" + std::to_string(i), "b");
    ASSERT_TRUE(r.ok()) << r.status();
  }
  auto lease = client_->LeaseGrant(5);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(client_->LeaseKeepAlive(*lease).ok());
  EXPECT_EQ(client_->GetPrefix("/f/")->kvs.size(), 5u);
  // The watch moved to another member and missed nothing.
  ASSERT_TRUE(got.WaitFor(5));
  watch->Cancel();
  std::lock_guard lock(got.mu);
  EXPECT_EQ(got.events, (std::vector<std::string>{"put /f/1=a", "put /f/2=b", "put /f/3=b",
                                                  "put /f/4=b", "put /f/5=b"}));
}

TEST_F(LabEtcdClient, QuorumLostIsUnavailableNamingEveryEndpointAndHealsWhenMembersReturn) {
  ASSERT_TRUE(client_->Put("/q/before", "1").ok());
  cluster_.StopMember(1);
  cluster_.StopMember(2);
  // The lone member loses its leader within an election timeout.
  absl::Status st;
  ASSERT_TRUE(Eventually(
      [&] {
        auto r = client_->CreateIfAbsent("/q/lease", "me", 0);
        st = r.status();
        // Members going down first fail calls in passing; then the one
        // left answers that it has no leader.
        return !r.ok() && absl::StrContains(st.message(), "no quorum");
      },
      std::chrono::seconds(20)))
      << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  for (const auto& e : cluster_.endpoints())
    EXPECT_NE(st.message().find(e), std::string::npos) << st;
  // One line a person can act on; each member's own answer is in the log.
  EXPECT_NE(st.message().find("the lab's registry (etcd) has no quorum: 1 of 3 members answer"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("leases and lab boards are unavailable until it recovers"),
            std::string::npos)
      << st;
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st;
  ASSERT_TRUE(cluster_.StartMember(1));
  ASSERT_TRUE(cluster_.StartMember(2));
  // The same client, not rebuilt, is served again.
  ASSERT_TRUE(Eventually([&] { return client_->CreateIfAbsent("/q/lease", "me", 0).ok(); },
                         std::chrono::seconds(20)));
  EXPECT_EQ((*client_->Get("/q/before"))->value, "1");
}

EtcdOptions With(std::vector<std::string> endpoints) {
  EtcdOptions o;
  o.endpoints = std::move(endpoints);
  return o;
}

TEST(LabEtcdClientConfig, EndpointsAreCheckedAndAnEmptyListRefused) {
  EXPECT_FALSE(EtcdClient::Connect(With({})).ok());
  auto bad = EtcdClient::Connect(With({"127.0.0.1"}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HOST:PORT"), std::string::npos);
  EXPECT_TRUE(EtcdClient::Connect(With({"http://127.0.0.1:2379"})).ok());
  auto mixed = EtcdClient::Connect(With({"https://127.0.0.1:2379", "http://127.0.0.1:2380"}));
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("every one https://"), std::string::npos)
      << mixed.status();
  // TLS without the files it needs, or with one that is not there: named.
  auto no_ca = EtcdClient::Connect(With({"https://127.0.0.1:2379"}));
  ASSERT_FALSE(no_ca.ok());
  EXPECT_NE(no_ca.status().message().find("lab.etcd_ca"), std::string::npos) << no_ca.status();
  EtcdOptions missing;
  missing.endpoints = {"https://127.0.0.1:2379"};
  missing.ca_file = missing.cert_file = missing.key_file = "/nonexistent/ca.pem";
  auto gone = EtcdClient::Connect(missing);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("/nonexistent/ca.pem: cannot be read"), std::string::npos)
      << gone.status();
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
}

// No member up at all: it says so, in one line naming them.
TEST(LabEtcdClientAlone, NoMemberUpIsUnavailableSayingNoneAnswers) {
  EtcdOptions o;
  o.endpoints = {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"};
  o.request_timeout_ms = 2000;
  auto client = EtcdClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto r = (*client)->Get("/q/any");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("the lab's registry (etcd) cannot be reached: none of its 3 "
                                      "members answers (127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:3)"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status();
}

}  // namespace
}  // namespace fwai::lab
