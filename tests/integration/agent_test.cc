// The full agent through a real fwaid and the fake provider: plan mode
// enforced in the daemon, plan approval, todos, questions answered after a
// reconnect, nested and parallel sub-agents, cancel killing a command tree.
#include <gtest/gtest.h>
#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;
namespace fs = std::filesystem;
using json = nlohmann::json;

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_GT(fake_.Start(), 0); }

  pb::Session Create(Daemon& d, const std::string& mode, bool auto_approve = false) {
    grpc::ClientContext ctx;
    pb::CreateSessionRequest req;
    req.set_project_root(d.project_dir());
    req.set_mode(mode);
    req.set_auto_approve_plan(auto_approve);
    pb::Session s;
    EXPECT_TRUE(d.sessions()->Create(&ctx, req, &s).ok());
    return s;
  }

  // Reads events until `pred` holds or the turn finishes.
  static bool ReadUntil(grpc::ClientReaderWriter<pb::ClientEvent, pb::ServerEvent>& stream,
                        std::vector<pb::ServerEvent>& seen,
                        const std::function<bool(const pb::ServerEvent&)>& pred) {
    pb::ServerEvent ev;
    while (stream.Read(&ev)) {
      seen.push_back(ev);
      if (pred(ev)) return true;
      if (ev.has_turn_finished()) return false;
    }
    return false;
  }

  static std::map<std::string, pb::ToolCallFinished> Finished(
      const std::vector<pb::ServerEvent>& evs) {
    std::map<std::string, pb::ToolCallFinished> out;
    for (const auto& e : evs) {
      if (e.has_tool_call_finished())
        out[e.tool_call_finished().call_id()] = e.tool_call_finished();
    }
    return out;
  }

  static std::vector<std::string> OfferedTools(const RecordedRequest& r) {
    std::vector<std::string> out;
    for (const auto& t : r.body["tools"]) out.push_back(t.value("name", ""));
    return out;
  }

  // One turn: the model makes the calls in `calls`, then answers `answer`.
  TurnOutcome ToolTurn(Daemon& d, const std::string& session_id, const std::string& text,
                       FakeReply calls, const std::string& answer) {
    fake_.Enqueue(std::move(calls));
    FakeReply done;
    done.chunks = {answer};
    fake_.Enqueue(done);
    return RunChat(*d.sessions(), session_id, text);
  }

  FakeLlmServer fake_;
};

TEST_F(AgentTest, AskBeforeEditsWaitsForTheUsersAcceptAndARejectLeavesTheFileAlone) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  std::ofstream(d.project_dir() + "/main.c") << "int counter = 1;\nint other = 2;\n";
  grpc::ClientContext cctx;
  pb::CreateSessionRequest creq;
  creq.set_project_root(d.project_dir());
  creq.set_ask_before_edits(true);
  pb::Session s;
  ASSERT_TRUE(d.sessions()->Create(&cctx, creq, &s).ok());
  EXPECT_TRUE(s.ask_before_edits());
  FakeReply r1;
  r1.tool_calls = {
      // Calls the tools refuse by themselves are not asked about (and a
      // path that is not a string must not bring fwaid down).
      {"bad1", "write_file", {{"path", 42}, {"content", "x"}}},
      {"bad2",
       "edit_file",
       {{"path", "main.c"}, {"old_string", "not in the file"}, {"new_string", "y"}}},
      {"e1",
       "edit_file",
       {{"path", "main.c"}, {"old_string", "counter = 1"}, {"new_string", "counter = 42"}}},
      {"w1", "write_file", {{"path", "notes.txt"}, {"content", "scratch\n"}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"done"};
  fake_.Enqueue(r2);

  grpc::ClientContext ctx;
  auto stream = OpenChat(*d.sessions(), &ctx, s.id(), "set counter to 42");
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_question_asked();
  })) << d.log();
  const pb::QuestionAsked first = seen.back().question_asked();
  ASSERT_TRUE(first.has_edit());
  EXPECT_EQ(first.edit().call_id(), "e1");
  EXPECT_EQ(first.edit().path(), "main.c");
  EXPECT_EQ(first.edit().preview(), "@@ line 1 @@\n-int counter = 1;\n+int counter = 42;\n");
  // Nothing is written before the accept.
  std::ifstream before(d.project_dir() + "/main.c");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(before), {}),
            "int counter = 1;\nint other = 2;\n");
  // Turning it off mid-turn is refused, as the mode is.
  pb::ClientEvent off;
  off.mutable_set_edit_approval()->set_ask_before_edits(false);
  {
    grpc::ClientContext ctx2;
    auto other = d.sessions()->Chat(&ctx2);
    pb::ClientEvent open;
    open.mutable_open()->set_session_id(s.id());
    ASSERT_TRUE(other->Write(open));
    other->Write(off);
    pb::ServerEvent ignored;
    while (other->Read(&ignored)) {
    }
    grpc::Status st = other->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("a turn is running"), std::string::npos)
        << st.error_message();
  }
  pb::ClientEvent accept;
  accept.mutable_answer()->set_question_id(first.question_id());
  accept.mutable_answer()->add_selected("Accept");
  ASSERT_TRUE(stream->Write(accept));
  ASSERT_TRUE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_question_asked();
  })) << d.log();
  const pb::QuestionAsked second = seen.back().question_asked();
  EXPECT_EQ(second.edit().path(), "notes.txt");
  EXPECT_EQ(second.edit().preview(), "@@ line 1 @@\n+scratch\n");
  pb::ClientEvent reject;
  reject.mutable_answer()->set_question_id(second.question_id());
  reject.mutable_answer()->add_selected("Reject");
  reject.mutable_answer()->set_text("no scratch files");
  ASSERT_TRUE(stream->Write(reject));
  ASSERT_FALSE(ReadUntil(*stream, seen, [](const pb::ServerEvent&) { return false; }));
  ASSERT_TRUE(seen.back().has_turn_finished()) << stream->Finish().error_message();
  auto fin = Finished(seen);
  EXPECT_TRUE(fin["bad1"].is_error());
  EXPECT_NE(fin["bad1"].output().find("path"), std::string::npos) << fin["bad1"].output();
  EXPECT_TRUE(fin["bad2"].is_error());
  EXPECT_NE(fin["bad2"].output().find("not found"), std::string::npos) << fin["bad2"].output();
  EXPECT_FALSE(fin["e1"].is_error()) << fin["e1"].output();
  EXPECT_TRUE(fin["w1"].is_error());
  EXPECT_NE(fin["w1"].output().find("rejected"), std::string::npos) << fin["w1"].output();
  EXPECT_NE(fin["w1"].output().find("no scratch files"), std::string::npos);
  std::ifstream after(d.project_dir() + "/main.c");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(after), {}),
            "int counter = 42;\nint other = 2;\n");
  EXPECT_FALSE(fs::exists(d.project_dir() + "/notes.txt"));
  // The model is told the edit was rejected, and why.
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_NE(reqs[1].body.dump().find("no scratch files"), std::string::npos);

  // Off between turns: said to every client, kept by the session, and the
  // next turn's edit runs without a question.
  ASSERT_TRUE(stream->Write(off));
  FakeReply r3;
  r3.tool_calls = {{"w2", "write_file", {{"path", "notes.txt"}, {"content", "kept\n"}}}};
  fake_.Enqueue(r3);
  FakeReply r4;
  r4.chunks = {"written"};
  fake_.Enqueue(r4);
  pb::ClientEvent msg;
  msg.mutable_message()->set_text("now write the notes");
  ASSERT_TRUE(stream->Write(msg));
  seen.clear();
  ASSERT_FALSE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_question_asked();
  })) << "asked again with asking off";
  bool told = false;
  for (const auto& e : seen) {
    told |= e.has_edit_approval_changed() && !e.edit_approval_changed().ask_before_edits();
  }
  EXPECT_TRUE(told);
  EXPECT_TRUE(fs::exists(d.project_dir() + "/notes.txt"));
  grpc::ClientContext gctx;
  pb::GetSessionRequest g;
  g.set_session_id(s.id());
  pb::Session now;
  ASSERT_TRUE(d.sessions()->Get(&gctx, g, &now).ok());
  EXPECT_FALSE(now.ask_before_edits());
  stream->WritesDone();
  stream->Finish();
}

// What a review of a turn's changes reads: the files as the checkpoint before
// the turn kept them, and a rewind of one file alone.
TEST_F(AgentTest, ATurnsFilesReadBackFromItsCheckpointAndOneFileRevertsAlone) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto slurp = [&](const std::string& rel) {
    std::ifstream in(d.project_dir() + "/" + rel);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::ofstream(d.project_dir() + "/main.c") << "int a = 1;\n";
  std::ofstream(d.project_dir() + "/other.c") << "int b = 1;\n";
  auto s = Create(d, "act");
  FakeReply calls;
  calls.tool_calls = {
      {"e1", "edit_file", {{"path", "main.c"}, {"old_string", "a = 1"}, {"new_string", "a = 2"}}},
      {"w1", "write_file", {{"path", "new.c"}, {"content", "int c;\n"}}},
      {"w2", "write_file", {{"path", "other.c"}, {"content", "int b = 2;\n"}}}};
  ASSERT_TRUE(ToolTurn(d, s.id(), "change three files", calls, "done").finished) << d.log();
  ASSERT_EQ(slurp("main.c"), "int a = 2;\n");

  grpc::ClientContext lctx;
  pb::ListCheckpointsRequest lreq;
  lreq.set_session_id(s.id());
  pb::ListCheckpointsResponse cps;
  ASSERT_TRUE(d.sessions()->ListCheckpoints(&lctx, lreq, &cps).ok());
  ASSERT_GE(cps.checkpoints_size(), 1);
  const std::string to = std::to_string(cps.checkpoints(cps.checkpoints_size() - 1).seq());
  auto read = [&](const std::string& path, pb::ReadCheckpointFileResponse* out) {
    grpc::ClientContext ctx;
    pb::ReadCheckpointFileRequest req;
    req.set_session_id(s.id());
    req.set_to(to);
    req.set_path(path);
    return d.sessions()->ReadCheckpointFile(&ctx, req, out);
  };
  pb::ReadCheckpointFileResponse then;
  ASSERT_TRUE(read("main.c", &then).ok());
  EXPECT_TRUE(then.kept());
  EXPECT_EQ(then.content(), "int a = 1;\n");
  EXPECT_EQ(then.sha256().size(), 64u);
  pb::ReadCheckpointFileResponse absent;
  ASSERT_TRUE(read("new.c", &absent).ok());
  EXPECT_FALSE(absent.kept()) << "new.c did not exist before the turn";
  for (const char* outside : {"../outside.txt", "/etc/passwd", ""}) {
    pb::ReadCheckpointFileResponse no;
    EXPECT_EQ(read(outside, &no).error_code(), grpc::StatusCode::NOT_FOUND) << outside;
  }

  auto rewind = [&](std::vector<std::string> paths, bool dry, pb::RewindResponse* out) {
    grpc::ClientContext ctx;
    pb::RewindRequest req;
    req.set_session_id(s.id());
    req.set_to(to);
    req.set_dry_run(dry);
    for (auto& p : paths) req.add_paths(p);
    if (paths.empty()) req.set_files(true);
    return d.sessions()->Rewind(&ctx, req, out);
  };
  pb::RewindResponse plan;
  ASSERT_TRUE(rewind({}, true, &plan).ok());
  std::map<std::string, std::string> actions;
  for (const auto& f : plan.files()) actions[f.path()] = f.action();
  EXPECT_EQ(actions, (std::map<std::string, std::string>{
                         {"main.c", "restore"}, {"new.c", "delete"}, {"other.c", "restore"}}));
  // A file the turn did not change is refused by name, and nothing changes.
  pb::RewindResponse refused;
  auto st = rewind({"main.c", "unchanged.c"}, false, &refused);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("unchanged.c"), std::string::npos) << st.error_message();
  EXPECT_EQ(slurp("main.c"), "int a = 2;\n");
  // One file alone goes back; the others stay as the turn left them.
  pb::RewindResponse one;
  ASSERT_TRUE(rewind({"main.c"}, false, &one).ok());
  EXPECT_TRUE(one.applied());
  ASSERT_EQ(one.files_size(), 1);
  EXPECT_EQ(slurp("main.c"), "int a = 1;\n");
  EXPECT_EQ(slurp("other.c"), "int b = 2;\n");
  EXPECT_TRUE(fs::exists(d.project_dir() + "/new.c"));
}

TEST_F(AgentTest, PlanModeRefusesChangesInCodeUntilThePlanIsApproved) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "plan");
  const std::string plan_path = ".fwai/plans/" + s.id() + ".md";
  const std::string plan_text =
      "1. Add uart_init() to src/uart.c\n2. Call it from main()\n3. Verify with ping on the "
      "board\n";
  FakeReply r1;
  r1.tool_calls = {{"w1", "write_file", {{"path", "src/uart.c"}, {"content", "int x;\n"}}},
                   {"b1", "bash", {{"command", "touch made_by_bash"}}},
                   {"p1", "write_file", {{"path", plan_path}, {"content", plan_text}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.tool_calls = {{"s1", "submitPlan", json::object()}};
  fake_.Enqueue(r2);
  FakeReply r3;  // after approval: act mode
  r3.tool_calls = {
      {"w2", "write_file", {{"path", "src/uart.c"}, {"content", "void uart_init(void) {}\n"}}}};
  fake_.Enqueue(r3);
  FakeReply r4;
  r4.chunks = {"done"};
  fake_.Enqueue(r4);

  grpc::ClientContext ctx;
  auto stream = OpenChat(*d.sessions(), &ctx, s.id(), "add a UART init");
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_plan_submitted();
  })) << d.log();
  const auto& plan = seen.back().plan_submitted();
  EXPECT_EQ(plan.text(), plan_text);
  EXPECT_EQ(plan.path(), plan_path);
  auto fin = Finished(seen);
  ASSERT_TRUE(fin.count("w1") && fin.count("b1") && fin.count("p1"));
  EXPECT_TRUE(fin["w1"].is_error());
  EXPECT_NE(fin["w1"].output().find("plan mode"), std::string::npos) << fin["w1"].output();
  EXPECT_TRUE(fin["b1"].is_error());
  EXPECT_NE(fin["b1"].output().find("plan mode"), std::string::npos) << fin["b1"].output();
  EXPECT_FALSE(fin["p1"].is_error()) << fin["p1"].output();
  EXPECT_FALSE(fs::exists(d.project_dir() + "/src/uart.c"));
  EXPECT_FALSE(fs::exists(d.project_dir() + "/made_by_bash"));
  {
    // Git does not list the plan as a file to commit.
    std::string git_out, git_err;
    ASSERT_EQ(RunCommand({"/usr/bin/git", "-C", d.project_dir(), "init", "-q"}, &git_out, &git_err),
              0)
        << git_err;
    ASSERT_EQ(RunCommand({"/usr/bin/git", "-C", d.project_dir(), "status", "--porcelain",
                          "--untracked-files=all"},
                         &git_out, &git_err),
              0)
        << git_err;
    EXPECT_EQ(git_out.find(".fwai/plans"), std::string::npos) << git_out;
  }
  // The model was never even offered bash in plan mode.
  auto reqs = fake_.requests();
  ASSERT_GE(reqs.size(), 1u);
  auto offered = OfferedTools(reqs[0]);
  EXPECT_EQ(std::count(offered.begin(), offered.end(), "bash"), 0);
  EXPECT_EQ(std::count(offered.begin(), offered.end(), "submitPlan"), 1);

  pb::ClientEvent decision;
  decision.mutable_plan_decision()->set_plan_id(plan.plan_id());
  decision.mutable_plan_decision()->set_approve(true);
  ASSERT_TRUE(stream->Write(decision));
  ASSERT_FALSE(ReadUntil(*stream, seen, [](const pb::ServerEvent&) { return false; }));
  ASSERT_TRUE(seen.back().has_turn_finished())
      << d.log() << seen.back().DebugString() << stream->Finish().error_message();
  bool mode_changed = false;
  for (const auto& e : seen)
    mode_changed |= e.has_mode_changed() && e.mode_changed().mode() == "act";
  EXPECT_TRUE(mode_changed);
  fin = Finished(seen);
  EXPECT_FALSE(fin["w2"].is_error()) << fin["w2"].output();
  EXPECT_TRUE(fs::exists(d.project_dir() + "/src/uart.c"));
  EXPECT_NE(fin["s1"].output().find("approved"), std::string::npos);
  EXPECT_NE(fin["s1"].output().find("uart_init"),
            std::string::npos);  // the plan becomes the instruction
  grpc::ClientContext gctx;
  pb::GetSessionRequest g;
  g.set_session_id(s.id());
  pb::Session after;
  ASSERT_TRUE(d.sessions()->Get(&gctx, g, &after).ok());
  EXPECT_EQ(after.mode(), "act");
  stream->WritesDone();
  stream->Finish();
}

TEST_F(AgentTest, ShortPlansAreRefusedAndAutoApproveRunsOn) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "plan", /*auto_approve=*/true);
  const std::string plan_path = ".fwai/plans/" + s.id() + ".md";
  FakeReply r1;
  r1.tool_calls = {{"s0", "submitPlan", json::object()},
                   {"p0", "write_file", {{"path", plan_path}, {"content", "too short"}}},
                   {"s1", "submitPlan", json::object()},
                   {"p1", "write_file", {{"path", plan_path}, {"content", std::string(60, 'x')}}},
                   {"s2", "submitPlan", json::object()}};
  auto out = ToolTurn(d, s.id(), "plan it", r1, "carried out");
  ASSERT_TRUE(out.finished) << d.log();
  auto fin = Finished(out.events);
  EXPECT_TRUE(fin["s0"].is_error());
  EXPECT_NE(fin["s0"].output().find("write the plan"), std::string::npos) << fin["s0"].output();
  EXPECT_TRUE(fin["s1"].is_error());
  EXPECT_NE(fin["s1"].output().find("at least 50"), std::string::npos) << fin["s1"].output();
  EXPECT_FALSE(fin["s2"].is_error()) << fin["s2"].output();
  EXPECT_NE(fin["s2"].output().find("approved"), std::string::npos);
  // After approval the next call offers the full tool set.
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  auto offered = OfferedTools(reqs[1]);
  EXPECT_EQ(std::count(offered.begin(), offered.end(), "bash"), 1);
}

TEST_F(AgentTest, TodoRulesAreEnforcedAndChangesAreEvents) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "act");
  FakeReply r1;
  r1.tool_calls = {
      {"t1",
       "todoWrite",
       {{"todos",
         {{{"id", "a"}, {"content", "x"}, {"status", "in_progress"}},
          {{"id", "b"}, {"content", "y"}, {"status", "in_progress"}}}}}},
      {"t2",
       "todoWrite",
       {{"todos",
         {{{"id", "a"}, {"content", "x"}, {"status", "pending"}},
          {{"id", "a"}, {"content", "y"}, {"status", "pending"}}}}}},
      {"t3", "todoWrite", {{"todos", {{{"id", "a"}, {"content", " "}, {"status", "pending"}}}}}},
      {"t4", "todoWrite", {{"todos", {{{"id", "a"}, {"content", "x"}, {"status", "someday"}}}}}},
      {"t5",
       "todoWrite",
       {{"todos",
         {{{"id", "a"}, {"content", "read the RM"}, {"status", "completed"}},
          {{"id", "b"}, {"content", "write the driver"}, {"status", "in_progress"}},
          {{"id", "c"},
           {"content", "test on board"},
           {"status", "pending"},
           {"parent_id", "b"}}}}}},
      {"t6", "todoRead", json::object()}};
  auto out = ToolTurn(d, s.id(), "track it", r1, "ok");
  ASSERT_TRUE(out.finished);
  auto fin = Finished(out.events);
  EXPECT_NE(fin["t1"].output().find("at most one item may be in_progress"), std::string::npos)
      << fin["t1"].output();
  EXPECT_NE(fin["t2"].output().find("unique"), std::string::npos) << fin["t2"].output();
  EXPECT_NE(fin["t3"].output().find("empty content"), std::string::npos) << fin["t3"].output();
  EXPECT_NE(fin["t4"].output().find("someday"), std::string::npos) << fin["t4"].output();
  EXPECT_FALSE(fin["t5"].is_error()) << fin["t5"].output();
  EXPECT_NE(fin["t6"].output().find("write the driver"), std::string::npos);
  int updates = 0;
  for (const auto& e : out.events) {
    if (e.has_todos_updated()) {
      ++updates;
      ASSERT_EQ(e.todos_updated().todos_size(), 3);
      EXPECT_EQ(e.todos_updated().todos(2).parent_id(), "b");
    }
  }
  EXPECT_EQ(updates, 1);  // refused writes change nothing
  // Persisted with the session, across a restart.
  EXPECT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start());
  grpc::ClientContext gctx;
  pb::GetSessionRequest g;
  g.set_session_id(s.id());
  pb::Session after;
  ASSERT_TRUE(d.sessions()->Get(&gctx, g, &after).ok());
  ASSERT_EQ(after.todos_size(), 3);
  EXPECT_EQ(after.todos(1).status(), "in_progress");
}

TEST_F(AgentTest, AQuestionIsAnsweredAfterTheClientReconnects) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "act");
  FakeReply r1;
  r1.tool_calls = {
      {"q1",
       "askQuestion",
       {{"questions", {{{"text", "Which UART?"}, {"options", {"USART1", "USART2"}}}}}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"using USART2"};
  fake_.Enqueue(r2);
  std::string qid;
  {
    grpc::ClientContext ctx;
    auto stream = OpenChat(*d.sessions(), &ctx, s.id(), "set up the console");
    std::vector<pb::ServerEvent> seen;
    ASSERT_TRUE(
        ReadUntil(*stream, seen, [](const pb::ServerEvent& e) { return e.has_question_asked(); }));
    ASSERT_EQ(seen.back().question_asked().questions(0).options_size(), 2);
    ctx.TryCancel();  // the client goes away while the question waits
    stream->Finish();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // A new client replays the stream, finds the open question and answers it.
  grpc::ClientContext ctx;
  auto stream = d.sessions()->Chat(&ctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(s.id());
  open.mutable_open()->set_replay(true);
  ASSERT_TRUE(stream->Write(open));
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(
      ReadUntil(*stream, seen, [](const pb::ServerEvent& e) { return e.has_question_asked(); }));
  qid = seen.back().question_asked().question_id();
  pb::ClientEvent answer;
  answer.mutable_answer()->set_question_id(qid);
  answer.mutable_answer()->add_selected("USART2");
  ASSERT_TRUE(stream->Write(answer));
  ReadUntil(*stream, seen, [](const pb::ServerEvent&) { return false; });
  ASSERT_TRUE(seen.back().has_turn_finished()) << d.log();
  auto fin = Finished(seen);
  EXPECT_NE(fin["q1"].output().find("USART2"), std::string::npos) << fin["q1"].output();
  // A reply nobody waits for is refused clearly.
  pb::ClientEvent stray;
  stray.mutable_answer()->set_question_id("q-nope");
  stream->Write(stray);
  pb::ServerEvent ev;
  while (stream->Read(&ev)) {
  }
  auto st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AgentTest, TwoClientsAnswerTheSameQuestionTheFirstWinsAndBothSeeIt) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "act");
  FakeReply r1;
  r1.tool_calls = {{"q1",
                    "askQuestion",
                    {{"questions", json::array({{{"text", "Which UART?"},
                                                 {"options", {"USART1", "USART2"}}}})}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"ok"};
  fake_.Enqueue(r2);
  // Client A starts the turn; client B (another program of the same user) watches.
  grpc::ClientContext actx;
  auto a = OpenChat(*d.sessions(), &actx, s.id(), "set up the console");
  std::vector<pb::ServerEvent> seen_a;
  ASSERT_TRUE(ReadUntil(*a, seen_a, [](const pb::ServerEvent& e) {
    return e.has_question_asked();
  })) << d.log();
  const std::string qid = seen_a.back().question_asked().question_id();
  EXPECT_EQ(seen_a.back().question_asked().call_id(), "q1");
  grpc::ClientContext bctx;
  bctx.AddMetadata("fwai-client", "vscode");
  auto b = d.sessions()->Chat(&bctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(s.id());
  open.mutable_open()->set_replay(true);
  ASSERT_TRUE(b->Write(open));
  std::vector<pb::ServerEvent> seen_b;
  ASSERT_TRUE(
      ReadUntil(*b, seen_b, [](const pb::ServerEvent& e) { return e.has_question_asked(); }));
  // B answers first, then A answers the same question.
  pb::ClientEvent answer_b;
  answer_b.mutable_answer()->set_question_id(qid);
  answer_b.mutable_answer()->add_selected("USART2");
  ASSERT_TRUE(b->Write(answer_b));
  ASSERT_TRUE(
      ReadUntil(*b, seen_b, [](const pb::ServerEvent& e) { return e.has_question_answered(); }));
  pb::ClientEvent answer_a;
  answer_a.mutable_answer()->set_question_id(qid);
  answer_a.mutable_answer()->add_selected("USART1");
  ASSERT_TRUE(a->Write(answer_a));
  // A's stream is not ended by its late answer: it sees B's answer and the end of the turn.
  ASSERT_FALSE(ReadUntil(*a, seen_a, [](const pb::ServerEvent&) { return false; }));
  ASSERT_TRUE(seen_a.back().has_turn_finished()) << a->Finish().error_message();
  int answered = 0;
  for (const auto& e : seen_a) {
    if (!e.has_question_answered()) continue;
    ++answered;
    EXPECT_EQ(e.question_answered().question_id(), qid);
    ASSERT_EQ(e.question_answered().selected_size(), 1);
    EXPECT_EQ(e.question_answered().selected(0), "USART2");
    EXPECT_NE(e.question_answered().answered_by().find("via vscode"), std::string::npos)
        << e.question_answered().answered_by();
    // As people name them: the account's name alone.
    EXPECT_EQ(e.question_answered().answered_by_user(), getpwuid(getuid())->pw_name);
  }
  EXPECT_EQ(answered, 1);
  auto fin = Finished(seen_a);
  EXPECT_NE(fin["q1"].output().find("USART2"), std::string::npos) << fin["q1"].output();
  EXPECT_EQ(fin["q1"].output().find("USART1"), std::string::npos) << fin["q1"].output();
  a->WritesDone();
  EXPECT_TRUE(a->Finish().ok());
  b->WritesDone();
  pb::ServerEvent ev;
  while (b->Read(&ev)) {
  }
  EXPECT_TRUE(b->Finish().ok());
}

TEST_F(AgentTest, PlanDecidedEventSaysWhoApprovedAndWhetherTheTextWasEdited) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "plan");
  const std::string plan_path = ".fwai/plans/" + s.id() + ".md";
  FakeReply r1;
  r1.tool_calls = {
      {"p1", "write_file", {{"path", plan_path}, {"content", std::string(80, 'x') + "\n"}}},
      {"s1", "submitPlan", json::object()}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"done"};
  fake_.Enqueue(r2);
  grpc::ClientContext ctx;
  auto stream = OpenChat(*d.sessions(), &ctx, s.id(), "plan it");
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_plan_submitted();
  })) << d.log();
  const auto plan = seen.back().plan_submitted();
  EXPECT_EQ(plan.call_id(), "s1");
  pb::ClientEvent decision;
  decision.mutable_plan_decision()->set_plan_id(plan.plan_id());
  decision.mutable_plan_decision()->set_approve(true);
  decision.mutable_plan_decision()->set_edited_plan(
      "1. edited by the engineer, long enough to be a plan of its own\n");
  ASSERT_TRUE(stream->Write(decision));
  ReadUntil(*stream, seen, [](const pb::ServerEvent&) { return false; });
  ASSERT_TRUE(seen.back().has_turn_finished());
  const pb::PlanDecided* decided = nullptr;
  for (const auto& e : seen) {
    if (e.has_plan_decided()) decided = &e.plan_decided();
  }
  ASSERT_NE(decided, nullptr);
  EXPECT_EQ(decided->plan_id(), plan.plan_id());
  EXPECT_TRUE(decided->approved());
  EXPECT_TRUE(decided->edited());
  EXPECT_NE(decided->decided_by().find("uid"), std::string::npos) << decided->decided_by();
  EXPECT_EQ(decided->decided_by_user(), getpwuid(getuid())->pw_name);
  std::ifstream in(d.project_dir() + "/" + plan_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "1. edited by the engineer, long enough to be a plan of its own\n");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(AgentTest, SubAgentEventsNestAtDepthTwoAndDelegationsRunInParallel) {
  Daemon d(&fake_,
           "agent:\n  subagents:\n    explorer-lead:\n      description: leads exploration\n"
           "      tools: [delegateSubagent, read_file]\n");
  ASSERT_TRUE(d.Start()) << d.log();
  std::ofstream(d.project_dir() + "/main.c") << "int counter = 42;\n";
  auto s = Create(d, "act");
  FakeReply m1;  // main delegates to the lead
  m1.tool_calls = {
      {"d1", "delegateSubagent", {{"agent_type", "explorer-lead"}, {"task", "find counter"}}}};
  fake_.Enqueue(m1);
  FakeReply l1;  // the lead delegates further
  l1.tool_calls = {
      {"d2", "delegateSubagent", {{"agent_type", "codebase-explorer"}, {"task", "grep counter"}}}};
  fake_.Enqueue(l1);
  FakeReply e1;  // the explorer reads
  e1.tool_calls = {{"r1", "read_file", {{"path", "main.c"}}}};
  fake_.Enqueue(e1);
  FakeReply e2;
  e2.chunks = {"counter is 42 in main.c:1"};
  fake_.Enqueue(e2);
  FakeReply l2;
  l2.chunks = {"lead: counter = 42"};
  fake_.Enqueue(l2);
  FakeReply m2;
  m2.chunks = {"It is 42."};
  fake_.Enqueue(m2);
  auto out = RunChat(*d.sessions(), s.id(), "where is counter?");
  ASSERT_TRUE(out.finished) << d.log();
  std::map<std::string, pb::ToolCallStarted> started;
  for (const auto& e : out.events) {
    if (e.has_tool_call_started()) started[e.tool_call_started().call_id()] = e.tool_call_started();
  }
  ASSERT_TRUE(started.count("d1") && started.count("d2") && started.count("r1"));
  EXPECT_EQ(started["d1"].agent(), "main");
  EXPECT_EQ(started["d1"].parent_call_id(), "");
  EXPECT_EQ(started["d2"].agent(), "explorer-lead");
  EXPECT_EQ(started["d2"].parent_call_id(), "d1");
  EXPECT_EQ(started["r1"].agent(), "codebase-explorer");
  EXPECT_EQ(started["r1"].parent_call_id(), "d2");
  bool nested_text = false;
  for (const auto& e : out.events) {
    if (e.has_text_delta() && e.text_delta().origin().agent() == "codebase-explorer") {
      nested_text = e.text_delta().origin().parent_call_id() == "d2";
    }
  }
  EXPECT_TRUE(nested_text);
  auto fin = Finished(out.events);
  EXPECT_NE(fin["d1"].output().find("lead: counter = 42"), std::string::npos);
  EXPECT_EQ(fin["r1"].agent(), "codebase-explorer");
  EXPECT_EQ(fin["r1"].parent_call_id(), "d2");
  EXPECT_EQ(out.text, "It is 42.");  // sub-agent text is not the main answer
  {
    // The CLI shows each sub-agent's text under the call that started it, and
    // a one-line result as one line.
    std::string cli_out, cli_err;
    ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(), "attach",
                          s.id(), "--no-follow"},
                         &cli_out, &cli_err),
              0)
        << cli_err;
    EXPECT_NE(cli_out.find("\n    counter is 42 in main.c:1\n"), std::string::npos) << cli_out;
    EXPECT_NE(cli_out.find("\n  lead: counter = 42\n"), std::string::npos) << cli_out;
    EXPECT_NE(cli_out.find("⎿ 1 line ("), std::string::npos) << cli_out;
    EXPECT_EQ(cli_out.find("0 lines"), std::string::npos) << cli_out;
    EXPECT_NE(cli_out.find("It is 42."), std::string::npos) << cli_out;
  }

  // Two delegations in one message overlap in time.
  FakeReply p1;
  p1.tool_calls = {
      {"pa", "delegateSubagent", {{"agent_type", "codebase-explorer"}, {"task", "a"}}},
      {"pb", "delegateSubagent", {{"agent_type", "codebase-explorer"}, {"task", "b"}}}};
  fake_.Enqueue(p1);
  for (int i = 0; i < 2; ++i) {
    FakeReply sub;
    sub.chunks = {"part ", "of ", "a ", "report"};
    sub.chunk_delay_ms = 100;
    fake_.Enqueue(sub);
  }
  FakeReply p2;
  p2.chunks = {"both done"};
  fake_.Enqueue(p2);
  out = RunChat(*d.sessions(), s.id(), "explore two things");
  ASSERT_TRUE(out.finished) << d.log();
  int started_before_first_finish = 0;
  for (const auto& e : out.events) {
    if (e.has_tool_call_finished() &&
        (e.tool_call_finished().call_id() == "pa" || e.tool_call_finished().call_id() == "pb"))
      break;
    if (e.has_text_delta() && e.text_delta().origin().agent() == "codebase-explorer") {
      static std::set<std::string> parents;
      parents.insert(e.text_delta().origin().parent_call_id());
      started_before_first_finish = static_cast<int>(parents.size());
    }
  }
  EXPECT_EQ(started_before_first_finish, 2) << "the two sub-agents did not stream at the same time";
}

TEST_F(AgentTest, GeminiAndOllamaDriveTheToolLoopThroughTheDaemon) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  std::ofstream(d.project_dir() + "/main.c") << "int counter = 42;\n";
  for (const std::string provider : {"gemini", "ollama"}) {
    FakeReply r1;
    r1.chunks = {"Looking."};
    r1.tool_calls = {{"", "read_file", {{"path", "main.c"}}}, {"", "list_dir", {{"path", "."}}}};
    fake_.Enqueue(r1);
    FakeReply r2;
    r2.chunks = {"counter ", "is 42"};
    r2.input_tokens = 50;
    r2.output_tokens = 5;
    fake_.Enqueue(r2);
    auto s = d.CreateSession(provider);
    auto out = RunChat(*d.sessions(), s.id(), "what is counter?");
    ASSERT_TRUE(out.finished) << provider << d.log();
    EXPECT_EQ(out.text, "Looking.counter is 42") << provider;
    auto fin = Finished(out.events);
    ASSERT_EQ(fin.size(), 2u) << provider;
    bool read = false;
    for (const auto& [id, f] : fin)
      read |= f.output().find("int counter = 42;") != std::string::npos;
    EXPECT_TRUE(read) << provider;
    EXPECT_EQ(out.events.back().turn_finished().usage().input_tokens(), 50 + 12) << provider;
  }
  // The tool results went back in each provider's own format.
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_EQ(reqs[1].body["contents"][2]["parts"][0]["functionResponse"]["name"], "read_file");
  EXPECT_EQ(reqs[3].body["messages"].back()["role"], "tool");
}

TEST_F(AgentTest, CompactionSummarisesOlderTurnsAndKeepsOpenTodos) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "act");
  auto reply = [&](const std::string& text) {
    FakeReply r;
    r.chunks = {text};
    fake_.Enqueue(r);
  };
  reply("A1");
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "first question about RCC").finished);
  FakeReply todo;
  todo.tool_calls = {
      {"t1",
       "todoWrite",
       {{"todos",
         {{{"id", "1"}, {"content", "check the PLL lock bit"}, {"status", "in_progress"}},
          {{"id", "2"}, {"content", "old done item"}, {"status", "completed"}}}}}}};
  fake_.Enqueue(todo);
  reply("A2");
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "second").finished);
  reply("A3");
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "third").finished);
  // On demand.
  reply("SUMMARY-XYZ: RCC was discussed");
  {
    grpc::ClientContext ctx;
    auto stream = d.sessions()->Chat(&ctx);
    pb::ClientEvent open, compact;
    open.mutable_open()->set_session_id(s.id());
    compact.mutable_compact()->set_turn_id("t-compact");
    ASSERT_TRUE(stream->Write(open));
    ASSERT_TRUE(stream->Write(compact));
    std::vector<pb::ServerEvent> seen;
    ReadUntil(*stream, seen, [](const pb::ServerEvent&) { return false; });
    ASSERT_TRUE(seen.back().has_turn_finished()) << d.log();
    EXPECT_EQ(seen.back().turn_finished().stop_reason(), "compacted");
    bool compacted = false;
    for (const auto& e : seen) {
      if (e.has_compacted()) {
        compacted = true;
        EXPECT_GT(e.compacted().dropped_messages(), 0);
        EXPECT_NE(e.compacted().summary().find("SUMMARY-XYZ"), std::string::npos);
      }
    }
    EXPECT_TRUE(compacted);
    stream->WritesDone();
    stream->Finish();
  }
  auto reqs = fake_.requests();
  const std::string summary_request = reqs.back().body.dump();
  EXPECT_NE(summary_request.find("first question about RCC"), std::string::npos);
  reply("A4");
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "fourth").finished);
  reqs = fake_.requests();
  const std::string next = reqs.back().body["messages"].dump();
  EXPECT_NE(next.find("SUMMARY-XYZ"), std::string::npos) << next;
  EXPECT_NE(next.find("check the PLL lock bit"), std::string::npos) << next;  // open todo kept
  EXPECT_EQ(next.find("old done item"), std::string::npos) << next;
  EXPECT_EQ(next.find("first question about RCC"), std::string::npos) << next;  // dropped
  EXPECT_NE(next.find("third"), std::string::npos) << next;  // the last turn is kept

  // Automatically, when a call nears the model's window.
  reply("A5");
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "fifth").finished);
  FakeReply big;
  big.tool_calls = {{"r1", "list_dir", {{"path", "."}}}};
  big.input_tokens = 190000;  // of claude-sonnet's 200,000
  fake_.Enqueue(big);
  reply("SUMMARY-AUTO");
  reply("A6");
  auto out = RunChat(*d.sessions(), s.id(), "sixth");
  ASSERT_TRUE(out.finished);
  bool auto_compacted = false;
  for (const auto& e : out.events)
    auto_compacted |= e.has_compacted() && e.compacted().summary() == "SUMMARY-AUTO";
  EXPECT_TRUE(auto_compacted);
  EXPECT_EQ(out.text, "A6");
}

TEST_F(AgentTest, UsagePerCallPerTurnAndPerSessionWithSessionSampling) {
  Daemon d(&fake_, "agent:\n  prices:\n    claude-sonnet-4: {input: 10, output: 20}\n");
  ASSERT_TRUE(d.Start()) << d.log();
  grpc::ClientContext cctx;
  pb::CreateSessionRequest creq;
  creq.set_project_root(d.project_dir());
  creq.set_temperature(0.2);
  creq.set_max_tokens(777);
  pb::Session s;
  ASSERT_TRUE(d.sessions()->Create(&cctx, creq, &s).ok());
  FakeReply r1;
  r1.tool_calls = {{"c1", "todoRead", json::object()}};
  r1.input_tokens = 100;
  r1.output_tokens = 10;
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"ok"};
  r2.input_tokens = 200;
  r2.output_tokens = 20;
  fake_.Enqueue(r2);
  auto out = RunChat(*d.sessions(), s.id(), "go");
  ASSERT_TRUE(out.finished);
  std::vector<pb::Usage> per_call;
  for (const auto& e : out.events) {
    if (e.has_message_done()) per_call.push_back(e.message_done().usage());
  }
  ASSERT_EQ(per_call.size(), 2u);
  EXPECT_EQ(per_call[0].input_tokens(), 100);
  EXPECT_EQ(per_call[1].output_tokens(), 20);
  EXPECT_NEAR(per_call[0].cost_usd(), (100 * 10 + 10 * 20) / 1e6, 1e-12);  // the configured price
  const auto& fin = out.events.back().turn_finished();
  EXPECT_EQ(fin.usage().input_tokens(), 300);
  EXPECT_NEAR(fin.usage().cost_usd(), (300 * 10 + 30 * 20) / 1e6, 1e-12);
  auto reqs = fake_.requests();
  EXPECT_DOUBLE_EQ(reqs[0].body["temperature"].get<double>(), 0.2);
  EXPECT_EQ(reqs[0].body["max_tokens"], 777);
  out = RunChat(*d.sessions(), s.id(), "again");  // the fake answers with its default usage
  grpc::ClientContext gctx;
  pb::GetSessionRequest g;
  g.set_session_id(s.id());
  pb::Session after;
  ASSERT_TRUE(d.sessions()->Get(&gctx, g, &after).ok());
  EXPECT_EQ(after.usage().input_tokens(), 300 + 12);
  std::string text, err;
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(), "sessions",
                        "show", s.id()},
                       &text, &err),
            0)
      << err;
  EXPECT_NE(text.find("usage    312 in"), std::string::npos) << text;
  EXPECT_NE(text.find("turns:"), std::string::npos) << text;
  EXPECT_NE(text.find("2 calls"), std::string::npos) << text;
}

TEST_F(AgentTest, ThePolicyRefusesInCodeNamesTheRuleAndIsRecorded) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  fs::create_directories(d.project_dir() + "/.fwai");
  std::ofstream(d.project_dir() + "/.fwai/project.yaml")
      << "name: p\npolicy:\n  protected_paths: [\"src/boot/**\"]\n  blocked_tools: [grep]\n"
         "  blocked_commands: [rm]\n  change_budget: {max_files: 1}\n";
  auto s = Create(d, "act");
  FakeReply r1;
  r1.tool_calls = {
      {"w1", "write_file", {{"path", "src/boot/startup.c"}, {"content", "x"}}},
      {"g1", "grep", {{"pattern", "x"}}},
      {"b1", "bash", {{"command", "rm -f notes.txt"}}},
      {"w2", "write_file", {{"path", "a.c"}, {"content", "a"}}},
      {"w3", "write_file", {{"path", "b.c"}, {"content", "b"}}},
      {"w4", "edit_file", {{"path", "a.c"}, {"old_string", "a"}, {"new_string", "aa"}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.chunks = {"ok"};
  fake_.Enqueue(r2);
  auto out = RunChat(*d.sessions(), s.id(), "change things");
  ASSERT_TRUE(out.finished) << d.log();
  auto fin = Finished(out.events);
  EXPECT_NE(fin["w1"].output().find("refused by policy (protected_paths: src/boot/**)"),
            std::string::npos)
      << fin["w1"].output();
  EXPECT_NE(fin["g1"].output().find("blocked_tools: grep"), std::string::npos)
      << fin["g1"].output();
  EXPECT_NE(fin["b1"].output().find("blocked_commands: rm"), std::string::npos)
      << fin["b1"].output();
  EXPECT_FALSE(fin["w2"].is_error()) << fin["w2"].output();
  EXPECT_NE(fin["w3"].output().find("change_budget: max_files 1"), std::string::npos)
      << fin["w3"].output();
  EXPECT_FALSE(fin["w4"].is_error()) << fin["w4"].output();  // the same file again is within budget
  EXPECT_FALSE(fs::exists(d.project_dir() + "/src/boot/startup.c"));
  EXPECT_FALSE(fs::exists(d.project_dir() + "/b.c"));
  // The decisions are in the evidence.
  std::string text, err;
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(), "--json",
                        "evidence", "ls"},
                       &text, &err),
            0)
      << err;
  EXPECT_NE(text.find("\"rule\":\"change_budget: max_files 1\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"rule\":\"blocked_tools: grep\""), std::string::npos) << text;
  // fwai policy check explains.
  const std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  EXPECT_EQ(RunCommand({fwai, "--daemon", d.address(), "--project", d.project_dir(), "policy",
                        "check", "src/boot/x.c"},
                       &text, &err),
            1);
  EXPECT_NE(text.find("refused (write src/boot/x.c) by protected_paths: src/boot/**"),
            std::string::npos)
      << text << err;
  EXPECT_EQ(RunCommand({fwai, "--daemon", d.address(), "--project", d.project_dir(), "policy",
                        "check", "make all"},
                       &text, &err),
            0);
  EXPECT_NE(text.find("allowed (command make all)"), std::string::npos) << text;
  // A broken policy fails closed.
  std::ofstream(d.project_dir() + "/.fwai/project.yaml") << "policy:\n  blocked_tool: [x]\n";
  fake_.Enqueue(r2);
  out = RunChat(*d.sessions(), s.id(), "again");
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.events.back().turn_finished().stop_reason(), "error");
  bool named = false;
  for (const auto& e : out.events)
    named |= e.has_error() && e.error().message().find("project.yaml:2") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST_F(AgentTest, LinesBudgetPerTurnAndSecretsNeverReachTheProvider) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  fs::create_directories(d.project_dir() + "/.fwai");
  std::ofstream(d.project_dir() + "/.fwai/project.yaml")
      << "name: p\npolicy:\n  change_budget: {max_lines: 5}\n";
  std::ofstream(d.project_dir() + "/config.h")
      << "#define WIFI_SSID \"lab\"\n#define WIFI_PASSWORD \"Tr0ub4dor&3\"\n";
  auto s = Create(d, "act");
  FakeReply r1;
  r1.tool_calls = {
      {"w1", "write_file", {{"path", "small.c"}, {"content", "int a;\nint b;\nint c;\n"}}},
      {"w2", "write_file", {{"path", "big.c"}, {"content", "1\n2\n3\n"}}},
      {"r1", "read_file", {{"path", "config.h"}}}};
  auto out = ToolTurn(d, s.id(), "write and read", r1, "ok");
  ASSERT_TRUE(out.finished) << d.log();
  auto fin = Finished(out.events);
  EXPECT_FALSE(fin["w1"].is_error()) << fin["w1"].output();  // 3 lines
  EXPECT_NE(fin["w2"].output().find("change_budget: max_lines 5"), std::string::npos)
      << fin["w2"].output();  // 3 more
  EXPECT_FALSE(fs::exists(d.project_dir() + "/big.c"));
  // The file's password was redacted before the model saw the tool result.
  EXPECT_NE(fin["r1"].output().find("WIFI_SSID"), std::string::npos);
  EXPECT_EQ(fin["r1"].output().find("Tr0ub4dor&3"), std::string::npos) << fin["r1"].output();
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  const std::string sent = reqs[1].body.dump();
  EXPECT_NE(sent.find("[REDACTED:assignment]"), std::string::npos) << sent;
  EXPECT_EQ(sent.find("Tr0ub4dor&3"), std::string::npos);
  // The turn's record names a log per tool call under .fwai/runs/<run_id>/.
  std::string text, err;
  ASSERT_EQ(RunCommand({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d.address(), "--json",
                        "evidence", "ls"},
                       &text, &err),
            0)
      << err;
  json rec;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j["record"].value("kind", "") == "agent_turn") rec = j["record"];
  }
  ASSERT_TRUE(rec.is_object()) << text;
  EXPECT_EQ(rec["log_dir"], d.project_dir() + "/.fwai/runs/" + rec["run_id"].get<std::string>());
  std::string read_log;
  for (const auto& t : rec["tools"]) {
    if (t["call_id"] == "r1") read_log = t["log_file"];
  }
  ASSERT_FALSE(read_log.empty()) << rec.dump();
  std::ifstream in(read_log);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("WIFI_SSID"), std::string::npos) << ss.str();
  EXPECT_EQ(ss.str().find("Tr0ub4dor&3"), std::string::npos);
}

TEST_F(AgentTest, CancelKillsARunningCommandAndItsChildrenWithinASecond) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = Create(d, "act");
  FakeReply r1;
  r1.tool_calls = {{"c1", "bash", {{"command", "echo started; sleep 97 & sleep 97; wait"}}}};
  fake_.Enqueue(r1);
  grpc::ClientContext ctx;
  auto stream = OpenChat(*d.sessions(), &ctx, s.id(), "run it");
  std::vector<pb::ServerEvent> seen;
  ASSERT_TRUE(ReadUntil(*stream, seen, [](const pb::ServerEvent& e) {
    return e.has_tool_call_output_delta() &&
           e.tool_call_output_delta().text().find("started") != std::string::npos;
  })) << d.log();
  const auto t0 = std::chrono::steady_clock::now();
  pb::ClientEvent cancel;
  cancel.mutable_cancel();
  ASSERT_TRUE(stream->Write(cancel));
  ReadUntil(*stream, seen, [](const pb::ServerEvent&) { return false; });
  const double s_elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(seen.back().has_turn_finished());
  EXPECT_EQ(seen.back().turn_finished().stop_reason(), "cancelled");
  EXPECT_LT(s_elapsed, 1.0);
  std::string pids, err;
  RunCommand({"/usr/bin/pgrep", "-f", "sleep 97"}, &pids, &err);
  EXPECT_EQ(pids, "") << "children survived the cancel";
  auto fin = Finished(seen);
  EXPECT_NE(fin["c1"].output().find("cancelled"), std::string::npos) << fin["c1"].output();
  stream->WritesDone();
  stream->Finish();
}

TEST_F(AgentTest, PassagesTheModelCitesOrDiscardsAreRecordedInTheRetrievalLog) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  const std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  const std::string docs = d.dir() + "/docs";
  fs::create_directories(docs);
  std::ofstream(docs + "/i2c.md")
      << "# I2C\n\n## Timing\n\nI2C_TIMINGR sets the SCL high and low periods.\n";
  std::ofstream(docs + "/spi.md") << "# SPI\n\n## Timing\n\nSPI_CR1 BR sets the clock of the SPI "
                                     "bus; SCL periods do not apply.\n";
  std::string out, err;
  ASSERT_EQ(RunCommand({fwai, "--daemon", d.address(), "kb", "add", docs}, &out, &err), 0) << err;
  auto s = Create(d, "act");
  // The first search of this daemon is q1: the model drops its second
  // passage and cites its first.
  FakeReply search;
  search.tool_calls = {
      {"k1", "documentSearch", {{"query", "I2C_TIMINGR SCL periods"}, {"max_results", 2}}}};
  FakeReply discard;
  discard.tool_calls = {{"k2", "documentFeedback", {{"passage", "q1.2"}, {"reason", "about SPI"}}}};
  fake_.Enqueue(search);
  fake_.Enqueue(discard);
  FakeReply answer;
  answer.chunks = {"Program I2C_TIMINGR [q1.1]."};
  fake_.Enqueue(answer);
  auto turn = RunChat(*d.sessions(), s.id(), "how do I set the I2C SCL timing?");
  ASSERT_TRUE(turn.finished) << turn.status.error_message();
  auto calls = Finished(turn.events);
  ASSERT_EQ(calls.count("k1"), 1u);
  EXPECT_NE(calls["k1"].output().find("[q1.1] source: "), std::string::npos)
      << calls["k1"].output();
  ASSERT_EQ(calls.count("k2"), 1u);
  EXPECT_FALSE(calls["k2"].is_error()) << calls["k2"].output();
  ASSERT_EQ(
      RunCommand({fwai, "--daemon", d.address(), "--json", "kb", "log", "-n", "1"}, &out, &err), 0)
      << err;
  auto log = json::parse(out.substr(0, out.find('\n')));
  EXPECT_EQ(log["id"], "q1");
  EXPECT_EQ(log["source"], "agent");
  EXPECT_EQ(log["session_id"], s.id());
  EXPECT_FALSE(log["turn_id"].get<std::string>().empty());
  EXPECT_EQ(log["call_id"], "k1");
  std::map<int, std::string> marks;
  for (const auto& f : log["feedback"]) marks[f["rank"].get<int>()] = f["source"];
  EXPECT_EQ(marks, (std::map<int, std::string>{{1, "cited"}, {2, "discarded"}})) << log;
  ASSERT_EQ(RunCommand({fwai, "--daemon", d.address(), "kb", "stats"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("1 cited, 1 discarded"), std::string::npos) << out;
}

TEST_F(AgentTest, KnowledgeSearchAsksTheProviderForRewritesAndAHypotheticalAnswer) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  const std::string fwai = std::string(FWAI_BIN_DIR) + "/fwai";
  const std::string docs = d.dir() + "/docs";
  fs::create_directories(docs);
  std::ofstream(docs + "/iwdg.md")
      << "# IWDG\n\n## Key register\n\nWrite 0xAAAA to IWDG_KR to reload the "
         "independent watchdog counter before it reaches zero.\n";
  std::ofstream(docs + "/uart.md")
      << "# UART\n\n## Baud\n\nEvery few frames the receiver samples the start bit by "
         "itself.\n";
  std::string out, err;
  ASSERT_EQ(RunCommand({fwai, "--daemon", d.address(), "kb", "add", docs}, &out, &err), 0) << err;
  // Rewriting and the hypothetical answer are asked at once; either reply
  // serves either (a JSON array of one query reads as a passage too).
  const size_t before = fake_.request_count();
  for (int i = 0; i < 2; ++i) {
    FakeReply r;
    r.chunks = {"[\"independent watchdog IWDG_KR reload 0xAAAA\"]"};
    fake_.Enqueue(r);
  }
  ASSERT_EQ(RunCommand({fwai, "--daemon", d.address(), "--json", "kb", "search", "-n", "1",
                        "why does my board restart by itself every few seconds"},
                       &out, &err),
            0)
      << err;
  auto hits = json::parse(out);
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(fs::path(hits[0]["doc"].get<std::string>()).filename(), "iwdg.md") << hits[0];
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size() - before, 2u);
  std::string prompts;
  for (size_t i = before; i < reqs.size(); ++i) prompts += reqs[i].body.dump();
  EXPECT_NE(prompts.find("Rewrite this search"), std::string::npos);
  EXPECT_NE(prompts.find("Write the passage"), std::string::npos);
  EXPECT_NE(prompts.find("restart by itself"), std::string::npos);
  ASSERT_EQ(
      RunCommand({fwai, "--daemon", d.address(), "--json", "kb", "log", "-n", "1"}, &out, &err), 0)
      << err;
  auto log = json::parse(out.substr(0, out.find('\n')));
  ASSERT_EQ(log["rewrites"].size(), 2u) << log;
  // A lookup by register name is no paraphrase: no model call.
  ASSERT_EQ(RunCommand({fwai, "--daemon", d.address(), "kb", "search", "IWDG_KR reload value"},
                       &out, &err),
            0)
      << err;
  EXPECT_EQ(fake_.request_count(), reqs.size());
}

}  // namespace
}  // namespace fwai::testing
