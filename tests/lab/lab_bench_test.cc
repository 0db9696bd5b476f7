// Benches of a lab: real fwaid processes registering their boards in a real
// three-member etcd cluster.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
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
using fwai::testing::Eventually;
using Clock = std::chrono::steady_clock;

// fwaid.yaml of a bench with one simulated board.
std::string BenchYaml(EtcdCluster& etcd, const std::string& node, const std::string& board,
                      int ttl_s) {
  return "lab:\n" + etcd.LabEtcdYaml(node) + "  node: " + node +
         "\n  advertise: tls:127.0.0.1:7443\n  ttl_s: " + std::to_string(ttl_s) +
         "\nhardware:\n  boards:\n    - {id: " + board +
         ", kind: simulated, machine: stm32vldiscovery, tags: [stm32f1, bench:" + node + "]}\n";
}

class LabBench : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
  }
  // The boards of `node` in the registry now (empty on an etcd error too).
  std::vector<LabBoard> BoardsOf(const std::string& node) {
    std::vector<LabBoard> out;
    auto view = ReadLab(*etcd_);
    if (!view.ok()) return out;
    for (const auto& b : view->boards) {
      if (b.node == node) out.push_back(b);
    }
    return out;
  }
  bool NodeRegistered(const std::string& node) {
    auto view = ReadLab(*etcd_);
    if (!view.ok()) return false;
    for (const auto& n : view->nodes) {
      if (n.node == node) return true;
    }
    return false;
  }

  EtcdCluster cluster_{3};
  std::unique_ptr<EtcdClient> etcd_;
};

TEST_F(LabBench, RegistersItsBoardsFollowsHealthAndLeavesWithinTtlWhenKilled) {
  constexpr int kTtl = 3;
  Daemon bench(nullptr, BenchYaml(cluster_, "bench1", "b1", kTtl), false);
  ASSERT_TRUE(bench.Start()) << bench.log();
  ASSERT_TRUE(Eventually([&] { return BoardsOf("bench1").size() == 1; }, std::chrono::seconds(10)))
      << bench.log();
  LabBoard b = BoardsOf("bench1")[0];
  EXPECT_EQ(b.id, "b1");
  EXPECT_EQ(b.kind, "simulated");
  EXPECT_EQ(b.health, "good");
  EXPECT_NE(std::find(b.tags.begin(), b.tags.end(), "stm32f1"), b.tags.end());
  auto node = etcd_->Get("/fwai/nodes/bench1");
  ASSERT_TRUE(node.ok() && node->has_value());
  EXPECT_NE((*node)->value.find("\"advertise\":\"tls:127.0.0.1:7443\""), std::string::npos)
      << (*node)->value;
  EXPECT_NE((*node)->value.find("\"pid\":" + std::to_string(bench.pid())), std::string::npos);
  // Everything the bench wrote is bound to one lease of the configured TTL.
  ASSERT_NE((*node)->lease, 0);
  EXPECT_EQ((*etcd_->Get("/fwai/boards/bench1/b1"))->lease, (*node)->lease);
  auto ttl = etcd_->LeaseTimeToLive((*node)->lease);
  ASSERT_TRUE(ttl.ok());
  EXPECT_LE(*ttl, kTtl);

  // A health change reaches the registry.
  auto hw = fwai::v1::Hardware::NewStub(bench.channel());
  {
    grpc::ClientContext ctx;
    fwai::v1::SetHealthRequest req;
    req.set_device_id("b1");
    req.set_health("maintenance");
    req.set_reason("rewiring the probe");
    fwai::v1::SetHealthResponse resp;
    auto s = hw->SetHealth(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(Eventually(
      [&] {
        auto bs = BoardsOf("bench1");
        return bs.size() == 1 && bs[0].health == "maintenance" &&
               bs[0].health_reason == "rewiring the probe";
      },
      std::chrono::seconds(5)));

  // Killed: its node and boards leave within TTL + 1 s, by etcd alone.
  bench.Kill9();
  const auto killed = Clock::now();
  ASSERT_TRUE(Eventually([&] { return BoardsOf("bench1").empty() && !NodeRegistered("bench1"); },
                         std::chrono::seconds(kTtl + 10)));
  const double gone_s = std::chrono::duration<double>(Clock::now() - killed).count();
  EXPECT_LE(gone_s, kTtl + 1.0) << "the killed bench's boards stayed " << gone_s << " s";

  // Back: its boards return (with the health it keeps in its database).
  ASSERT_TRUE(bench.Start()) << bench.log();
  ASSERT_TRUE(Eventually([&] { return BoardsOf("bench1").size() == 1; }, std::chrono::seconds(10)))
      << bench.log();
  EXPECT_TRUE(NodeRegistered("bench1"));
}

TEST_F(LabBench, AStoppedBenchLeavesAtOnce) {
  Daemon bench(nullptr, BenchYaml(cluster_, "bench1", "b1", 30), false);
  ASSERT_TRUE(bench.Start()) << bench.log();
  ASSERT_TRUE(Eventually([&] { return BoardsOf("bench1").size() == 1; }, std::chrono::seconds(10)))
      << bench.log();
  EXPECT_EQ(bench.Stop(), 0) << bench.log();
  // Not after its 30 s TTL: its lease was revoked on the way out.
  EXPECT_TRUE(BoardsOf("bench1").empty());
  EXPECT_FALSE(NodeRegistered("bench1"));
}

TEST_F(LabBench, WithEtcdDownAtStartItServesItsBoardsAndJoinsWhenEtcdComes) {
  // The node's etcd user is made while etcd is up; then etcd goes.
  const std::string yaml = BenchYaml(cluster_, "bench1", "b1", 5);
  for (int i = 0; i < cluster_.size(); ++i) cluster_.StopMember(i);
  Daemon bench(nullptr, yaml, false);
  ASSERT_TRUE(bench.Start()) << bench.log();
  auto hw = fwai::v1::Hardware::NewStub(bench.channel());
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    fwai::v1::ListDevicesResponse resp;
    auto s = hw->ListDevices(&ctx, {}, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.devices_size(), 1);
    EXPECT_EQ(resp.devices(0).id(), "b1");
  }
  for (int i = 0; i < cluster_.size(); ++i) ASSERT_TRUE(cluster_.StartMember(i));
  ASSERT_TRUE(cluster_.WaitServing(0));
  ASSERT_TRUE(Eventually([&] { return BoardsOf("bench1").size() == 1; }, std::chrono::seconds(15)))
      << bench.log();
  EXPECT_TRUE(NodeRegistered("bench1"));
}

TEST_F(LabBench, TwoBenchesAreOneLab) {
  Daemon bench1(nullptr, BenchYaml(cluster_, "bench1", "b1", 5), false);
  Daemon bench2(nullptr, BenchYaml(cluster_, "bench2", "b2", 5), false);
  ASSERT_TRUE(bench1.Start()) << bench1.log();
  ASSERT_TRUE(bench2.Start()) << bench2.log();
  ASSERT_TRUE(
      Eventually([&] { return BoardsOf("bench1").size() == 1 && BoardsOf("bench2").size() == 1; },
                 std::chrono::seconds(10)));
  EXPECT_EQ(BoardsOf("bench2")[0].id, "b2");
  // One of three etcd members stopped: the lab does not change.
  cluster_.StopMember(0);
  std::this_thread::sleep_for(std::chrono::seconds(6));  // longer than the benches' TTL
  EXPECT_EQ(BoardsOf("bench1").size(), 1u);
  EXPECT_EQ(BoardsOf("bench2").size(), 1u);
}

}  // namespace
}  // namespace fwai::lab
