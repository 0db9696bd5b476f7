// Sessions shared between users, tried as each of them would: the owner
// (root on the unix socket, with a project) shares with token users over
// TCP. Each role gets exactly what it names and every refusal says why; a
// user the session is not shared with learns nothing; a sharer cannot
// re-share, delete, rewind or read the owner's files; unsharing and expiry
// end the sharer's streams within a sweep; every message, decision and
// cancel names its verified author, whatever the client claims; the agent
// uses the owner's board leases, never a sharer's, and sharing gives a
// sharer none.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "client/lib/client.h"
#include "fwai/v1/auth.grpc.pb.h"
#include "fwai/v1/evidence.grpc.pb.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/sessions.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;
using json = nlohmann::json;
using Stream = grpc::ClientReaderWriter<pb::ClientEvent, pb::ServerEvent>;

class SharingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(fake_.Start(), 0);
    d_ = std::make_unique<Daemon>(&fake_);
    d_->AddListen("tcp:127.0.0.1:0");
    ASSERT_TRUE(d_->Start()) << d_->log();
    owner_ = d_->sessions();
    bob_ = User("bob");
    carol_ = User("carol");
  }

  // A token user over TCP (root, on the unix socket, makes the token).
  std::unique_ptr<pb::Sessions::Stub> User(const std::string& name) {
    grpc::ClientContext ctx;
    pb::CreateTokenRequest req;
    req.set_user(name);
    req.set_role("user");
    pb::CreateTokenResponse resp;
    EXPECT_TRUE(pb::Auth::NewStub(d_->channel())->CreateToken(&ctx, req, &resp).ok());
    auto addr = ResolveDaemonAddress("tcp:127.0.0.1:" + std::to_string(d_->TcpPort()));
    EXPECT_TRUE(addr.ok());
    auto ch = ConnectToDaemon(*addr, false, 5000, Credentials{"", "", "", resp.token()});
    EXPECT_TRUE(ch.ok()) << ch.status();
    channels_[name] = *ch;
    return pb::Sessions::NewStub(*ch);
  }

  // The sessions named by the evidence records `user` may list (its own
  // refusals name none and are left out), and the kinds of those records.
  std::pair<std::set<std::string>, std::set<std::string>> RunsOf(const std::string& user) {
    grpc::ClientContext ctx;
    pb::ListRunsResponse out;
    EXPECT_TRUE(
        pb::Evidence::NewStub(channels_[user])->ListRuns(&ctx, pb::ListRunsRequest(), &out).ok());
    std::set<std::string> sessions, kinds;
    for (const auto& r : out.runs()) {
      const json j = json::parse(r.record_json());
      if (j.value("session_id", "").empty()) continue;
      sessions.insert(j.value("session_id", ""));
      kinds.insert(j.value("kind", ""));
    }
    return {sessions, kinds};
  }

  // The owner's session on its project, in `mode`.
  pb::Session Create(const std::string& mode = "act") {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_project_root(d_->project_dir());
    req.set_mode(mode);
    pb::Session s;
    EXPECT_TRUE(owner_->Create(&ctx, req, &s).ok());
    return s;
  }

  grpc::Status Share(const std::string& session, const std::string& user, const std::string& role,
                     int64_t expires_in_s = 0, pb::Sessions::Stub* as = nullptr) {
    grpc::ClientContext ctx;
    pb::ShareSessionRequest req;
    req.set_session_id(session);
    req.set_user(user);
    req.set_role(role);
    req.set_expires_in_s(expires_in_s);
    pb::SessionShare out;
    return (as != nullptr ? as : owner_.get())->Share(&ctx, req, &out);
  }

  grpc::Status Unshare(const std::string& session, const std::string& user,
                       pb::Sessions::Stub* as = nullptr) {
    grpc::ClientContext ctx;
    pb::UnshareSessionRequest req;
    req.set_session_id(session);
    req.set_user(user);
    pb::UnshareSessionResponse out;
    return (as != nullptr ? as : owner_.get())->Unshare(&ctx, req, &out);
  }

  static grpc::Status Get(pb::Sessions::Stub& as, const std::string& session,
                          pb::Session* out = nullptr) {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(session);
    pb::Session s;
    auto st = as.Get(&ctx, req, &s);
    if (out != nullptr) *out = s;
    return st;
  }

  // Opens a Chat stream without a message.
  static std::unique_ptr<Stream> Open(pb::Sessions::Stub& as, grpc::ClientContext* ctx,
                                      const std::string& session) {
    auto stream = as.Chat(ctx);
    pb::ClientEvent open;
    open.mutable_open()->set_session_id(session);
    open.mutable_open()->set_replay(true);
    stream->Write(open);
    return stream;
  }

  // Sends `ev` and reads the stream to its end: the status it ended with.
  static grpc::Status SendAndEnd(pb::Sessions::Stub& as, const std::string& session,
                                 const pb::ClientEvent& ev) {
    grpc::ClientContext ctx;
    auto stream = Open(as, &ctx, session);
    stream->Write(ev);
    stream->WritesDone();
    pb::ServerEvent got;
    while (stream->Read(&got)) {
    }
    return stream->Finish();
  }

  static bool ReadUntil(Stream& stream, std::vector<pb::ServerEvent>& seen,
                        const std::function<bool(const pb::ServerEvent&)>& pred) {
    pb::ServerEvent ev;
    while (stream.Read(&ev)) {
      seen.push_back(ev);
      if (pred(ev)) return true;
    }
    return false;
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  std::unique_ptr<pb::Sessions::Stub> owner_, bob_, carol_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // token users by name
};

TEST_F(SharingTest, AWatcherSeesTheSessionAndNothingMoreAndOthersLearnNothing) {
  const pb::Session s = Create();
  ASSERT_TRUE(RunChat(*owner_, s.id(), "hello").finished) << d_->log();
  // Not shared yet: not found, as if it did not exist.
  EXPECT_EQ(Get(*bob_, s.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Share(s.id(), "bob", "watch").ok()) << d_->log();
  pb::Session seen;
  ASSERT_TRUE(Get(*bob_, s.id(), &seen).ok());
  EXPECT_EQ(seen.my_role(), "watch");
  EXPECT_FALSE(seen.owner_user().empty());
  EXPECT_EQ(seen.shares_size(), 0) << "a sharer sees whom else it is shared with";
  // Listed for him only when he asks for shared sessions.
  {
    grpc::ClientContext ctx;
    pb::ListSessionsRequest req;
    pb::ListSessionsResponse out;
    ASSERT_TRUE(bob_->List(&ctx, req, &out).ok());
    EXPECT_EQ(out.sessions_size(), 0);
    grpc::ClientContext ctx2;
    req.set_shared_with_me(true);
    ASSERT_TRUE(bob_->List(&ctx2, req, &out).ok());
    ASSERT_EQ(out.sessions_size(), 1);
    EXPECT_EQ(out.sessions(0).id(), s.id());
    EXPECT_EQ(out.sessions(0).my_role(), "watch");
  }
  // He reads the whole conversation; the owner's message names the owner.
  const pb::UserMessage* first = nullptr;
  const auto events = ReadAll(*bob_, s.id());
  for (const auto& e : events) {
    if (e.has_user_message() && first == nullptr) first = &e.user_message();
  }
  ASSERT_NE(first, nullptr) << "the watcher does not see the conversation";
  EXPECT_EQ(first->text(), "hello");
  EXPECT_TRUE(first->author().owner());
  // He cannot drive it, answer in it, or approve in it.
  pb::ClientEvent msg;
  msg.mutable_message()->set_text("let me drive");
  auto st = SendAndEnd(*bob_, s.id(), msg);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(st.error_message().find("needs the role drive; yours is watch"), std::string::npos)
      << st.error_message();
  pb::ClientEvent approve;
  approve.mutable_plan_decision()->set_plan_id("p-anything");
  approve.mutable_plan_decision()->set_approve(true);
  EXPECT_EQ(SendAndEnd(*bob_, s.id(), approve).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Nor re-share it, delete it, rewind it, or read the owner's files.
  st = Share(s.id(), "carol", "watch", 0, bob_.get());
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("only the owner"), std::string::npos) << st.error_message();
  EXPECT_EQ(Unshare(s.id(), "bob", bob_.get()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  {
    grpc::ClientContext ctx;
    pb::DeleteSessionRequest req;
    req.set_session_id(s.id());
    pb::DeleteSessionResponse out;
    EXPECT_EQ(bob_->Delete(&ctx, req, &out).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    pb::RewindRequest req;
    req.set_session_id(s.id());
    req.set_dry_run(true);
    pb::RewindResponse out;
    EXPECT_EQ(bob_->Rewind(&ctx, req, &out).error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(out.files_size(), 0);
  }
  {
    grpc::ClientContext ctx;
    pb::ReadCheckpointFileRequest req;
    req.set_session_id(s.id());
    req.set_path("README.md");
    pb::ReadCheckpointFileResponse out;
    EXPECT_EQ(bob_->ReadCheckpointFile(&ctx, req, &out).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_TRUE(out.content().empty());
  }
  // Carol, whom it is not shared with, still learns nothing of it.
  EXPECT_EQ(Get(*carol_, s.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(ReadAll(*carol_, s.id()).empty());
  // The owner's other sessions stay the owner's.
  const pb::Session other = Create();
  EXPECT_EQ(Get(*bob_, other.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  // The evidence of the session he watches is his to read; of the owner's
  // other session, none; carol reads none; unshared, he reads none again.
  // Whom the owner shares it with is not his to learn from the log either.
  ASSERT_TRUE(RunChat(*owner_, other.id(), "private").finished) << d_->log();
  const auto [sessions, kinds] = RunsOf("bob");
  EXPECT_EQ(sessions, std::set<std::string>{s.id()});
  EXPECT_TRUE(kinds.count("agent_turn")) << ::testing::PrintToString(kinds);
  EXPECT_FALSE(kinds.count("session_shared")) << ::testing::PrintToString(kinds);
  EXPECT_TRUE(RunsOf("carol").first.empty());
  ASSERT_TRUE(Unshare(s.id(), "bob").ok());
  EXPECT_TRUE(RunsOf("bob").first.empty());
}

TEST_F(SharingTest, ADriversMessageNamesItsVerifiedAuthorWhateverTheClientSays) {
  const pb::Session s = Create();
  ASSERT_TRUE(Share(s.id(), "bob", "drive").ok()) << d_->log();
  // The client names itself as the owner; the author is who the token says.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  ctx.AddMetadata("fwai-client", "root");
  auto stream = OpenChat(*bob_, &ctx, s.id(), "from bob");
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_turn_finished();
  })) << d_->log();
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  const pb::UserMessage* m = nullptr;
  for (const auto& e : seen) {
    if (e.has_user_message()) m = &e.user_message();
  }
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->author().principal(), "user:bob");
  EXPECT_EQ(m->author().user(), "bob");
  EXPECT_FALSE(m->author().owner());
  // Unknown users and roles are refused naming them.
  auto st = Share(s.id(), "nobody-by-this-name", "watch");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("nobody-by-this-name"), std::string::npos)
      << st.error_message();
  st = Share(s.id(), "carol", "admin");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("watch, answer, approve, drive"), std::string::npos)
      << st.error_message();
}

TEST_F(SharingTest, AnAnswerersAnswerContinuesTheTurnAndAWatcherCannotAnswer) {
  const pb::Session s = Create();
  ASSERT_TRUE(Share(s.id(), "bob", "watch").ok()) << d_->log();
  ASSERT_TRUE(Share(s.id(), "carol", "answer").ok()) << d_->log();
  FakeReply r1;
  r1.tool_calls = {
      {"q1",
       "askQuestion",
       {{"questions", {{{"text", "Which UART?"}, {"options", {"USART1", "USART2"}}}}}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"USART2 it is"};
  fake_.Enqueue(r2);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(60);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  auto owner = OpenChat(*owner_, &ctx, s.id(), "which uart?");
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(ReadUntil(*owner, seen, [](const pb::ServerEvent& e) {
    return e.has_question_asked();
  })) << d_->log();
  pb::ClientEvent answer;
  answer.mutable_answer()->set_question_id(seen.back().question_asked().question_id());
  answer.mutable_answer()->add_selected("USART2");
  // The watcher may not answer; the answerer does, and the turn goes on.
  const grpc::Status refused = SendAndEnd(*bob_, s.id(), answer);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(refused.error_message().find("needs the role answer; yours is watch"),
            std::string::npos)
      << refused.error_message();
  grpc::ClientContext carol_ctx;
  carol_ctx.set_deadline(deadline);
  auto carol = Open(*carol_, &carol_ctx, s.id());
  ASSERT_TRUE(carol->Write(answer));
  ASSERT_TRUE(ReadUntil(*owner, seen, [](const pb::ServerEvent& e) {
    return e.has_turn_finished();
  })) << d_->log();
  const pb::QuestionAnswered* answered = nullptr;
  std::string text;
  for (const auto& e : seen) {
    if (e.has_question_answered()) answered = &e.question_answered();
    if (e.has_text_delta()) text += e.text_delta().text();
  }
  ASSERT_NE(answered, nullptr);
  EXPECT_EQ(answered->author().principal(), "user:carol");
  EXPECT_FALSE(answered->author().owner());
  EXPECT_EQ(std::vector<std::string>(answered->selected().begin(), answered->selected().end()),
            std::vector<std::string>{"USART2"});
  EXPECT_NE(text.find("USART2 it is"), std::string::npos) << text;
  carol->WritesDone();
  pb::ServerEvent ev;
  while (carol->Read(&ev)) {
  }
  EXPECT_TRUE(carol->Finish().ok());
  owner->WritesDone();
  EXPECT_TRUE(owner->Finish().ok());
}

TEST_F(SharingTest, AnApproversDecisionContinuesTheTurnAndASecondApprovalIsToldWhoWasFirst) {
  const pb::Session s = Create("plan");
  ASSERT_TRUE(Share(s.id(), "bob", "approve").ok()) << d_->log();
  ASSERT_TRUE(Share(s.id(), "carol", "answer").ok()) << d_->log();
  const std::string plan_path = ".fwai/plans/" + s.id() + ".md";
  FakeReply r1;
  r1.tool_calls = {
      {"p1", "write_file", {{"path", plan_path}, {"content", std::string(80, 'x') + "\n"}}},
      {"s1", "submitPlan", json::object()}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"done"};
  fake_.Enqueue(r2);
  // Bob follows the session before the owner starts the turn.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(60);
  grpc::ClientContext bob_ctx;
  bob_ctx.set_deadline(deadline);
  auto bob = Open(*bob_, &bob_ctx, s.id());
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  auto owner = OpenChat(*owner_, &ctx, s.id(), "plan it");
  std::vector<pb::ServerEvent> bob_seen, owner_seen;
  ASSERT_TRUE(ReadUntil(*bob, bob_seen, [](const pb::ServerEvent& e) {
    return e.has_plan_submitted();
  })) << d_->log();
  const std::string plan_id = bob_seen.back().plan_submitted().plan_id();
  // Carol may answer questions, not decide plans.
  pb::ClientEvent decision;
  decision.mutable_plan_decision()->set_plan_id(plan_id);
  decision.mutable_plan_decision()->set_approve(true);
  EXPECT_EQ(SendAndEnd(*carol_, s.id(), decision).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(bob->Write(decision));
  ASSERT_TRUE(ReadUntil(*owner, owner_seen, [](const pb::ServerEvent& e) {
    return e.has_plan_decided();
  })) << d_->log();
  const auto& decided = owner_seen.back().plan_decided();
  EXPECT_TRUE(decided.approved());
  EXPECT_EQ(decided.decided_by_user(), "bob");
  EXPECT_EQ(decided.author().principal(), "user:bob");
  // The owner approves too, late: told who was first; the turn goes on.
  ASSERT_TRUE(owner->Write(decision));
  bool told = false, finished = false;
  ReadUntil(*owner, owner_seen, [&](const pb::ServerEvent& e) {
    if (e.has_error() && e.error().message().find("already approved by bob") != std::string::npos)
      told = true;
    if (e.has_turn_finished()) finished = true;
    return told && finished;
  });
  EXPECT_TRUE(told) << "the second approval was not told who approved first";
  EXPECT_TRUE(finished) << d_->log();
  owner->WritesDone();
  EXPECT_TRUE(owner->Finish().ok());
  bob->WritesDone();
  pb::ServerEvent ev;
  while (bob->Read(&ev)) {
  }
  EXPECT_TRUE(bob->Finish().ok());
}

TEST_F(SharingTest, UnsharingAndExpiryEndTheSharersStreamsWithinASweep) {
  const pb::Session s = Create();
  // Events to replay: a stream that has shown one is open, its share checked.
  ASSERT_TRUE(RunChat(*owner_, s.id(), "hello").finished) << d_->log();
  ASSERT_TRUE(Share(s.id(), "bob", "watch").ok()) << d_->log();
  {
    grpc::ClientContext ctx;
    pb::AttachRequest req;
    req.set_session_id(s.id());
    auto follower = bob_->Attach(&ctx, req);
    pb::ServerEvent ev;
    ASSERT_TRUE(follower->Read(&ev)) << d_->log();
    ASSERT_TRUE(Unshare(s.id(), "bob").ok());
    const auto t0 = std::chrono::steady_clock::now();
    while (follower->Read(&ev)) {
    }
    auto st = follower->Finish();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
        << "the stream outlived the share";
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_NE(st.error_message().find("no longer shared with you"), std::string::npos)
        << st.error_message();
  }
  EXPECT_EQ(Get(*bob_, s.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Unshare(s.id(), "bob").error_code(), grpc::StatusCode::NOT_FOUND);
  // For a minute: good for it, then refused (fwaid's clock is moved).
  ASSERT_TRUE(Share(s.id(), "bob", "drive", 60).ok());
  grpc::ClientContext ctx;
  auto chat = Open(*bob_, &ctx, s.id());
  pb::ServerEvent ev;
  ASSERT_TRUE(chat->Read(&ev)) << d_->log();
  d_->AdvanceClock(61'000'000);
  const auto t1 = std::chrono::steady_clock::now();
  while (chat->Read(&ev)) {
  }
  auto st = chat->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5))
      << "the stream outlived the share";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_EQ(Get(*bob_, s.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  // A deleted session's shares go with it.
  grpc::ClientContext dctx;
  pb::DeleteSessionRequest dreq;
  dreq.set_session_id(s.id());
  pb::DeleteSessionResponse dout;
  ASSERT_TRUE(owner_->Delete(&dctx, dreq, &dout).ok());
  grpc::ClientContext lctx;
  pb::ListSessionsRequest lreq;
  lreq.set_shared_with_me(true);
  pb::ListSessionsResponse lout;
  ASSERT_TRUE(bob_->List(&lctx, lreq, &lout).ok());
  EXPECT_EQ(lout.sessions_size(), 0);
}

// A driver has the agent use the board its owner holds; he cannot take,
// reset or release that board himself, even with the owner's lease id (which
// every listing shows); and a board he holds, even under the session's id, is
// not one the agent in the owner's session may write to.
TEST_F(SharingTest, TheAgentUsesTheOwnersLeasesNeverTheSharersAndSharingGivesNone) {
  const pb::Session s = Create();
  ASSERT_TRUE(Share(s.id(), "bob", "drive").ok()) << d_->log();
  auto owner_hw = pb::Hardware::NewStub(d_->channel());
  auto bob_hw = pb::Hardware::NewStub(channels_["bob"]);
  auto acquire = [](pb::Hardware::Stub& as, pb::Lease* out, const std::string& session = "") {
    grpc::ClientContext ctx;
    pb::AcquireRequest req;
    req.set_device_id("sim-stm32vl");
    req.set_ttl_s(300);
    req.set_session_id(session);
    return as.Acquire(&ctx, req, out);
  };
  auto release = [](pb::Hardware::Stub& as, const std::string& lease_id) {
    grpc::ClientContext ctx;
    pb::ReleaseRequest req;
    req.set_lease_id(lease_id);
    pb::ReleaseResponse out;
    return as.Release(&ctx, req, &out);
  };
  // bob drives a turn whose agent writes to the board's serial console.
  auto agent_writes = [&](const std::string& call) {
    FakeReply calls;
    calls.tool_calls = {{call,
                         "serialSendCommand",
                         {{"board", "sim-stm32vl"}, {"command", "ping"}, {"wait_for", "^pong"}}}};
    fake_.Enqueue(calls);
    FakeReply done;
    done.chunks = {"done"};
    fake_.Enqueue(done);
    auto turn = RunChat(*bob_, s.id(), "ping the board", 60);
    EXPECT_TRUE(turn.finished) << d_->log();
    for (const auto& e : turn.events) {
      if (e.has_tool_call_finished() && e.tool_call_finished().call_id() == call)
        return e.tool_call_finished();
    }
    ADD_FAILURE() << "no result for " << call;
    return pb::ToolCallFinished();
  };
  pb::Lease owners;
  ASSERT_TRUE(acquire(*owner_hw, &owners).ok()) << d_->log();
  // The example's image, flashed by the owner from a project of its own (the
  // image was built from another tree, so freshness is not asked).
  const std::string p = d_->dir() + "/flashed";
  std::filesystem::create_directories(p + "/.fwai");
  std::filesystem::create_directories(p + "/build");
  std::filesystem::copy_file(FWAI_BLINKY_ELF, p + "/build/blinky.elf");
  std::ofstream(p + "/.fwai/project.yaml")
      << "name: flashed\npolicy:\n  flash:\n    require_fresh: false\n";
  std::string out, err;
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(), "--project",
                        p, "flash", "--yes", "sim-stm32vl", p + "/build/blinky.elf"},
                       &out, &err, {}, 120),
            0)
      << out << err;
  const pb::ToolCallFinished used = agent_writes("c1");
  EXPECT_FALSE(used.is_error()) << used.output();
  EXPECT_NE(used.output().find("pong"), std::string::npos) << used.output();

  // The owner's lease is not bob's to use, end or take.
  pb::Lease taken;
  auto st = acquire(*bob_hw, &taken);
  EXPECT_FALSE(st.ok()) << "bob took the board the owner holds";
  grpc::ClientContext rctx;
  pb::ResetRequest rreq;
  rreq.set_device_id("sim-stm32vl");
  rreq.set_lease_id(owners.lease_id());
  pb::ResetResponse rout;
  EXPECT_FALSE(bob_hw->Reset(&rctx, rreq, &rout).ok()) << "bob reset through the owner's lease";
  EXPECT_FALSE(release(*bob_hw, owners.lease_id()).ok()) << "bob ended the owner's lease";
  grpc::ClientContext lctx;
  pb::ListDevicesResponse listed;
  ASSERT_TRUE(bob_hw->ListDevices(&lctx, pb::ListDevicesRequest(), &listed).ok());
  for (const auto& l : listed.leases()) EXPECT_FALSE(l.yours()) << l.ShortDebugString();

  // The board bob holds himself is not the session's to write to, even a
  // lease he takes naming the session.
  ASSERT_TRUE(release(*owner_hw, owners.lease_id()).ok());
  pb::Lease bobs;
  ASSERT_TRUE(acquire(*bob_hw, &bobs, s.id()).ok()) << d_->log();
  const pb::ToolCallFinished refused = agent_writes("c2");
  EXPECT_TRUE(refused.is_error()) << refused.output();
  EXPECT_NE(refused.output().find("lease"), std::string::npos) << refused.output();
  EXPECT_TRUE(release(*bob_hw, bobs.lease_id()).ok());
}

}  // namespace
}  // namespace fwai::testing
