// The shared daemon, tried as an attacker would: TCP without credentials,
// bad and revoked tokens, wrong CAs and unmapped certificates, a second
// identity on one connection, another user's sessions, runs, records and
// leases, every RPC of the API without a token, limits. Real TLS (made with
// fwaid tls), real tokens, a real fwaid.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "common/local_account.h"
#include "client/lib/client.h"
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
std::shared_ptr<grpc::Channel> LazyChannel(const std::string& target, std::shared_ptr<grpc::ChannelCredentials> creds) {
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
  std::string MakeToken(const std::string& user, const std::string& role = "user", int64_t ttl_s = 0) {
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
  int rc = RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "--data-dir", dir + "/data", "--listen",
                       "unix:" + dir + "/s.sock", "--listen", "tcp:0.0.0.0:0"},
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
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token << ": " << st.error_message();
  }
  // A plaintext client (no local credentials) gets no further.
  auto plain = LazyChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials());
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
  auto ch = LazyChannel("127.0.0.1:" + std::to_string(port_), grpc::experimental::LocalCredentials(LOCAL_TCP));
  grpc::GenericStub stub(ch);
  int checked = 0;
  // A message of each service's file makes sure its descriptors are linked in.
  const std::vector<std::pair<std::string, const google::protobuf::Descriptor*>> services = {
      {"Sessions", pb::CreateSessionRequest::descriptor()},   {"Daemon", pb::DaemonStatusRequest::descriptor()},
      {"Auth", pb::WhoAmIRequest::descriptor()},              {"Knowledge", pb::SearchRequest::descriptor()},
      {"ToolCatalog", pb::ToolSearchRequest::descriptor()},   {"Hardware", pb::AcquireRequest::descriptor()},
      {"Projects", pb::InitRequest::descriptor()},            {"Skills", pb::RunSkillRequest::descriptor()},
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
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method << ": " << st.error_message();
      ++checked;
    }
  }
  EXPECT_GE(checked, 45);
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
  {
    grpc::ClientContext ctx;
    pb::RevokeTokenRequest req;
    req.set_id(token_ids_[token]);
    pb::RevokeTokenResponse resp;
    ASSERT_TRUE(pb::Auth::NewStub(d_->channel())->RevokeToken(&ctx, req, &resp).ok());
  }
  const auto t0 = std::chrono::steady_clock::now();
  pb::ServerEvent ev;
  while (follower->Read(&ev)) {
  }
  auto st = follower->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "the stream outlived its token";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(st.error_message().find("revoked"), std::string::npos) << st.error_message();
  st = WhoAmI(ch);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("was revoked at"), std::string::npos) << st.error_message();
  // An expired token says so.
  const std::string short_lived = MakeToken("bob", "user", 1);
  auto bob = Channel(Tcp(), Credentials{"", "", "", short_lived});
  st = grpc::Status::OK;
  for (int i = 0; i < 100 && st.ok(); ++i) {
    st = WhoAmI(bob);
    if (st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
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

// gRPC shares one auth context among a connection's calls: the first
// identity is bound to it and a second is refused.
TEST_F(SecurityTest, ASecondIdentityOnOneConnectionIsRefused) {
  StartDaemon("");
  const std::string alice = MakeToken("alice"), bob = MakeToken("bob");
  class Alternate final : public grpc::experimental::Interceptor {
   public:
    Alternate(std::atomic<int>* n, std::string a, std::string b) : n_(n), a_(std::move(a)), b_(std::move(b)) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
      if (m->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
        m->GetSendInitialMetadata()->insert({"authorization", "Bearer " + ((*n_)++ % 2 == 0 ? a_ : b_)});
      }
      m->Proceed();
    }
    std::atomic<int>* n_;
    std::string a_, b_;
  };
  class Factory final : public grpc::experimental::ClientInterceptorFactoryInterface {
   public:
    Factory(std::atomic<int>* n, std::string a, std::string b) : n_(n), a_(std::move(a)), b_(std::move(b)) {}
    grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
      return new Alternate(n_, a_, b_);
    }
    std::atomic<int>* n_;
    std::string a_, b_;
  };
  std::atomic<int> n{0};
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<Factory>(&n, alice, bob));
  auto ch = grpc::experimental::CreateCustomChannelWithInterceptors(
      "127.0.0.1:" + std::to_string(port_), grpc::experimental::LocalCredentials(LOCAL_TCP), grpc::ChannelArguments(),
      std::move(f));
  pb::WhoAmIResponse who;
  ASSERT_TRUE(WhoAmI(ch, &who).ok());
  EXPECT_EQ(who.principal(), "user:alice");
  auto st = WhoAmI(ch, &who);  // bob's token on alice's connection
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << who.principal();
  EXPECT_NE(st.error_message().find("already used by user:alice"), std::string::npos) << st.error_message();
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
  StartDaemon("tls: {cert: " + dir + "/server.pem, key: " + dir + "/server.key, client_ca: " + dir +
              "/ca.pem, reload_interval_s: 1}\nusers:\n  carol: {role: ci, cert_subject: \"CN=carol\"}\n");
  const std::string ca = dir + "/ca.pem";
  // Plain TCP to the TLS port fails.
  {
    auto plain = LazyChannel("127.0.0.1:" + std::to_string(port_), grpc::experimental::LocalCredentials(LOCAL_TCP));
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
  ASSERT_TRUE(WhoAmI(Channel(Tls(), Credentials{ca, dir + "/carol.pem", dir + "/carol.key", ""}), &who).ok());
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
  EXPECT_FALSE(WhoAmI(tls_channel(dir + "/old.pem", dir + "/old.key")).ok());
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
    EXPECT_NE(s.no_project_reason().find("no local account"), std::string::npos) << s.no_project_reason();
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
    EXPECT_EQ(st.error_message().find("alice"), std::string::npos) << "reveals the owner: " << st.error_message();
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
  // Records: alice's turn is hers.
  auto records = [](const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    pb::ListRunsRequest req;
    pb::ListRunsResponse out;
    EXPECT_TRUE(pb::Evidence::NewStub(ch)->ListRuns(&ctx, req, &out).ok());
    return out;
  };
  EXPECT_GE(records(alice).runs_size(), 1);
  EXPECT_EQ(records(bob).runs_size(), 0);
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
  bool kicked = false;
  for (const auto& r : all["records"]) {
    const auto& rec = r["record"];
    if (rec.value("kind", "") == "lease_kicked") {
      kicked = rec.value("holder", "") == "user:alice" && rec.value("principal", "") == "uid:0";
    }
  }
  EXPECT_TRUE(kicked) << exp.data();
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
  EXPECT_EQ(listed(*pb::Knowledge::NewStub(d_->channel())), std::vector<std::string>{id});  // the admin
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
  for (const auto& t : tokens.tokens()) EXPECT_EQ(t.DebugString().find("fwai_"), std::string::npos) << "secret listed";
}

TEST_F(SecurityTest, LimitsRefuseNamingTheLimit) {
  StartDaemon("limits: {sessions: 2, requests_per_second: 1000, burst: 1000}\n");
  auto alice = Channel(Tcp(), Credentials{"", "", "", MakeToken("alice")});
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
      EXPECT_NE(st.error_message().find("limit sessions (2)"), std::string::npos) << st.error_message();
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
    int rc = RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "--config", dir + "/fwaid.yaml", "--data-dir",
                         dir + "/data", "--listen", "unix:" + dir + "/s.sock"},
                        &out, &err);
    EXPECT_EQ(rc, 1) << yaml;
    EXPECT_NE(err.find(want), std::string::npos) << "want '" << want << "' in: " << err;
  };
  check("users:\n  alice: {role: boss}\n", "fwaid.yaml:2: users.alice.role: expected admin, user or ci");
  check("tls: {cert: /nonexistent.pem, key: /nonexistent.key}\n", "fwaid.yaml:1: tls.cert: cannot read");
  check("unix_socket: {mode: \"0666\"}\n", "unix_socket.mode: must not give others access");
  check("limits:\n  sessions: -1\n", "fwaid.yaml:2: limits.sessions: expected an integer in 0..");
  check("users:\n  a: {cert_subject: \"CN=x\"}\n  b: {cert_subject: \"CN=x\"}\n", "users.b.cert_subject: already maps to user a");
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
        << "name: probe\nsteps:\n  - name: look\n    tool: shell\n    command: \"id -u > uid.txt; cat "
        << secret_ << " root-only.txt link.txt || true\"\n";
    auto nobody = LookupAccount("nobody");
    ASSERT_TRUE(nobody.ok());
    nobody_uid_ = nobody->uid;
    for (const auto& e : fs::recursive_directory_iterator(project_)) {
      if (e.path().filename() != "root-only.txt") {
        ASSERT_EQ(lchown(e.path().c_str(), nobody->uid, nobody->gid), 0);
      }
    }
    ASSERT_EQ(chown(project_.c_str(), nobody->uid, nobody->gid), 0);
    StartDaemon("users:\n  mallory: {role: user, local_user: nobody}\n");
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
  std::map<std::string, std::string> Turn(const std::shared_ptr<grpc::Channel>& ch, const std::string& session,
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
      if (ev.has_tool_call_finished()) results[ev.tool_call_finished().call_id()] = ev.tool_call_finished().output();
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
  auto out = Turn(mallory_, s.id(),
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
  EXPECT_EQ(Read(secret_), "TOP-SECRET-ROOT-ONLY\n") << "a write through the link reached the secret";
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
    for (const char* banned : {"read_file", "list_dir", "grep", "glob", "write_file", "edit_file", "bash"}) {
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
  // A caller with no account cannot run a skill at all.
  grpc::ClientContext ctx2;
  auto refused = pb::Skills::NewStub(nameless_)->Run(&ctx2, req);
  while (refused->Read(&ev)) {
  }
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
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
      fs::permissions(d_tmp_ + "/bin", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                           fs::perms::others_read | fs::perms::others_exec);
      fs::permissions(fwai, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
    }
    argv.insert(argv.end(), {"--", fwai, "--daemon", d_->address()});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, {"HOME=/nonexistent", "PATH=/usr/bin:/bin"});
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
    EXPECT_NE(absl::AsciiStrToLower(res[id]).find("permission denied"), std::string::npos) << id << ": " << res[id];
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
  std::string sid;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line) && sid.empty();) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object()) sid = j.value("session_id", "");
  }
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

}  // namespace fwai::testing
