// Board work through a front: flash (the image's bytes streamed) and serial
// (both ways) forwarded to the owning bench over mutual TLS with node
// certificates; the bench refuses anyone without a node certificate holding
// the board's lab lease. Real etcd, real fwaids, a real QEMU board.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/grpc_status.h"
#include "fwai/v1/auth.grpc.pb.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "server/lab/registry.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"
#include "tests/lab/lab_support.h"

namespace fwai::lab {
namespace {

using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;
using fwai::testing::FlashOnBench;
using fwai::testing::FwaidTls;
using fwai::testing::ReadText;
using fwai::testing::RunCommand;
namespace pb = ::fwai::v1;

class LabForward : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    tls_ = cluster_.tls_dir();
    ASSERT_TRUE(FwaidTls({"issue", tls_, "--user", "alice"}));
    const std::string lab = "lab:\n  ttl_s: 3\n";
    // The bench: one QEMU board, mutual TLS for the other nodes, and a
    // person (alice) with a certificate of the same CA.
    bench_ = std::make_unique<Daemon>(
        nullptr,
        lab + cluster_.LabEtcdYaml("bench1") + "  node: bench1\n  advertise: tls:127.0.0.1:0\n" +
            "tls: {cert: " + tls_ + "/bench1.pem, key: " + tls_ + "/bench1.key, client_ca: " +
            tls_ + "/ca.pem}\n" + "users:\n  alice: {role: user, cert_subject: \"CN=alice\"}\n" +
            "hardware:\n  boards:\n    - {id: b1, kind: simulated, machine: stm32vldiscovery, "
            "boot_pattern: booted, "
            "tags: [stm32f1]}\n",
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
    ASSERT_GT(bench_->TcpPort(), 0);
    ASSERT_TRUE(Eventually(
        [&] {
          auto node = etcd_->Get("/fwai/nodes/bench1");
          return node.ok() && node->has_value() &&
                 (*node)->value.find(":" + std::to_string(bench_->TcpPort()) + "\"") !=
                     std::string::npos;
        },
        std::chrono::seconds(10)))
        << "the bench advertises the port its tls: listener bound\n"
        << bench_->log();
  }

  pb::Lease Lease(Daemon& d, const std::string& board, int ttl_s = 60) {
    auto hw = pb::Hardware::NewStub(d.channel());
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id(board);
    req.set_ttl_s(ttl_s);
    pb::Lease lease;
    auto s = hw->Acquire(&ctx, req, &lease);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return lease;
  }

  struct Flashed {
    grpc::Status status;
    std::string boot_line, sha256;
    std::vector<std::string> stages;
    std::string messages;  // every progress message, one per line
  };
  Flashed Flash(Daemon& d, const std::string& board, const std::string& lease_id,
                const std::string& image = FWAI_BLINKY_ELF, const std::string& project_root = "") {
    auto hw = pb::Hardware::NewStub(d.channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    pb::FlashRequest req;
    req.set_device_id(board);
    req.set_lease_id(lease_id);
    req.set_image_path(image);
    req.set_approved(true);
    req.set_project_root(project_root.empty() ? std::filesystem::path(image).parent_path().string()
                                              : project_root);
    auto reader = hw->Flash(&ctx, req);
    Flashed out;
    pb::FlashProgress p;
    while (reader->Read(&p)) {
      out.stages.push_back(p.stage());
      out.messages += p.message() + "\n";
      if (p.done()) {
        out.boot_line = p.boot_line();
        out.sha256 = p.image_sha256();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  // A channel to the bench's tls: listener as `who` (a certificate name, or "" for none).
  std::shared_ptr<grpc::Channel> BenchAs(const std::string& who) {
    return fwai::testing::BenchAs(tls_, bench_->TcpPort(), who);
  }

  EtcdCluster cluster_{1};
  std::unique_ptr<EtcdClient> etcd_;
  std::string tls_;
  std::unique_ptr<Daemon> bench_, front1_, front2_;
};

TEST_F(LabForward, FlashThroughAFrontBootsTheBenchsBoardAndSerialPingPongs) {
  pb::Lease lease = Lease(*front1_, "b1");
  ASSERT_EQ(lease.node(), "bench1");
  Flashed f = Flash(*front1_, "b1", lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_NE(f.boot_line.find("stm32vl-blinky"), std::string::npos) << f.boot_line;
  EXPECT_NE(f.boot_line.find("booted"), std::string::npos) << f.boot_line;
  EXPECT_EQ(f.sha256.size(), 64u);
  // The bench's own stages came through the front.
  EXPECT_NE(std::find(f.stages.begin(), f.stages.end(), "booting"), f.stages.end());

  // Serial through the front, both ways.
  auto hw = pb::Hardware::NewStub(front1_->channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = hw->Serial(&ctx);
  pb::SerialClientMessage open;
  open.mutable_open()->set_device_id("b1");
  open.mutable_open()->set_lease_id(lease.lease_id());
  ASSERT_TRUE(stream->Write(open));
  pb::SerialServerMessage m;
  ASSERT_TRUE(stream->Read(&m));
  ASSERT_EQ(m.opened(), "b1") << m.error() << m.reason();
  pb::SerialClientMessage ping;
  ping.set_send_line("ping");
  ASSERT_TRUE(stream->Write(ping));
  bool pong = false;
  while (!pong && stream->Read(&m)) {
    ASSERT_TRUE(m.error().empty()) << m.error();
    for (const auto& l : m.lines()) pong = pong || l.line() == "pong";
  }
  EXPECT_TRUE(pong);

  // GDB commands through the front, on the bench's board.
  {
    grpc::ClientContext dctx;
    pb::DebugRequest req;
    req.set_device_id("b1");
    req.set_lease_id(lease.lease_id());
    req.add_commands("print counter");
    pb::DebugResponse resp;
    auto st = hw->Debug(&dctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message() << "\nbench:\n" << bench_->log();
    ASSERT_EQ(resp.outputs_size(), 1);
    EXPECT_NE(resp.outputs(0).find("counter = "), std::string::npos) << resp.outputs(0);
  }

  // A reset through the front restarts the bench's board: its boot line comes again.
  {
    grpc::ClientContext rctx;
    pb::ResetRequest req;
    req.set_device_id("b1");
    req.set_lease_id(lease.lease_id());
    pb::ResetResponse resp;
    auto st = hw->Reset(&rctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message() << "\nbench:\n" << bench_->log();
    bool booted = false;
    while (!booted && stream->Read(&m)) {
      for (const auto& l : m.lines())
        booted = booted || l.line().find("booted") != std::string::npos;
    }
    EXPECT_TRUE(booted) << "no boot line after the reset";
  }

  // The lease released through the front ends the stream on the bench.
  {
    auto hw2 = pb::Hardware::NewStub(front1_->channel());
    grpc::ClientContext rctx;
    pb::ReleaseRequest req;
    req.set_lease_id(lease.lease_id());
    pb::ReleaseResponse resp;
    ASSERT_TRUE(hw2->Release(&rctx, req, &resp).ok());
  }
  std::string reason;
  while (stream->Read(&m)) {
    if (m.end_of_stream()) reason = m.reason();
  }
  EXPECT_NE(reason.find("ended"), std::string::npos) << reason;
  stream->WritesDone();
  stream->Finish();
}

// One Hardware.Serial stream through a daemon, opened on `stream`.
struct SerialStream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SerialClientMessage, pb::SerialServerMessage>> rw;
  pb::SerialServerMessage first;
  grpc::Status refused;  // how the stream ended when the open was refused
  bool ended = false;

  SerialStream(Daemon& d, const std::string& board, const std::string& lease_id,
               const std::string& stream, bool from_history) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    rw = pb::Hardware::NewStub(d.channel())->Serial(&ctx);
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id(board);
    open.mutable_open()->set_lease_id(lease_id);
    open.mutable_open()->set_stream(stream);
    open.mutable_open()->set_from_history(from_history);
    if (!rw->Write(open) || !rw->Read(&first)) {
      refused = rw->Finish();
      ended = true;
    }
  }
  // Reads until a line matches `want` exactly; every line read is appended to `seen`.
  bool ReadUntil(const std::string& want, std::string* seen) {
    pb::SerialServerMessage m;
    while (rw->Read(&m)) {
      if (!m.error().empty() || m.end_of_stream()) {
        *seen += "[" + m.error() + m.reason() + "]\n";
        return false;
      }
      for (const auto& l : m.lines()) {
        *seen += l.line() + "\n";
        if (l.line() == want) return true;
      }
    }
    return false;
  }
  void Close() {
    if (ended) return;
    ctx.TryCancel();
    (void)rw->Finish();
  }
};

// The firmware's RTT channels of a bench's board, through a front: the boot
// line from rtt:0's history read by two readers, a command written to the
// down-channel answered to both, the trace channel read; a channel the
// firmware lacks refused with the bench's own words.
TEST_F(LabForward, RttThroughAFrontBothWays) {
  pb::Lease lease = Lease(*front1_, "b1");
  Flashed f = Flash(*front1_, "b1", lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n" << bench_->log();

  SerialStream a(*front1_, "b1", lease.lease_id(), "rtt:0", /*from_history=*/true);
  SerialStream b(*front1_, "b1", lease.lease_id(), "rtt:0", /*from_history=*/true);
  for (SerialStream* s : {&a, &b}) {
    ASSERT_EQ(s->first.opened(), "b1") << s->first.error() << "\nbench:\n" << bench_->log();
    EXPECT_EQ(s->first.stream(), "rtt:0");
  }
  std::string seen_a, seen_b;
  ASSERT_TRUE(a.ReadUntil("rtt: stm32vl-blinky 1.0.0 booted", &seen_a)) << seen_a;
  ASSERT_TRUE(b.ReadUntil("rtt: stm32vl-blinky 1.0.0 booted", &seen_b)) << seen_b;
  pb::SerialClientMessage ping;
  ping.set_send_line("ping");
  ASSERT_TRUE(a.rw->Write(ping));
  EXPECT_TRUE(a.ReadUntil("pong", &seen_a)) << seen_a;
  EXPECT_TRUE(b.ReadUntil("pong", &seen_b)) << seen_b;

  SerialStream trace(*front1_, "b1", lease.lease_id(), "rtt:1", /*from_history=*/false);
  ASSERT_EQ(trace.first.opened(), "b1") << trace.first.error();
  pb::SerialServerMessage m;
  bool tick = false;
  std::string seen;
  while (!tick && trace.rw->Read(&m)) {
    for (const auto& l : m.lines()) {
      seen += l.line() + "\n";
      tick = tick || l.line().rfind("tick counter=", 0) == 0;
    }
  }
  EXPECT_TRUE(tick) << seen;

  // The front's listing names the bench's board's channels, as the bench registered them.
  std::string listed;
  EXPECT_TRUE(Eventually(
      [&] {
        grpc::ClientContext ctx;
        pb::ListDevicesResponse resp;
        if (!pb::Hardware::NewStub(front1_->channel())->ListDevices(&ctx, {}, &resp).ok())
          return false;
        listed.clear();
        for (const auto& d : resp.devices()) {
          if (d.id() != "b1") continue;
          for (const auto& s : d.streams()) listed += s.id() + "=" + s.name() + ";";
        }
        return listed == "uart=;rtt:0=Terminal;rtt:1=Trace;";
      },
      std::chrono::seconds(20)))
      << listed;

  SerialStream none(*front1_, "b1", lease.lease_id(), "rtt:5", /*from_history=*/false);
  ASSERT_TRUE(none.ended);
  EXPECT_EQ(none.refused.error_code(), grpc::StatusCode::NOT_FOUND) << none.refused.error_message();
  EXPECT_NE(none.refused.error_message().find("RTT up-channels 0 to 1, not rtt:5"),
            std::string::npos)
      << none.refused.error_message();
  EXPECT_NE(none.refused.error_message().find("the bench bench1"), std::string::npos)
      << none.refused.error_message();
  for (SerialStream* s : {&a, &b, &trace, &none}) s->Close();
}

// A watch on a bench's board, added through a front: it reads the board
// through the bench as its owner, captures the HardFault into the owner's
// project (a capture that decodes offline with the image), and its notice
// reaches the front's reader after the banner.
TEST_F(LabForward, AWatchOnABenchsBoardCapturesAndNotifiesThroughTheFront) {
  namespace fs = std::filesystem;
  pb::Lease lease = Lease(*front1_, "b1");
  Flashed f = Flash(*front1_, "b1", lease.lease_id());
  ASSERT_TRUE(f.status.ok()) << f.status.error_message() << "\nbench:\n" << bench_->log();
  const std::string project = cluster_.dir() + "/watched";
  fs::create_directories(project);
  auto hw = pb::Hardware::NewStub(front1_->channel());
  {
    grpc::ClientContext ctx;
    pb::AddWatchRequest req;
    req.set_project_root(project);
    req.set_lease_id(lease.lease_id());
    auto* r = req.mutable_rule();
    r->set_name("hardfault");
    r->set_board("b1");
    r->set_pattern("^FAULT");
    r->set_capture(true);
    r->set_notify(true);
    pb::Watch w;
    auto s = hw->AddWatch(&ctx, req, &w);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(w.active());
  }
  SerialStream reader(*front1_, "b1", lease.lease_id(), "", /*from_history=*/false);
  ASSERT_EQ(reader.first.opened(), "b1") << reader.first.error();
  pb::SerialClientMessage fault;
  fault.set_send_line("fault");
  ASSERT_TRUE(reader.rw->Write(fault));
  std::string seen, notice;
  bool banner = false;
  pb::SerialServerMessage m;
  while (notice.empty() && reader.rw->Read(&m)) {
    for (const auto& l : m.lines()) {
      seen += (l.notice() ? "notice: " : "") + l.line() + "\n";
      if (!l.notice()) banner = banner || l.line().rfind("FAULT", 0) == 0;
      if (l.notice()) {
        notice = l.line();
        EXPECT_EQ(l.seq(), 0u);
      }
    }
    if (m.end_of_stream()) break;
  }
  EXPECT_TRUE(banner) << seen;
  EXPECT_EQ(notice.rfind("watch 'hardfault' fired on b1: FAULT", 0), 0u) << seen << "\nfront:\n"
                                                                         << front1_->log();
  reader.Close();
  pb::ListWatchesResponse listed;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(hw->ListWatches(&ctx, {}, &listed).ok());
  }
  ASSERT_EQ(listed.watches_size(), 1);
  EXPECT_EQ(listed.watches(0).fired(), 1);
  const std::string rel = listed.watches(0).last_capture();
  ASSERT_EQ(rel.rfind(".fwai/captures/b1-", 0), 0u) << listed.DebugString();
  std::string out, err;
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "fault", "decode", project + "/" + rel,
                        "--image", FWAI_BLINKY_ELF},
                       &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("in trigger_fault at src/main.c:"), std::string::npos) << out;
}

// A bench whose fwaid predates trace streams: its LabNode.Serial ignores
// SerialOpen.stream and serves the UART, without naming a stream.
class OldBenchSerial final : public pb::LabNode::Service {
 public:
  grpc::Status Serial(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<pb::SerialServerMessage, pb::SerialClientMessage>* rw) override {
    pb::SerialClientMessage m;
    if (!rw->Read(&m)) return grpc::Status::OK;
    {
      std::lock_guard<std::mutex> lock(mu_);
      asked_.push_back(m.open().stream());
    }
    pb::SerialServerMessage hello;
    hello.set_opened(m.open().device_id());
    hello.set_next_seq(1);
    pb::SerialServerMessage line;
    auto* l = line.add_lines();
    l->set_seq(1);
    l->set_line("old bench: uart line");
    if (!rw->Write(hello) || !rw->Write(line)) return grpc::Status::OK;
    while (rw->Read(&m)) {
    }
    return grpc::Status::OK;
  }
  std::vector<std::string> asked() {
    std::lock_guard<std::mutex> lock(mu_);
    return asked_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> asked_;
};

// A front asking such a bench for a trace stream refuses what comes back (the
// UART under the stream's name would be a lie) and says why; its UART still
// reads.
TEST_F(LabForward, AnOlderBenchServingItsUartForATraceStreamIsRefused) {
  OldBenchSerial old;
  grpc::SslServerCredentialsOptions creds(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  creds.pem_root_certs = ReadText(tls_ + "/ca.pem");
  creds.pem_key_cert_pairs.push_back(
      {ReadText(tls_ + "/bench1.key"), ReadText(tls_ + "/bench1.pem")});
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(creds), &port);
  builder.RegisterService(&old);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  ASSERT_TRUE(etcd_
                  ->Put("/fwai/nodes/oldbench",
                        nlohmann::json{{"node", "oldbench"},
                                       {"advertise", "tls:127.0.0.1:" + std::to_string(port)},
                                       {"version", "0.9.0"}}
                            .dump())
                  .ok());
  LabBoard b;
  b.id = "b9";
  b.node = "oldbench";
  b.kind = "simulated";
  b.health = "good";
  ASSERT_TRUE(etcd_->Put("/fwai/boards/oldbench/b9", BoardToJson(b)).ok());
  pb::Lease lease = Lease(*front1_, "b9");
  ASSERT_EQ(lease.node(), "oldbench");

  SerialStream rtt(*front1_, "b9", lease.lease_id(), "rtt:0", /*from_history=*/true);
  ASSERT_TRUE(rtt.ended) << rtt.first.DebugString();
  EXPECT_EQ(rtt.refused.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << rtt.refused.error_message();
  EXPECT_NE(rtt.refused.error_message().find(
                "the bench oldbench of board b9 does not serve rtt:0: its fwaid is older"),
            std::string::npos)
      << rtt.refused.error_message();
  SerialStream uart(*front1_, "b9", lease.lease_id(), "", /*from_history=*/true);
  ASSERT_EQ(uart.first.opened(), "b9") << uart.refused.error_message();
  std::string seen;
  EXPECT_TRUE(uart.ReadUntil("old bench: uart line", &seen)) << seen;
  uart.Close();
  EXPECT_EQ(old.asked(), (std::vector<std::string>{"rtt:0", ""}));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

TEST_F(LabForward, TheBenchRefusesAnyoneWithoutANodeCertificateHoldingTheLease) {
  // front1 holds the board; front2 comes with its own (valid) node
  // certificate but without the lease: refused, through its front or directly.
  pb::Lease lease = Lease(*front1_, "b1");
  Flashed other = Flash(*front2_, "b1", "");
  EXPECT_EQ(other.status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << other.status.error_message();
  EXPECT_NE(other.status.error_message().find("rule: the board's lease holder"), std::string::npos)
      << other.status.error_message();
  grpc::Status s = FlashOnBench(BenchAs("front2"), lease.lease_id());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("holds no lab lease"), std::string::npos) << s.error_message();
  // A person's certificate (alice is a user of the bench) is not a node's.
  s = FlashOnBench(BenchAs("alice"), lease.lease_id());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("lab node certificate"), std::string::npos) << s.error_message();
  // No certificate at all.
  s = FlashOnBench(BenchAs(""), lease.lease_id());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  // A user token (an admin's, even) is not a node certificate.
  std::string token;
  {
    grpc::ClientContext ctx;
    pb::CreateTokenRequest req;
    req.set_user("ci-runner");
    req.set_role("admin");
    pb::CreateTokenResponse resp;
    auto st = pb::Auth::NewStub(bench_->channel())->CreateToken(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    token = resp.token();
  }
  s = FlashOnBench(BenchAs(""), lease.lease_id(), token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // A node certificate is nobody's account: nothing but LabNode.
  {
    auto hw = pb::Hardware::NewStub(BenchAs("front1"));
    grpc::ClientContext ctx;
    pb::ListDevicesResponse resp;
    auto st = hw->ListDevices(&ctx, {}, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  }
  // The holder's node certificate is let in (the 4 bytes are then refused as an image).
  s = FlashOnBench(BenchAs("front1"), lease.lease_id());
  EXPECT_NE(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  // ...and once the lease is released, it is refused too.
  {
    auto hw = pb::Hardware::NewStub(front1_->channel());
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_lease_id(lease.lease_id());
    pb::ReleaseResponse resp;
    ASSERT_TRUE(hw->Release(&ctx, req, &resp).ok());
  }
  s = FlashOnBench(BenchAs("front1"), lease.lease_id());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
}

// The flash guard through a front: the front judges the image against its
// project's policy — here a source changed after the image was built —
// before a byte moves, naming the rule, and the bench's board is left as it
// was; the same image once fresh again is flashed and boots.
TEST_F(LabForward, TheFlashGuardRefusesAStaleImageThroughAFrontAndLeavesTheBoardAlone) {
  namespace fs = std::filesystem;
  const pb::Lease l = Lease(*front1_, "b1");
  ASSERT_FALSE(l.lease_id().empty());
  const std::string project = cluster_.dir() + "/project";
  fs::create_directories(project);
  const std::string image = project + "/blinky.elf";
  fs::copy_file(FWAI_BLINKY_ELF, image, fs::copy_options::overwrite_existing);
  std::ofstream(project + "/Makefile") << "all:\n";
  std::ofstream(project + "/main.c") << "int main(void) { return 0; }\n";
  const auto built = fs::last_write_time(image);
  fs::last_write_time(project + "/Makefile", built - std::chrono::seconds(60));
  fs::last_write_time(project + "/main.c",
                      built + std::chrono::seconds(10));  // edited after the build
  auto board = [&] {
    auto hw = pb::Hardware::NewStub(bench_->channel());
    grpc::ClientContext ctx;
    pb::ListDevicesResponse r;
    EXPECT_TRUE(hw->ListDevices(&ctx, {}, &r).ok());
    for (const auto& d : r.devices()) {
      if (d.id() == "b1") return d;
    }
    return pb::Device();
  };
  const pb::Device before = board();
  Flashed stale = Flash(*front1_, "b1", l.lease_id(), image, project);
  EXPECT_EQ(stale.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << stale.status.error_message();
  EXPECT_NE(stale.status.error_message().find("flash guard (fresh)"), std::string::npos)
      << stale.status.error_message();
  EXPECT_NE(stale.status.error_message().find("main.c"), std::string::npos)
      << stale.status.error_message();
  // Untouched: no byte reached the bench, its board runs what it ran.
  EXPECT_EQ(bench_->log().find("lab: flash of b1"), std::string::npos) << bench_->log();
  const pb::Device after = board();
  EXPECT_EQ(after.image_sha256(), before.image_sha256());
  EXPECT_EQ(after.image(), before.image());
  EXPECT_EQ(after.health(), "good");
  // Rebuilt (newer than its sources): the same bytes go through and boot.
  fs::last_write_time(image, built + std::chrono::seconds(20));
  Flashed fresh = Flash(*front1_, "b1", l.lease_id(), image, project);
  ASSERT_TRUE(fresh.status.ok()) << fresh.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_NE(fresh.boot_line.find("booted"), std::string::npos) << fresh.boot_line;
  EXPECT_NE(std::find(fresh.stages.begin(), fresh.stages.end(), "guard"), fresh.stages.end());
}

// Whose failure a flash on a bench's board was is the bench's to say, and its
// verdict reaches the front's caller unchanged: the bench's simulator killed
// while the board boots is the lab's; a firmware that never says it booted,
// the firmware's.
TEST_F(LabForward, TheBenchsVerdictReachesTheFrontsCaller) {
  namespace fs = std::filesystem;
  const pb::Lease l = Lease(*front1_, "b1");
  ASSERT_FALSE(l.lease_id().empty());
  // The example with its boot line changed: it runs, but never says "booted".
  std::string bytes = ReadText(FWAI_BLINKY_ELF);
  size_t changed = 0;
  for (size_t at = bytes.find("booted"); at != std::string::npos; at = bytes.find("booted", at)) {
    bytes.replace(at, 6, "bootex");
    ++changed;
  }
  ASSERT_GT(changed, 0u);
  const std::string dir = cluster_.dir() + "/mute";
  fs::create_directories(dir);
  const std::string image = dir + "/mute.elf";
  std::ofstream(image, std::ios::binary) << bytes;
  auto qemu_pid = [&] {
    auto hw = pb::Hardware::NewStub(bench_->channel());
    grpc::ClientContext ctx;
    pb::ListDevicesResponse r;
    EXPECT_TRUE(hw->ListDevices(&ctx, {}, &r).ok());
    for (const auto& d : r.devices())
      if (d.id() == "b1") return d.pid();
    return 0;
  };
  const int before = qemu_pid();
  Flashed killed;
  std::thread flash([&] { killed = Flash(*front1_, "b1", l.lease_id(), image); });
  int qemu = before;
  for (int i = 0; i < 600 && (qemu <= 0 || qemu == before); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    qemu = qemu_pid();
  }
  ASSERT_GT(qemu, 0) << bench_->log();
  ASSERT_NE(qemu, before);
  ASSERT_EQ(kill(qemu, SIGKILL), 0);
  flash.join();
  EXPECT_EQ(VerdictOf(killed.status), "lab") << killed.status.error_message();
  EXPECT_NE(killed.status.error_message().find("the bench bench1 of board b1"), std::string::npos)
      << killed.status.error_message();
  // Flashed again, the board runs it and never says it booted.
  Flashed mute = Flash(*front1_, "b1", l.lease_id(), image);
  EXPECT_EQ(VerdictOf(mute.status), "firmware") << mute.status.error_message();
  EXPECT_NE(mute.status.error_message().find("did not appear on the serial port"),
            std::string::npos)
      << mute.status.error_message();
}

TEST_F(LabForward, TheFrontChecksTheProjectsRegistersBeforeABenchsBoardIsFlashed) {
  namespace fs = std::filesystem;
  const pb::Lease l = Lease(*front1_, "b1");
  ASSERT_FALSE(l.lease_id().empty());
  const std::string project = cluster_.dir() + "/regs";
  fs::create_directories(project + "/.fwai");
  // Bit 13 of RCC_APB2ENR is reserved on the STM32F100; USART1EN is bit 14.
  auto write_source = [&](int bit) {
    std::ofstream(project + "/main.c", std::ios::trunc)
        << "#define RCC_APB2ENR (*(volatile unsigned int *)0x40021018u)\n"
        << "#define RCC_APB2ENR_USART1EN (1u << " << bit << ")\n"
        << "int main(void) {\n  RCC_APB2ENR |= RCC_APB2ENR_USART1EN;\n  return 0;\n}\n";
  };
  auto set_policy = [&](const std::string& mode) {
    std::ofstream(project + "/.fwai/project.yaml", std::ios::trunc)
        << "name: regs\ntarget: stm32f100rb\npolicy:\n  flash:\n    register_check: " << mode
        << "\n";
  };
  const std::string image = project + "/blinky.elf";
  fs::copy_file(FWAI_BLINKY_ELF, image, fs::copy_options::overwrite_existing);
  write_source(13);
  set_policy("block");
  fs::last_write_time(project + "/main.c", fs::last_write_time(image) - std::chrono::seconds(60));

  Flashed blocked = Flash(*front1_, "b1", l.lease_id(), image, project);
  EXPECT_EQ(blocked.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << blocked.status.error_message();
  EXPECT_NE(blocked.status.error_message().find(
                "flash guard (register_check): 1 register error in the sources against "
                "STM32F100.svd: main.c:2: RCC_APB2ENR_USART1EN"),
            std::string::npos)
      << blocked.status.error_message() << "\nfront:\n"
      << front1_->log();
  // Refused at the front: no byte reached the bench.
  EXPECT_EQ(bench_->log().find("lab: flash of b1"), std::string::npos) << bench_->log();

  // warn: the flash goes on through the bench and says what it went on despite.
  set_policy("warn");
  Flashed warned = Flash(*front1_, "b1", l.lease_id(), image, project);
  ASSERT_TRUE(warned.status.ok()) << warned.status.error_message() << "\nbench:\n" << bench_->log();
  EXPECT_NE(warned.messages.find("warning: register_check: 1 register error"), std::string::npos)
      << warned.messages;
  EXPECT_NE(warned.boot_line.find("booted"), std::string::npos) << warned.boot_line;

  // Fixed: block lets it through and the front's guard says the registers match.
  write_source(14);
  fs::last_write_time(project + "/main.c", fs::last_write_time(image) - std::chrono::seconds(30));
  set_policy("block");
  Flashed clean = Flash(*front1_, "b1", l.lease_id(), image, project);
  ASSERT_TRUE(clean.status.ok()) << clean.status.error_message();
  EXPECT_NE(clean.messages.find("registers match STM32F100.svd ("), std::string::npos)
      << clean.messages;
}

// A token revoked ends the leases it took, in the whole lab: bob's lease on
// the bench's own board (claimed in etcd) and carol's lab lease on it taken
// through a front, each when its node revokes the token; the board is free
// for the other nodes at once, not when the lease's TTL runs out.
TEST_F(LabForward, ALeaseTakenWithATokenEndsInTheLabWhenTheTokenIsRevoked) {
  auto token_on = [](Daemon& d, const std::string& user, std::string* id) {
    grpc::ClientContext ctx;
    pb::CreateTokenRequest req;
    req.set_user(user);
    req.set_role("user");
    pb::CreateTokenResponse resp;
    auto st = pb::Auth::NewStub(d.channel())->CreateToken(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    *id = resp.info().id();
    return resp.token();
  };
  auto revoke_on = [](Daemon& d, const std::string& id) {
    grpc::ClientContext ctx;
    pb::RevokeTokenRequest req;
    req.set_id(id);
    pb::RevokeTokenResponse resp;
    auto st = pb::Auth::NewStub(d.channel())->RevokeToken(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  };
  auto acquire_as = [](const std::shared_ptr<grpc::Channel>& ch, const std::string& token,
                       pb::Lease* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    ctx.AddMetadata("authorization", "Bearer " + token);
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(600);
    return pb::Hardware::NewStub(ch)->Acquire(&ctx, req, out);
  };
  auto held_in_lab = [&] {
    auto kv = etcd_->Get("/fwai/leases/b1");
    return kv.ok() && kv->has_value();
  };
  // Bob, with a token of the bench, takes its board: a local lease claimed in the lab.
  std::string bob_id;
  const std::string bob = token_on(*bench_, "bob", &bob_id);
  pb::Lease bobs;
  grpc::Status st = acquire_as(BenchAs(""), bob, &bobs);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_TRUE(held_in_lab());
  EXPECT_NE((*etcd_->Get("/fwai/leases/b1"))->value.find(bob_id), std::string::npos)
      << "the lab's record names the token the lease was taken with";
  pb::RevokeTokenResponse ended = revoke_on(*bench_, bob_id);
  ASSERT_EQ(ended.leases_ended_size(), 1);
  EXPECT_EQ(ended.leases_ended(0).lease_id(), bobs.lease_id());
  EXPECT_FALSE(held_in_lab()) << "the bench's board is still claimed in the lab";
  // Carol, with a token of a front that people reach over TLS, takes the
  // bench's board through it: a lab lease.
  auto front3 = std::make_unique<Daemon>(
      nullptr,
      "lab:\n  ttl_s: 3\n" + cluster_.LabEtcdYaml("front3") + "  node: front3\n  cert: " + tls_ +
          "/front3.pem\n  key: " + tls_ + "/front3.key\n  ca: " + tls_ + "/ca.pem\n" +
          "tls: {cert: " + tls_ + "/front3.pem, key: " + tls_ + "/front3.key}\n" +
          "hardware:\n  default_simulated_board: false\n",
      false);
  front3->AddListen("tls:127.0.0.1:0");
  ASSERT_TRUE(front3->Start()) << front3->log();
  std::string carol_id;
  const std::string carol = token_on(*front3, "carol", &carol_id);
  pb::Lease carols;
  st = acquire_as(fwai::testing::BenchAs(tls_, front3->TcpPort(), ""), carol, &carols);
  ASSERT_TRUE(st.ok()) << st.error_message() << "\n" << front3->log();
  EXPECT_EQ(carols.node(), "bench1");
  ASSERT_TRUE(held_in_lab());
  // Another node cannot have it meanwhile; once the token is revoked, at once.
  {
    auto hw = pb::Hardware::NewStub(front1_->channel());
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("b1");
    pb::Lease l;
    EXPECT_EQ(hw->Acquire(&ctx, req, &l).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  ended = revoke_on(*front3, carol_id);
  ASSERT_EQ(ended.leases_ended_size(), 1);
  EXPECT_EQ(ended.leases_ended(0).lease_id(), carols.lease_id());
  EXPECT_EQ(ended.leases_ended(0).node(), "bench1");
  EXPECT_FALSE(held_in_lab()) << "the lab lease outlived the token it was taken with";
  pb::Lease front1s = Lease(*front1_, "b1");
  EXPECT_FALSE(front1s.lease_id().empty());
}

}  // namespace
}  // namespace fwai::lab
