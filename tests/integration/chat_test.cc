// Chat, tools, attach and streaming through a real fwaid and the fake provider.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

class ChatTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_GT(fake_.Start(), 0); }
  FakeLlmServer fake_;
};

void ExpectSeqStrictlyIncreasing(const std::vector<pb::ServerEvent>& evs) {
  for (size_t i = 1; i < evs.size(); ++i) EXPECT_GT(evs[i].seq(), evs[i - 1].seq());
}

TEST_F(ChatTest, StreamsAnswerWithUsageForBothProviders) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  for (const std::string provider : {"anthropic", "openai"}) {
    FakeReply r;
    r.chunks = {"The ", "GPIO ", "clock is ", "RCC_AHB2ENR."};
    r.input_tokens = 1000;
    r.output_tokens = 200;
    fake_.Enqueue(r);
    auto s = d.CreateSession(provider);
    auto out = RunChat(*d.sessions(), s.id(), "which register enables the GPIO clock?");
    ASSERT_TRUE(out.finished) << out.status.error_message() << d.log();
    EXPECT_EQ(out.text, "The GPIO clock is RCC_AHB2ENR.");
    EXPECT_EQ(out.stop_reason, "end_turn");
    const auto& fin = out.events.back().turn_finished();
    EXPECT_EQ(fin.usage().input_tokens(), 1000);
    EXPECT_EQ(fin.usage().output_tokens(), 200);
    EXPECT_GT(fin.usage().cost_usd(), 0);  // known model prices
    ExpectSeqStrictlyIncreasing(out.events);
    EXPECT_TRUE(out.events.front().has_user_message());
    EXPECT_TRUE(out.events[1].has_turn_started());
    EXPECT_EQ(out.events[1].turn_started().provider(), provider);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::OK);
    for (const auto& ev : out.events) EXPECT_EQ(ev.session_id(), s.id());
  }
}

TEST_F(ChatTest, ToolLoopRunsToolsAndSendsResultsBack) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  std::ofstream(d.project_dir() + "/main.c") << "int counter = 42;\n";
  std::ofstream(d.dir() + "/outside.txt") << "not yours\n";
  FakeReply first;
  first.chunks = {"Let me look."};
  first.tool_calls = {{"call_a", "read_file", {{"path", "main.c"}}},
                      {"call_b", "read_file", {{"path", "../outside.txt"}}}};
  fake_.Enqueue(first);
  FakeReply second;
  second.chunks = {"counter is 42"};
  fake_.Enqueue(second);
  auto s = d.CreateSession("openai");
  auto out = RunChat(*d.sessions(), s.id(), "what is counter?");
  ASSERT_TRUE(out.finished) << d.log();
  EXPECT_EQ(out.stop_reason, "end_turn");
  std::vector<const pb::ToolCallFinished*> finished;
  int started = 0;
  for (const auto& ev : out.events) {
    if (ev.has_tool_call_started()) {
      ++started;
      EXPECT_EQ(ev.tool_call_started().tool(), "read_file");
      EXPECT_EQ(ev.tool_call_started().agent(), "main");
    }
    if (ev.has_tool_call_finished()) finished.push_back(&ev.tool_call_finished());
  }
  EXPECT_EQ(started, 2);
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(finished[0]->call_id(), "call_a");
  EXPECT_FALSE(finished[0]->is_error());
  EXPECT_NE(finished[0]->output().find("int counter = 42;"), std::string::npos);
  EXPECT_TRUE(finished[1]->is_error());
  EXPECT_NE(finished[1]->output().find("outside the project root"), std::string::npos);
  // The second request carries both results in OpenAI's format.
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  const auto& msgs = reqs[1].body["messages"];
  int tool_msgs = 0;
  for (const auto& m : msgs) {
    if (m["role"] == "tool") {
      ++tool_msgs;
      if (m["tool_call_id"] == "call_a") {
        EXPECT_NE(m["content"].get<std::string>().find("counter = 42"), std::string::npos);
      }
    }
  }
  EXPECT_EQ(tool_msgs, 2);
  // History keeps the whole exchange.
  grpc::ClientContext ctx;
  pb::HistoryRequest hr;
  hr.set_session_id(s.id());
  pb::HistoryResponse h;
  ASSERT_TRUE(d.sessions()->History(&ctx, hr, &h).ok());
  ASSERT_EQ(h.messages_size(), 4);  // user, assistant(tool_use), user(tool_result), assistant
  EXPECT_EQ(h.messages(2).role(), "user");
  EXPECT_NE(h.messages(2).content_json().find("tool_result"), std::string::npos);
}

TEST_F(ChatTest, SecondTurnSendsTheConversation) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = d.CreateSession();
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "first").finished);
  ASSERT_TRUE(RunChat(*d.sessions(), s.id(), "second").finished);
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  const auto& msgs = reqs[1].body["messages"];
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[0]["content"][0]["text"], "first");
  EXPECT_EQ(msgs[1]["role"], "assistant");
  EXPECT_EQ(msgs[2]["content"][0]["text"], "second");
}

TEST_F(ChatTest, AttachReplaysExactlyWhatLiveClientsSaw) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply r;
  for (int i = 0; i < 40; ++i) r.chunks.push_back("w" + std::to_string(i) + " ");
  r.chunk_delay_ms = 5;
  fake_.Enqueue(r);
  auto s = d.CreateSession();
  // A second client attaches live before the turn starts and follows it.
  std::vector<pb::ServerEvent> watcher;
  grpc::ClientContext wctx;
  pb::AttachRequest areq;
  areq.set_session_id(s.id());
  auto wstub = d.sessions();
  auto reader = wstub->Attach(&wctx, areq);
  std::thread t([&] {
    pb::ServerEvent ev;
    while (reader->Read(&ev)) {
      watcher.push_back(ev);
      if (ev.has_turn_finished()) break;
    }
    wctx.TryCancel();
    reader->Finish();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto out = RunChat(*d.sessions(), s.id(), "count");
  t.join();
  ASSERT_TRUE(out.finished);
  auto stored = ReadAll(*d.sessions(), s.id());
  ASSERT_EQ(stored.size(), out.events.size());
  ASSERT_EQ(watcher.size(), out.events.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_EQ(stored[i].SerializeAsString(), out.events[i].SerializeAsString()) << i;
    EXPECT_EQ(watcher[i].SerializeAsString(), out.events[i].SerializeAsString()) << i;
  }
  // Resuming after a seq gives exactly the rest.
  uint64_t mid = stored[stored.size() / 2].seq();
  auto rest = ReadAll(*d.sessions(), s.id(), mid);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.front().seq(), mid + 1);
  EXPECT_EQ(rest.back().seq(), stored.back().seq());
}

TEST_F(ChatTest, ClientLeavingMidTurnDoesNotStopTheTurn) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply r;
  for (int i = 0; i < 20; ++i) r.chunks.push_back("x");
  r.chunk_delay_ms = 20;
  fake_.Enqueue(r);
  auto s = d.CreateSession();
  {
    grpc::ClientContext ctx;
    auto stub = d.sessions();
    auto stream = OpenChat(*stub, &ctx, s.id(), "go");
    pb::ServerEvent ev;
    stream->Read(&ev);
    ctx.TryCancel();  // the client vanishes
  }
  // The turn completes in the daemon; a reconnecting client sees all of it.
  std::vector<pb::ServerEvent> evs;
  for (int i = 0; i < 100; ++i) {
    evs = ReadAll(*d.sessions(), s.id());
    if (!evs.empty() && evs.back().has_turn_finished()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(evs.empty());
  ASSERT_TRUE(evs.back().has_turn_finished());
  EXPECT_EQ(evs.back().turn_finished().stop_reason(), "end_turn");
  std::string text;
  for (const auto& ev : evs) {
    if (ev.has_text_delta()) text += ev.text_delta().text();
  }
  EXPECT_EQ(text, std::string(20, 'x'));
}

TEST_F(ChatTest, CancelStopsTheTurnPromptly) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply r;
  for (int i = 0; i < 200; ++i) r.chunks.push_back("x");
  r.chunk_delay_ms = 50;
  fake_.Enqueue(r);
  auto s = d.CreateSession();
  grpc::ClientContext ctx;
  auto stub = d.sessions();
  auto stream = OpenChat(*stub, &ctx, s.id(), "go");
  pb::ServerEvent ev;
  int deltas = 0;
  std::chrono::steady_clock::time_point cancelled_at;
  std::string stop;
  while (stream->Read(&ev)) {
    if (ev.has_text_delta() && ++deltas == 3) {
      pb::ClientEvent c;
      c.mutable_cancel();
      cancelled_at = std::chrono::steady_clock::now();
      stream->Write(c);
    }
    if (ev.has_turn_finished()) {
      stop = ev.turn_finished().stop_reason();
      break;
    }
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  cancelled_at)
                .count();
  stream->WritesDone();
  stream->Finish();
  EXPECT_EQ(stop, "cancelled");
  EXPECT_LT(ms, 1000);
  // The session is usable afterwards and the partial answer is in history.
  auto next = RunChat(*stub, s.id(), "again");
  EXPECT_TRUE(next.finished);
  EXPECT_EQ(next.stop_reason, "end_turn");
}

TEST_F(ChatTest, MaxIterationsBoundsTheLoop) {
  Daemon d(&fake_, "agent:\n  max_iterations: 3\n");
  ASSERT_TRUE(d.Start()) << d.log();
  for (int i = 0; i < 5; ++i) {
    FakeReply r;
    r.tool_calls = {{"call_" + std::to_string(i), "list_dir", nlohmann::json::object()}};
    fake_.Enqueue(r);
  }
  auto s = d.CreateSession();
  auto out = RunChat(*d.sessions(), s.id(), "loop forever");
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.stop_reason, "max_iterations");
  EXPECT_EQ(out.events.back().turn_finished().iterations(), 3);
  EXPECT_EQ(fake_.request_count(), 3u);
  bool error_said_why = false;
  for (const auto& ev : out.events) {
    if (ev.has_error() && ev.error().message().find("agent.max_iterations") != std::string::npos) {
      error_said_why = true;
    }
  }
  EXPECT_TRUE(error_said_why);
}

TEST_F(ChatTest, NextTurnIsAcceptedTheMomentTurnFinishedArrives) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = d.CreateSession();
  grpc::ClientContext ctx;
  auto stub = d.sessions();
  auto stream = OpenChat(*stub, &ctx, s.id(), "turn 0");
  int finished = 0;
  pb::ServerEvent ev;
  while (finished < 20 && stream->Read(&ev)) {
    if (ev.has_turn_finished()) {
      ASSERT_EQ(ev.turn_finished().stop_reason(), "end_turn");
      if (++finished == 20) break;
      pb::ClientEvent msg;
      msg.mutable_message()->set_text("turn " + std::to_string(finished));
      ASSERT_TRUE(stream->Write(msg));
    }
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(finished, 20);
}

TEST_F(ChatTest, EmptyOrOversizedMessageIsInvalidArgument) {
  Daemon d(&fake_, "agent:\n  max_message_bytes: 1000\n");
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = d.CreateSession();
  auto empty = RunChat(*d.sessions(), s.id(), "   ");
  EXPECT_EQ(empty.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto big = RunChat(*d.sessions(), s.id(), std::string(1001, 'a'));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(big.status.error_message().find("over the limit"), std::string::npos);
  EXPECT_EQ(fake_.request_count(), 0u);
}

// A message sent while a turn runs waits for it, then runs as its own turn:
// messages of people sharing a session run in the order they came.
TEST_F(ChatTest, ASecondMessageWaitsForTheRunningTurnThenRunsAsItsOwn) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply r;
  for (int i = 0; i < 20; ++i) r.chunks.push_back("x");
  r.chunk_delay_ms = 30;
  fake_.Enqueue(r);
  FakeReply r2;
  r2.chunks = {"second answer"};
  fake_.Enqueue(r2);
  auto s = d.CreateSession();
  // Each message on its own stream, read until its own turn has finished.
  auto run = [&](const std::string& text, const std::string& turn_id, std::string* answer) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stream = OpenChat(*d.sessions(), &ctx, s.id(), text, "", turn_id);
    pb::ServerEvent ev;
    bool finished = false;
    while (!finished && stream->Read(&ev)) {
      if (ev.turn_id() != turn_id) continue;
      if (ev.has_text_delta()) *answer += ev.text_delta().text();
      finished = ev.has_turn_finished();
    }
    // The stream follows the session: the next turn's events may already be
    // on their way. Read until fwaid ends the stream, as a client must
    // before it asks for the status.
    stream->WritesDone();
    while (stream->Read(&ev)) {
    }
    const grpc::Status st = stream->Finish();
    EXPECT_TRUE(st.ok()) << turn_id << ": " << st.error_message() << "\n" << d.log();
    return finished;
  };
  std::string first_answer, second_answer;
  bool first_finished = false;
  std::thread t([&] { first_finished = run("long", "t-first", &first_answer); });
  for (int i = 0; i < 500; ++i) {  // until the daemon reports the turn running
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(s.id());
    pb::Session got;
    if (d.sessions()->Get(&ctx, req, &got).ok() && got.turn_running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool second_finished = run("meanwhile", "t-second", &second_answer);
  t.join();
  EXPECT_TRUE(first_finished) << d.log();
  ASSERT_TRUE(second_finished) << d.log();
  EXPECT_EQ(first_answer, std::string(20, 'x'));
  EXPECT_EQ(second_answer, "second answer");
  // In the session's log: the first turn ends before the second begins.
  std::vector<std::string> order;
  for (const auto& e : ReadAll(*d.sessions(), s.id())) {
    if (e.has_user_message()) order.push_back(e.turn_id() + " " + e.user_message().text());
    if (e.has_turn_finished()) order.push_back(e.turn_id() + " finished");
  }
  EXPECT_EQ(order, (std::vector<std::string>{"t-first long", "t-first finished",
                                             "t-second meanwhile", "t-second finished"}));
}

TEST_F(ChatTest, ManySessionsStreamConcurrently) {
  Daemon d(&fake_);
  ASSERT_TRUE(d.Start()) << d.log();
  constexpr int kSessions = 20;
  for (int i = 0; i < kSessions; ++i) {
    FakeReply r;
    for (int k = 0; k < 30; ++k) r.chunks.push_back("y");
    r.chunk_delay_ms = 2;
    fake_.Enqueue(r);
  }
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&] {
      auto stub = d.sessions();
      auto s = d.CreateSession();
      auto out = RunChat(*stub, s.id(), "go");
      if (out.finished && out.text == std::string(30, 'y')) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kSessions);
}

}  // namespace
}  // namespace fwai::testing
