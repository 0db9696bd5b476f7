// Sessions API against a real fwaid over its unix socket.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <future>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

TEST(SessionsApiTest, CreateListGetDeleteAndOwner) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  auto stub = d.sessions();
  pb::Session s = d.CreateSession();
  ASSERT_EQ(s.id().rfind("s-", 0), 0u) << s.id();
  EXPECT_EQ(s.owner(), "uid:" + std::to_string(getuid()));  // from SO_PEERCRED
  {
    grpc::ClientContext ctx;
    pb::ListSessionsResponse resp;
    ASSERT_TRUE(stub->List(&ctx, pb::ListSessionsRequest(), &resp).ok());
    ASSERT_EQ(resp.sessions_size(), 1);
    EXPECT_EQ(resp.sessions(0).id(), s.id());
  }
  {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(s.id());
    pb::Session got;
    ASSERT_TRUE(stub->Get(&ctx, req, &got).ok());
    EXPECT_EQ(got.project_root(), s.project_root());
  }
  {
    grpc::ClientContext ctx;
    pb::DeleteSessionRequest req;
    req.set_session_id(s.id());
    pb::DeleteSessionResponse resp;
    ASSERT_TRUE(stub->Delete(&ctx, req, &resp).ok());
  }
  grpc::ClientContext ctx;
  pb::GetSessionRequest req;
  req.set_session_id(s.id());
  pb::Session got;
  auto st = stub->Get(&ctx, req, &got);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find(s.id()), std::string::npos);
}

TEST(SessionsApiTest, BadInputIsInvalidArgumentOrNotFound) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  auto stub = d.sessions();
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_project_root(d.dir() + "/does-not-exist");
    pb::Session s;
    auto st = stub->Create(&ctx, req, &s);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("project_root"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_project_root(d.project_dir());
    req.set_provider("nonesuch");
    pb::Session s;
    EXPECT_EQ(stub->Create(&ctx, req, &s).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Attach / Chat to an unknown session.
  {
    grpc::ClientContext ctx;
    pb::AttachRequest req;
    req.set_session_id("s-nope");
    auto reader = stub->Attach(&ctx, req);
    pb::ServerEvent ev;
    EXPECT_FALSE(reader->Read(&ev));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  auto out = RunChat(*stub, "s-nope", "hello");
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(SessionsApiTest, HealthAndDaemonStatus) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  grpc::ClientContext ctx;
  pb::DaemonStatus s;
  ASSERT_TRUE(d.daemon()->Status(&ctx, pb::DaemonStatusRequest(), &s).ok());
  EXPECT_EQ(s.pid(), d.pid());
  EXPECT_EQ(s.providers_size(), 0);
  EXPECT_EQ(s.caller(), "uid:" + std::to_string(getuid()));
}

TEST(SessionsApiTest, GrpcHealthCheckServes) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  grpc::GenericStub stub(d.channel());
  grpc::ClientContext ctx;
  // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message.
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status st = done.get_future().get();
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01"));  // status: SERVING
}

// Chat and Attach read their messages as bytes: one that is not the message
// it must be is refused with INVALID_ARGUMENT naming what it must be, and
// the daemon goes on serving.
TEST(SessionsApiTest, AChatOrAttachMessageThatIsNotOneIsRefusedByName) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  const std::string garbage("\x0f\xff\xff\xff", 4);  // a field of a wire type that does not exist
  grpc::Status chat = RawStream(d.channel(), "/fwai.v1.Sessions/Chat", garbage);
  EXPECT_EQ(chat.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << chat.error_message();
  EXPECT_NE(chat.error_message().find("fwai.v1.ClientEvent"), std::string::npos)
      << chat.error_message();
  grpc::Status attach = RawStream(d.channel(), "/fwai.v1.Sessions/Attach", garbage);
  EXPECT_EQ(attach.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << attach.error_message();
  EXPECT_NE(attach.error_message().find("fwai.v1.AttachRequest"), std::string::npos)
      << attach.error_message();
  auto s = d.CreateSession();
  auto out = RunChat(*d.sessions(), s.id(), "hi");
  EXPECT_TRUE(out.finished);
}

TEST(SessionsApiTest, SessionsAndEventsSurviveRestart) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = d.CreateSession();
  auto out = RunChat(*d.sessions(), s.id(), "hi");
  ASSERT_TRUE(out.finished);
  auto before = ReadAll(*d.sessions(), s.id());
  EXPECT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
  auto after = ReadAll(*d.sessions(), s.id());
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].SerializeAsString(), after[i].SerializeAsString());
  }
}

}  // namespace
}  // namespace fwai::testing
