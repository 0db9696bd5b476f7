// Fronts of a lab: fwaids with no boards of their own that list every board
// of the lab and lease them through etcd. Real etcd, real fwaid processes.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "fwai/v1/hardware.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "server/lab/lab_leases.h"
#include "server/lab/registry.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"

namespace fwai::lab {
namespace {

using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;
using fwai::testing::RunCommand;
using Clock = std::chrono::steady_clock;
namespace pb = ::fwai::v1;

std::string LabYaml(EtcdCluster& etcd, const std::string& node, int ttl_s) {
  return "lab:\n" + etcd.LabEtcdYaml(node) + "  node: " + node +
         "\n  ttl_s: " + std::to_string(ttl_s) + "\n";
}

std::string BenchYaml(EtcdCluster& etcd, const std::string& node, const std::string& board,
                      int ttl_s) {
  return LabYaml(etcd, node, ttl_s) + "hardware:\n  boards:\n    - {id: " + board +
         ", kind: simulated, machine: stm32vldiscovery, tags: [stm32f1, bench:" + node + "]}\n";
}

std::string FrontYaml(EtcdCluster& etcd, const std::string& node) {
  return LabYaml(etcd, node, 5) + "hardware:\n  default_simulated_board: false\n";
}

struct Acquired {
  grpc::Status status;
  pb::Lease lease;
};

Acquired Acquire(Daemon& d, const std::string& board, const std::vector<std::string>& tags,
                 int ttl_s, const std::string& session, int wait_s = 0) {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(wait_s + 30));
  pb::AcquireRequest req;
  req.set_device_id(board);
  for (const auto& t : tags) {
    auto* tag = req.add_tags();
    auto c = t.find(':');
    tag->set_key(t.substr(0, c));
    if (c != std::string::npos) tag->set_value(t.substr(c + 1));
  }
  req.set_ttl_s(ttl_s);
  req.set_wait_s(wait_s);
  req.set_session_id(session);
  Acquired out;
  out.status = hw->Acquire(&ctx, req, &out.lease);
  return out;
}

grpc::Status Release(Daemon& d, const std::string& lease_id, const std::string& board = "") {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  pb::ReleaseRequest req;
  req.set_lease_id(lease_id);
  req.set_device_id(board);
  pb::ReleaseResponse resp;
  return hw->Release(&ctx, req, &resp);
}

pb::ListDevicesResponse List(Daemon& d) {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  pb::ListDevicesResponse resp;
  (void)hw->ListDevices(&ctx, {}, &resp);
  return resp;
}

pb::WhoResponse Who(Daemon& d) {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  pb::WhoResponse resp;
  (void)hw->Who(&ctx, {}, &resp);
  return resp;
}

// The session ids of the lab's waiters, in the order `fwai hw who` lists them.
std::vector<std::string> WaitingSessions(Daemon& d) {
  std::vector<std::string> out;
  const pb::WhoResponse who = Who(d);
  for (const auto& w : who.waiters()) out.push_back(w.session_id());
  return out;
}

const pb::Device* Find(const pb::ListDevicesResponse& r, const std::string& id) {
  for (const auto& d : r.devices()) {
    if (d.id() == id) return &d;
  }
  return nullptr;
}

class LabFront : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    bench1_ = std::make_unique<Daemon>(nullptr, BenchYaml(cluster_, "bench1", "b1", 3), false);
    bench2_ = std::make_unique<Daemon>(nullptr, BenchYaml(cluster_, "bench2", "b2", 3), false);
    front1_ = std::make_unique<Daemon>(nullptr, FrontYaml(cluster_, "front1"), false);
    front2_ = std::make_unique<Daemon>(nullptr, FrontYaml(cluster_, "front2"), false);
    for (Daemon* d : {bench1_.get(), bench2_.get(), front1_.get(), front2_.get()})
      ASSERT_TRUE(d->Start()) << d->log();
    ASSERT_TRUE(Eventually(
        [&] {
          auto r = List(*front1_);
          return Find(r, "b1") && Find(r, "b2");
        },
        std::chrono::seconds(10)))
        << front1_->log();
  }

  EtcdCluster cluster_{3};
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<Daemon> bench1_, bench2_, front1_, front2_;
};

TEST_F(LabFront, HwLsListsEveryBoardOfTheLabWithItsNode) {
  std::string out, err;
  ASSERT_EQ(
      RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", front1_->address(), "hw", "ls"},
                 &out, &err),
      0)
      << err;
  EXPECT_NE(out.find("NODE"), std::string::npos) << out;
  // One line per board, each with its node.
  bool b1 = false, b2 = false;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    b1 = b1 || (line.rfind("bench1 ", 0) == 0 && line.find(" b1 ") != std::string::npos);
    b2 = b2 || (line.rfind("bench2 ", 0) == 0 && line.find(" b2 ") != std::string::npos);
  }
  EXPECT_TRUE(b1 && b2) << out;
  auto r = List(*front1_);
  EXPECT_EQ(r.devices_size(), 2) << "a front has no boards of its own";
  EXPECT_EQ(Find(r, "b2")->node(), "bench2");
  EXPECT_EQ(Find(r, "b2")->state(), "remote");
  // A bench sees the other bench's board too.
  EXPECT_EQ(Find(List(*bench1_), "b2")->node(), "bench2");
  EXPECT_EQ(Find(List(*bench1_), "b1")->node(), "bench1");
}

TEST_F(LabFront, LeaseByTagAcrossBenchesHoldsTheBoardForTheWholeLab) {
  auto got = Acquire(*front1_, "", {"bench:bench2"}, 60, "s1");
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.lease.device_id(), "b2");
  EXPECT_EQ(got.lease.node(), "bench2");
  auto key = etcd_->Get("/fwai/leases/b2");
  ASSERT_TRUE(key.ok() && key->has_value());
  EXPECT_NE((*key)->lease, 0) << "a lab lease is bound to an etcd lease";
  // The other front, and a local user of the bench itself, find it held.
  auto other = Acquire(*front2_, "b2", {}, 60, "s2");
  EXPECT_EQ(other.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << other.status.error_message();
  EXPECT_NE(other.status.error_message().find("held by"), std::string::npos)
      << other.status.error_message();
  EXPECT_NE(other.status.error_message().find("front1"), std::string::npos)
      << other.status.error_message();
  auto local = Acquire(*bench2_, "b2", {}, 60, "s3");
  EXPECT_EQ(local.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << local.status.error_message();
  EXPECT_NE(Find(List(*front2_), "b2")->holder().find("via front1"), std::string::npos);
  EXPECT_NE(Find(List(*bench2_), "b2")->holder().find("via front1"), std::string::npos);
  // Released through the front: free for everyone at once.
  ASSERT_TRUE(Release(*front1_, got.lease.lease_id()).ok());
  EXPECT_FALSE(etcd_->Get("/fwai/leases/b2")->has_value());
  auto mine = Acquire(*bench2_, "b2", {}, 60, "s3");
  ASSERT_TRUE(mine.status.ok()) << mine.status.error_message();
  // ...and now the bench's own lease keeps the fronts out.
  auto blocked = Acquire(*front1_, "b2", {}, 60, "s1");
  EXPECT_EQ(blocked.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << blocked.status.error_message();
  ASSERT_TRUE(Release(*bench2_, mine.lease.lease_id()).ok());
  EXPECT_TRUE(Acquire(*front1_, "b2", {}, 60, "s1").status.ok());
}

TEST_F(LabFront, TenClientsRacingThroughTwoFrontsHaveExactlyOneWinner) {
  constexpr int kClients = 10;
  std::vector<Acquired> results(kClients);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      ready++;
      while (ready < kClients) std::this_thread::yield();
      results[i] = Acquire(i % 2 ? *front2_ : *front1_, "b1", {}, 60, "racer-" + std::to_string(i));
    });
  }
  for (auto& t : threads) t.join();
  int winners = 0;
  for (const auto& r : results) {
    if (r.status.ok()) {
      ++winners;
    } else {
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << r.status.error_message();
    }
  }
  EXPECT_EQ(winners, 1);
}

TEST_F(LabFront, ALeaseNotRenewedLapsesForTheWholeLab) {
  auto got = Acquire(*front1_, "b1", {}, 2, "short");
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  // Renewed once through its front.
  {
    auto hw = pb::Hardware::NewStub(front1_->channel());
    grpc::ClientContext ctx;
    pb::RenewRequest req;
    req.set_lease_id(got.lease.lease_id());
    pb::Lease out;
    ASSERT_TRUE(hw->Renew(&ctx, req, &out).ok());
  }
  EXPECT_TRUE(etcd_->Get("/fwai/leases/b1")->has_value());
  // Then left alone: etcd ends it; the other front can take the board.
  ASSERT_TRUE(Eventually([&] { return !etcd_->Get("/fwai/leases/b1")->has_value(); },
                         std::chrono::seconds(10)));
  EXPECT_TRUE(Acquire(*front2_, "b1", {}, 60, "next").status.ok());
}

TEST_F(LabFront, QuorumLostMakesNewLeasesUnavailableNamingTheEndpoints) {
  cluster_.StopMember(1);
  cluster_.StopMember(2);
  Acquired got;
  ASSERT_TRUE(Eventually(
      [&] {
        got = Acquire(*front1_, "b1", {}, 60, "q");
        // Until the member left knows it has no leader, it may not answer at all.
        return got.status.error_code() == grpc::StatusCode::UNAVAILABLE &&
               got.status.error_message().find("no quorum") != std::string::npos;
      },
      std::chrono::seconds(30)))
      << got.status.error_message();
  for (const auto& e : cluster_.endpoints())
    EXPECT_NE(got.status.error_message().find(e), std::string::npos) << e;
  // One line a person can act on; what each member answered behind --verbose.
  EXPECT_NE(got.status.error_message().find("has no quorum: 1 of 3 members answer"),
            std::string::npos)
      << got.status.error_message();
  EXPECT_EQ(got.status.error_message().find('\n'), std::string::npos) << got.status.error_message();
  const std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  std::string out, err, vout, verr;
  ASSERT_EQ(RunCommand({fwai, "--daemon", front1_->address(), "hw", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(
      err.find(
          "warning: the lab's registry cannot be read (the lab's registry (etcd) has no quorum"),
      std::string::npos)
      << err;
  EXPECT_NE(err.find("fwai hw ls --verbose"), std::string::npos) << err;
  ASSERT_EQ(
      RunCommand({fwai, "--daemon", front1_->address(), "hw", "ls", "--verbose"}, &vout, &verr), 0)
      << verr;
  // The member that is up has no leader; the stopped ones do not answer at all.
  EXPECT_NE(verr.find("  etcd " + cluster_.endpoint(0) + ": "), std::string::npos) << verr;
  EXPECT_NE(verr.find("no leader"), std::string::npos) << verr;
  for (int i : {1, 2})
    EXPECT_NE(verr.find("  etcd " + cluster_.endpoint(i) + ": "), std::string::npos) << verr;
  // etcd back: the same fronts lease again, no restart.
  ASSERT_TRUE(cluster_.StartMember(1));
  ASSERT_TRUE(cluster_.StartMember(2));
  ASSERT_TRUE(Eventually([&] { return Acquire(*front1_, "b1", {}, 60, "q").status.ok(); },
                         std::chrono::seconds(20)));
  // The benches' registrations (whose etcd leases may have lapsed meanwhile)
  // come back: the lab view converges, no fwaid restarted.
  ASSERT_TRUE(Eventually(
      [&] {
        auto r = List(*front2_);
        return r.lab_error().empty() && Find(r, "b1") && Find(r, "b2");
      },
      std::chrono::seconds(20)));
  EXPECT_TRUE(bench1_->running() && bench2_->running() && front1_->running() && front2_->running());
}

TEST_F(LabFront, AKilledBenchsBoardsLeaveTheFrontsViewWithinTtl) {
  bench1_->Kill9();
  const auto killed = Clock::now();
  ASSERT_TRUE(
      Eventually([&] { return Find(List(*front1_), "b1") == nullptr; }, std::chrono::seconds(15)));
  EXPECT_LE(std::chrono::duration<double>(Clock::now() - killed).count(), 3 + 1.0);
  EXPECT_NE(Find(List(*front1_), "b2"), nullptr);
  ASSERT_TRUE(bench1_->Start());
  EXPECT_TRUE(
      Eventually([&] { return Find(List(*front1_), "b1") != nullptr; }, std::chrono::seconds(10)));
}

// The lab's wait queue: ten clients through two fronts wait for one board;
// it goes to one at a time, in the order they were queued (the order etcd
// created their keys in, which `hw who` shows).
TEST_F(LabFront, TenWaitersThroughTwoFrontsGetTheBoardOneAtATimeInQueueOrder) {
  auto first = Acquire(*front1_, "b1", {}, 60, "holder");
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  constexpr int kClients = 10;
  std::mutex mu;
  std::vector<std::string> served;  // sessions, in the order they got the board
  std::atomic<int> holding{0};
  std::atomic<bool> overlap{false};
  std::vector<Acquired> results(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      Daemon& front = i % 2 ? *front2_ : *front1_;
      const std::string session = "w" + std::to_string(i);
      results[i] = Acquire(front, "b1", {}, 60, session, /*wait_s=*/120);
      if (!results[i].status.ok()) return;
      if (holding.fetch_add(1) != 0) overlap = true;
      // The lab agrees: the board's lease key is this client's.
      auto key = etcd_->Get("/fwai/leases/b1");
      if (!key.ok() || !key->has_value() ||
          (*key)->value.find(results[i].lease.lease_id()) == std::string::npos) {
        overlap = true;
      }
      {
        std::lock_guard lock(mu);
        served.push_back(session);
      }
      holding.fetch_sub(1);
      (void)Release(front, results[i].lease.lease_id());
    });
  }
  // Every client waits in the lab's queue (seen through either front).
  std::vector<std::string> queued;
  ASSERT_TRUE(Eventually(
      [&] {
        queued = WaitingSessions(*front2_);
        return queued.size() == kClients;
      },
      std::chrono::seconds(30)))
      << queued.size() << " waiting\n"
      << front1_->log();
  {
    pb::WhoResponse who = Who(*front1_);
    ASSERT_EQ(who.waiters_size(), kClients);
    for (int i = 0; i < kClients; ++i) {
      const auto& w = who.waiters(i);
      EXPECT_EQ(w.position(), i + 1);
      EXPECT_EQ(w.wants(), "b1");
      EXPECT_TRUE(w.node() == "front1" || w.node() == "front2") << w.node();
      EXPECT_NE(w.holder().find(" via " + w.node()), std::string::npos) << w.holder();
      ASSERT_EQ(w.device_ids_size(), 1);
      EXPECT_EQ(w.device_ids(0), "b1");
    }
    // The holder, with the bench the board is on and the front it came through.
    bool holder = false;
    for (const auto& l : who.leases()) {
      if (l.lease_id() != first.lease.lease_id()) continue;
      holder = true;
      EXPECT_EQ(l.node(), "bench1");
      EXPECT_NE(l.holder().find("via front1"), std::string::npos) << l.holder();
      EXPECT_GT(l.expires_us(), l.acquired_us());
    }
    EXPECT_TRUE(holder);
  }
  // A caller that does not wait cannot jump the queue, even when the board is free.
  ASSERT_TRUE(Release(*front1_, first.lease.lease_id()).ok());
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i)
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
  EXPECT_FALSE(overlap) << "two holders at once";
  EXPECT_EQ(served, queued);
  EXPECT_TRUE(WaitingSessions(*front1_).empty());
  auto left = etcd_->GetPrefix("/fwai/queue/");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->kvs.empty()) << "every waiter left the queue when served";
}

TEST_F(LabFront, ANonWaiterCannotTakeAFreeBoardSomeoneWaitsFor) {
  // b2 is free; someone of the lab waits for any board tagged bench:bench2.
  LabWaiter w;
  w.tags = {"bench:bench2"};
  w.wants = "tags bench:bench2";
  w.identity = w.holder = "carol";
  w.via = "front9";
  ASSERT_TRUE(etcd_->Put("/fwai/queue/tags:bench:bench2/w-carol", WaiterToJson(w)).ok());
  ASSERT_EQ(WaitingSessions(*front1_).size(), 1u);
  // Through a front, and by a local user of the bench itself: refused, naming the queue.
  for (Daemon* d : {front1_.get(), bench2_.get()}) {
    auto got = Acquire(*d, "b2", {}, 60, "jumper");
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << got.status.error_message();
    EXPECT_NE(got.status.error_message().find("wait"), std::string::npos)
        << got.status.error_message();
  }
  EXPECT_FALSE(etcd_->Get("/fwai/leases/b2")->has_value());
  // b1 is nobody's wish: taken at once.
  EXPECT_TRUE(Acquire(*front1_, "b1", {}, 60, "jumper").status.ok());
  // The waiter gone, b2 is anyone's.
  ASSERT_TRUE(etcd_->Delete("/fwai/queue/tags:bench:bench2/w-carol").ok());
  EXPECT_TRUE(Acquire(*front2_, "b2", {}, 60, "jumper").status.ok());
}

TEST_F(LabFront, AWaiterThatGoesAwayLeavesTheLabsQueue) {
  auto first = Acquire(*front1_, "b1", {}, 60, "holder");
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  // A client that gives up (its call is cancelled) leaves at once.
  {
    auto hw = pb::Hardware::NewStub(front1_->channel());
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(60);
    req.set_wait_s(120);
    req.set_session_id("quitter");
    pb::Lease out;
    std::thread t([&] { (void)hw->Acquire(&ctx, req, &out); });
    ASSERT_TRUE(Eventually([&] { return WaitingSessions(*front2_).size() == 1; },
                           std::chrono::seconds(10)));
    ctx.TryCancel();
    t.join();
    EXPECT_TRUE(
        Eventually([&] { return WaitingSessions(*front2_).empty(); }, std::chrono::seconds(5)));
  }
  // A front killed while its client waits: its waiter leaves within the
  // front's TTL (5 s), and the next waiter gets the board.
  std::thread doomed([&] { (void)Acquire(*front2_, "b1", {}, 60, "doomed", 120); });
  ASSERT_TRUE(
      Eventually([&] { return WaitingSessions(*front1_).size() == 1; }, std::chrono::seconds(10)));
  Acquired next;
  std::thread t([&] { next = Acquire(*front1_, "b1", {}, 60, "next", 120); });
  ASSERT_TRUE(
      Eventually([&] { return WaitingSessions(*front1_).size() == 2; }, std::chrono::seconds(10)));
  EXPECT_EQ(WaitingSessions(*front1_), (std::vector<std::string>{"doomed", "next"}));
  front2_->Kill9();
  const auto killed = Clock::now();
  ASSERT_TRUE(
      Eventually([&] { return WaitingSessions(*front1_) == std::vector<std::string>{"next"}; },
                 std::chrono::seconds(15)));
  EXPECT_LE(std::chrono::duration<double>(Clock::now() - killed).count(), 5 + 2.0);
  ASSERT_TRUE(Release(*front1_, first.lease.lease_id()).ok());
  t.join();
  doomed.join();
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.lease.device_id(), "b1");
}

TEST_F(LabFront, ALeaseOnAKilledBenchEndsWithTheReason) {
  // Held with --hold through a front (renewed every 2 s), and taken plainly.
  auto hw = pb::Hardware::NewStub(front1_->channel());
  grpc::ClientContext hold_ctx;
  hold_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  pb::AcquireRequest req;
  req.set_device_id("b2");
  req.set_ttl_s(6);
  req.set_session_id("held");
  auto hold = hw->Hold(&hold_ctx, req);
  pb::Lease held;
  ASSERT_TRUE(hold->Read(&held));
  EXPECT_EQ(held.node(), "bench2");
  auto plain = Acquire(*front2_, "b1", {}, 60, "plain");
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  bench2_->Kill9();
  // The holder hears why when its lease ends: the bench left the lab.
  while (hold->Read(&held)) {
  }
  grpc::Status ended = hold->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::NOT_FOUND) << ended.error_message();
  EXPECT_NE(ended.error_message().find("bench bench2 left the lab"), std::string::npos)
      << ended.error_message();
  // A renewal of a lease on that bench's board says the same; the board's lease key is gone.
  EXPECT_FALSE(etcd_->Get("/fwai/leases/b2")->has_value());
  // A lease on the other bench's board is untouched.
  auto hw2 = pb::Hardware::NewStub(front2_->channel());
  grpc::ClientContext rctx;
  pb::RenewRequest rr;
  rr.set_lease_id(plain.lease.lease_id());
  pb::Lease renewed;
  EXPECT_TRUE(hw2->Renew(&rctx, rr, &renewed).ok());
}

// A local user of a bench who waits for one of its boards held through a
// front waits in the lab's queue, in turn with a waiter through another
// front (as `fwai hw who` lists them on the bench), instead of being refused
// at once; the board is theirs, here and in the lab, when the waiter before
// them is done with it.
TEST_F(LabFront, ALocalUserOfABenchWaitsInTheLabsQueueForItsBoardHeldThroughAFront) {
  auto first = Acquire(*front1_, "b1", {}, 60, "holder");
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  // Without waiting the local user is refused at once, naming the holder.
  auto now = Acquire(*bench1_, "b1", {}, 60, "local");
  EXPECT_EQ(now.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(now.status.error_message().find("front1"), std::string::npos)
      << now.status.error_message();
  Acquired remote, local;
  std::thread via_front(
      [&] { remote = Acquire(*front2_, "b1", {}, 60, "remote", /*wait_s=*/120); });
  ASSERT_TRUE(
      Eventually([&] { return WaitingSessions(*bench1_).size() == 1; }, std::chrono::seconds(30)));
  std::thread on_bench([&] { local = Acquire(*bench1_, "b1", {}, 60, "local", /*wait_s=*/120); });
  std::vector<std::string> queued;
  ASSERT_TRUE(Eventually(
      [&] {
        queued = WaitingSessions(*bench1_);
        return queued.size() == 2;
      },
      std::chrono::seconds(30)))
      << queued.size() << " waiting\n"
      << bench1_->log();
  EXPECT_EQ(queued, (std::vector<std::string>{"remote", "local"}));
  {
    const pb::WhoResponse who = Who(*front1_);
    ASSERT_EQ(who.waiters_size(), 2);
    EXPECT_EQ(who.waiters(1).node(), "bench1");
    EXPECT_EQ(who.waiters(1).position(), 2);
  }
  // The holder releases: the waiter through the front is served first.
  ASSERT_TRUE(Release(*front1_, first.lease.lease_id()).ok());
  via_front.join();
  ASSERT_TRUE(remote.status.ok()) << remote.status.error_message();
  EXPECT_EQ(WaitingSessions(*bench1_), std::vector<std::string>{"local"});
  // It is done: the local user gets the board, held here and in the lab.
  ASSERT_TRUE(Release(*front2_, remote.lease.lease_id()).ok());
  on_bench.join();
  ASSERT_TRUE(local.status.ok()) << local.status.error_message() << "\n" << bench1_->log();
  EXPECT_EQ(local.lease.device_id(), "b1");
  EXPECT_EQ(local.lease.node(), "bench1");
  auto key = etcd_->Get("/fwai/leases/b1");
  ASSERT_TRUE(key.ok() && key->has_value());
  EXPECT_NE((*key)->value.find(local.lease.lease_id()), std::string::npos) << (*key)->value;
  const pb::Device* b1 = Find(List(*bench1_), "b1");
  ASSERT_NE(b1, nullptr);
  EXPECT_FALSE(b1->holder().empty());
  EXPECT_EQ(Acquire(*front2_, "b1", {}, 60, "late").status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(WaitingSessions(*bench1_).empty());
  // Released here, it is free for the lab again.
  ASSERT_TRUE(Release(*bench1_, local.lease.lease_id()).ok());
  EXPECT_TRUE(Acquire(*front2_, "b1", {}, 60, "late").status.ok());
}

// The queue's bands, on LabLeases itself: people before CI, first come first
// served within a band; one band for all with interactive_first off.
class LabQueueBands : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    LabBoard b;
    b.id = "b1";
    b.node = "bench1";
    b.health = "good";
    b.tags = {"stm32f1"};
    ASSERT_TRUE(etcd_->Put("/fwai/nodes/bench1", R"({"node":"bench1"})").ok());
    ASSERT_TRUE(etcd_->Put("/fwai/boards/bench1/b1", BoardToJson(b)).ok());
  }

  // Holds b1, queues {name, ci} in that order (each seen queued before the
  // next comes), frees b1, and returns who got it in turn.
  std::vector<std::string> Serve(const std::vector<std::pair<std::string, bool>>& waiters,
                                 bool interactive_first) {
    LabLeasesOptions o;
    o.queue_ttl_s = 5;
    o.interactive_first = interactive_first;
    LabLeases front1(*etcd_, "front1", o), front2(*etcd_, "front2", o);
    LabLeases::Request hold;
    hold.board = "b1";
    hold.identity = hold.holder = "holder";
    hold.ttl_s = 60;
    auto h = front1.Acquire(hold, nullptr);
    EXPECT_TRUE(h.ok()) << h.status();
    std::mutex mu;
    std::vector<std::string> served;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < waiters.size(); ++i) {
      threads.emplace_back([&, i] {
        LabLeases& via = i % 2 ? front2 : front1;
        LabLeases::Request r;
        r.tags = {"stm32f1"};
        r.identity = r.holder = waiters[i].first;
        r.ci = waiters[i].second;
        r.ttl_s = 60;
        r.wait_s = 60;
        auto l = via.Acquire(r, nullptr);
        if (!l.ok()) return;
        {
          std::lock_guard lock(mu);
          served.push_back(waiters[i].first);
        }
        (void)via.Release(l->lease_id, "", r.identity, false, false);
      });
      EXPECT_TRUE(Eventually([&] { return front1.Queue().ok() && front1.Queue()->size() == i + 1; },
                             std::chrono::seconds(10)));
    }
    auto q = front2.Queue();
    EXPECT_TRUE(q.ok());
    std::vector<std::string> listed;
    for (const auto& w : *q) listed.push_back(w.holder);
    EXPECT_TRUE(front1.Release(h->lease_id, "", "holder", false, false).ok());
    for (auto& t : threads) t.join();
    EXPECT_EQ(listed, served) << "served in the order the queue lists";
    return served;
  }

  EtcdCluster cluster_{1};
  std::unique_ptr<EtcdClient> etcd_;
};

TEST_F(LabQueueBands, PeopleGoBeforeCiAndEachBandIsFirstComeFirstServed) {
  EXPECT_EQ(Serve({{"ci1", true}, {"alice", false}, {"ci2", true}, {"bob", false}}, true),
            (std::vector<std::string>{"alice", "bob", "ci1", "ci2"}));
}

TEST_F(LabQueueBands, WithoutInteractiveFirstOneQueueForAll) {
  EXPECT_EQ(Serve({{"ci1", true}, {"alice", false}, {"ci2", true}, {"bob", false}}, false),
            (std::vector<std::string>{"ci1", "alice", "ci2", "bob"}));
}

}  // namespace
}  // namespace fwai::lab
