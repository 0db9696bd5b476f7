// The shared daemon, tried as an attacker would: TCP without credentials,
// bad and revoked tokens, wrong CAs and unmapped certificates, a second
// identity on one connection, another user's sessions, runs, records and
// leases, every RPC of the API without a token, limits. Real TLS (made with
// fwaid tls), real tokens, a real fwaid.
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "client/lib/client.h"
#include "common/local_account.h"
#include "fwai/v1/auth.grpc.pb.h"
#include "fwai/v1/evidence.grpc.pb.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "fwai/v1/projects.grpc.pb.h"
#include "fwai/v1/tool_catalog.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `fwaid tls ...`; true on exit 0.
bool FwaidTls(const std::vector<std::string>& args, std::string* err = nullptr) {
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwaid", "tls"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out, e;
  int rc = RunCommand(argv, &out, &e);
  if (err) *err = e;
  return rc == 0;
}

// A channel to `address` ("tcp:127.0.0.1:PORT" or "tls:...") with `creds`.
std::shared_ptr<grpc::Channel> Channel(const std::string& address, const Credentials& creds) {
  auto addr = ResolveDaemonAddress(address);
  if (!addr.ok()) return nullptr;
  auto ch = ConnectToDaemon(*addr, false, 5000, creds);
  return ch.ok() ? *ch : nullptr;
}

// Without a handshake: ConnectToDaemon waits for a ready channel, which a
// refused TLS handshake never gives.
std::shared_ptr<grpc::Channel> LazyChannel(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> creds) {
  return grpc::CreateChannel(target, std::move(creds));
}

grpc::Status WhoAmI(const std::shared_ptr<grpc::Channel>& ch, pb::WhoAmIResponse* out = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::WhoAmIResponse r;
  auto st = pb::Auth::NewStub(ch)->WhoAmI(&ctx, pb::WhoAmIRequest(), &r);
  if (out) *out = r;
  return st;
}

// One Knowledge.Ingest: a header naming `name`, `collection` and the
// `declared` size, then `sent` bytes of Markdown in 256 KB messages. The
// status the stream ends with.
grpc::Status Upload(pb::Knowledge::Stub& stub, const std::string& name,
                    const std::string& collection, int64_t declared, size_t sent) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub.Ingest(&ctx);
  pb::IngestChunk head;
  head.mutable_header()->set_name(name);
  head.mutable_header()->set_collection(collection);
  head.mutable_header()->set_size(declared);
  stream->Write(head);
  const std::string line = "# Notes\n\nThe UART0 baud rate register holds the divisor.\n";
  std::string body;
  while (body.size() < sent) body += line;
  body.resize(sent);
  for (size_t at = 0; at < body.size(); at += 256 * 1024) {
    pb::IngestChunk part;
    part.set_data(body.substr(at, 256 * 1024));
    if (!stream->Write(part)) break;
  }
  stream->WritesDone();
  pb::IngestProgress p;
  while (stream->Read(&p)) {
  }
  return stream->Finish();
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_GT(fake_.Start(), 0); }

  // fwaid with `yaml` and a loopback TCP listener (TLS when `tls`).
  void StartDaemon(const std::string& yaml, const std::string& listen = "tcp:127.0.0.1:0") {
    d_ = std::make_unique<Daemon>(&fake_, yaml);
    d_->AddListen(listen);
    ASSERT_TRUE(d_->Start()) << d_->log();
    port_ = d_->TcpPort();
    ASSERT_GT(port_, 0) << d_->log();
  }
  std::string Tcp() const { return "tcp:127.0.0.1:" + std::to_string(port_); }
  std::string Tls() const { return "tls:localhost:" + std::to_string(port_); }

  // A token made by an admin (this test runs as root: the unix socket's
  // root peer is an admin).
  std::string MakeToken(const std::string& user, const std::string& role = "user",
                        int64_t ttl_s = 0) {
    grpc::ClientContext ctx;
    pb::CreateTokenRequest req;
    req.set_user(user);
    req.set_role(role);
    req.set_expires_in_s(ttl_s);
    pb::CreateTokenResponse resp;
    auto st = pb::Auth::NewStub(d_->channel())->CreateToken(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    token_ids_[resp.token()] = resp.info().id();
    return resp.token();
  }

  // An admin (root on the unix socket) revokes a token MakeToken made.
  void RevokeToken(const std::string& token) {
    grpc::ClientContext ctx;
    pb::RevokeTokenRequest req;
    req.set_id(token_ids_[token]);
    pb::RevokeTokenResponse resp;
    ASSERT_TRUE(pb::Auth::NewStub(d_->channel())->RevokeToken(&ctx, req, &resp).ok());
  }

  // TLS material in DIR: CA, a server certificate for localhost and
  // 127.0.0.1, and client certificates for `users`.
  std::string MakeTls(const std::string& name, const std::vector<std::string>& users = {}) {
    std::string dir = d_tmp_ + "/" + name;
    std::string err;
    EXPECT_TRUE(FwaidTls({"init", dir, "--host", "localhost", "--host", "127.0.0.1"}, &err)) << err;
    for (const auto& u : users) EXPECT_TRUE(FwaidTls({"issue", dir, "--user", u}, &err)) << err;
    return dir;
  }

  void SetUpTmp() { d_tmp_ = MakeTempDir("fwai-sec-"); }
  void TearDown() override {
    if (!d_tmp_.empty()) fs::remove_all(d_tmp_);
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  int port_ = 0;
  std::string d_tmp_;
  std::map<std::string, std::string> token_ids_;
};

TEST_F(SecurityTest, TcpOffLoopbackWithoutTlsRefusesToStart) {
  std::string dir = MakeTempDir("fwai-sec-");
  std::string out, err;
  int rc = RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "--data-dir", dir + "/data",
                       "--listen", "unix:" + dir + "/s.sock", "--listen", "tcp:0.0.0.0:0"},
                      &out, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("0.0.0.0 is not a loopback address"), std::string::npos) << err;
  EXPECT_NE(err.find("fwaid tls init"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST_F(SecurityTest, LoopbackTcpNeedsAValidToken) {
  StartDaemon("");
  // No token at all, a malformed one, a well-formed one that does not exist.
  for (const std::string& token : {std::string(), std::string("hunter2"),
                                   std::string("fwai_aaaaaaaaaa_") + std::string(43, 'A')}) {
    auto ch = Channel(Tcp(), Credentials{"", "", "", token});
    ASSERT_NE(ch, nullptr);
    auto st = WhoAmI(ch);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << token << ": " << st.error_message();
  }
  // A plaintext client (no local credentials) gets no further.
  auto plain =
      LazyChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials());
  auto st = WhoAmI(plain);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.error_code(), grpc::StatusCode::OK);
  // The right token works and says who it is.
  const std::string token = MakeToken("alice");
  pb::WhoAmIResponse who;
  ASSERT_TRUE(WhoAmI(Channel(Tcp(), Credentials{"", "", "", token}), &who).ok());
  EXPECT_EQ(who.principal(), "user:alice");
  EXPECT_EQ(who.role(), "user");
  EXPECT_EQ(who.token_id(), token_ids_[token]);
  EXPECT_FALSE(who.file_access()) << "alice has no local account";
}

// Every RPC of every service, called over TCP without credentials, is
// refused before it does anything.
TEST_F(SecurityTest, EveryRpcRefusesACallerWithoutCredentials) {
  StartDaemon("");
  auto ch = LazyChannel("127.0.0.1:" + std::to_string(port_),
                        grpc::experimental::LocalCredentials(LOCAL_TCP));
  grpc::GenericStub stub(ch);
  int checked = 0;
  // A message of each service's file makes sure its descriptors are linked in.
  const std::vector<std::pair<std::string, const google::protobuf::Descriptor*>> services = {
      {"Sessions", pb::CreateSessionRequest::descriptor()},
      {"Daemon", pb::DaemonStatusRequest::descriptor()},
      {"Auth", pb::WhoAmIRequest::descriptor()},
      {"Knowledge", pb::SearchRequest::descriptor()},
      {"ToolCatalog", pb::ToolSearchRequest::descriptor()},
      {"Hardware", pb::AcquireRequest::descriptor()},
      {"Projects", pb::InitRequest::descriptor()},
      {"Skills", pb::RunSkillRequest::descriptor()},
      {"Evidence", pb::ListRunsRequest::descriptor()}};
  for (const auto& [name, message] : services) {
    const std::string service = "fwai.v1." + name;
    const auto* sd = message->file()->FindServiceByName(name);
    ASSERT_NE(sd, nullptr) << service;
    for (int i = 0; i < sd->method_count(); ++i) {
      const std::string method = "/" + service + "/" + sd->method(i)->name();
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      grpc::CompletionQueue cq;
      auto call = stub.PrepareCall(&ctx, method, &cq);
      call->StartCall(reinterpret_cast<void*>(1));
      void* tag;
      bool ok;
      cq.Next(&tag, &ok);
      grpc::ByteBuffer empty;
      call->Write(grpc::ByteBuffer(), reinterpret_cast<void*>(2));
      cq.Next(&tag, &ok);
      call->WritesDone(reinterpret_cast<void*>(3));
      cq.Next(&tag, &ok);
      grpc::Status st;
      call->Finish(&st, reinterpret_cast<void*>(4));
      while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
      }
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << ": " << st.error_message();
      ++checked;
    }
  }
  EXPECT_GE(checked, 45);
}

// Chat and Attach parse what they read themselves (they are raw methods): a
// caller without credentials who sends them bytes that are no message at all
// is refused as unauthenticated, as for every other method (the raw methods
// are behind the same check); the refusal does not tell it what the message
// must be.
TEST_F(SecurityTest, BytesSentToChatOrAttachWithoutCredentialsAreRefusedBeforeTheyAreRead) {
  StartDaemon("");
  auto ch = LazyChannel("127.0.0.1:" + std::to_string(port_),
                        grpc::experimental::LocalCredentials(LOCAL_TCP));
  const std::string garbage("\x0f\xff\xff\xff", 4);
  for (const char* method : {"/fwai.v1.Sessions/Chat", "/fwai.v1.Sessions/Attach"}) {
    const grpc::Status st = RawStream(ch, method, garbage);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << st.error_message();
    EXPECT_EQ(st.error_message().find("fwai.v1."), std::string::npos)
        << method << ": " << st.error_message();
  }
}

TEST_F(SecurityTest, RevokedAndExpiredTokensAreRefusedSayingSoAndTheirStreamsEnd) {
  StartDaemon("");
  const std::string token = MakeToken("alice");
  auto ch = Channel(Tcp(), Credentials{"", "", "", token});
  ASSERT_NE(ch, nullptr);
  // Alice's session, followed live.
  pb::Session s;
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_title("alice's");
    ASSERT_TRUE(pb::Sessions::NewStub(ch)->Create(&ctx, req, &s).ok());
  }
  grpc::ClientContext follow_ctx;
  pb::AttachRequest areq;
  areq.set_session_id(s.id());
  auto follower = pb::Sessions::NewStub(ch)->Attach(&follow_ctx, areq);
  // The admin revokes the token (on the unix socket, as root).
  RevokeToken(token);
  const auto t0 = std::chrono::steady_clock::now();
  pb::ServerEvent ev;
  while (follower->Read(&ev)) {
  }
  auto st = follower->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
      << "the stream outlived its token";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  st = WhoAmI(ch);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("was revoked at"), std::string::npos) << st.error_message();
  // An expired token says so: good for its 60 s, refused past them (fwaid's
  // clock is moved, not waited for).
  const std::string short_lived = MakeToken("bob", "user", 60);
  auto bob = Channel(Tcp(), Credentials{"", "", "", short_lived});
  st = WhoAmI(bob);
  ASSERT_TRUE(st.ok()) << st.error_message();
  pb::Session bobs;
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_title("bob's");
    ASSERT_TRUE(pb::Sessions::NewStub(bob)->Create(&ctx, req, &bobs).ok());
  }
  grpc::ClientContext bob_follow_ctx;
  pb::AttachRequest breq;
  breq.set_session_id(bobs.id());
  auto bob_follower = pb::Sessions::NewStub(bob)->Attach(&bob_follow_ctx, breq);
  d_->AdvanceClock(61'000'000);
  // His stream ends with the token, within a sweep of the gate.
  const auto t1 = std::chrono::steady_clock::now();
  st = bob_follower->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5))
      << "the stream outlived its token";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("expired"), std::string::npos) << st.error_message();
  st = WhoAmI(bob);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("expired at"), std::string::npos) << st.error_message();
  // Revocation and refusals are in the evidence log.
  grpc::ClientContext ctx;
  pb::ExportRequest ereq;
  ereq.set_format("json");
  pb::ExportResponse exp;
  ASSERT_TRUE(pb::Evidence::NewStub(d_->channel())->Export(&ctx, ereq, &exp).ok());
  EXPECT_NE(exp.data().find("token_revoked"), std::string::npos);
  EXPECT_NE(exp.data().find("\"kind\": \"refusal\""), std::string::npos);
}

// Every stream a token opened ends once the token is revoked, saying so, and
// the work behind it stops: a held lease is released (and recorded), an
// upload left open is not stored.
TEST_F(SecurityTest, StreamsOfARevokedTokenEndSayingSoAndTheirWorkStops) {
  StartDaemon("");
  const std::string token = MakeToken("alice");
  auto ch = Channel(Tcp(), Credentials{"", "", "", token});
  ASSERT_NE(ch, nullptr);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(20);
  // An upload into a personal collection, left open mid-way.
  grpc::ClientContext up_ctx;
  up_ctx.set_deadline(deadline);
  auto upload = pb::Knowledge::NewStub(ch)->Ingest(&up_ctx);
  {
    pb::IngestChunk head;
    head.mutable_header()->set_name("half.md");
    head.mutable_header()->set_collection("~notes");
    head.mutable_header()->set_size(64 * 1024);
    ASSERT_TRUE(upload->Write(head));
    pb::IngestChunk part;
    part.set_data("# Half\n\nThe first half of a document whose second half never comes.\n");
    ASSERT_TRUE(upload->Write(part));
  }
  // The simulated board, held: the lease comes first.
  grpc::ClientContext hold_ctx;
  hold_ctx.set_deadline(deadline);
  pb::AcquireRequest hreq;
  hreq.set_device_id("sim-stm32vl");
  hreq.set_ttl_s(30);
  auto hold = pb::Hardware::NewStub(ch)->Hold(&hold_ctx, hreq);
  pb::Lease lease;
  ASSERT_TRUE(hold->Read(&lease)) << hold->Finish().error_message();
  ASSERT_FALSE(lease.lease_id().empty());
  EXPECT_NE(lease.holder().find("alice"), std::string::npos) << lease.holder();
  // The admin revokes the token (on the unix socket, as root).
  RevokeToken(token);
  const auto t0 = std::chrono::steady_clock::now();
  pb::Lease more;
  while (hold->Read(&more)) {
  }
  auto st = hold->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "Hold: " << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  pb::IngestProgress p;
  while (upload->Read(&p)) {
  }
  st = upload->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "Ingest: " << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "the streams outlived their token";
  // The board is free: the admin takes it at once, and alice's lease was
  // released on the record.
  auto hw = pb::Hardware::NewStub(d_->channel());
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("sim-stm32vl");
    pb::Lease mine;
    auto acquired = hw->Acquire(&ctx, req, &mine);
    ASSERT_TRUE(acquired.ok()) << "the revoked token's lease still holds the board: "
                               << acquired.error_message();
    grpc::ClientContext rctx;
    pb::ReleaseRequest rel;
    rel.set_lease_id(mine.lease_id());
    pb::ReleaseResponse out;
    EXPECT_TRUE(hw->Release(&rctx, rel, &out).ok());
  }
  grpc::ClientContext ectx;
  pb::ExportRequest ereq;
  ereq.set_format("json");
  pb::ExportResponse exp;
  ASSERT_TRUE(pb::Evidence::NewStub(d_->channel())->Export(&ectx, ereq, &exp).ok());
  // The lease's end is on the record: released by alice's hold as its
  // stream ended, or ended by the revocation itself (whichever came first).
  bool released = false;
  const json all = json::parse(exp.data());
  for (const auto& r : all["records"]) {
    const auto& rec = r["record"];
    if (rec.value("kind", "") == "lease_released" &&
        rec.value("lease_id", "") == lease.lease_id()) {
      released = released || rec.value("principal", "") == "user:alice";
    }
    if (rec.value("kind", "") == "token_revoked" && rec.contains("leases_ended")) {
      for (const auto& l : rec["leases_ended"])
        released = released || l.value("lease_id", "") == lease.lease_id();
    }
  }
  EXPECT_TRUE(released) << "no record of the end of " << lease.lease_id();
  // Half an upload is not a document.
  grpc::ClientContext lctx;
  pb::ListDocumentsRequest lreq;
  lreq.set_collection("~alice/notes");
  pb::ListDocumentsResponse docs;
  ASSERT_TRUE(pb::Knowledge::NewStub(d_->channel())->ListDocuments(&lctx, lreq, &docs).ok());
  EXPECT_EQ(docs.documents_size(), 0);
}

// The rule for a lease taken with a token that is later revoked: it ends at
// once, whoever else waits gets the board, and the revocation's record
// names it. It is the token's, not the person's: revoking alice's other
// token leaves it alone. Which token holds a lease is told to its holder
// and admins, never to another user.
TEST_F(SecurityTest, ALeaseTakenWithARevokedTokenEndsAtOnceAndTheBoardGoesToTheNextWaiter) {
  StartDaemon("");
  const std::string token = MakeToken("alice");
  const std::string other = MakeToken("alice");
  const std::string bobs = MakeToken("bob");
  auto alice = Channel(Tcp(), Credentials{"", "", "", token});
  auto bob = Channel(Tcp(), Credentials{"", "", "", bobs});
  ASSERT_NE(alice, nullptr);
  ASSERT_NE(bob, nullptr);
  pb::Lease lease;
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("sim-stm32vl");
    req.set_ttl_s(600);
    auto st = pb::Hardware::NewStub(alice)->Acquire(&ctx, req, &lease);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  auto token_of = [&](const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    pb::WhoResponse who;
    EXPECT_TRUE(pb::Hardware::NewStub(ch)->Who(&ctx, pb::WhoRequest(), &who).ok());
    for (const auto& l : who.leases()) {
      if (l.lease_id() == lease.lease_id()) return l.token_id();
    }
    return std::string("(no lease)");
  };
  EXPECT_EQ(token_of(alice), token_ids_[token]);
  EXPECT_EQ(token_of(d_->channel()), token_ids_[token]) << "an admin sees it";
  EXPECT_EQ(token_of(bob), "") << "another user learns which token holds alice's lease";
  auto revoke = [&](const std::string& t) {
    grpc::ClientContext ctx;
    pb::RevokeTokenRequest req;
    req.set_id(token_ids_[t]);
    pb::RevokeTokenResponse resp;
    EXPECT_TRUE(pb::Auth::NewStub(d_->channel())->RevokeToken(&ctx, req, &resp).ok());
    return resp;
  };
  // Her other token: the lease is not its.
  EXPECT_EQ(revoke(other).leases_ended_size(), 0);
  EXPECT_EQ(token_of(d_->channel()), token_ids_[token]) << "the lease ended with another token";
  // Bob waits for the board; the token that took it is revoked.
  grpc::Status bobs_wait;
  pb::Lease bobs_lease;
  std::thread waiter([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pb::AcquireRequest req;
    req.set_device_id("sim-stm32vl");
    req.set_wait_s(60);
    bobs_wait = pb::Hardware::NewStub(bob)->Acquire(&ctx, req, &bobs_lease);
  });
  bool queued = false;
  for (int i = 0; i < 400 && !queued; ++i) {
    grpc::ClientContext ctx;
    pb::WhoResponse who;
    queued = pb::Hardware::NewStub(d_->channel())->Who(&ctx, pb::WhoRequest(), &who).ok() &&
             who.waiters_size() == 1;
    if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(queued) << "bob never queued";
  pb::RevokeTokenResponse revoked = revoke(token);
  ASSERT_EQ(revoked.leases_ended_size(), 1);
  EXPECT_EQ(revoked.leases_ended(0).lease_id(), lease.lease_id());
  EXPECT_EQ(revoked.leases_ended(0).device_id(), "sim-stm32vl");
  waiter.join();
  ASSERT_TRUE(bobs_wait.ok()) << "the revoked token's lease kept the board: "
                              << bobs_wait.error_message();
  EXPECT_NE(bobs_lease.holder().find("bob"), std::string::npos) << bobs_lease.holder();
  // The revocation's record names the lease that ended with it.
  grpc::ClientContext ectx;
  pb::ExportRequest ereq;
  ereq.set_format("json");
  pb::ExportResponse exp;
  ASSERT_TRUE(pb::Evidence::NewStub(d_->channel())->Export(&ectx, ereq, &exp).ok());
  bool recorded = false;
  const json all = json::parse(exp.data());
  for (const auto& r : all["records"]) {
    const auto& rec = r["record"];
    if (rec.value("kind", "") != "token_revoked" || rec.value("token_id", "") != token_ids_[token])
      continue;
    for (const auto& l : rec["leases_ended"]) {
      recorded = recorded || (l.value("lease_id", "") == lease.lease_id() &&
                              l.value("holder", "") == "user:alice");
    }
  }
  EXPECT_TRUE(recorded) << "no token_revoked record naming " << lease.lease_id();
}

// A board's streams end with the token that opened them: alice's serial
// stream and her flash (waiting for a boot line that never comes, for up to
// 15 s) both end UNAUTHENTICATED saying "revoked" as soon as the admin
// revokes the token, and the flash stops: the board is free for the next
// operation at once instead of after the boot wait.
TEST_F(SecurityTest, SerialAndFlashStreamsEndWithTheirTokenAndTheFlashStops) {
  ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
  StartDaemon(
      "hardware:\n  default_simulated_board: false\n  boards:\n"
      "    - {id: quiet, kind: simulated, machine: stm32vldiscovery, boot_pattern: \"no such "
      "line\"}\n"
      "    - {id: chatty, kind: simulated, machine: stm32vldiscovery, boot_pattern: booted}\n"
      // The image is read as alice's account (this test's own).
      "users:\n  alice: {role: user, local_user: root}\n");
  const std::string token = MakeToken("alice");
  auto ch = Channel(Tcp(), Credentials{"", "", "", token});
  auto hw = pb::Hardware::NewStub(ch);
  auto lease_of = [&](const std::string& board) {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id(board);
    req.set_ttl_s(120);
    pb::Lease lease;
    EXPECT_TRUE(hw->Acquire(&ctx, req, &lease).ok());
    return lease.lease_id();
  };
  const std::string quiet = lease_of("quiet"), chatty = lease_of("chatty");
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(60);
  // The serial stream on chatty, open and reading.
  grpc::ClientContext sctx;
  sctx.set_deadline(deadline);
  auto serial = hw->Serial(&sctx);
  {
    pb::SerialClientMessage open;
    open.mutable_open()->set_device_id("chatty");
    open.mutable_open()->set_lease_id(chatty);
    ASSERT_TRUE(serial->Write(open));
    pb::SerialServerMessage m;
    ASSERT_TRUE(serial->Read(&m));
    ASSERT_EQ(m.opened(), "chatty") << m.error();
  }
  // The flash on quiet, waiting for its boot line.
  grpc::ClientContext fctx;
  fctx.set_deadline(deadline);
  pb::FlashRequest freq;
  freq.set_device_id("quiet");
  freq.set_lease_id(quiet);
  freq.set_image_path(FWAI_BLINKY_ELF);
  freq.set_approved(true);
  freq.set_project_root(std::filesystem::path(FWAI_BLINKY_ELF).parent_path().string());
  auto flash = hw->Flash(&fctx, freq);
  pb::FlashProgress p;
  bool booting = false;
  while (!booting && flash->Read(&p)) booting = p.stage() == "booting";
  ASSERT_TRUE(booting) << flash->Finish().error_message();

  RevokeToken(token);
  const auto revoked = std::chrono::steady_clock::now();
  while (flash->Read(&p)) {
  }
  grpc::Status st = flash->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "Flash: " << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  pb::SerialServerMessage m;
  while (serial->Read(&m)) {
  }
  st = serial->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "Serial: " << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  // The flash stopped: the admin's reset of quiet (which waits for any
  // operation on the board) is done long before the 15 s boot wait. The
  // lease on quiet ended with the token: the admin takes the board at once.
  auto admin = pb::Hardware::NewStub(d_->channel());
  grpc::ClientContext actx;
  pb::AcquireRequest areq;
  areq.set_device_id("quiet");
  pb::Lease mine;
  ASSERT_TRUE(admin->Acquire(&actx, areq, &mine).ok());
  grpc::ClientContext rctx;
  pb::ResetRequest rreq;
  rreq.set_device_id("quiet");
  rreq.set_lease_id(mine.lease_id());
  pb::ResetResponse rresp;
  ASSERT_TRUE(admin->Reset(&rctx, rreq, &rresp).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - revoked, std::chrono::seconds(10))
      << "the revoked flash went on waiting for its boot line";
}

// A debug session ends with the token too: alice's `continue` (the target
// running, gdb waiting up to 30 s for it to stop) ends UNAUTHENTICATED saying
// "revoked" once the admin revokes her token, and gdb is gone with it.
TEST_F(SecurityTest, ADebugSessionEndsWithItsTokenAndItsGdbGoes) {
  ASSERT_TRUE(std::filesystem::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
  StartDaemon(
      "hardware:\n  default_simulated_board: false\n  boards:\n"
      "    - {id: dbg, kind: simulated, machine: stm32vldiscovery, boot_pattern: booted}\n"
      "users:\n  alice: {role: user, local_user: root}\n");
  const std::string token = MakeToken("alice");
  auto hw = pb::Hardware::NewStub(Channel(Tcp(), Credentials{"", "", "", token}));
  pb::Lease lease;
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("dbg");
    req.set_ttl_s(120);
    ASSERT_TRUE(hw->Acquire(&ctx, req, &lease).ok());
  }
  {
    grpc::ClientContext ctx;
    pb::FlashRequest req;
    req.set_device_id("dbg");
    req.set_lease_id(lease.lease_id());
    req.set_image_path(FWAI_BLINKY_ELF);
    req.set_approved(true);
    req.set_project_root(std::filesystem::path(FWAI_BLINKY_ELF).parent_path().string());
    auto flash = hw->Flash(&ctx, req);
    pb::FlashProgress p;
    while (flash->Read(&p)) {
    }
    ASSERT_TRUE(flash->Finish().ok());
  }
  // gdb sessions of this daemon's boards, by their command lines.
  const std::string images = d_->dir();
  auto gdbs = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string cmd = Read(e.path().string() + "/cmdline");
      n += cmd.find("--interpreter=mi3") != std::string::npos &&
           cmd.find(images) != std::string::npos;
    }
    return n;
  };
  grpc::Status debugged;
  std::thread debug([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
    pb::DebugRequest req;
    req.set_device_id("dbg");
    req.set_lease_id(lease.lease_id());
    req.add_commands("continue");
    req.set_timeout_s(30);
    pb::DebugResponse resp;
    debugged = hw->Debug(&ctx, req, &resp);
  });
  bool started = false;  // gdb runs (connecting, or waiting on `continue`)
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !started && std::chrono::steady_clock::now() < until;) {
    started = gdbs() > 0;
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  RevokeToken(token);
  const auto revoked = std::chrono::steady_clock::now();
  debug.join();
  ASSERT_TRUE(started) << "gdb never ran";
  EXPECT_EQ(debugged.error_code(), grpc::StatusCode::UNAUTHENTICATED) << debugged.error_message();
  EXPECT_NE(debugged.error_message().find("revoked"), std::string::npos)
      << debugged.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - revoked, std::chrono::seconds(10))
      << "the debug call outlived its token by the length of its wait";
  EXPECT_EQ(gdbs(), 0) << "gdb still runs";
}

// gRPC shares one auth context among a connection's calls: the first
// identity is bound to it and a second is refused.
TEST_F(SecurityTest, ASecondIdentityOnOneConnectionIsRefused) {
  StartDaemon("");
  const std::string alice = MakeToken("alice"), bob = MakeToken("bob");
  class Alternate final : public grpc::experimental::Interceptor {
   public:
    Alternate(std::atomic<int>* n, std::string a, std::string b)
        : n_(n), a_(std::move(a)), b_(std::move(b)) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
      if (m->QueryInterceptionHookPoint(
              grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
        m->GetSendInitialMetadata()->insert(
            {"authorization", "Bearer " + ((*n_)++ % 2 == 0 ? a_ : b_)});
      }
      m->Proceed();
    }
    std::atomic<int>* n_;
    std::string a_, b_;
  };
  class Factory final : public grpc::experimental::ClientInterceptorFactoryInterface {
   public:
    Factory(std::atomic<int>* n, std::string a, std::string b)
        : n_(n), a_(std::move(a)), b_(std::move(b)) {}
    grpc::experimental::Interceptor* CreateClientInterceptor(
        grpc::experimental::ClientRpcInfo*) override {
      return new Alternate(n_, a_, b_);
    }
    std::atomic<int>* n_;
    std::string a_, b_;
  };
  std::atomic<int> n{0};
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<Factory>(&n, alice, bob));
  auto ch = grpc::experimental::CreateCustomChannelWithInterceptors(
      "127.0.0.1:" + std::to_string(port_), grpc::experimental::LocalCredentials(LOCAL_TCP),
      grpc::ChannelArguments(), std::move(f));
  pb::WhoAmIResponse who;
  ASSERT_TRUE(WhoAmI(ch, &who).ok());
  EXPECT_EQ(who.principal(), "user:alice");
  auto st = WhoAmI(ch, &who);  // bob's token on alice's connection
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << who.principal();
  EXPECT_NE(st.error_message().find("already used by user:alice"), std::string::npos)
      << st.error_message();
}

TEST_F(SecurityTest, TlsWithTokensAndClientCertificates) {
  SetUpTmp();
  // The material first: one CA for the daemon, another that must not be trusted.
  std::string dir = d_tmp_ + "/tls";
  std::string err;
  ASSERT_TRUE(FwaidTls({"init", dir, "--host", "localhost", "--host", "127.0.0.1"}, &err)) << err;
  ASSERT_TRUE(FwaidTls({"issue", dir, "--user", "carol"}, &err)) << err;
  ASSERT_TRUE(FwaidTls({"issue", dir, "--user", "mallory"}, &err)) << err;
  ASSERT_TRUE(FwaidTls({"issue", dir, "--user", "old", "--days", "-1"}, &err)) << err;
  std::string other = d_tmp_ + "/other";
  ASSERT_TRUE(FwaidTls({"init", other, "--host", "localhost"}, &err)) << err;
  ASSERT_TRUE(FwaidTls({"issue", other, "--user", "carol"}, &err)) << err;
  struct stat st {};
  ASSERT_EQ(stat((dir + "/ca.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "keys are for their owner only";
  ASSERT_EQ(stat((dir + "/carol.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Refuses to overwrite.
  EXPECT_FALSE(FwaidTls({"init", dir, "--host", "localhost"}, &err));
  EXPECT_NE(err.find("already exists"), std::string::npos) << err;
  StartDaemon(
      "tls: {cert: " + dir + "/server.pem, key: " + dir + "/server.key, client_ca: " + dir +
      "/ca.pem, reload_interval_s: 1}\nusers:\n  carol: {role: ci, cert_subject: \"CN=carol\"}\n"
      // old maps to a user: its certificate is refused for its dates alone.
      "  old: {cert_subject: \"CN=old\"}\n");
  const std::string ca = dir + "/ca.pem";
  // Plain TCP to the TLS port fails.
  {
    auto plain = LazyChannel("127.0.0.1:" + std::to_string(port_),
                             grpc::experimental::LocalCredentials(LOCAL_TCP));
    EXPECT_FALSE(WhoAmI(plain).ok());
  }
  // A token over TLS, the daemon checked against our CA.
  const std::string token = MakeToken("dave");
  pb::WhoAmIResponse who;
  ASSERT_TRUE(WhoAmI(Channel(Tls(), Credentials{ca, "", "", token}), &who).ok());
  EXPECT_EQ(who.principal(), "user:dave");
  // The wrong CA: the client does not trust the daemon.
  {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(other + "/ca.pem");
    auto ch = LazyChannel("localhost:" + std::to_string(port_), grpc::SslCredentials(o));
    EXPECT_EQ(WhoAmI(ch).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  // Client certificates: carol's maps to a user; mallory's (same CA) maps
  // to nobody; carol's from another CA and an expired one are refused.
  ASSERT_TRUE(
      WhoAmI(Channel(Tls(), Credentials{ca, dir + "/carol.pem", dir + "/carol.key", ""}), &who)
          .ok());
  EXPECT_EQ(who.principal(), "user:carol");
  EXPECT_EQ(who.role(), "ci");
  EXPECT_NE(who.verified_by().find("CN=carol"), std::string::npos) << who.verified_by();
  auto tls_channel = [&](const std::string& cert, const std::string& key) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(ca);
    o.pem_cert_chain = Read(cert);
    o.pem_private_key = Read(key);
    return LazyChannel("localhost:" + std::to_string(port_), grpc::SslCredentials(o));
  };
  auto stm = WhoAmI(tls_channel(dir + "/mallory.pem", dir + "/mallory.key"));
  EXPECT_EQ(stm.error_code(), grpc::StatusCode::UNAUTHENTICATED) << stm.error_message();
  EXPECT_NE(stm.error_message().find("maps to no user"), std::string::npos) << stm.error_message();
  EXPECT_FALSE(WhoAmI(tls_channel(other + "/carol.pem", other + "/carol.key")).ok());
  // A lab node's certificate named like a user (CN=carol, OU=fwai-lab-node)
  // is never that user, and on a daemon in no lab is no node either.
  {
    const std::string nodes = d_tmp_ + "/nodes";
    std::filesystem::create_directories(nodes);
    for (const char* f : {"ca.pem", "ca.key"})
      std::filesystem::copy_file(dir + "/" + f, nodes + "/" + f);
    ASSERT_TRUE(FwaidTls({"issue", nodes, "--node", "carol"}, &err)) << err;
    auto as_node = WhoAmI(tls_channel(nodes + "/carol.pem", nodes + "/carol.key"), &who);
    EXPECT_EQ(as_node.error_code(), grpc::StatusCode::UNAUTHENTICATED) << who.principal();
    EXPECT_NE(as_node.error_message().find("is a lab node's"), std::string::npos)
        << as_node.error_message();
  }
  // Names that would read as another attribute of a subject are refused.
  EXPECT_FALSE(FwaidTls({"issue", dir, "--user", "eve,OU=fwai-lab-node"}, &err));
  EXPECT_NE(err.find("without"), std::string::npos) << err;
  EXPECT_FALSE(FwaidTls({"issue", dir, "--user", "eve", "--node", "eve"}, &err));
  {
    auto expired = WhoAmI(tls_channel(dir + "/old.pem", dir + "/old.key"));
    EXPECT_FALSE(expired.ok());
    EXPECT_EQ(expired.error_message().find("maps to no user"), std::string::npos)
        << expired.error_message();
  }
  // The server certificate is replaced on disk while a client streams: new
  // connections get the new one, the open stream goes on.
  auto dave = Channel(Tls(), Credentials{ca, "", "", token});
  pb::Session s;
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    ASSERT_TRUE(pb::Sessions::NewStub(dave)->Create(&ctx, req, &s).ok());
  }
  grpc::ClientContext follow_ctx;
  pb::AttachRequest areq;
  areq.set_session_id(s.id());
  auto follower = pb::Sessions::NewStub(dave)->Attach(&follow_ctx, areq);
  std::string next = d_tmp_ + "/next";
  ASSERT_TRUE(FwaidTls({"init", next, "--host", "localhost", "--host", "127.0.0.1"}, &err)) << err;
  // Key first, then the certificate, each replaced by a rename.
  fs::copy_file(next + "/server.key", dir + "/server.key.new");
  fs::copy_file(next + "/server.pem", dir + "/server.pem.new");
  fs::rename(dir + "/server.key.new", dir + "/server.key");
  fs::rename(dir + "/server.pem.new", dir + "/server.pem");
  bool switched = false;
  for (int i = 0; i < 100 && !switched; ++i) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Read(next + "/ca.pem");
    switched = WhoAmI(Channel(Tls(), Credentials{next + "/ca.pem", "", "", token})).ok();
    if (!switched) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(switched) << "new connections never saw the new certificate";
  // The stream opened before is still there: a turn's events reach it.
  auto out = RunChat(*pb::Sessions::NewStub(dave), s.id(), "still there?");
  EXPECT_TRUE(out.finished);
  pb::ServerEvent ev;
  bool seen = false;
  while (!seen && follower->Read(&ev)) seen = ev.has_turn_finished();
  EXPECT_TRUE(seen);
  follow_ctx.TryCancel();
}

// The TLS listener speaks TLS 1.2 and 1.3 only: a client offering 1.0 or
// 1.1 (its own floor lowered to allow them) gets no connection.
TEST_F(SecurityTest, TlsBelowOnePointTwoIsRefused) {
  SetUpTmp();
  const std::string dir = MakeTls("tls");
  StartDaemon("tls: {cert: " + dir + "/server.pem, key: " + dir + "/server.key}\n");
  auto handshake = [&](const std::string& version) {
    std::string out, err;
    RunCommand({"/usr/bin/openssl", "s_client", "-connect", "127.0.0.1:" + std::to_string(port_),
                version, "-cipher", "DEFAULT:@SECLEVEL=0", "-alpn", "h2", "-servername",
                "localhost", "-CAfile", dir + "/ca.pem", "-verify_return_error", "-brief"},
               &out, &err, {}, 20);
    return out + err;
  };
  const std::string v12 = handshake("-tls1_2");
  EXPECT_NE(v12.find("CONNECTION ESTABLISHED"), std::string::npos) << v12;
  EXPECT_NE(v12.find("TLSv1.2"), std::string::npos) << v12;
  EXPECT_NE(handshake("-tls1_3").find("TLSv1.3"), std::string::npos);
  for (const char* old : {"-tls1_1", "-tls1"}) {
    const std::string got = handshake(old);
    EXPECT_EQ(got.find("CONNECTION ESTABLISHED"), std::string::npos) << old << ": " << got;
  }
}

// Two users over tokens: neither sees, attaches to, answers or deletes the
// other's sessions, nor lists the other's records; leases name their holder,
// a user cannot kick, an admin can and it is recorded.
TEST_F(SecurityTest, UsersSeeOnlyTheirOwn) {
  StartDaemon("");
  auto alice = Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")});
  auto bob = Channel(Tcp(), Credentials{"", "", "", MakeToken("bob")});
  auto sa = pb::Sessions::NewStub(alice), sb = pb::Sessions::NewStub(bob);
  pb::Session s;
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_title("alice's secret");
    req.set_project_root("/etc");
    ASSERT_TRUE(sa->Create(&ctx, req, &s).ok());
    EXPECT_EQ(s.owner(), "user:alice");
    EXPECT_EQ(s.project_root(), "") << "no local account: no project";
    EXPECT_NE(s.no_project_reason().find("no local account"), std::string::npos)
        << s.no_project_reason();
  }
  ASSERT_TRUE(RunChat(*sa, s.id(), "hello").finished);
  // Bob: not found, however he asks.
  {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(s.id());
    pb::Session out;
    auto st = sb->Get(&ctx, req, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(st.error_message().find("alice"), std::string::npos)
        << "reveals the owner: " << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    pb::ListSessionsRequest req;
    pb::ListSessionsResponse out;
    ASSERT_TRUE(sb->List(&ctx, req, &out).ok());
    EXPECT_EQ(out.sessions_size(), 0);
    grpc::ClientContext ctx2;
    req.set_all(true);
    EXPECT_EQ(sb->List(&ctx2, req, &out).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_TRUE(ReadAll(*sb, s.id()).empty());
  {
    grpc::ClientContext ctx;
    auto chat = OpenChat(*sb, &ctx, s.id(), "let me in");
    pb::ServerEvent ev;
    while (chat->Read(&ev)) {
    }
    EXPECT_EQ(chat->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    pb::DeleteSessionRequest req;
    req.set_session_id(s.id());
    pb::DeleteSessionResponse out;
    EXPECT_EQ(sb->Delete(&ctx, req, &out).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Nor can he rewind it, list its checkpoints, or learn either exists.
  for (bool dry : {true, false}) {
    grpc::ClientContext ctx;
    pb::RewindRequest req;
    req.set_session_id(s.id());
    req.set_dry_run(dry);
    req.set_conversation(true);
    pb::RewindResponse out;
    auto st = sb->Rewind(&ctx, req, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
    EXPECT_EQ(out.files_size() + out.boards_size(), 0);
  }
  {
    grpc::ClientContext ctx;
    pb::ListCheckpointsRequest req;
    req.set_session_id(s.id());
    pb::ListCheckpointsResponse out;
    EXPECT_EQ(sb->ListCheckpoints(&ctx, req, &out).error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(out.checkpoints_size(), 0);
  }
  // Nor read a file as her checkpoints kept it, or learn whether one was kept.
  for (const char* path : {"passwd", "hosts", "no-such-file"}) {
    grpc::ClientContext ctx;
    pb::ReadCheckpointFileRequest req;
    req.set_session_id(s.id());
    req.set_path(path);
    pb::ReadCheckpointFileResponse out;
    EXPECT_EQ(sb->ReadCheckpointFile(&ctx, req, &out).error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_FALSE(out.kept());
    EXPECT_TRUE(out.content().empty() && out.sha256().empty());
  }
  // Records: alice's turn is hers.
  auto records = [](const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    pb::ListRunsRequest req;
    pb::ListRunsResponse out;
    EXPECT_TRUE(pb::Evidence::NewStub(ch)->ListRuns(&ctx, req, &out).ok());
    return out;
  };
  EXPECT_GE(records(alice).runs_size(), 1);
  // bob's records are his refusals (the list of every user's sessions), nothing of alice's.
  {
    const auto bobs = records(bob);
    for (const auto& r : bobs.runs()) {
      auto rec = json::parse(r.record_json(), nullptr, false);
      EXPECT_EQ(rec.value("principal", ""), "user:bob") << r.record_json();
      EXPECT_EQ(rec.value("kind", ""), "refusal") << r.record_json();
    }
  }
  // Leases on the simulated board.
  auto ha = pb::Hardware::NewStub(alice), hb = pb::Hardware::NewStub(bob);
  pb::Lease lease;
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("sim-stm32vl");
    ASSERT_TRUE(ha->Acquire(&ctx, req, &lease).ok());
    EXPECT_NE(lease.holder().find("alice"), std::string::npos) << lease.holder();
  }
  {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("sim-stm32vl");
    pb::Lease out;
    auto st = hb->Acquire(&ctx, req, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("alice"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_device_id("sim-stm32vl");
    req.set_force(true);
    pb::ReleaseResponse out;
    auto st = hb->Release(&ctx, req, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(st.error_message().find("rule: admin"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_lease_id(lease.lease_id());
    pb::ReleaseResponse out;
    EXPECT_FALSE(hb->Release(&ctx, req, &out).ok());
  }
  // bob cannot renew alice's lease (naming the rule); an admin can, and it is recorded.
  {
    grpc::ClientContext ctx;
    pb::RenewRequest req;
    req.set_lease_id(lease.lease_id());
    pb::Lease out;
    auto st = hb->Renew(&ctx, req, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_NE(st.error_message().find("rule: the lease's holder"), std::string::npos)
        << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    pb::RenewRequest req;
    req.set_lease_id(lease.lease_id());
    pb::Lease out;
    ASSERT_TRUE(pb::Hardware::NewStub(d_->channel())->Renew(&ctx, req, &out).ok());
  }
  // An admin reads alice's session: allowed, and recorded where alice sees it.
  {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(s.id());
    pb::Session out;
    ASSERT_TRUE(pb::Sessions::NewStub(d_->channel())->Get(&ctx, req, &out).ok());
  }
  {
    bool seen = false;
    const auto alices = records(alice);
    for (const auto& r : alices.runs()) {
      auto rec = json::parse(r.record_json(), nullptr, false);
      seen |= rec.is_object() && rec.value("kind", "") == "admin_override" &&
              rec.value("rpc", "") == "Sessions.Get" && rec.value("session_id", "") == s.id() &&
              rec.value("principal", "") == "uid:0";
    }
    EXPECT_TRUE(seen) << "alice does not see that an admin read her session";
    const auto bobs = records(bob);
    for (const auto& r : bobs.runs()) {
      EXPECT_EQ(r.record_json().find(s.id()), std::string::npos)
          << "bob sees a record of alice's session";
    }
  }
  // The admin (root on the unix socket) kicks alice; it is recorded.
  {
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_device_id("sim-stm32vl");
    req.set_force(true);
    pb::ReleaseResponse out;
    ASSERT_TRUE(pb::Hardware::NewStub(d_->channel())->Release(&ctx, req, &out).ok());
  }
  grpc::ClientContext ctx;
  pb::ExportRequest ereq;
  pb::ExportResponse exp;
  ASSERT_TRUE(pb::Evidence::NewStub(d_->channel())->Export(&ctx, ereq, &exp).ok());
  auto all = json::parse(exp.data());
  bool kicked = false, renewed = false;
  for (const auto& r : all["records"]) {
    const auto& rec = r["record"];
    if (rec.value("kind", "") == "lease_kicked") {
      kicked = rec.value("holder", "") == "user:alice" && rec.value("principal", "") == "uid:0";
    }
    if (rec.value("kind", "") == "lease_renewed" && rec.value("principal", "") == "uid:0") {
      renewed = rec.value("holder", "") == "user:alice" && rec.value("admin_override", false);
    }
  }
  EXPECT_TRUE(kicked) << exp.data();
  EXPECT_TRUE(renewed) << exp.data();
  // bob's refusals inside the hardware RPCs (a lease's holder, admin for
  // --force) are recorded with his principal and address, as the gate's are.
  bool bob_refused = false;
  for (const auto& r : all["records"]) {
    const auto& rec = r["record"];
    if (rec.value("kind", "") != "refusal" || rec.value("principal", "") != "user:bob") continue;
    bob_refused = absl::StartsWith(rec.value("rpc", ""), "Hardware.") &&
                  rec.value("code", "") == "PERMISSION_DENIED" &&
                  rec.value("peer", "").find("127.0.0.1") != std::string::npos;
  }
  EXPECT_TRUE(bob_refused) << exp.data();
}

TEST_F(SecurityTest, SearchesAreListedAndCorrectedOnlyByWhoeverMadeThem) {
  StartDaemon("");
  auto alice = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")}));
  auto bob = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("bob")}));
  std::string id;
  {
    grpc::ClientContext ctx;
    pb::SearchRequest req;
    req.set_query("watchdog reload key");
    pb::SearchResponse out;
    ASSERT_TRUE(alice->Search(&ctx, req, &out).ok());
    id = out.search_id();
    ASSERT_FALSE(id.empty());
  }
  auto listed = [&](pb::Knowledge::Stub& stub) {
    grpc::ClientContext ctx;
    pb::ListSearchesRequest req;
    pb::ListSearchesResponse out;
    EXPECT_TRUE(stub.ListSearches(&ctx, req, &out).ok());
    std::vector<std::string> ids;
    for (const auto& s : out.searches()) ids.push_back(s.id());
    return ids;
  };
  EXPECT_EQ(listed(*alice), std::vector<std::string>{id});
  EXPECT_TRUE(listed(*bob).empty());
  EXPECT_EQ(listed(*pb::Knowledge::NewStub(d_->channel())),
            std::vector<std::string>{id});  // the admin
  auto correct = [&](pb::Knowledge::Stub& stub) {
    grpc::ClientContext ctx;
    pb::FeedbackRequest req;
    req.set_search_id(id);
    req.set_result("1");
    pb::FeedbackResponse out;
    return stub.Feedback(&ctx, req, &out);
  };
  // Bob is told the search does not exist, and not whose it is.
  auto st = correct(*bob);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_EQ(st.error_message().find("alice"), std::string::npos) << st.error_message();
  // Alice gets past that check (the empty base returned no result 1).
  st = correct(*alice);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("has no result '1'"), std::string::npos) << st.error_message();
}

TEST_F(SecurityTest, AdminOnlyCallsAreRefusedNamingTheRule) {
  StartDaemon("");
  auto user = Channel(Tcp(), Credentials{"", "", "", MakeToken("eve")});
  auto auth = pb::Auth::NewStub(user);
  grpc::ClientContext c1;
  pb::CreateTokenRequest req;
  req.set_user("eve");
  req.set_role("admin");
  pb::CreateTokenResponse resp;
  auto st = auth->CreateToken(&c1, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("rule: admin"), std::string::npos) << st.error_message();
  grpc::ClientContext c2;
  pb::ShutdownResponse sr;
  EXPECT_EQ(pb::Daemon::NewStub(user)->Shutdown(&c2, pb::ShutdownRequest(), &sr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Status hides where the daemon keeps its data from non-admins.
  grpc::ClientContext c3;
  pb::DaemonStatus status;
  ASSERT_TRUE(pb::Daemon::NewStub(user)->Status(&c3, pb::DaemonStatusRequest(), &status).ok());
  EXPECT_TRUE(status.data_dir().empty());
  EXPECT_EQ(status.caller(), "user:eve");
  // An admin token may.
  auto admin = Channel(Tcp(), Credentials{"", "", "", MakeToken("root-ci", "admin")});
  grpc::ClientContext c4;
  pb::ListTokensResponse tokens;
  ASSERT_TRUE(pb::Auth::NewStub(admin)->ListTokens(&c4, pb::ListTokensRequest(), &tokens).ok());
  EXPECT_EQ(tokens.tokens_size(), 2);
  for (const auto& t : tokens.tokens())
    EXPECT_EQ(t.DebugString().find("fwai_"), std::string::npos) << "secret listed";
}

TEST_F(SecurityTest, LimitsRefuseNamingTheLimit) {
  StartDaemon("limits: {sessions: 2, requests_per_second: 1000, burst: 1000}\n");
  auto alice = Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")});
  // whoami tells each caller its limits; an admin has none.
  {
    pb::WhoAmIResponse who;
    ASSERT_TRUE(WhoAmI(alice, &who).ok());
    ASSERT_TRUE(who.has_limits());
    EXPECT_EQ(who.limits().sessions(), 2);
    EXPECT_EQ(who.limits().running_turns(), 4);
    EXPECT_EQ(who.limits().requests_per_second(), 1000);
    ASSERT_TRUE(WhoAmI(d_->channel(), &who).ok());
    EXPECT_EQ(who.role(), "admin");
    EXPECT_FALSE(who.has_limits());
  }
  auto stub = pb::Sessions::NewStub(alice);
  std::vector<std::string> made;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    pb::Session s;
    auto st = stub->Create(&ctx, req, &s);
    if (i < 2) {
      EXPECT_TRUE(st.ok()) << st.error_message();
      made.push_back(s.id());
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_NE(st.error_message().find("limit sessions (2)"), std::string::npos)
          << st.error_message();
    }
  }
  ASSERT_EQ(made.size(), 2u);
  // Another user's sessions do not count against alice's limit, nor hers against theirs.
  auto bob = pb::Sessions::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("bob")}));
  {
    grpc::ClientContext ctx;
    pb::Session s;
    EXPECT_TRUE(bob->Create(&ctx, pb::CreateSessionRequest(), &s).ok());
  }
  // A deleted session frees its place, once: the next create fits, the one after does not.
  {
    grpc::ClientContext ctx;
    pb::DeleteSessionRequest del;
    del.set_session_id(made[0]);
    pb::DeleteSessionResponse resp;
    ASSERT_TRUE(stub->Delete(&ctx, del, &resp).ok());
  }
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    pb::Session s;
    auto st = stub->Create(&ctx, pb::CreateSessionRequest(), &s);
    if (i == 0) {
      EXPECT_TRUE(st.ok()) << st.error_message();
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    }
  }
}

// Running turns, leases held and a lease's longest ttl: each refused past
// its limit with RESOURCE_EXHAUSTED naming the limit and when to retry;
// another user is not held back by them.
TEST_F(SecurityTest, TurnAndLeaseLimitsRefuseNamingTheLimit) {
  StartDaemon(
      "limits: {running_turns: 1, leases: 1, lease_ttl_max_s: 60, requests_per_second: 1000, "
      "burst: 1000}\n");
  auto ch = Channel(Tcp(), Credentials{"", "", "", MakeToken("busy")});
  auto stub = pb::Sessions::NewStub(ch);
  auto create = [](pb::Sessions::Stub& st) {
    grpc::ClientContext ctx;
    pb::Session s;
    EXPECT_TRUE(st.Create(&ctx, pb::CreateSessionRequest(), &s).ok());
    return s.id();
  };
  const std::string a = create(*stub), b = create(*stub);
  // A turn that streams slowly holds busy's one running turn.
  FakeReply slow;
  slow.match = "the slow one";
  slow.chunks = std::vector<std::string>(60, "tick ");
  slow.chunk_delay_ms = 500;
  fake_.Enqueue(slow);
  grpc::ClientContext slow_ctx;
  auto running = stub->Chat(&slow_ctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(a);
  ASSERT_TRUE(running->Write(open));
  pb::ClientEvent msg;
  msg.mutable_message()->set_text("the slow one");
  ASSERT_TRUE(running->Write(msg));
  pb::ServerEvent ev;
  bool streaming = false;
  while (!streaming && running->Read(&ev)) streaming = ev.has_text_delta();
  ASSERT_TRUE(streaming) << "the slow turn never started";
  auto second = RunChat(*stub, b, "another");
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << second.status.error_message();
  EXPECT_NE(second.status.error_message().find("limit running_turns (1)"), std::string::npos)
      << second.status.error_message();
  EXPECT_NE(second.status.error_message().find("retry when"), std::string::npos)
      << second.status.error_message();
  // Another user's turn runs meanwhile.
  auto other = pb::Sessions::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("idle")}));
  FakeReply quick;
  quick.match = "quick";
  quick.chunks = {"done"};
  fake_.Enqueue(quick);
  EXPECT_TRUE(RunChat(*other, create(*other), "quick").finished);
  // The slow turn cancelled: busy's next turn runs.
  pb::ClientEvent cancel;
  cancel.mutable_cancel();
  ASSERT_TRUE(running->Write(cancel));
  bool ended = false;
  while (!ended && running->Read(&ev)) ended = ev.has_turn_finished();
  ASSERT_TRUE(ended);
  running->WritesDone();
  (void)running->Finish();
  FakeReply after;
  after.match = "after";
  after.chunks = {"ok"};
  fake_.Enqueue(after);
  EXPECT_TRUE(RunChat(*stub, b, "after").finished);

  // Leases: a ttl over lease_ttl_max_s, then a second lease past leases (1).
  auto hw = pb::Hardware::NewStub(ch);
  auto acquire = [&](const std::string& board, int ttl_s, pb::Lease* out) {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id(board);  // "": any board
    req.set_ttl_s(ttl_s);
    return hw->Acquire(&ctx, req, out);
  };
  pb::Lease held;
  auto st = acquire("sim-stm32vl", 3600, &held);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("limit lease_ttl_max_s (60 s)"), std::string::npos)
      << st.error_message();
  ASSERT_TRUE(acquire("sim-stm32vl", 60, &held).ok());
  pb::Lease more;
  st = acquire("", 60, &more);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("limit leases (1)"), std::string::npos) << st.error_message();
  // Released, a lease fits again.
  {
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_lease_id(held.lease_id());
    pb::ReleaseResponse out;
    ASSERT_TRUE(hw->Release(&ctx, req, &out).ok());
  }
  EXPECT_TRUE(acquire("sim-stm32vl", 60, &more).ok());
}

// The hour's ingest budget is charged with the bytes that arrive, not the
// size the client declares: declaring 0 (or too little) gains nothing.
TEST_F(SecurityTest, TheIngestBudgetCountsTheBytesSentNotTheSizeDeclared) {
  StartDaemon("limits: {ingest_mb_per_hour: 1, requests_per_second: 1000, burst: 1000}\n");
  auto stub = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("hoarder")}));
  auto upload = [&](const std::string& name, int64_t declared, size_t sent) {
    return Upload(*stub, name, "~hoard", declared, sent);
  };
  // 1.5 MB declared as nothing: refused once the bytes pass the budget.
  auto st = upload("liar.md", 0, 1536 * 1024);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("limit ingest_mb_per_hour (1 MB)"), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("retry in"), std::string::npos) << st.error_message();
  // What did arrive counts: a small honest file no longer fits either.
  st = upload("small.md", 4096, 4096);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  // Nothing of the refused upload was stored.
  grpc::ClientContext ctx;
  pb::ListDocumentsRequest req;
  req.set_collection("~hoard");
  pb::ListDocumentsResponse docs;
  auto listed = stub->ListDocuments(&ctx, req, &docs);
  ASSERT_TRUE(listed.ok()) << listed.error_message();
  EXPECT_EQ(docs.documents_size(), 0);
  // Another user's budget is their own.
  auto other = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("reader")}));
  stub.swap(other);
  EXPECT_TRUE(upload("fine.md", 4096, 4096).ok());
}

// An upload cut short — fewer bytes than its header declared, or the client
// gone mid-upload — stores nothing.
TEST_F(SecurityTest, AnUploadCutShortStoresNothing) {
  StartDaemon("");
  auto kb = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")}));
  auto st = Upload(*kb, "short.md", "~cut", 8192, 4096);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("4096 of the 8192 bytes its header declared arrived"),
            std::string::npos)
      << st.error_message();
  {
    // Half of a 1 MB file, then the client cancels.
    grpc::ClientContext ctx;
    auto stream = kb->Ingest(&ctx);
    pb::IngestChunk head;
    head.mutable_header()->set_name("cancelled.md");
    head.mutable_header()->set_collection("~cut");
    head.mutable_header()->set_size(1 << 20);
    ASSERT_TRUE(stream->Write(head));
    pb::IngestChunk part;
    part.set_data("# Half\n\n" + std::string((1 << 19) - 9, 'x'));
    ASSERT_TRUE(stream->Write(part));
    ctx.TryCancel();
    pb::IngestProgress p;
    while (stream->Read(&p)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Uploads are ingested one after another: once a whole one is in, one
  // cut short before it would be too.
  ASSERT_TRUE(Upload(*kb, "whole.md", "~cut", 4096, 4096).ok());
  grpc::ClientContext ctx;
  pb::ListDocumentsRequest req;
  req.set_collection("~cut");
  pb::ListDocumentsResponse docs;
  ASSERT_TRUE(kb->ListDocuments(&ctx, req, &docs).ok());
  ASSERT_EQ(docs.documents_size(), 1);
  EXPECT_EQ(docs.documents(0).name(), "whole.md");
}

// The team's shared knowledge base is read by everyone and written only by
// the roles in knowledge_writers; personal collections by their owner.
TEST_F(SecurityTest, TheSharedKnowledgeBaseIsWrittenOnlyByTheRolesConfigured) {
  StartDaemon("knowledge_writers: [admin]\n");
  auto user = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")}));
  auto admin = pb::Knowledge::NewStub(d_->channel());
  auto st = Upload(*user, "user-notes.md", "", 64, 64);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("rule: knowledge_writers"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(Upload(*user, "mine.md", "~notes", 64, 64).ok());
  ASSERT_TRUE(Upload(*admin, "team.md", "", 64, 64).ok());
  // alice reads the team's document, and cannot delete it.
  std::string team_id;
  {
    grpc::ClientContext ctx;
    pb::ListDocumentsResponse docs;
    ASSERT_TRUE(user->ListDocuments(&ctx, pb::ListDocumentsRequest(), &docs).ok());
    for (const auto& d : docs.documents()) {
      if (d.name() == "team.md") team_id = d.id();
      EXPECT_NE(d.name(), "user-notes.md");
    }
  }
  ASSERT_FALSE(team_id.empty()) << "the shared document is not listed for alice";
  {
    grpc::ClientContext ctx;
    pb::DeleteDocumentRequest req;
    req.set_doc(team_id);
    pb::DeleteDocumentResponse out;
    auto del = user->DeleteDocument(&ctx, req, &out);
    EXPECT_EQ(del.error_code(), grpc::StatusCode::PERMISSION_DENIED) << del.error_message();
  }
  // The default (admin and user) lets a user write it, not a ci token.
  StartDaemon("");
  user = pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")}));
  auto ci =
      pb::Knowledge::NewStub(Channel(Tcp(), Credentials{"", "", "", MakeToken("ci-bot", "ci")}));
  EXPECT_TRUE(Upload(*user, "user-notes.md", "", 64, 64).ok());
  st = Upload(*ci, "ci-notes.md", "", 64, 64);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
}

TEST_F(SecurityTest, RequestFloodsAreRefusedWithWhenToRetry) {
  StartDaemon("limits: {requests_per_second: 5, burst: 10}\n");
  auto ch = Channel(Tcp(), Credentials{"", "", "", MakeToken("flood")});
  int refused = 0;
  std::string msg;
  for (int i = 0; i < 40; ++i) {
    auto st = WhoAmI(ch);
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      msg = st.error_message();
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_NE(msg.find("requests_per_second"), std::string::npos) << msg;
  EXPECT_NE(msg.find("retry in"), std::string::npos) << msg;
  // Another user is not affected.
  EXPECT_TRUE(WhoAmI(Channel(Tcp(), Credentials{"", "", "", MakeToken("calm")})).ok());
}

TEST_F(SecurityTest, BadSecurityConfigIsRefusedNamingFileAndLine) {
  std::string dir = MakeTempDir("fwai-sec-");
  auto check = [&](const std::string& yaml, const std::string& want) {
    std::ofstream(dir + "/fwaid.yaml") << yaml;
    std::string out, err;
    int rc = RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "--config", dir + "/fwaid.yaml",
                         "--data-dir", dir + "/data", "--listen", "unix:" + dir + "/s.sock"},
                        &out, &err);
    EXPECT_EQ(rc, 1) << yaml;
    EXPECT_NE(err.find(want), std::string::npos) << "want '" << want << "' in: " << err;
  };
  check("users:\n  alice: {role: boss}\n",
        "fwaid.yaml:2: users.alice.role: expected admin, user or ci");
  check("tls: {cert: /nonexistent.pem, key: /nonexistent.key}\n",
        "fwaid.yaml:1: tls.cert: cannot read");
  check("unix_socket: {mode: \"0666\"}\n", "unix_socket.mode: must not give others access");
  check("limits:\n  sessions: -1\n", "fwaid.yaml:2: limits.sessions: expected an integer in 0..");
  check("users:\n  a: {cert_subject: \"CN=x\"}\n  b: {cert_subject: \"CN=x\"}\n",
        "users.b.cert_subject: already maps to user a");
  fs::remove_all(dir);
}

}  // namespace
// A world where "mallory" has a token mapped to the account nobody: her
// project (owned by nobody) sits next to a root-only secret, and holds a
// root-only file and a link to the secret.
class AgentIsolationTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    SetUpTmp();
    ASSERT_EQ(chmod(d_tmp_.c_str(), 0755), 0);
    secret_ = d_tmp_ + "/secret.txt";
    std::ofstream(secret_) << "TOP-SECRET-ROOT-ONLY\n";
    ASSERT_EQ(chmod(secret_.c_str(), 0600), 0);
    project_ = d_tmp_ + "/proj";
    fs::create_directories(project_ + "/.fwai/skills");
    std::ofstream(project_ + "/main.c") << "int main(void) { return 0; }\n";
    std::ofstream(project_ + "/root-only.txt") << "TOP-SECRET-IN-PROJECT\n";
    ASSERT_EQ(chmod((project_ + "/root-only.txt").c_str(), 0600), 0);
    fs::create_symlink(secret_, project_ + "/link.txt");
    std::ofstream(project_ + "/.fwai/skills/probe.yaml")
        << "name: probe\nsteps:\n  - name: look\n    tool: shell\n    command: \"id -u > uid.txt; "
           "cat "
        << secret_ << " root-only.txt link.txt || true\"\n";
    // Runs until the test creates `go` in the project (60 s at most).
    std::ofstream(project_ + "/.fwai/skills/gated.yaml")
        << "name: gated\nsteps:\n  - name: wait\n    tool: shell\n    command: \"for i in $(seq 1 "
           "1200); do "
           "[ -e go ] && exit 0; sleep 0.05; done; exit 1\"\n";
    auto nobody = LookupAccount("nobody");
    ASSERT_TRUE(nobody.ok());
    nobody_uid_ = nobody->uid;
    for (const auto& e : fs::recursive_directory_iterator(project_)) {
      if (e.path().filename() != "root-only.txt") {
        ASSERT_EQ(lchown(e.path().c_str(), nobody->uid, nobody->gid), 0);
      }
    }
    ASSERT_EQ(chown(project_.c_str(), nobody->uid, nobody->gid), 0);
    StartDaemon("users:\n  mallory: {role: user, local_user: nobody}\nlimits: {running_runs: 1}\n");
    mallory_ = Channel(Tcp(), Credentials{"", "", "", MakeToken("mallory")});
    nameless_ = Channel(Tcp(), Credentials{"", "", "", MakeToken("drifter")});
  }

  pb::Session NewSession(const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_project_root(project_);
    pb::Session s;
    auto st = pb::Sessions::NewStub(ch)->Create(&ctx, req, &s);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return s;
  }

  // One turn in which the model makes `calls`; the output of each call by id.
  std::map<std::string, std::string> Turn(const std::shared_ptr<grpc::Channel>& ch,
                                          const std::string& session,
                                          std::vector<FakeToolCall> calls) {
    FakeReply r;
    r.tool_calls = std::move(calls);
    fake_.Enqueue(r);
    FakeReply done;
    done.chunks = {"done"};
    fake_.Enqueue(done);
    auto out = RunChat(*pb::Sessions::NewStub(ch), session, "try");
    EXPECT_TRUE(out.finished) << out.status.error_message();
    std::map<std::string, std::string> results;
    for (const auto& ev : out.events) {
      if (ev.has_tool_call_finished())
        results[ev.tool_call_finished().call_id()] = ev.tool_call_finished().output();
    }
    return results;
  }

  std::string secret_, project_;
  uint32_t nobody_uid_ = 0;
  std::shared_ptr<grpc::Channel> mallory_, nameless_;
};

TEST_F(AgentIsolationTest, FileAndCommandToolsActAsTheSessionsAccountInsideItsProject) {
  pb::Session s = NewSession(mallory_);
  ASSERT_EQ(s.project_root(), project_);
  ASSERT_EQ(s.account(), "nobody");
  auto out = Turn(
      mallory_, s.id(),
      {{"c1", "read_file", {{"path", "../secret.txt"}}},
       {"c2", "read_file", {{"path", secret_}}},
       {"c3", "read_file", {{"path", "link.txt"}}},
       {"c4", "read_file", {{"path", "root-only.txt"}}},
       {"c5", "grep", {{"pattern", "TOP-SECRET"}}},
       {"c6", "write_file", {{"path", "../planted.txt"}, {"content", "x"}}},
       {"c7", "write_file", {{"path", "link.txt"}, {"content", "overwritten"}}},
       {"c8", "edit_file", {{"path", "root-only.txt"}, {"old_string", "TOP"}, {"new_string", "X"}}},
       {"c9", "bash", {{"command", "id -u > whoami.txt; cat " + secret_ + " root-only.txt; true"}}},
       {"c10", "write_file", {{"path", "notes/ok.txt"}, {"content", "mine\n"}}},
       {"c11", "read_file", {{"path", "main.c"}}}});
  ASSERT_EQ(out.size(), 11u);
  for (const auto& [id, text] : out) {
    EXPECT_EQ(text.find("TOP-SECRET"), std::string::npos) << id << " leaked: " << text;
  }
  EXPECT_NE(out["c1"].find("outside the project root"), std::string::npos) << out["c1"];
  EXPECT_NE(out["c2"].find("outside the project root"), std::string::npos) << out["c2"];
  EXPECT_NE(out["c3"].find("outside the project root"), std::string::npos) << out["c3"];
  EXPECT_NE(out["c4"].find("permission denied"), std::string::npos) << out["c4"];
  EXPECT_FALSE(fs::exists(d_tmp_ + "/planted.txt"));
  EXPECT_EQ(Read(secret_), "TOP-SECRET-ROOT-ONLY\n")
      << "a write through the link reached the secret";
  EXPECT_EQ(Read(project_ + "/root-only.txt"), "TOP-SECRET-IN-PROJECT\n");
  EXPECT_EQ(Read(project_ + "/whoami.txt"), std::to_string(nobody_uid_) + "\n");
  struct stat st {};
  ASSERT_EQ(stat((project_ + "/notes/ok.txt").c_str(), &st), 0) << out["c10"];
  EXPECT_EQ(st.st_uid, nobody_uid_) << "files the agent writes belong to the session's account";
  EXPECT_NE(out["c11"].find("int main"), std::string::npos) << out["c11"];
  // The turn's logs in the project are the account's too.
  for (const auto& e : fs::recursive_directory_iterator(project_ + "/.fwai/runs")) {
    ASSERT_EQ(stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, nobody_uid_) << e.path();
  }
  // The turn's record names who started it and from where.
  grpc::ClientContext ctx;
  pb::ListRunsResponse runs;
  ASSERT_TRUE(pb::Evidence::NewStub(mallory_)->ListRuns(&ctx, pb::ListRunsRequest(), &runs).ok());
  int turns = 0;
  for (const auto& r : runs.runs()) {
    auto rec = json::parse(r.record_json(), nullptr, false);
    if (!rec.is_object() || rec.value("kind", "") != "agent_turn") continue;
    ++turns;
    EXPECT_EQ(rec.value("principal", ""), "user:mallory") << rec.dump();
    EXPECT_NE(rec.value("peer", "").find("127.0.0.1"), std::string::npos) << rec.dump();
  }
  EXPECT_EQ(turns, 1);
}

TEST_F(AgentIsolationTest, ASessionWithoutAnAccountIsOfferedNoFileToolsAndCannotCallThem) {
  pb::Session s = NewSession(nameless_);
  EXPECT_EQ(s.project_root(), "");
  EXPECT_EQ(s.account(), "");
  auto out = Turn(nameless_, s.id(),
                  {{"c1", "read_file", {{"path", secret_}}},
                   {"c2", "bash", {{"command", "cat " + secret_}}},
                   {"c3", "list_dir", {{"path", "/"}}}});
  for (const auto& [id, text] : out) {
    EXPECT_EQ(text.find("TOP-SECRET"), std::string::npos) << id << " leaked: " << text;
    EXPECT_NE(text.find("needs a project"), std::string::npos) << id << ": " << text;
  }
  // What the model was offered: no file or command tool.
  auto reqs = fake_.requests();
  ASSERT_FALSE(reqs.empty());
  for (const auto& t : reqs.back().body["tools"]) {
    const std::string name = t.value("name", "");
    for (const char* banned :
         {"read_file", "list_dir", "grep", "glob", "write_file", "edit_file", "bash"}) {
      EXPECT_NE(name, banned) << "offered to a session without a project";
    }
  }
}

TEST_F(AgentIsolationTest, ASkillRunsAsTheCallersAccount) {
  grpc::ClientContext ctx;
  pb::RunSkillRequest req;
  req.set_project_root(project_);
  req.set_skill("probe");
  req.set_ci(true);
  auto stream = pb::Skills::NewStub(mallory_)->Run(&ctx, req);
  pb::SkillEvent ev;
  std::string all;
  bool finished = false;
  while (stream->Read(&ev)) {
    all += ev.text() + "\n" + ev.json() + "\n";
    if (ev.kind() == "run_finished") finished = true;
  }
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_TRUE(finished) << all;
  EXPECT_EQ(all.find("TOP-SECRET"), std::string::npos) << all;
  EXPECT_EQ(Read(project_ + "/uid.txt"), std::to_string(nobody_uid_) + "\n");
  struct stat st {};
  for (const auto& e : fs::recursive_directory_iterator(project_ + "/.fwai/runs")) {
    ASSERT_EQ(stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, nobody_uid_) << e.path();
  }
  // The run's record names who ran it and from where; its owner sees it,
  // another user does not.
  auto skill_runs = [&](const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext c;
    pb::ListRunsResponse out;
    EXPECT_TRUE(pb::Evidence::NewStub(ch)->ListRuns(&c, pb::ListRunsRequest(), &out).ok());
    std::vector<json> runs;
    for (const auto& r : out.runs()) {
      auto rec = json::parse(r.record_json(), nullptr, false);
      if (rec.is_object() && rec.value("kind", "") == "skill_run") runs.push_back(rec);
    }
    return runs;
  };
  auto mine = skill_runs(mallory_);
  ASSERT_EQ(mine.size(), 1u) << "the caller does not see the record of the run she made";
  EXPECT_EQ(mine[0].value("principal", ""), "user:mallory") << mine[0].dump();
  EXPECT_NE(mine[0].value("peer", "").find("127.0.0.1"), std::string::npos) << mine[0].dump();
  EXPECT_TRUE(skill_runs(nameless_).empty());
  // A caller with no account cannot run a skill at all.
  grpc::ClientContext ctx2;
  auto refused = pb::Skills::NewStub(nameless_)->Run(&ctx2, req);
  while (refused->Read(&ev)) {
  }
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// A run whose token is revoked is cancelled as a client's cancel cancels it,
// and its stream ends saying why.
TEST_F(AgentIsolationTest, ARunEndsWhenItsTokenIsRevoked) {
  const std::string skill = project_ + "/.fwai/skills/slow.yaml";
  std::ofstream(skill) << "name: slow\nsteps:\n  - name: wait\n    tool: shell\n    command: "
                          "\"echo started; sleep 60\"\n";
  ASSERT_EQ(lchown(skill.c_str(), nobody_uid_, static_cast<gid_t>(-1)), 0);
  const std::string token = MakeToken("mallory");
  auto ch = Channel(Tcp(), Credentials{"", "", "", token});
  ASSERT_NE(ch, nullptr);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(40));
  pb::RunSkillRequest req;
  req.set_project_root(project_);
  req.set_skill("slow");
  req.set_ci(true);
  auto stream = pb::Skills::NewStub(ch)->Run(&ctx, req);
  // Under way: the shell step has said so.
  pb::SkillEvent ev;
  std::string run_id, seen;
  bool started = false;
  while (!started && stream->Read(&ev)) {
    if (!ev.run_id().empty()) run_id = ev.run_id();
    seen += ev.kind() + ": " + ev.text() + "\n";
    started = ev.kind() == "output" && ev.text() == "started";
  }
  ASSERT_TRUE(started) << seen << stream->Finish().error_message();
  ASSERT_FALSE(run_id.empty());
  RevokeToken(token);
  const auto t0 = std::chrono::steady_clock::now();
  while (stream->Read(&ev)) {
  }
  auto st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "the run's stream outlived its token";
  // The run itself was cancelled, long before its step would have ended.
  std::string rec;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (rec.empty() && std::chrono::steady_clock::now() < until) {
    grpc::ClientContext gctx;
    pb::GetRunRequest greq;
    greq.set_run_id(run_id);
    pb::RunRecord r;
    if (pb::Evidence::NewStub(d_->channel())->GetRun(&gctx, greq, &r).ok()) {
      rec = r.record_json();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_FALSE(rec.empty()) << "the run " << run_id << " left no record: it was not stopped";
  EXPECT_EQ(json::parse(rec).value("failure_class", ""), "cancelled") << rec;
}

// limits.running_runs (1 here): a second run while one runs is refused
// naming the limit; the moment the first has ended, the next one runs.
TEST_F(AgentIsolationTest, ASecondSkillRunPastTheLimitIsRefused) {
  pb::RunSkillRequest req;
  req.set_project_root(project_);
  req.set_skill("gated");
  req.set_ci(true);
  grpc::ClientContext first_ctx;
  auto first = pb::Skills::NewStub(mallory_)->Run(&first_ctx, req);
  pb::SkillEvent ev;
  bool started = false;
  while (!started && first->Read(&ev)) started = ev.kind() == "run_started";
  ASSERT_TRUE(started);
  auto run = [&](const std::string& skill) {
    grpc::ClientContext ctx;
    pb::RunSkillRequest r = req;
    r.set_skill(skill);
    auto stream = pb::Skills::NewStub(mallory_)->Run(&ctx, r);
    pb::SkillEvent e;
    bool finished = false;
    while (stream->Read(&e)) finished |= e.kind() == "run_finished";
    auto st = stream->Finish();
    return std::make_pair(st, finished);
  };
  auto [refused, never] = run("probe");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("limit running_runs (1)"), std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("retry when"), std::string::npos)
      << refused.error_message();
  EXPECT_FALSE(never);
  // The first run let go and read to its end: the next one runs at once.
  std::ofstream(project_ + "/go") << "go\n";
  bool finished = false;
  while (first->Read(&ev)) finished |= ev.kind() == "run_finished";
  ASSERT_TRUE(first->Finish().ok());
  ASSERT_TRUE(finished);
  auto [st, ran] = run("probe");
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(ran);
}

// fwaid runs as root and serves a group socket (mode 0660, group nogroup).
// `nobody` connects through it with the real CLI (runuser) and makes the
// model try every tool that touches files against /etc/shadow and against
// another user's private directory: nothing leaks, nothing changes. A second
// uid on the same socket cannot see or touch nobody's sessions, runs or
// leases.
class UnixPeerAttackTest : public SecurityTest {
 protected:
  void SetUp() override {
    SecurityTest::SetUp();
    SetUpTmp();
    ASSERT_EQ(chmod(d_tmp_.c_str(), 0755), 0);
    auto nobody = LookupAccount("nobody");
    ASSERT_TRUE(nobody.ok());
    nobody_ = *nobody;
    // Another user's private directory: 0700, owned by a uid that is neither
    // root nor nobody, holding a secret and a file whose name is a secret too.
    victim_ = d_tmp_ + "/victim";
    fs::create_directories(victim_);
    std::ofstream(victim_ + "/secret.txt") << "VICTIM-PRIVATE-BYTES\n";
    std::ofstream(victim_ + "/victim-name-canary.txt") << "x\n";
    for (const auto& e : fs::directory_iterator(victim_)) {
      ASSERT_EQ(chmod(e.path().c_str(), 0600), 0);
      ASSERT_EQ(chown(e.path().c_str(), kVictimUid, kVictimUid), 0);
    }
    ASSERT_EQ(chmod(victim_.c_str(), 0700), 0);
    ASSERT_EQ(chown(victim_.c_str(), kVictimUid, kVictimUid), 0);
    victim_before_ = Snapshot(victim_);
    shadow_before_ = Read("/etc/shadow");
    ASSERT_FALSE(shadow_before_.empty());
    shadow_line_ = shadow_before_.substr(0, shadow_before_.find('\n'));
    // nobody's own project: a build skill and a project MCP server that try
    // the same, as nobody.
    project_ = d_tmp_ + "/proj";
    fs::create_directories(project_ + "/.fwai/skills");
    std::ofstream(project_ + "/main.c") << "int main(void) { return 0; }\n";
    std::ofstream(project_ + "/.fwai/skills/build.yaml")
        << "name: build\nsteps:\n  - name: steal\n    tool: shell\n    command: \"id -u > "
           "skill-uid.txt; cat /etc/shadow "
        << victim_ << "/secret.txt; ls " << victim_ << "; echo x > " << victim_
        << "/planted-by-skill; echo x >> /etc/shadow; true\"\n";
    // The server from a copy nobody can reach wherever the checkout lies.
    const fs::path mcp_bin(FWAI_MCP_BIN_DIR);
    const std::string mcp = d_tmp_ + "/mcp-servers";
    fs::copy(mcp_bin.parent_path().parent_path(), mcp,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    std::ofstream(project_ + "/.fwai/project.yaml")
        << "name: p\nmcp_servers:\n  fs:\n    command: [" << mcp
        << "/node_modules/.bin/mcp-server-filesystem, /]\n";
    for (const auto& e : fs::recursive_directory_iterator(project_)) {
      ASSERT_EQ(lchown(e.path().c_str(), nobody_.uid, nobody_.gid), 0);
    }
    ASSERT_EQ(chown(project_.c_str(), nobody_.uid, nobody_.gid), 0);
    d_ = std::make_unique<Daemon>(&fake_, "unix_socket: {mode: \"0660\", group: nogroup}\n");
    d_->AddListen("tcp:127.0.0.1:0");
    ASSERT_EQ(chmod(d_->dir().c_str(), 0755),
              0);  // the socket's group decides, not this test's temp dir
    ASSERT_TRUE(d_->Start()) << d_->log();
    port_ = d_->TcpPort();
  }

  static std::map<std::string, std::string> Snapshot(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename()] = Read(e.path());
    return out;
  }

  // `fwai ARGS...` run as `user` (runuser), against the group socket.
  int AsUser(const std::string& user, std::vector<std::string> args, std::string* out,
             std::string* err, const std::string& group = "") {
    std::vector<std::string> argv = {"/usr/sbin/runuser", "-u", user};
    if (!group.empty()) argv.insert(argv.end(), {"-g", group});
    // A copy the other user can execute whatever the checkout's directories allow
    // (a clone in a 0700 directory, e.g. from mktemp -d).
    const std::string fwai = d_tmp_ + "/bin/fwai";
    if (!fs::exists(fwai)) {
      fs::create_directories(d_tmp_ + "/bin");
      fs::copy_file(std::string(FWAI_BIN_DIR) + "/fwai", fwai);
      fs::permissions(d_tmp_ + "/bin", fs::perms::owner_all | fs::perms::group_read |
                                           fs::perms::group_exec | fs::perms::others_read |
                                           fs::perms::others_exec);
      fs::permissions(fwai, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
    }
    argv.insert(argv.end(), {"--", fwai, "--daemon", d_->address()});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, {"HOME=/nonexistent", "PATH=/usr/bin:/bin"});
  }

  // The session of a `fwai --json chat`'s output ("" if none).
  static std::string SessionIn(const std::string& json_lines) {
    std::istringstream lines(json_lines);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && !j.value("session_id", "").empty()) return j.value("session_id", "");
    }
    return "";
  }

  // The model makes `calls` in one turn of `fwai chat` run by nobody; each
  // call's output by id (and the whole of what the CLI printed in `all`).
  std::map<std::string, std::string> NobodyTurn(const std::string& project,
                                                std::vector<FakeToolCall> calls, std::string* all) {
    FakeReply r;
    r.tool_calls = std::move(calls);
    fake_.Enqueue(r);
    FakeReply done;
    done.chunks = {"done"};
    fake_.Enqueue(done);
    std::string out, err;
    int rc = AsUser("nobody", {"--project", project, "--json", "chat", "try"}, &out, &err);
    EXPECT_EQ(rc, 0) << err << out;
    *all = out + err;
    std::map<std::string, std::string> results;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("type", "") == "tool_call_finished")
        results[j.value("call_id", "")] = j.value("output", "");
    }
    return results;
  }

  void ExpectNothingLeakedOrChanged(const std::string& all) {
    EXPECT_EQ(all.find(shadow_line_), std::string::npos) << "/etc/shadow leaked: " << all;
    EXPECT_EQ(all.find("VICTIM-PRIVATE"), std::string::npos) << "the private file leaked: " << all;
    EXPECT_EQ(all.find("victim-name-canary"), std::string::npos)
        << "the private directory was listed: " << all;
    EXPECT_EQ(Read("/etc/shadow"), shadow_before_) << "/etc/shadow changed";
    EXPECT_EQ(Snapshot(victim_), victim_before_) << "the private directory changed";
    EXPECT_FALSE(fs::exists("/etc/fwai-planted.txt"));
  }

  static constexpr uid_t kVictimUid = 4242;
  LocalAccount nobody_;
  std::string victim_, project_, shadow_before_, shadow_line_;
  std::map<std::string, std::string> victim_before_;
};

TEST_F(UnixPeerAttackTest, TheSocketIsTheConfiguredModeAndGroup) {
  struct stat st {};
  ASSERT_EQ(stat(d_->socket_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, nobody_.gid);
  std::string out, err;
  ASSERT_EQ(AsUser("nobody", {"--json", "whoami"}, &out, &err), 0) << err;
  auto who = json::parse(out);
  EXPECT_EQ(who.value("principal", ""), "uid:" + std::to_string(nobody_.uid)) << out;
  EXPECT_NE(who.value("role", ""), "admin") << out;
}

TEST_F(UnixPeerAttackTest, EveryFileToolIsRefusedOutsideWhatNobodyMayTouch) {
  const std::string v = victim_;
  std::string all;
  auto out = NobodyTurn(
      project_,
      {{"c1", "read_file", {{"path", "/etc/shadow"}}},
       {"c2", "read_file", {{"path", v + "/secret.txt"}}},
       {"c3", "list_dir", {{"path", v}}},
       {"c4", "grep", {{"pattern", "root|VICTIM"}, {"path", "/etc/shadow"}}},
       {"c5", "grep", {{"pattern", "VICTIM"}, {"path", v}}},
       {"c6", "glob", {{"pattern", "../victim/**"}}},
       {"c7", "write_file", {{"path", "/etc/fwai-planted.txt"}, {"content", "x"}}},
       {"c8", "write_file", {{"path", v + "/planted.txt"}, {"content", "x"}}},
       {"c9",
        "edit_file",
        {{"path", "/etc/shadow"}, {"old_string", "root"}, {"new_string", "toor"}}},
       {"c10",
        "edit_file",
        {{"path", "../victim/secret.txt"}, {"old_string", "VICTIM"}, {"new_string", "X"}}},
       {"c11",
        "bash",
        {{"command", "id -u > bash-uid.txt; cat /etc/shadow " + v + "/secret.txt; ls " + v +
                         "; echo x > " + v + "/planted-by-bash; echo x >> /etc/shadow; true"}}},
       {"c12", "build", json::object()},
       {"c13", "mcp_fs_read_text_file", {{"path", "/etc/shadow"}}},
       {"c14", "mcp_fs_read_text_file", {{"path", v + "/secret.txt"}}},
       {"c15", "mcp_fs_list_directory", {{"path", v}}},
       {"c16", "mcp_fs_write_file", {{"path", v + "/planted-by-mcp"}, {"content", "x"}}},
       {"c17", "read_file", {{"path", "main.c"}}}},
      &all);
  ASSERT_EQ(out.size(), 17u) << all;
  ExpectNothingLeakedOrChanged(all);
  for (const char* id : {"c1", "c2", "c3", "c5", "c8", "c10"}) {
    EXPECT_NE(out[id].find("outside the project root"), std::string::npos) << id << ": " << out[id];
  }
  // The tools ran, as nobody: the commands wrote their uid, the MCP server
  // answered (with the kernel's refusal), the project's own file was read.
  EXPECT_EQ(Read(project_ + "/bash-uid.txt"), std::to_string(nobody_.uid) + "\n");
  EXPECT_EQ(Read(project_ + "/skill-uid.txt"), std::to_string(nobody_.uid) + "\n") << out["c12"];
  for (const char* id : {"c13", "c14", "c15", "c16"}) {
    EXPECT_NE(out[id].find("EACCES"), std::string::npos) << id << ": " << out[id];
  }
  EXPECT_NE(out["c17"].find("int main"), std::string::npos) << out["c17"];
  // The run's log kept in the project holds nothing either.
  for (const auto& e : fs::recursive_directory_iterator(project_ + "/.fwai")) {
    if (!e.is_regular_file()) continue;
    const std::string text = Read(e.path());
    EXPECT_EQ(text.find(shadow_line_), std::string::npos) << e.path();
    EXPECT_EQ(text.find("VICTIM-PRIVATE"), std::string::npos) << e.path();
  }
}

// nobody's own project names root-only files every way a run reads files:
// flash.image, a build output linked to a root-only ELF, a skill's evidence
// files (/etc/shadow, a link to it). Nothing of them reaches nobody: no
// hash, no size, no section or symbol, in the run's output or the evidence.
TEST_F(UnixPeerAttackTest, ARunTellsNobodyAnythingOfFilesNobodyCannotRead) {
  ASSERT_TRUE(fs::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
  const std::string secret_elf = d_tmp_ + "/root-only.elf";
  fs::copy_file(FWAI_BLINKY_ELF, secret_elf);
  ASSERT_EQ(chmod(secret_elf.c_str(), 0600), 0);
  auto sha = [](const std::string& path) {
    std::string out, err;
    RunCommand({"/usr/bin/sha256sum", path}, &out, &err);
    return out.substr(0, 64);
  };
  const std::string shadow_sha = sha("/etc/shadow"), elf_sha = sha(secret_elf);
  ASSERT_EQ(shadow_sha.size(), 64u);
  const std::string elf_bytes = std::to_string(fs::file_size(secret_elf));
  const std::string p = d_tmp_ + "/peek";
  fs::create_directories(p + "/.fwai/skills");
  fs::create_directories(p + "/build");
  std::ofstream(p + "/.fwai/skills/peek.yaml")
      << "name: peek\nsteps:\n  - name: look\n    evidence:\n      files: [\""
      << "/etc/shadow"
      << "\"]\n";
  std::ofstream(p + "/.fwai/skills/peek-link.yaml")
      << "name: peek-link\nsteps:\n  - name: look\n    evidence:\n      files: [\"build/x.txt\"]\n";
  std::ofstream(p + "/.fwai/skills/build.yaml")
      << "name: build\nsteps:\n  - name: build\n    tool: build\n";
  fs::create_symlink("/etc/shadow", p + "/build/x.txt");
  // An ELF nobody may read, but outside the project: not followed either.
  const std::string public_elf = d_tmp_ + "/public.elf";
  fs::copy_file(FWAI_BLINKY_ELF, public_elf);
  ASSERT_EQ(chmod(public_elf.c_str(), 0644), 0);
  auto own = [&] {
    for (const auto& e : fs::recursive_directory_iterator(p))
      ASSERT_EQ(lchown(e.path().c_str(), nobody_.uid, nobody_.gid), 0);
    ASSERT_EQ(chown(p.c_str(), nobody_.uid, nobody_.gid), 0);
  };
  auto leaks = [&](const std::string& said) {
    EXPECT_EQ(said.find(shadow_sha), std::string::npos) << "the hash of /etc/shadow\n" << said;
    EXPECT_EQ(said.find(elf_sha), std::string::npos) << "the hash of a root-only ELF\n" << said;
    EXPECT_EQ(said.find("\"bytes\":" + elf_bytes), std::string::npos) << said;
    for (const char* symbol : {"\"symbols\"", "\"sections\"", "main.c:"})
      EXPECT_EQ(said.find(symbol), std::string::npos) << symbol << "\n" << said;
  };
  std::string out, err;
  // flash.image outside the project; the build dir's link out of it to a
  // file nobody may read, then to one it may not.
  struct Case {
    std::string image, link_to, says;
  };
  for (const Case& k : {Case{secret_elf, "", "is outside the project: not read"},
                        Case{"", public_elf, "leads outside the project"},
                        Case{"", secret_elf, "no image found"}}) {
    std::ofstream(p + "/.fwai/project.yaml")
        << "name: peek\nbuild: {command: \"true\"}\n"
        << (k.image.empty() ? "" : "flash: {command: \"true\", image: \"" + k.image + "\"}\n");
    fs::remove(p + "/build/x.elf");
    if (!k.link_to.empty()) fs::create_symlink(k.link_to, p + "/build/x.elf");
    own();
    AsUser("nobody", {"--project", p, "--json", "run", "build"}, &out, &err);
    leaks(out + err);
    EXPECT_EQ((out + err).find(sha(public_elf)), std::string::npos) << out << err;
    EXPECT_NE((out + err).find(k.says), std::string::npos) << out << err;
  }
  // Evidence: an absolute path out of the project, and a link out of it.
  AsUser("nobody", {"--project", p, "--json", "run", "peek"}, &out, &err);
  leaks(out + err);
  EXPECT_NE((out + err).find("is outside the project"), std::string::npos) << out << err;
  EXPECT_NE((out + err).find("rule: a run reads only files beneath its project, as its caller"),
            std::string::npos)
      << out << err;
  AsUser("nobody", {"--project", p, "--json", "run", "peek-link"}, &out, &err);
  leaks(out + err);
  EXPECT_NE((out + err).find("leads outside the project"), std::string::npos) << out << err;
  // Nor does the evidence log tell it later.
  AsUser("nobody", {"--json", "evidence", "ls"}, &out, &err);
  leaks(out + err);
}

// A flash's memory budget reads the project's linker scripts as the caller:
// a script linked to a file nobody may read (whose 1 KiB FLASH would fail the
// budget) changes nothing of the verdict nobody hears.
TEST_F(UnixPeerAttackTest, AFlashsMemoryBudgetReadsNoLinkerScriptNobodyCannotRead) {
  ASSERT_TRUE(fs::exists(FWAI_BLINKY_ELF)) << FWAI_BLINKY_ELF << " not built";
  const std::string p = d_tmp_ + "/budget";
  fs::create_directories(p + "/.fwai");
  fs::create_directories(p + "/build");
  fs::copy_file(FWAI_BLINKY_ELF, p + "/build/blinky.elf");
  std::ofstream(p + "/.fwai/project.yaml")
      << "name: budget\npolicy:\n  flash:\n    require_fresh: false\n  memory:\n    "
         "flash_max_pct: 90\n";
  const std::string secret_ld = d_tmp_ + "/root-only.ld";
  std::ofstream(secret_ld) << "MEMORY\n{\n  FLASH (rx) : ORIGIN = 0x08000000, LENGTH = 1K\n"
                              "  RAM (rwx) : ORIGIN = 0x20000000, LENGTH = 8K\n}\n";
  ASSERT_EQ(chmod(secret_ld.c_str(), 0600), 0);
  fs::create_symlink(secret_ld, p + "/link.ld");
  for (const auto& e : fs::recursive_directory_iterator(p))
    ASSERT_EQ(lchown(e.path().c_str(), nobody_.uid, nobody_.gid), 0);
  ASSERT_EQ(chown(p.c_str(), nobody_.uid, nobody_.gid), 0);
  std::string out, err;
  ASSERT_EQ(AsUser("nobody", {"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << out << err;
  const int rc =
      AsUser("nobody", {"--project", p, "flash", "--yes", "sim-stm32vl", p + "/build/blinky.elf"},
             &out, &err);
  EXPECT_EQ((out + err).find("flash guard (memory)"), std::string::npos)
      << "the budget was judged against a linker script nobody cannot read\n"
      << out << err;
  EXPECT_EQ((out + err).find("root-only.ld"), std::string::npos) << out << err;
  EXPECT_EQ(rc, 0) << out << err << d_->log();
}

// A register check reads the project, its settings and the SVD it names as
// the caller: a header, a source and an SVD linked to files nobody may read
// are named as not checked, and nothing of them (a macro, an address, a
// device's name) reaches nobody through a finding or an error.
TEST_F(UnixPeerAttackTest, ARegisterCheckLearnsNothingOfFilesNobodyCannotRead) {
  const std::string p = d_tmp_ + "/registers";
  fs::create_directories(p + "/.fwai");
  fs::create_directories(p + "/src");
  std::ofstream(p + "/.fwai/project.yaml") << "name: registers\ntarget: stm32f100rb\n";
  std::ofstream(p + "/src/main.c") << "#include \"regs.h\"\nint main(void) { return 0; }\n";
  // Root's files: a header with a wrong register (a finding would quote it),
  // a source, and an SVD whose device name is a canary.
  const std::string secret_h = d_tmp_ + "/root-only-regs.h";
  std::ofstream(secret_h) << "#define ROOTSECRET_APB2ENR (*(volatile unsigned *)0x40021014)\n"
                             "void f(void) { ROOTSECRET_APB2ENR |= (1u << 1); }\n";
  const std::string secret_c = d_tmp_ + "/root-only.c";
  std::ofstream(secret_c) << "void g(void) { *(volatile unsigned *)0x4001380D = 1; }\n";
  const std::string secret_svd = d_tmp_ + "/root-only.svd";
  std::ofstream(secret_svd)
      << "<?xml version=\"1.0\"?><device><name>ROOTCANARYCHIP</name><peripherals>"
         "<peripheral><name>P</name><baseAddress>0x40000000</baseAddress></peripheral>"
         "</peripherals></device>\n";
  for (const auto& f : {secret_h, secret_c, secret_svd}) ASSERT_EQ(chmod(f.c_str(), 0600), 0);
  fs::create_symlink(secret_h, p + "/src/regs.h");
  fs::create_symlink(secret_c, p + "/src/secret.c");
  fs::create_symlink(secret_svd, p + "/chip.svd");
  for (const auto& e : fs::recursive_directory_iterator(p))
    ASSERT_EQ(lchown(e.path().c_str(), nobody_.uid, nobody_.gid), 0);
  ASSERT_EQ(chown(p.c_str(), nobody_.uid, nobody_.gid), 0);
  auto expect_nothing_learned = [&](const std::string& all) {
    for (const char* canary : {"ROOTSECRET", "0x40021014", "0x4001380D", "ROOTCANARYCHIP",
                               "reserved-bits", "misaligned", "wrong-register"}) {
      EXPECT_EQ(all.find(canary), std::string::npos) << canary << " reached nobody:\n" << all;
    }
  };
  std::string out, err;
  int rc = AsUser("nobody", {"--project", p, "--json", "check", "registers"}, &out, &err);
  EXPECT_EQ(rc, 0) << out << err << d_->log();
  expect_nothing_learned(out + err);
  const json report = json::parse(out, nullptr, false);
  ASSERT_TRUE(report.is_object()) << out << err;
  EXPECT_EQ(report["checked"]["files"], 1) << out;  // src/main.c only
  std::set<std::string> skipped;
  for (const auto& s : report["skipped"]) {
    skipped.insert(s.value("path", ""));
    EXPECT_NE(s.value("why", "").find("permission denied"), std::string::npos) << s.dump();
  }
  EXPECT_EQ(skipped, (std::set<std::string>{"src/regs.h", "src/secret.c"})) << out;
  // The SVD it names, and the same file by its real path.
  for (const std::string& svd : {p + "/chip.svd", secret_svd}) {
    rc = AsUser("nobody", {"--project", p, "check", "registers", "--svd", svd}, &out, &err);
    EXPECT_EQ(rc, 2) << out << err;
    EXPECT_NE(err.find("permission denied"), std::string::npos) << err;
    expect_nothing_learned(out + err);
  }
  // The agent's tool, as nobody, on the same files.
  std::string all;
  auto res = NobodyTurn(p,
                        {{"r1", "checkRegisters", {{"json", true}}},
                         {"r2", "checkRegisters", {{"paths", {"src/regs.h", "src/secret.c"}}}},
                         {"r3", "checkRegisters", {{"svd", "chip.svd"}}}},
                        &all);
  ASSERT_EQ(res.size(), 3u) << all;
  expect_nothing_learned(all);
  EXPECT_NE(res["r2"].find("permission denied"), std::string::npos) << res["r2"];
  EXPECT_NE(res["r3"].find("permission denied"), std::string::npos) << res["r3"];
}

TEST_F(UnixPeerAttackTest, ProjectRootsAreCheckedAsThePeer) {
  // Another user's private directory is no project for nobody.
  std::string out, err;
  EXPECT_NE(AsUser("nobody", {"--project", victim_, "chat", "hi"}, &out, &err), 0);
  EXPECT_NE(err.find("nobody cannot use " + victim_), std::string::npos) << err << out;
  // /etc is one (nobody may read it with a shell too), but not its shadow
  // file, and nothing in it may be written: the attack of the report.
  std::string all;
  auto res = NobodyTurn(
      "/etc",
      {{"c1", "read_file", {{"path", "shadow"}}},
       {"c2", "grep", {{"pattern", "root"}, {"path", "shadow"}}},
       {"c3", "write_file", {{"path", "fwai-planted.txt"}, {"content", "x"}}},
       {"c4", "edit_file", {{"path", "shadow"}, {"old_string", "root"}, {"new_string", "toor"}}},
       {"c5",
        "bash",
        {{"command", "cat shadow; echo x >> shadow; echo x > fwai-planted.txt; true"}}}},
      &all);
  ASSERT_EQ(res.size(), 5u) << all;
  ExpectNothingLeakedOrChanged(all);
  for (const char* id : {"c1", "c3", "c4"}) {
    EXPECT_NE(absl::AsciiStrToLower(res[id]).find("permission denied"), std::string::npos)
        << id << ": " << res[id];
  }
}

TEST_F(UnixPeerAttackTest, ATokenWithoutAnAccountGetsNoFileToolAtAll) {
  auto drifter = Channel(Tcp(), Credentials{"", "", "", MakeToken("drifter")});
  grpc::ClientContext ctx;
  pb::CreateSessionRequest req;
  req.set_project_root(project_);
  pb::Session s;
  ASSERT_TRUE(pb::Sessions::NewStub(drifter)->Create(&ctx, req, &s).ok());
  EXPECT_EQ(s.project_root(), "");
  FakeReply r;
  r.tool_calls = {{"c1", "read_file", {{"path", "/etc/shadow"}}},
                  {"c2", "list_dir", {{"path", victim_}}},
                  {"c3", "grep", {{"pattern", "root"}, {"path", "/etc/shadow"}}},
                  {"c4", "glob", {{"pattern", "/etc/*"}}},
                  {"c5", "write_file", {{"path", "/etc/fwai-planted.txt"}, {"content", "x"}}},
                  {"c6",
                   "edit_file",
                   {{"path", "/etc/shadow"}, {"old_string", "root"}, {"new_string", "toor"}}},
                  {"c7", "bash", {{"command", "cat /etc/shadow; echo x >> /etc/shadow"}}},
                  {"c8", "build", json::object()},
                  {"c9", "mcp_fs_read_text_file", {{"path", "/etc/shadow"}}}};
  fake_.Enqueue(r);
  FakeReply done;
  done.chunks = {"done"};
  fake_.Enqueue(done);
  auto turn = RunChat(*pb::Sessions::NewStub(drifter), s.id(), "try");
  ASSERT_TRUE(turn.finished) << turn.status.error_message();
  std::string all;
  int finished = 0;
  for (const auto& ev : turn.events) {
    if (!ev.has_tool_call_finished()) continue;
    ++finished;
    const auto& f = ev.tool_call_finished();
    all += f.output() + "\n";
    EXPECT_TRUE(f.is_error()) << f.call_id() << ": " << f.output();
  }
  EXPECT_EQ(finished, 9);
  ExpectNothingLeakedOrChanged(all);
  // Nothing that touches files was offered, the project's MCP server included.
  for (const auto& t : fake_.requests().back().body["tools"]) {
    const std::string name = t.value("name", "");
    EXPECT_EQ(name.rfind("mcp_fs_", 0), std::string::npos) << name;
    for (const char* banned :
         {"read_file", "list_dir", "grep", "glob", "write_file", "edit_file", "bash", "build"}) {
      EXPECT_NE(name, banned) << "offered to a session without a project";
    }
  }
  // The CLI says so before the model answers: no project, no file or command tools, and why.
  FakeReply hello;
  hello.chunks = {"hello"};
  fake_.Enqueue(hello);
  std::string out, err;
  const std::string token = MakeToken("drifter");
  EXPECT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", Tcp(), "--project",
                        project_, "chat", "hi"},
                       &out, &err, {"FWAI_TOKEN=" + token}),
            0)
      << err;
  EXPECT_NE(err.find("this session has no project and no file or command tools"), std::string::npos)
      << err;
  EXPECT_FALSE(s.no_project_reason().empty());
  EXPECT_NE(err.find(s.no_project_reason()), std::string::npos) << err;
}

// Two uids on the group socket: `daemon` (given the socket's group) cannot
// list, read, attach to, answer or delete nobody's session, see its records,
// nor release its lease.
TEST_F(UnixPeerAttackTest, TwoUidsOnTheGroupSocketSeeOnlyTheirOwn) {
  FakeReply hello;
  hello.chunks = {"hello nobody"};
  fake_.Enqueue(hello);
  std::string out, err;
  ASSERT_EQ(AsUser("nobody", {"--project", project_, "--json", "chat", "nobody's secret plan"},
                   &out, &err),
            0)
      << err;
  const std::string sid = SessionIn(out);
  ASSERT_FALSE(sid.empty()) << out;
  ASSERT_EQ(AsUser("nobody", {"--json", "hw", "lease", "sim-stm32vl"}, &out, &err), 0)
      << err << out;
  auto other = [&](std::vector<std::string> args, std::string* o, std::string* e) {
    return AsUser("daemon", std::move(args), o, e, "nogroup");
  };
  ASSERT_EQ(other({"--json", "whoami"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out).value("principal", ""), "uid:1") << out;
  ASSERT_EQ(other({"--json", "sessions", "ls"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out), json::array()) << out;
  EXPECT_NE(other({"sessions", "ls", "--all"}, &out, &err), 0);
  EXPECT_NE(other({"sessions", "show", sid}, &out, &err), 0);
  EXPECT_EQ((out + err).find("secret plan"), std::string::npos) << out << err;
  EXPECT_NE(other({"attach", sid, "--no-follow"}, &out, &err), 0);
  EXPECT_EQ((out + err).find("secret plan"), std::string::npos) << out << err;
  EXPECT_NE(other({"chat", "-s", sid, "answer for nobody"}, &out, &err), 0);
  EXPECT_NE(other({"sessions", "rm", sid}, &out, &err), 0);
  ASSERT_EQ(other({"--json", "evidence", "ls"}, &out, &err), 0) << err;
  EXPECT_EQ(out.find(sid), std::string::npos) << out;
  EXPECT_NE(other({"hw", "release", "sim-stm32vl"}, &out, &err), 0);
  EXPECT_NE(err.find("nobody"), std::string::npos) << "names the holder: " << err;
  EXPECT_NE(other({"hw", "release", "sim-stm32vl", "--force"}, &out, &err), 0);
  EXPECT_NE(err.find("rule: admin"), std::string::npos) << err;
  // nobody's session, history and lease are all still there.
  ASSERT_EQ(AsUser("nobody", {"--json", "sessions", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find(sid), std::string::npos) << out;
  ASSERT_EQ(AsUser("nobody", {"sessions", "show", sid}, &out, &err), 0) << err;
  EXPECT_NE(out.find("secret plan"), std::string::npos) << out;
  ASSERT_EQ(AsUser("nobody", {"--json", "evidence", "ls"}, &out, &err), 0) << err;
  EXPECT_NE(out.find(sid), std::string::npos) << out;
  auto holder = pb::Hardware::NewStub(d_->channel());
  grpc::ClientContext ctx;
  pb::ListDevicesResponse devs;
  ASSERT_TRUE(holder->ListDevices(&ctx, pb::ListDevicesRequest(), &devs).ok());
  ASSERT_EQ(devs.leases_size(), 1);
  EXPECT_NE(devs.leases(0).holder().find("nobody"), std::string::npos) << devs.leases(0).holder();
}

// Two uids on the group socket share a session through the CLI: the owner
// (nobody) shares it with the daemon account as approver, who sees it listed
// with its owner, cannot send, approves the owner's plan with `fwai attach
// --approve` (the owner's turn goes on, naming who approved); shared to drive,
// its message is shown by the owner's `fwai attach` as "daemon> ...".
TEST_F(UnixPeerAttackTest, ASessionSharedBetweenTwoUidsThroughTheCliNamesEachAuthor) {
  FakeReply hello;
  hello.chunks = {"hello"};
  fake_.Enqueue(hello);
  std::string out, err;
  ASSERT_EQ(AsUser("nobody", {"--project", project_, "--json", "chat", "hello"}, &out, &err), 0)
      << err;
  const std::string sid = SessionIn(out);
  ASSERT_FALSE(sid.empty()) << out;
  auto other = [&](std::vector<std::string> args, std::string* o, std::string* e) {
    return AsUser("daemon", std::move(args), o, e, "nogroup");
  };
  ASSERT_EQ(AsUser("nobody", {"sessions", "share", sid, "daemon", "--role", "approve"}, &out, &err),
            0)
      << err << out;
  ASSERT_EQ(other({"--json", "sessions", "ls", "--shared-with-me"}, &out, &err), 0) << err;
  auto listed = json::parse(out, nullptr, false);
  ASSERT_TRUE(listed.is_array() && listed.size() == 1) << out;
  EXPECT_EQ(listed[0].value("id", ""), sid);
  EXPECT_EQ(listed[0].value("owner_user", ""), "nobody");
  EXPECT_EQ(listed[0].value("my_role", ""), "approve");
  // An approver does not send messages.
  EXPECT_NE(other({"chat", "-s", sid, "from daemon"}, &out, &err), 0);
  EXPECT_NE(err.find("drive"), std::string::npos) << err;
  // The owner's plan waits; the approver approves it from `fwai attach`.
  const std::string plan_path = ".fwai/plans/" + sid + ".md";
  FakeReply plan;
  plan.tool_calls = {
      {"p1", "write_file", {{"path", plan_path}, {"content", std::string(80, 'x') + "\n"}}},
      {"s1", "submitPlan", json::object()}};
  fake_.Enqueue(plan);
  FakeReply done;
  done.chunks = {"done as planned"};
  fake_.Enqueue(done);
  std::string owner_out, owner_err;
  int owner_rc = -1;
  std::thread owner([&] {
    owner_rc = AsUser("nobody", {"--project", project_, "chat", "-s", sid, "--plan", "plan it"},
                      &owner_out, &owner_err);
  });
  const int approve_rc = other({"attach", sid, "--approve"}, &out, &err);
  owner.join();
  EXPECT_EQ(approve_rc, 0) << err << out;
  EXPECT_NE(out.find("[plan approved by daemon"), std::string::npos) << out;
  EXPECT_EQ(owner_rc, 0) << owner_err << owner_out;
  EXPECT_NE((owner_out + owner_err).find("approved by daemon"), std::string::npos)
      << owner_out << owner_err;
  EXPECT_NE(owner_out.find("done as planned"), std::string::npos) << owner_out;
  // Shared to drive (the share replaced), the daemon account's message runs.
  ASSERT_EQ(AsUser("nobody", {"sessions", "share", sid, "daemon", "--role", "drive"}, &out, &err),
            0)
      << err << out;
  FakeReply ok;
  ok.chunks = {"ok daemon"};
  fake_.Enqueue(ok);
  ASSERT_EQ(other({"chat", "-s", sid, "from daemon"}, &out, &err), 0) << err << out;
  ASSERT_EQ(AsUser("nobody", {"attach", sid, "--no-follow"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("daemon> from daemon"), std::string::npos) << out;
  EXPECT_NE(out.find("ok daemon"), std::string::npos) << out;
  // Unshared: the daemon account sees nothing of it again.
  ASSERT_EQ(AsUser("nobody", {"sessions", "unshare", sid, "daemon"}, &out, &err), 0) << err;
  EXPECT_NE(other({"attach", sid, "--no-follow"}, &out, &err), 0);
  EXPECT_EQ(out.find("from daemon"), std::string::npos) << out;
}

// Personal collections follow identities, not names: a token made for the
// name of a local account (nobody) that fwaid.yaml does not map to that
// account gets nothing of the account's ~nobody collections — neither over
// the API nor through the agent's documentSearch — and cannot write there.
TEST_F(UnixPeerAttackTest, ATokenNamedAfterALocalAccountGetsNoneOfItsPersonalCollections) {
  const std::string note = d_tmp_ + "/note.md";
  std::ofstream(note) << "# Private\n\nThe NOBODY-PRIVATE-NOTE says the unlock code is 4711.\n";
  ASSERT_EQ(chmod(note.c_str(), 0644), 0);
  std::string out, err;
  ASSERT_EQ(AsUser("nobody", {"kb", "add", note, "--collection", "~notes"}, &out, &err), 0)
      << err << out;
  ASSERT_EQ(AsUser("nobody", {"--json", "kb", "ls", "--collection", "~notes"}, &out, &err), 0)
      << err;
  ASSERT_NE(out.find("note.md"), std::string::npos) << "nobody does not see its own note: " << out;
  // The agent of nobody's own session finds it (so the search below can find it at all).
  std::string all;
  auto own = NobodyTurn(
      project_, {{"s1", "documentSearch", {{"query", "NOBODY-PRIVATE-NOTE unlock code"}}}}, &all);
  ASSERT_NE(own["s1"].find("NOBODY-PRIVATE-NOTE"), std::string::npos) << all;

  // A token for "nobody" (users: does not name it): another principal.
  auto impostor = Channel(Tcp(), Credentials{"", "", "", MakeToken("nobody")});
  auto kb = pb::Knowledge::NewStub(impostor);
  for (const std::string collection : {"", "~nobody/notes", "~nobody", "~notes"}) {
    grpc::ClientContext ctx;
    pb::ListDocumentsRequest req;
    req.set_collection(collection);
    pb::ListDocumentsResponse docs;
    (void)kb->ListDocuments(&ctx, req, &docs);  // refused, or without the note
    for (const auto& d : docs.documents()) {
      EXPECT_EQ(d.name().find("note.md"), std::string::npos) << "listed in '" << collection << "'";
    }
  }
  for (const std::string collection : {"", "~nobody/notes"}) {
    grpc::ClientContext ctx;
    pb::SearchRequest req;
    req.set_query("NOBODY-PRIVATE-NOTE unlock code");
    req.set_collection(collection);
    pb::SearchResponse found;
    (void)kb->Search(&ctx, req, &found);
    for (const auto& r : found.results()) {
      EXPECT_EQ(r.text().find("NOBODY-PRIVATE-NOTE"), std::string::npos)
          << "found in '" << collection << "'";
    }
  }
  {
    // Its "~notes" is nobody's: refused, saying whose and what to do.
    grpc::ClientContext ctx;
    auto stream = kb->Ingest(&ctx);
    pb::IngestChunk head;
    head.mutable_header()->set_name("planted.md");
    head.mutable_header()->set_collection("~notes");
    head.mutable_header()->set_size(10);
    stream->Write(head);
    pb::IngestChunk data;
    data.set_data("# planted");
    stream->Write(data);
    stream->WritesDone();
    pb::IngestProgress p;
    while (stream->Read(&p)) {
    }
    auto st = stream->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_NE(st.error_message().find("belongs to the local account nobody"), std::string::npos)
        << st.error_message();
  }
  // Its agent does not find the note either.
  grpc::ClientContext ctx;
  pb::Session s;
  ASSERT_TRUE(pb::Sessions::NewStub(impostor)->Create(&ctx, pb::CreateSessionRequest(), &s).ok());
  FakeReply r;
  r.tool_calls = {{"s2", "documentSearch", {{"query", "NOBODY-PRIVATE-NOTE unlock code"}}}};
  fake_.Enqueue(r);
  FakeReply done;
  done.chunks = {"done"};
  fake_.Enqueue(done);
  auto turn = RunChat(*pb::Sessions::NewStub(impostor), s.id(), "find it");
  ASSERT_TRUE(turn.finished) << turn.status.error_message();
  int searched = 0;
  for (const auto& ev : turn.events) {
    if (!ev.has_tool_call_finished()) continue;
    ++searched;
    EXPECT_EQ(ev.tool_call_finished().output().find("NOBODY-PRIVATE-NOTE"), std::string::npos)
        << ev.tool_call_finished().output();
  }
  EXPECT_EQ(searched, 1);
  // nobody's note is still there, whole.
  ASSERT_EQ(AsUser("nobody", {"--json", "kb", "ls", "--collection", "~notes"}, &out, &err), 0)
      << err;
  EXPECT_NE(out.find("note.md"), std::string::npos) << out;
  EXPECT_EQ(out.find("planted.md"), std::string::npos) << out;
}

}  // namespace fwai::testing
