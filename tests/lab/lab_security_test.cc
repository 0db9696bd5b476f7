// The lab seen by an attacker: through a front, user bob (his own token)
// goes after a board of another bench that alice leased through the same
// front — flash, serial, reset, renew and release — and is refused each
// time, alice's lease and serial stream going on untouched; a bench refuses
// forwarded work whose node certificate is valid but whose lease is for
// another board. Real etcd, real fwaids, a real QEMU board, real TLS.
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "fwai/v1/auth.grpc.pb.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "fwai/v1/projects.grpc.pb.h"
#include "server/lab/etcd_client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/lab/etcd_cluster.h"
#include "tests/lab/lab_support.h"

namespace fwai::lab {
namespace {

using fwai::testing::Daemon;
using fwai::testing::EtcdCluster;
using fwai::testing::Eventually;
using fwai::testing::FwaidTls;
using fwai::testing::ReadText;
using fwai::testing::RunCommand;
using fwai::testing::SayAndHear;
using fwai::testing::Serial;
namespace pb = ::fwai::v1;

class LabSecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
    ASSERT_TRUE(cluster_.Start()) << cluster_.log(0);
    etcd_ = *EtcdClient::Connect(cluster_.Options());
    tls_ = cluster_.tls_dir();
    const std::string lab = "lab:\n  ttl_s: 3\n";
    bench_ = std::make_unique<Daemon>(
        nullptr,
        lab + cluster_.LabEtcdYaml("bench1") + "  node: bench1\n  advertise: tls:127.0.0.1:0\n" +
            "tls: {cert: " + tls_ + "/bench1.pem, key: " + tls_ +
            "/bench1.key, client_ca: " + tls_ + "/ca.pem}\n" +
            "hardware:\n  boards:\n"
            "    - {id: b1, kind: simulated, machine: stm32vldiscovery, boot_pattern: booted}\n"
            "    - {id: b2, kind: simulated, machine: stm32vldiscovery, boot_pattern: booted}\n",
        false);
    bench_->AddListen("tls:127.0.0.1:0");
    // The front: people come with tokens on loopback TCP.
    front_ = std::make_unique<Daemon>(
        nullptr,
        lab + cluster_.LabEtcdYaml("front1") + "  node: front1\n  cert: " + tls_ +
            "/front1.pem\n  key: " + tls_ + "/front1.key\n  ca: " + tls_ + "/ca.pem\n" +
            "users:\n  alice: {role: user}\n  bob: {role: user}\n" +
            "hardware:\n  default_simulated_board: false\n",
        false);
    front_->AddListen("tcp:127.0.0.1:0");
    for (Daemon* d : {bench_.get(), front_.get()}) ASSERT_TRUE(d->Start()) << d->log();
    ASSERT_GT(front_->TcpPort(), 0);
    ASSERT_TRUE(Eventually(
        [&] {
          auto node = etcd_->Get("/fwai/nodes/bench1");
          return node.ok() && node->has_value() &&
                 (*node)->value.find(":" + std::to_string(bench_->TcpPort()) + "\"") !=
                     std::string::npos;
        },
        std::chrono::seconds(10)))
        << bench_->log();
    alice_ = Token("alice");
    bob_ = Token("bob");
  }

  // A token for `user`, made by root on the front's unix socket (an admin).
  std::string Token(const std::string& user) {
    grpc::ClientContext ctx;
    pb::CreateTokenRequest req;
    req.set_user(user);
    req.set_role("user");
    pb::CreateTokenResponse resp;
    auto st = pb::Auth::NewStub(front_->channel())->CreateToken(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    token_ids_[resp.token()] = resp.info().id();
    return resp.token();
  }

  // The admin (root on the front's unix socket) revokes `token`.
  void Revoke(const std::string& token) {
    grpc::ClientContext ctx;
    pb::RevokeTokenRequest req;
    req.set_id(token_ids_[token]);
    pb::RevokeTokenResponse resp;
    auto st = pb::Auth::NewStub(front_->channel())->RevokeToken(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }

  // The front as the token's user (loopback TCP).
  std::unique_ptr<pb::Hardware::Stub> As(const std::string& token, grpc::ClientContext& ctx) {
    ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    // One connection per identity: the front binds a connection to its first principal.
    auto& ch = channels_[token];
    if (!ch) {
      ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(front_->TcpPort()),
                               grpc::experimental::LocalCredentials(LOCAL_TCP));
    }
    return pb::Hardware::NewStub(ch);
  }

  grpc::Status FlashAs(const std::string& token, const std::string& board,
                       const std::string& lease_id) {
    grpc::ClientContext ctx;
    auto hw = As(token, ctx);
    pb::FlashRequest req;
    req.set_device_id(board);
    req.set_lease_id(lease_id);
    req.set_image_path(FWAI_BLINKY_ELF);
    req.set_approved(true);
    auto reader = hw->Flash(&ctx, req);
    pb::FlashProgress p;
    while (reader->Read(&p)) {
    }
    return reader->Finish();
  }

  grpc::Status SerialAs(const std::string& token, const std::string& board,
                        const std::string& lease_id) {
    grpc::ClientContext ctx;
    auto hw = As(token, ctx);
    auto s = hw->Serial(&ctx);
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id(board);
    open.mutable_open()->set_lease_id(lease_id);
    s->Write(open);
    pb::SerialServerMessage m;
    if (s->Read(&m) && m.opened() == board) {
      // Opened for reading: a write must still be refused.
      pb::SerialClientMessage w;
      w.set_send_line("ping");
      s->Write(w);
      while (s->Read(&m)) {
        if (!m.error().empty()) {
          ctx.TryCancel();
          (void)s->Finish();
          return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "write refused: " + m.error());
        }
        for (const auto& l : m.lines()) {
          if (l.line() == "pong") {
            ctx.TryCancel();
            (void)s->Finish();
            return grpc::Status::OK;  // bob's line reached alice's board
          }
        }
      }
    }
    s->WritesDone();
    return s->Finish();
  }

  grpc::Status ResetAs(const std::string& token, const std::string& board,
                       const std::string& lease_id) {
    grpc::ClientContext ctx;
    auto hw = As(token, ctx);
    pb::ResetRequest req;
    req.set_device_id(board);
    req.set_lease_id(lease_id);
    pb::ResetResponse resp;
    return hw->Reset(&ctx, req, &resp);
  }

  grpc::Status RenewAs(const std::string& token, const std::string& lease_id) {
    grpc::ClientContext ctx;
    auto hw = As(token, ctx);
    pb::RenewRequest req;
    req.set_lease_id(lease_id);
    pb::Lease resp;
    return hw->Renew(&ctx, req, &resp);
  }

  grpc::Status ReleaseAs(const std::string& token, const std::string& board,
                         const std::string& lease_id, bool force = false) {
    grpc::ClientContext ctx;
    auto hw = As(token, ctx);
    pb::ReleaseRequest req;
    req.set_device_id(board);
    req.set_lease_id(lease_id);
    req.set_force(force);
    pb::ReleaseResponse resp;
    return hw->Release(&ctx, req, &resp);
  }

  // Root flashes the example firmware (it answers ping with pong) on b1
  // through the front, then lets the board go.
  void FlashTheExampleAsRootAndLetGo() {
    auto hw = pb::Hardware::NewStub(front_->channel());
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(60);
    pb::Lease root;
    ASSERT_TRUE(hw->Acquire(&ctx, req, &root).ok());
    grpc::ClientContext fctx;
    fctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    pb::FlashRequest freq;
    freq.set_device_id("b1");
    freq.set_lease_id(root.lease_id());
    freq.set_image_path(FWAI_BLINKY_ELF);
    freq.set_approved(true);
    freq.set_project_root(std::filesystem::path(FWAI_BLINKY_ELF).parent_path().string());
    auto reader = hw->Flash(&fctx, freq);
    pb::FlashProgress p;
    while (reader->Read(&p)) {
    }
    const grpc::Status st = reader->Finish();
    ASSERT_TRUE(st.ok()) << st.error_message() << "\nbench:\n" << bench_->log();
    grpc::ClientContext rctx;
    pb::ReleaseRequest rreq;
    rreq.set_lease_id(root.lease_id());
    pb::ReleaseResponse rresp;
    ASSERT_TRUE(hw->Release(&rctx, rreq, &rresp).ok());
  }

  EtcdCluster cluster_{1};
  std::unique_ptr<EtcdClient> etcd_;
  std::string tls_, alice_, bob_;
  std::unique_ptr<Daemon> bench_, front_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
  std::map<std::string, std::string> token_ids_;
};

TEST_F(LabSecurity, AnotherUserThroughTheFrontCannotTouchALeasedLabBoard) {
  // The example firmware (it answers ping with pong) on b1, flashed by root
  // through the front, which then lets the board go.
  ASSERT_NO_FATAL_FAILURE(FlashTheExampleAsRootAndLetGo());
  // alice leases bench1's b1 through the front and opens its serial port.
  pb::Lease a;
  {
    grpc::ClientContext ctx;
    auto hw = As(alice_, ctx);
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(120);
    auto st = hw->Acquire(&ctx, req, &a);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(a.node(), "bench1");
  }
  grpc::ClientContext sctx;
  auto hw = As(alice_, sctx);
  auto serial = hw->Serial(&sctx);
  {
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id("b1");
    open.mutable_open()->set_lease_id(a.lease_id());
    ASSERT_TRUE(serial->Write(open));
    pb::SerialServerMessage m;
    ASSERT_TRUE(serial->Read(&m));
    ASSERT_EQ(m.opened(), "b1") << m.error() << m.reason();
  }
  ASSERT_TRUE(SayAndHear(*serial, "ping", "pong")) << bench_->log();

  // bob, with alice's lease id: an id that is not his is NOT_FOUND
  // (nothing of alice's is revealed); without one: PERMISSION_DENIED
  // naming the rule.
  auto not_his = [](const grpc::Status& s, const char* what) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("rule: "), std::string::npos)
        << what << ": " << s.error_message();
  };
  auto denied = [](const grpc::Status& s, const char* what) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << what << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("rule: "), std::string::npos)
        << what << ": " << s.error_message();
  };
  not_his(FlashAs(bob_, "b1", a.lease_id()), "flash with alice's lease");
  denied(FlashAs(bob_, "b1", ""), "flash");
  not_his(SerialAs(bob_, "b1", a.lease_id()), "serial with alice's lease");
  denied(SerialAs(bob_, "b1", ""), "serial");
  not_his(ResetAs(bob_, "b1", a.lease_id()), "reset with alice's lease");
  denied(ResetAs(bob_, "b1", ""), "reset");
  {
    const grpc::Status s = RenewAs(bob_, a.lease_id());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  {
    const grpc::Status s = ReleaseAs(bob_, "", a.lease_id());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  denied(ReleaseAs(bob_, "b1", ""), "release by board");
  denied(ReleaseAs(bob_, "b1", "", /*force=*/true), "release --force by a user");

  // alice's lease and stream are untouched.
  EXPECT_TRUE(SayAndHear(*serial, "ping", "pong")) << bench_->log();
  EXPECT_TRUE(RenewAs(alice_, a.lease_id()).ok());
  {
    auto key = etcd_->Get("/fwai/leases/b1");
    ASSERT_TRUE(key.ok() && key->has_value());
    EXPECT_NE((*key)->value.find(a.lease_id()), std::string::npos) << (*key)->value;
  }

  // The bench: the front's node certificate is valid and its node holds
  // alice's lease — on b1. For b2 it is refused, and so is a serial stream.
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadText(tls_ + "/ca.pem");
  o.pem_cert_chain = ReadText(tls_ + "/front1.pem");
  o.pem_private_key = ReadText(tls_ + "/front1.key");
  auto bench = pb::LabNode::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(bench_->TcpPort()), grpc::SslCredentials(o)));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::ResetRequest req;
    req.set_device_id("b2");
    req.set_lease_id(a.lease_id());
    pb::ResetResponse resp;
    const grpc::Status s = bench->Reset(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("rule: a valid lab lease"), std::string::npos)
        << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto s = bench->Serial(&ctx);
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id("b2");
    open.mutable_open()->set_lease_id(a.lease_id());
    s->Write(open);
    pb::SerialServerMessage m;
    while (s->Read(&m)) {
      EXPECT_NE(m.opened(), "b2");
    }
    const grpc::Status st = s->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  }
  // ...and alice's stream on b1 still goes on.
  EXPECT_TRUE(SayAndHear(*serial, "ping", "pong")) << bench_->log();
  serial->WritesDone();
  sctx.TryCancel();
  (void)serial->Finish();
}

// A skill run's flash step on a lab board another user holds through the
// same front is refused by rule (the step fails as a policy refusal naming
// "the board's lease holder"); the holder's lease and serial stream go on and the
// board is not flashed.
TEST_F(LabSecurity, ASkillRunsFlashOnABoardAnotherUserHoldsIsRefusedByRule) {
  namespace fs = std::filesystem;
  // alice holds b1 through the front; the example firmware answers ping.
  ASSERT_NO_FATAL_FAILURE(FlashTheExampleAsRootAndLetGo());
  pb::Lease a;
  {
    grpc::ClientContext ctx;
    auto hw = As(alice_, ctx);
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(120);
    ASSERT_TRUE(hw->Acquire(&ctx, req, &a).ok());
  }
  grpc::ClientContext sctx;
  auto hw = As(alice_, sctx);
  auto serial = hw->Serial(&sctx);
  {
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id("b1");
    open.mutable_open()->set_lease_id(a.lease_id());
    ASSERT_TRUE(serial->Write(open));
    pb::SerialServerMessage m;
    ASSERT_TRUE(serial->Read(&m));
    ASSERT_EQ(m.opened(), "b1") << m.error() << m.reason();
  }
  ASSERT_TRUE(SayAndHear(*serial, "ping", "pong")) << bench_->log();
  auto flashes = [&] {
    const std::string log = bench_->log();
    size_t n = 0;
    for (size_t at = log.find("lab: flash of b1"); at != std::string::npos;
         at = log.find("lab: flash of b1", at + 1))
      ++n;
    return n;
  };
  const size_t flashed_before = flashes();

  // Another user of the front (root, on its unix socket) runs the flash
  // skill on b1.
  grpc::ClientContext rctx;
  rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  pb::RunSkillRequest run;
  const std::string project = cluster_.dir() + "/project";  // the run's logs go here
  fs::create_directories(project);
  run.set_project_root(project);
  run.set_skill("flash");
  run.set_board("b1");
  run.set_approved(true);
  (*run.mutable_vars())["IMAGE"] = FWAI_BLINKY_ELF;
  auto events = pb::Skills::NewStub(front_->channel())->Run(&rctx, run);
  pb::SkillEvent e;
  nlohmann::json summary;
  std::string step_text;
  while (events->Read(&e)) {
    if (e.kind() == "step_finished") step_text = e.text();
    if (e.kind() == "run_finished") summary = nlohmann::json::parse(e.json(), nullptr, false);
  }
  const grpc::Status st = events->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_TRUE(summary.is_object()) << step_text;
  EXPECT_FALSE(summary.value("ok", true)) << summary.dump();
  EXPECT_EQ(summary.value("failure_class", ""), "policy") << summary.dump();
  EXPECT_NE(step_text.find("rule: the board's lease holder"), std::string::npos) << step_text;
  EXPECT_NE(step_text.find("held by alice"), std::string::npos) << step_text;
  ASSERT_TRUE(summary["policy_refusals"].is_array() && summary["policy_refusals"].size() == 1)
      << summary.dump();
  EXPECT_EQ(summary["policy_refusals"][0].value("rule", ""), "the board's lease holder");
  EXPECT_EQ(summary["policy_refusals"][0].value("target", ""), "b1");

  // Nothing of alice's changed: her stream, her lease, her board's image.
  EXPECT_EQ(flashes(), flashed_before) << bench_->log();
  EXPECT_TRUE(SayAndHear(*serial, "ping", "pong")) << bench_->log();
  EXPECT_TRUE(RenewAs(alice_, a.lease_id()).ok());
  auto key = etcd_->Get("/fwai/leases/b1");
  ASSERT_TRUE(key.ok() && key->has_value());
  EXPECT_NE((*key)->value.find(a.lease_id()), std::string::npos) << (*key)->value;
  serial->WritesDone();
  sctx.TryCancel();
  (void)serial->Finish();
}

// etcd as an attacker on the lab's network meets it: root holds b1 through
// the front. Without a certificate etcd is not reached at all; with a
// person's certificate from the lab's own CA, or as another node, the
// lease, the bench's registration and its boards cannot be erased or forged.
TEST_F(LabSecurity, EtcdRefusesStrangersPeopleAndNodesWritingWhatIsNotTheirs) {
  auto hw = pb::Hardware::NewStub(front_->channel());
  grpc::ClientContext ctx;
  pb::AcquireRequest req;
  req.set_device_id("b1");
  req.set_ttl_s(120);
  pb::Lease root;
  ASSERT_TRUE(hw->Acquire(&ctx, req, &root).ok());
  auto lease_before = etcd_->Get("/fwai/leases/b1");
  ASSERT_TRUE(lease_before.ok() && lease_before->has_value());
  auto node_before = etcd_->Get("/fwai/nodes/bench1");
  ASSERT_TRUE(node_before.ok() && node_before->has_value());
  ASSERT_TRUE(FwaidTls({"issue", tls_, "--user", "mallory"}));

  // etcdctl as `who` ("" : no client certificate); its exit code and words.
  auto ctl = [&](const std::string& who, const std::vector<std::string>& args, std::string* said) {
    std::vector<std::string> env = cluster_.CtlEnv(who);
    std::vector<std::string> argv = {"/usr/bin/env"};
    if (who.empty()) argv.insert(argv.end(), {"-u", "ETCDCTL_CERT", "-u", "ETCDCTL_KEY"});
    argv.insert(argv.end(), {"/usr/bin/etcdctl", "--command-timeout=3s"});
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out, err;
    const int rc = RunCommand(argv, &out, &err, env, 20);
    *said = out + err;
    return rc;
  };
  std::string said;
  for (const std::string& who : {std::string(), std::string("mallory")}) {
    EXPECT_NE(ctl(who, {"del", "/fwai/leases/b1"}, &said), 0) << who << ": " << said;
    EXPECT_NE(ctl(who, {"put", "/fwai/leases/b2", R"({"holder":"mallory"})"}, &said), 0)
        << who << ": " << said;
    EXPECT_NE(ctl(who, {"get", "--prefix", "/fwai/"}, &said), 0) << who << ": " << said;
    EXPECT_EQ(said.find("bench1"), std::string::npos) << who << " read the registry: " << said;
  }
  // A node (front1) may lease boards, but not be bench1 or add boards to it.
  EXPECT_NE(
      ctl("front1",
          {"put", "/fwai/nodes/bench1", R"({"node":"bench1","advertise":"tls:6.6.6.6:1"})"}, &said),
      0)
      << said;
  EXPECT_NE(said.find("permission denied"), std::string::npos) << said;
  EXPECT_NE(
      ctl("front1", {"put", "/fwai/boards/bench1/b9", R"({"id":"b9","node":"bench1"})"}, &said), 0)
      << said;
  EXPECT_NE(ctl("front1", {"del", "--prefix", "/fwai/boards/bench1/"}, &said), 0) << said;
  EXPECT_EQ(ctl("front1", {"get", "/fwai/nodes/bench1"}, &said), 0)
      << said;  // reading is every node's

  // Nothing changed: root's lease, bench1's registration and boards.
  auto lease_after = etcd_->Get("/fwai/leases/b1");
  ASSERT_TRUE(lease_after.ok() && lease_after->has_value());
  EXPECT_EQ((*lease_after)->mod_revision, (*lease_before)->mod_revision);
  EXPECT_NE((*lease_after)->value.find(root.lease_id()), std::string::npos);
  EXPECT_FALSE(etcd_->Get("/fwai/leases/b2")->has_value());
  auto node_after = etcd_->Get("/fwai/nodes/bench1");
  ASSERT_TRUE(node_after.ok() && node_after->has_value());
  EXPECT_EQ((*node_after)->value, (*node_before)->value);
  EXPECT_FALSE(etcd_->Get("/fwai/boards/bench1/b9")->has_value());
  EXPECT_TRUE(etcd_->Get("/fwai/boards/bench1/b1")->has_value());
  // And through the front the board is still root's.
  grpc::ClientContext rctx;
  pb::RenewRequest renew;
  renew.set_lease_id(root.lease_id());
  pb::Lease renewed;
  EXPECT_TRUE(hw->Renew(&rctx, renew, &renewed).ok());
}

// A node joins the lab only under the name its certificate gives it: a
// second bench with bench1's certificate claiming bench2, or with a
// person's certificate, does not start and says why; bench1's registration
// is untouched.
TEST_F(LabSecurity, ANodeClaimingAnotherNameThanItsCertificatesIsRefusedAtStart) {
  ASSERT_TRUE(FwaidTls({"issue", tls_, "--user", "carol"}));
  auto node_before = etcd_->Get("/fwai/nodes/bench1");
  ASSERT_TRUE(node_before.ok() && node_before->has_value());
  struct Case {
    std::string cert, says;
  } cases[] = {
      {"bench1", "is node bench1's certificate, but lab.node is bench2"},
      {"carol", "is not a lab node's certificate"},
  };
  for (const Case& k : cases) {
    Daemon impostor(
        nullptr,
        "lab:\n  ttl_s: 3\n  etcd: [https://" + cluster_.endpoint(0) + "]\n  node: bench2\n" +
            "tls: {cert: " + tls_ + "/" + k.cert + ".pem, key: " + tls_ + "/" + k.cert +
            ".key, client_ca: " + tls_ + "/ca.pem}\n" +
            "hardware:\n  boards:\n    - {id: b7, kind: simulated, machine: stm32vldiscovery}\n",
        false);
    EXPECT_FALSE(impostor.Start()) << k.cert;
    EXPECT_NE(impostor.log().find(k.says), std::string::npos) << impostor.log();
    EXPECT_NE(impostor.log().find("fwaid tls issue DIR --node bench2"), std::string::npos)
        << impostor.log();
  }
  EXPECT_FALSE(etcd_->Get("/fwai/nodes/bench2")->has_value());
  EXPECT_EQ((*etcd_->Get("/fwai/nodes/bench1"))->value, (*node_before)->value);
}

// One CA signs people and nodes: a person's certificate is no node to a
// bench (LabNode calls refused before any lease is looked at), and a node's
// certificate is no person (the calls people make are refused to it).
TEST_F(LabSecurity, APersonsCertificateIsNoNodeAndANodesIsNoPerson) {
  ASSERT_TRUE(FwaidTls({"issue", tls_, "--user", "dave"}));
  auto channel_as = [&](const std::string& who) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadText(tls_ + "/ca.pem");
    o.pem_cert_chain = ReadText(tls_ + "/" + who + ".pem");
    o.pem_private_key = ReadText(tls_ + "/" + who + ".key");
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(bench_->TcpPort()),
                               grpc::SslCredentials(o));
  };
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::ResetRequest req;
    req.set_device_id("b1");
    pb::ResetResponse resp;
    const grpc::Status s = pb::LabNode::NewStub(channel_as("dave"))->Reset(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_NE(s.error_message().find("not a lab node's certificate"), std::string::npos)
        << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(60);
    pb::Lease lease;
    const grpc::Status s = pb::Hardware::NewStub(channel_as("front1"))->Acquire(&ctx, req, &lease);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }
  EXPECT_FALSE(etcd_->Get("/fwai/leases/b1")->has_value());
}

// A debug session through the front ends with its user's token on the
// bench too: alice's `continue` on bench1's b1 (gdb waiting up to 30 s on the
// bench) ends UNAUTHENTICATED at the front once her token is revoked, and the
// bench's gdb is gone with it, not left to its timeout.
TEST_F(LabSecurity, ARevokedTokensDebugSessionEndsOnTheBenchToo) {
  ASSERT_NO_FATAL_FAILURE(FlashTheExampleAsRootAndLetGo());
  pb::Lease a;
  {
    grpc::ClientContext ctx;
    auto hw = As(alice_, ctx);
    pb::AcquireRequest req;
    req.set_device_id("b1");
    req.set_ttl_s(120);
    ASSERT_TRUE(hw->Acquire(&ctx, req, &a).ok());
  }
  // gdb sessions of the bench's boards, by their command lines.
  auto gdbs = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string cmd = ReadText(e.path().string() + "/cmdline");
      n += cmd.find("--interpreter=mi3") != std::string::npos &&
           cmd.find(bench_->dir()) != std::string::npos;
    }
    return n;
  };
  grpc::Status debugged;
  std::thread debug([&] {
    grpc::ClientContext ctx;
    auto hw = As(alice_, ctx);
    pb::DebugRequest req;
    req.set_device_id("b1");
    req.set_lease_id(a.lease_id());
    req.add_commands("continue");
    req.set_timeout_s(30);
    pb::DebugResponse resp;
    debugged = hw->Debug(&ctx, req, &resp);
  });
  const bool started = Eventually([&] { return gdbs() > 0; }, std::chrono::seconds(30));
  Revoke(alice_);
  const auto revoked = std::chrono::steady_clock::now();
  debug.join();
  ASSERT_TRUE(started) << "gdb never ran on the bench\n" << bench_->log();
  EXPECT_EQ(debugged.error_code(), grpc::StatusCode::UNAUTHENTICATED) << debugged.error_message();
  EXPECT_NE(debugged.error_message().find("revoked"), std::string::npos)
      << debugged.error_message();
  // Gone with the call (about a second), not when the board's lease ends on
  // the bench some seconds later, nor at gdb's 30 s timeout.
  EXPECT_TRUE(Eventually([&] { return gdbs() == 0; }, std::chrono::seconds(3)))
      << "the bench's gdb outlived the call";
  std::fprintf(stderr, "gdb gone %.2f s after the revocation\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - revoked).count());
}

}  // namespace
}  // namespace fwai::lab
