// Faults of a lab with work in flight: etcd's quorum lost under an open
// serial stream, a flash and a lease wait through a front; a front killed
// mid-flash; nodes killed and restarted with leases held; a bench cut off
// from etcd (a partition). Real etcd (three members), real fwaids (a bench
// with a QEMU board, two fronts) and mutual TLS between the nodes. The bench
// reaches etcd through a TCP proxy per member, which the partition test cuts.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "fwai/v1/hardware.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"
#include "tests/lab/lab_support.h"
#include "tests/lab/tcp_proxy.h"

namespace fwai::lab {
namespace {

using fwai::testing::BenchAs;
using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;
using fwai::testing::FlashOnBench;
using fwai::testing::FwaidTls;
using fwai::testing::RunCommand;
using fwai::testing::SayAndHear;
using fwai::testing::Serial;
using fwai::testing::TcpProxy;
namespace pb = ::fwai::v1;

struct Acquired {
  grpc::Status status;
  pb::Lease lease;
};

Acquired Acquire(Daemon& d, const std::string& board, int ttl_s, int wait_s = 0) {
  auto hw = pb::Hardware::NewStub(d.channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(wait_s + 30));
  pb::AcquireRequest req;
  req.set_device_id(board);
  req.set_ttl_s(ttl_s);
  req.set_wait_s(wait_s);
  Acquired out;
  out.status = hw->Acquire(&ctx, req, &out.lease);
  return out;
}

class LabFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    tls_ = cluster_.tls_dir();
    const std::string lab = "lab:\n  ttl_s: 3\n";
    std::vector<int> via;
    for (const auto& e : cluster_.endpoints()) {
      proxies_.push_back(std::make_unique<TcpProxy>(std::stoi(e.substr(e.rfind(':') + 1))));
      via.push_back(proxies_.back()->port());
    }
    bench_ = std::make_unique<Daemon>(
        nullptr,
        lab + cluster_.LabEtcdYaml("bench1", via) +
            "  node: bench1\n  advertise: tls:127.0.0.1:0\n" + "tls: {cert: " + tls_ +
            "/bench1.pem, key: " + tls_ + "/bench1.key, client_ca: " + tls_ + "/ca.pem}\n" +
            "hardware:\n  boards:\n    - {id: b1, kind: simulated, machine: stm32vldiscovery, "
            "boot_pattern: booted, tags: [stm32f1]}\n",
        false);
    bench_->AddListen("tls:127.0.0.1:0");
    auto front = [&](const std::string& node) {
      return std::make_unique<Daemon>(
          nullptr,
          lab + cluster_.LabEtcdYaml(node) + "  node: " + node + "\n  cert: " + tls_ + "/" + node +
              ".pem\n  key: " + tls_ + "/" + node + ".key\n  ca: " + tls_ + "/ca.pem\n" +
              "hardware:\n  default_simulated_board: false\n",
          false);
    };
    front1_ = front("front1");
    front2_ = front("front2");
    for (Daemon* d : {bench_.get(), front1_.get(), front2_.get()})
      ASSERT_TRUE(d->Start()) << d->log();
    ASSERT_TRUE(Eventually(
        [&] {
          auto node = etcd_->Get("/fwai/nodes/bench1");
          return node.ok() && node->has_value() &&
                 (*node)->value.find(":" + std::to_string(bench_->TcpPort()) + "\"") !=
                     std::string::npos;
        },
        std::chrono::seconds(10)))
        << bench_->log();
  }

  // An open serial stream on `board` through `d` under `lease_id`.
  std::unique_ptr<Serial> OpenSerial(Daemon& d, grpc::ClientContext& ctx, const std::string& board,
                                     const std::string& lease_id) {
    auto hw = pb::Hardware::NewStub(d.channel());
    auto s = hw->Serial(&ctx);
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id(board);
    open.mutable_open()->set_lease_id(lease_id);
    EXPECT_TRUE(s->Write(open));
    pb::SerialServerMessage m;
    EXPECT_TRUE(s->Read(&m));
    EXPECT_EQ(m.opened(), board) << m.error() << m.reason();
    return s;
  }

  struct Flashed {
    grpc::Status status;
    std::string boot_line;
  };
  // Flashes the example firmware through `d`; `on_stage` sees each stage as it comes.
  Flashed Flash(Daemon& d, const std::string& lease_id,
                const std::function<void(const std::string&)>& on_stage = nullptr) {
    auto hw = pb::Hardware::NewStub(d.channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    pb::FlashRequest req;
    req.set_device_id("b1");
    req.set_lease_id(lease_id);
    req.set_image_path(FWAI_BLINKY_ELF);
    req.set_approved(true);
    req.set_project_root(std::filesystem::path(FWAI_BLINKY_ELF).parent_path().string());
    auto reader = hw->Flash(&ctx, req);
    Flashed out;
    pb::FlashProgress p;
    while (reader->Read(&p)) {
      if (on_stage) on_stage(p.stage());
      if (p.done()) out.boot_line = p.boot_line();
    }
    out.status = reader->Finish();
    return out;
  }

  // Renews `lease_id` through `d`; the status.
  grpc::Status Renew(Daemon& d, const std::string& lease_id) {
    auto hw = pb::Hardware::NewStub(d.channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::RenewRequest req;
    req.set_lease_id(lease_id);
    pb::Lease out;
    return hw->Renew(&ctx, req, &out);
  }

  // `hw ls` through `d`; nullopt when the call fails or the lab's registry
  // could not be read.
  static std::optional<pb::ListDevicesResponse> List(Daemon& d) {
    auto hw = pb::Hardware::NewStub(d.channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    pb::ListDevicesResponse r;
    if (!hw->ListDevices(&ctx, {}, &r).ok() || !r.lab_error().empty()) return std::nullopt;
    return r;
  }

  // True when `hw ls` through `d` lists board b1 with no lab error; `free`:
  // and nobody holds it.
  static bool ListsB1(Daemon& d, bool free) {
    auto r = List(d);
    return r && HasB1(*r, free);
  }
  static bool HasB1(const pb::ListDevicesResponse& r, bool free) {
    for (const auto& dev : r.devices()) {
      if (dev.id() == "b1") return !free || dev.holder().empty();
    }
    return false;
  }

  // Lists board b1 through `d`, or cannot tell (the lab's registry unread).
  static bool Lists(Daemon& d) {
    auto r = List(d);
    return !r || HasB1(*r, /*free=*/false);
  }

  // The flash records of `d`'s evidence log, oldest first.
  std::vector<nlohmann::json> FlashRecords(Daemon& d) {
    std::string out, err;
    EXPECT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(), "--json",
                          "evidence", "ls", "-n", "0"},
                         &out, &err),
              0)
        << err;
    std::vector<nlohmann::json> found;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto rec = nlohmann::json::parse(line, nullptr, false);
      if (rec.is_object() && rec["record"]["kind"] == "flash") found.push_back(rec["record"]);
    }
    return found;
  }

  grpc::Status Release(Daemon& d, const std::string& lease_id) {
    auto hw = pb::Hardware::NewStub(d.channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    pb::ReleaseRequest req;
    req.set_lease_id(lease_id);
    pb::ReleaseResponse out;
    return hw->Release(&ctx, req, &out);
  }

  EtcdCluster cluster_{3};
  std::vector<std::unique_ptr<TcpProxy>> proxies_;  // the bench's way to each member
  std::unique_ptr<EtcdClient> etcd_;
  std::string tls_;
  std::unique_ptr<Daemon> bench_, front1_, front2_;
};

// Quorum lost under an open serial stream through a front: the stream goes
// on (both ways) on the bench's stand-in for the lab lease until the lab
// lease's TTL, counted from the last renewal etcd confirmed — a busy stream
// does not extend it — and then ends saying the lease expired and etcd is
// unreachable; new leases fail UNAVAILABLE naming every endpoint; once etcd
// is back the same daemons agree on the lab again and the board is leased
// and used through the other front.
TEST_F(LabFaults, SerialThroughAFrontOutlivesQuorumLossUntilItsLeasesTtl) {
  // Not waited out: the bench's clock is moved to it.
  constexpr int kLeaseTtl = 60;
  Acquired a = Acquire(*front1_, "b1", kLeaseTtl);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  // The example firmware answers ping with pong.
  Flashed f = Flash(*front1_, a.lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n" << bench_->log();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(240));
  auto serial = OpenSerial(*front1_, ctx, "b1", a.lease.lease_id());
  ASSERT_TRUE(SayAndHear(*serial, "ping", "pong")) << bench_->log();

  // The last renewal etcd confirms: the lab lease lasts kLeaseTtl from here,
  // and so does the bench's stand-in once the bench has read it from etcd.
  const int64_t renewed_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  const grpc::Status r = Renew(*front1_, a.lease.lease_id());
  ASSERT_TRUE(r.ok()) << r.error_message();
  int64_t stand_in_until = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        auto hw = pb::Hardware::NewStub(bench_->channel());
        grpc::ClientContext lctx;
        pb::ListDevicesResponse l;
        if (!hw->ListDevices(&lctx, {}, &l).ok()) return false;
        for (const auto& dev : l.devices()) {
          if (dev.id() == "b1") stand_in_until = dev.lease_expires_us();
        }
        // etcd says what is left in whole seconds.
        return stand_in_until >= renewed_us + int64_t{kLeaseTtl - 1} * 1000000;
      },
      std::chrono::seconds(30)))
      << "the bench's stand-in never took the renewal: ends at " << stand_in_until
      << ", renewed at " << renewed_us << "\n"
      << bench_->log();
  cluster_.StopMember(1);
  cluster_.StopMember(2);

  // Meanwhile a new lease through the other front fails, naming every endpoint.
  std::atomic<bool> unavailable{false};
  std::string other_error;
  std::thread other([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!unavailable && std::chrono::steady_clock::now() < until) {
      Acquired o = Acquire(*front2_, "b1", 30);
      other_error = o.status.error_message();
      unavailable = o.status.error_code() == grpc::StatusCode::UNAVAILABLE;
    }
  });
  // The stream carries data both ways while etcd cannot decide...
  std::string reason;
  bool alive_after_loss = true;
  for (int i = 0; i < 3 && alive_after_loss; ++i)
    alive_after_loss = SayAndHear(*serial, "ping", "pong", &reason);
  // ...still 10 s before the TTL since the last confirmed renewal, however
  // busy the stream was meanwhile (the bench's clock is moved there once it
  // has found that etcd cannot say)...
  const bool bench_noticed = Eventually(
      [&] {
        return bench_->log().find("lab: etcd cannot say whether lab lease " + a.lease.lease_id()) !=
               std::string::npos;
      },
      std::chrono::seconds(60));
  bool alive_before_ttl = false;
  if (alive_after_loss && bench_noticed) {
    const int64_t real_now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
    if (stand_in_until - 10'000'000 > real_now_us)
      bench_->AdvanceClock(stand_in_until - 10'000'000 - real_now_us);
    alive_before_ttl = SayAndHear(*serial, "ping", "pong", &reason);
  }
  // ...and ends once that TTL has passed on the bench.
  bench_->AdvanceClock(11'000'000);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (alive_before_ttl && std::chrono::steady_clock::now() < give_up) {
    if (!SayAndHear(*serial, "ping", "pong", &reason)) {
      // A write refused in the instant the lease ends: the end says why.
      pb::SerialServerMessage m;
      while (serial->Read(&m)) {
        if (m.end_of_stream()) {
          reason = m.reason();
          break;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto ended = std::chrono::steady_clock::now();
  other.join();
  ASSERT_TRUE(alive_after_loss) << "the stream ended when the quorum was lost: " << reason
                                << "\nbench:\n"
                                << bench_->log();
  ASSERT_TRUE(bench_noticed) << "the bench never found etcd unreachable\nbench:\n" << bench_->log();
  ASSERT_TRUE(alive_before_ttl) << "the stream ended before its lease's TTL: " << reason
                                << "\nbench:\n"
                                << bench_->log();
  ASSERT_LT(ended, give_up) << "the busy stream outlived its lease's TTL by a minute\nbench:\n"
                            << bench_->log();
  EXPECT_NE(reason.find("lab lease " + a.lease.lease_id()), std::string::npos) << reason;
  EXPECT_NE(reason.find("expired"), std::string::npos) << reason;
  EXPECT_NE(reason.find("etcd unreachable"), std::string::npos) << reason;
  serial->WritesDone();
  (void)serial->Finish();
  ASSERT_TRUE(unavailable) << other_error;
  for (const auto& e : cluster_.endpoints())
    EXPECT_NE(other_error.find(e), std::string::npos) << e << ": " << other_error;

  // etcd back: no fwaid restarted, the lab converges: front1 releases its
  // lease (or finds it gone), both fronts list the board free, and front2
  // leases it and talks to it.
  ASSERT_TRUE(cluster_.StartMember(1));
  ASSERT_TRUE(cluster_.StartMember(2));
  ASSERT_TRUE(cluster_.WaitServing(0));
  grpc::Status released;
  ASSERT_TRUE(Eventually(
      [&] {
        auto hw = pb::Hardware::NewStub(front1_->channel());
        grpc::ClientContext rctx;
        rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        pb::ReleaseRequest req;
        req.set_lease_id(a.lease.lease_id());
        pb::ReleaseResponse resp;
        released = hw->Release(&rctx, req, &resp);
        return released.ok() || released.error_code() == grpc::StatusCode::NOT_FOUND;
      },
      std::chrono::seconds(60)))
      << released.error_message();
  for (Daemon* d : {front1_.get(), front2_.get()}) {
    ASSERT_TRUE(Eventually([&] { return ListsB1(*d, /*free=*/true); }, std::chrono::seconds(60)))
        << d->log();
  }
  Acquired b = Acquire(*front2_, "b1", 60, /*wait_s=*/30);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto serial2 = OpenSerial(*front2_, ctx2, "b1", b.lease.lease_id());
  EXPECT_TRUE(SayAndHear(*serial2, "ping", "pong")) << bench_->log();
  serial2->WritesDone();
  ctx2.TryCancel();
  (void)serial2->Finish();
  EXPECT_TRUE(bench_->running() && front1_->running() && front2_->running());
}

// A front killed (kill -9) while the bench flashes for it: the bench
// finishes the flash (the image had fully arrived) and says so in its log,
// the lease lapses by its TTL, and another front leases the board and
// flashes it: the board boots.
TEST_F(LabFaults, AFrontKilledMidFlashLeavesTheBoardUsableAndFreeAfterTtl) {
  constexpr int kLeaseTtl = 4;
  Acquired a = Acquire(*front1_, "b1", kLeaseTtl);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  // Killed as soon as the bench reports it is writing the board; the flash
  // call itself then fails for this client (its front is gone).
  std::atomic<bool> killed{false};
  Flashed f = Flash(*front1_, a.lease.lease_id(), [&](const std::string& stage) {
    if (!killed && (stage == "loading" || stage == "writing" || stage == "booting")) {
      killed = true;
      front1_->Kill9();
    }
  });
  ASSERT_TRUE(killed) << "no flash stage from the bench came through the front: "
                      << f.status.error_message() << "\nbench:\n"
                      << bench_->log();
  EXPECT_FALSE(f.status.ok());
  // The bench says how the flash ended: finished (the front gone or not by
  // then), never left halfway.
  const std::string finished =
      "lab: flash of b1 for node front1 (lease " + a.lease.lease_id() + ") finished";
  ASSERT_TRUE(Eventually([&] { return bench_->log().find(finished) != std::string::npos; },
                         std::chrono::seconds(30)))
      << bench_->log();
  // The lease lapses by its TTL: front2 sees the board free and takes it
  // (waiting, not sleeping), flashes it, and the board boots.
  Acquired b = Acquire(*front2_, "b1", 60, /*wait_s=*/kLeaseTtl + 30);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  Flashed g = Flash(*front2_, b.lease.lease_id());
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_NE(g.boot_line.find("booted"), std::string::npos) << g.boot_line;
}

// A front killed with -9 and started again at once: it waits for its dead
// predecessor's data dir lock instead of refusing, and its users' leases are
// theirs again — the holder flashes, renews and releases through it as
// before, and nobody else gets the board meanwhile. Then the same for the
// bench: killed and restarted under a lease held through the front, its
// board is flashed through the front again.
TEST_F(LabFaults, RestartedNodesKeepTheLeasesHeldThroughThem) {
  Acquired a = Acquire(*front1_, "b1", 120);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  front1_->Kill9();
  ASSERT_TRUE(front1_->Start()) << front1_->log();
  Flashed f = Flash(*front1_, a.lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nfront1:\n" << front1_->log();
  EXPECT_NE(f.boot_line.find("booted"), std::string::npos) << f.boot_line;
  EXPECT_TRUE(Renew(*front1_, a.lease.lease_id()).ok());
  Acquired other = Acquire(*front2_, "b1", 60);
  EXPECT_FALSE(other.status.ok()) << "front2 took a board held through front1";

  // The bench restarts with the board leased: flashed through the front again.
  bench_->Kill9();
  ASSERT_TRUE(bench_->Start()) << bench_->log();
  ASSERT_TRUE(Eventually(
      [&] {
        auto node = etcd_->Get("/fwai/nodes/bench1");
        return node.ok() && node->has_value() &&
               (*node)->value.find(":" + std::to_string(bench_->TcpPort()) + "\"") !=
                   std::string::npos;
      },
      std::chrono::seconds(10)))
      << bench_->log();
  f = Flash(*front1_, a.lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_TRUE(Renew(*front1_, a.lease.lease_id()).ok());

  // Released through the restarted front: the board is free for front2.
  {
    auto hw = pb::Hardware::NewStub(front1_->channel());
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_lease_id(a.lease.lease_id());
    pb::ReleaseResponse out;
    auto st = hw->Release(&ctx, req, &out);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  other = Acquire(*front2_, "b1", 60);
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
}

// etcd's quorum lost while the bench flashes for a front: the bench works on
// its stand-in for the lab lease (the image had arrived), so the flash
// finishes and boots and is on the front's record under the lab lease;
// meanwhile nobody else is granted the board; once etcd is back the lease
// is still its holder's (renewed, the board refused to the other front) and
// the holder flashes again.
TEST_F(LabFaults, QuorumLostMidFlashTheFlashEndsAndTheLeaseStaysTheHolders) {
  Acquired a = Acquire(*front1_, "b1", 60);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  const std::string id = a.lease.lease_id();
  std::atomic<bool> lost{false};
  Flashed f = Flash(*front1_, id, [&](const std::string& stage) {
    if (!lost && (stage == "loading" || stage == "writing" || stage == "booting")) {
      lost = true;
      cluster_.StopMember(1);
      cluster_.StopMember(2);
    }
  });
  ASSERT_TRUE(lost) << "no flash stage from the bench came through the front: "
                    << f.status.error_message() << "\nbench:\n"
                    << bench_->log();
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n"
                             << bench_->log() << "\nfront1:\n"
                             << front1_->log();
  EXPECT_NE(f.boot_line.find("booted"), std::string::npos) << f.boot_line;
  Acquired other = Acquire(*front2_, "b1", 30);
  EXPECT_EQ(other.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << other.status.error_message();

  ASSERT_TRUE(cluster_.StartMember(1));
  ASSERT_TRUE(cluster_.StartMember(2));
  ASSERT_TRUE(cluster_.WaitServing(0));
  grpc::Status renewed;
  ASSERT_TRUE(Eventually(
      [&] {
        renewed = Renew(*front1_, id);
        return renewed.ok();
      },
      std::chrono::seconds(30)))
      << renewed.error_message() << "\nfront1:\n"
      << front1_->log();
  other = Acquire(*front2_, "b1", 30);
  EXPECT_EQ(other.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << other.status.error_message();
  EXPECT_NE(other.status.error_message().find("through front1"), std::string::npos)
      << other.status.error_message();
  bool recorded = false;
  for (const auto& rec : FlashRecords(*front1_)) {
    recorded = recorded || (rec.value("lease_id", "") == id && rec.value("board", "") == "b1");
  }
  EXPECT_TRUE(recorded) << "the flash during the loss is not on front1's record";
  Flashed g = Flash(*front1_, id);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_NE(g.boot_line.find("booted"), std::string::npos) << g.boot_line;
}

// etcd's quorum lost while a caller waits in the lab's queue for a held
// board: the wait goes on (a pause, not an error); once etcd is back the
// board stays its holder's until released, then goes to the waiter — one
// holder at a time, and the waiter is served once.
TEST_F(LabFaults, QuorumLostDuringALeaseWaitTheWaitGoesOnAndTheBoardHasOneHolder) {
  Acquired a = Acquire(*front1_, "b1", 60);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  std::atomic<bool> served{false};
  Acquired w;
  std::thread waiter([&] {
    w = Acquire(*front2_, "b1", 60, /*wait_s=*/150);
    served = true;
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{waiter};
  ASSERT_TRUE(Eventually(
      [&] {
        auto q = etcd_->GetPrefix("/fwai/queue/");
        return q.ok() && !q->kvs.empty();
      },
      std::chrono::seconds(20)))
      << "the waiter never joined the lab's queue\nfront2:\n"
      << front2_->log();
  cluster_.StopMember(1);
  cluster_.StopMember(2);
  ASSERT_TRUE(Eventually(
      [&] {
        return front2_->log().find("goes on while the registry is unavailable") !=
                   std::string::npos ||
               served;
      },
      std::chrono::seconds(60)))
      << front2_->log();
  EXPECT_FALSE(served) << "the wait ended with the quorum: " << w.status.error_message();

  ASSERT_TRUE(cluster_.StartMember(1));
  ASSERT_TRUE(cluster_.StartMember(2));
  ASSERT_TRUE(cluster_.WaitServing(0));
  // Still front1's: renewed through it, and not handed to the waiter.
  grpc::Status renewed;
  ASSERT_TRUE(Eventually(
      [&] {
        renewed = Renew(*front1_, a.lease.lease_id());
        return renewed.ok();
      },
      std::chrono::seconds(30)))
      << renewed.error_message();
  EXPECT_FALSE(served) << w.status.error_message();
  grpc::Status released;
  ASSERT_TRUE(Eventually(
      [&] {
        released = Release(*front1_, a.lease.lease_id());
        return released.ok();
      },
      std::chrono::seconds(30)))
      << released.error_message();
  waiter.join();
  ASSERT_TRUE(w.status.ok()) << w.status.error_message() << "\nfront2:\n" << front2_->log();
  EXPECT_NE(w.lease.lease_id(), a.lease.lease_id());
  auto held = etcd_->Get("/fwai/leases/b1");
  ASSERT_TRUE(held.ok() && held->has_value());
  EXPECT_NE((*held)->value.find(w.lease.lease_id()), std::string::npos) << (*held)->value;
  auto queue = etcd_->GetPrefix("/fwai/queue/");
  ASSERT_TRUE(queue.ok());
  EXPECT_TRUE(queue->kvs.empty()) << "the served waiter is still queued";
  Acquired again = Acquire(*front1_, "b1", 30);
  EXPECT_EQ(again.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << again.status.error_message();
}

// A bench cut off from etcd (its connections to every member stop, as in a
// partition) while a front holds its board: its boards leave the lab's view
// within its TTL, the lease through the front ends with the reason, and the
// bench itself refuses forwarded work it can no longer check with etcd —
// even the front's, with the lease it held (fenced). Healed, the bench
// rejoins and the board is leased and flashed through the other front.
TEST_F(LabFaults, ABenchCutOffFromEtcdLeavesTheLabAndIsFenced) {
  Acquired a = Acquire(*front1_, "b1", 60);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  Flashed f = Flash(*front1_, a.lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n" << bench_->log();

  for (auto& p : proxies_) p->Cut();
  // The registration's TTL is 3 s; each front reads the lab afresh.
  for (Daemon* d : {front1_.get(), front2_.get()}) {
    ASSERT_TRUE(Eventually([&] { return !Lists(*d); }, std::chrono::seconds(30))) << d->log();
  }
  Flashed stale = Flash(*front1_, a.lease.lease_id());
  EXPECT_FALSE(stale.status.ok());
  EXPECT_NE(stale.status.error_message().find("left the lab"), std::string::npos)
      << stale.status.error_message();
  const grpc::Status fenced =
      FlashOnBench(BenchAs(tls_, bench_->TcpPort(), "front1"), a.lease.lease_id());
  EXPECT_EQ(fenced.error_code(), grpc::StatusCode::UNAVAILABLE) << fenced.error_message();
  EXPECT_NE(fenced.error_message().find("etcd"), std::string::npos) << fenced.error_message();
  Acquired other = Acquire(*front2_, "b1", 30);
  EXPECT_FALSE(other.status.ok()) << "a board of a bench cut off from etcd was handed out";

  for (auto& p : proxies_) p->Heal();
  ASSERT_TRUE(
      Eventually([&] { return ListsB1(*front2_, /*free=*/true); }, std::chrono::seconds(60)))
      << bench_->log();
  Acquired b = Acquire(*front2_, "b1", 60, /*wait_s=*/30);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  Flashed g = Flash(*front2_, b.lease.lease_id());
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_NE(g.boot_line.find("booted"), std::string::npos) << g.boot_line;
  EXPECT_TRUE(bench_->running());
}

}  // namespace
}  // namespace fwai::lab
