// Fronts of a lab: fwaids with no boards of their own that list every board
// of the lab and lease them through etcd. Real etcd, real fwaid processes.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <sstream>
#include <chrono>
#include <thread>

#include "fwai/v1/hardware.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "server/lab/registry.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"

namespace fwai::lab {
namespace {

using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::RunCommand;
using Clock = std::chrono::steady_clock;
namespace pb = ::fwai::v1;

template <typename F>
bool Eventually(F cond, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

std::string LabYaml(const EtcdCluster& etcd, const std::string& node, int ttl_s) {
  std::string eps;
  for (const auto& e : etcd.endpoints()) eps += (eps.empty() ? "" : ", ") + ("http://" + e);
  return "lab:\n  etcd: [" + eps + "]\n  node: " + node + "\n  ttl_s: " + std::to_string(ttl_s) + "\n";
}

std::string BenchYaml(const EtcdCluster& etcd, const std::string& node, const std::string& board, int ttl_s) {
  return LabYaml(etcd, node, ttl_s) + "hardware:\n  boards:\n    - {id: " + board +
         ", kind: simulated, machine: stm32vldiscovery, tags: [stm32f1, bench:" + node + "]}\n";
}

std::string FrontYaml(const EtcdCluster& etcd, const std::string& node) {
  return LabYaml(etcd, node, 5) + "hardware:\n  default_simulated_board: false\n";
}

struct Acquired {
  grpc::Status status;
  pb::Lease lease;
};

Acquired Acquire(Daemon& d, const std::string& board, const std::vector<std::string>& tags, int ttl_s,
                 const std::string& session, int wait_s = 0) {
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
    etcd_ = *EtcdClient::Connect({cluster_.endpoints()});
    bench1_ = std::make_unique<Daemon>(nullptr, BenchYaml(cluster_, "bench1", "b1", 3), false);
    bench2_ = std::make_unique<Daemon>(nullptr, BenchYaml(cluster_, "bench2", "b2", 3), false);
    front1_ = std::make_unique<Daemon>(nullptr, FrontYaml(cluster_, "front1"), false);
    front2_ = std::make_unique<Daemon>(nullptr, FrontYaml(cluster_, "front2"), false);
    for (Daemon* d : {bench1_.get(), bench2_.get(), front1_.get(), front2_.get()}) ASSERT_TRUE(d->Start()) << d->log();
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
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", front1_->address(), "hw", "ls"}, &out, &err),
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
  EXPECT_EQ(other.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << other.status.error_message();
  EXPECT_NE(other.status.error_message().find("held by"), std::string::npos) << other.status.error_message();
  EXPECT_NE(other.status.error_message().find("front1"), std::string::npos) << other.status.error_message();
  auto local = Acquire(*bench2_, "b2", {}, 60, "s3");
  EXPECT_EQ(local.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << local.status.error_message();
  EXPECT_NE(Find(List(*front2_), "b2")->holder().find("via front1"), std::string::npos);
  EXPECT_NE(Find(List(*bench2_), "b2")->holder().find("via front1"), std::string::npos);
  // Released through the front: free for everyone at once.
  ASSERT_TRUE(Release(*front1_, got.lease.lease_id()).ok());
  EXPECT_FALSE(etcd_->Get("/fwai/leases/b2")->has_value());
  auto mine = Acquire(*bench2_, "b2", {}, 60, "s3");
  ASSERT_TRUE(mine.status.ok()) << mine.status.error_message();
  // ...and now the bench's own lease keeps the fronts out.
  auto blocked = Acquire(*front1_, "b2", {}, 60, "s1");
  EXPECT_EQ(blocked.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << blocked.status.error_message();
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
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << r.status.error_message();
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
  ASSERT_TRUE(Eventually([&] { return !etcd_->Get("/fwai/leases/b1")->has_value(); }, std::chrono::seconds(10)));
  EXPECT_TRUE(Acquire(*front2_, "b1", {}, 60, "next").status.ok());
}

TEST_F(LabFront, QuorumLostMakesNewLeasesUnavailableNamingTheEndpoints) {
  cluster_.StopMember(1);
  cluster_.StopMember(2);
  Acquired got;
  ASSERT_TRUE(Eventually(
      [&] {
        got = Acquire(*front1_, "b1", {}, 60, "q");
        return got.status.error_code() == grpc::StatusCode::UNAVAILABLE;
      },
      std::chrono::seconds(15)))
      << got.status.error_message();
  for (const auto& e : cluster_.endpoints()) EXPECT_NE(got.status.error_message().find(e), std::string::npos) << e;
  // etcd back: the same fronts lease again, no restart.
  ASSERT_TRUE(cluster_.StartMember(1));
  ASSERT_TRUE(cluster_.StartMember(2));
  ASSERT_TRUE(Eventually([&] { return Acquire(*front1_, "b1", {}, 60, "q").status.ok(); }, std::chrono::seconds(20)));
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
  ASSERT_TRUE(Eventually([&] { return Find(List(*front1_), "b1") == nullptr; }, std::chrono::seconds(15)));
  EXPECT_LE(std::chrono::duration<double>(Clock::now() - killed).count(), 3 + 1.0);
  EXPECT_NE(Find(List(*front1_), "b2"), nullptr);
  ASSERT_TRUE(bench1_->Start());
  EXPECT_TRUE(Eventually([&] { return Find(List(*front1_), "b1") != nullptr; }, std::chrono::seconds(10)));
}

}  // namespace
}  // namespace fwai::lab
