// Faults: provider errors, crashes, shutdown, bad config, slow clients.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

const pb::ErrorEvent* FindError(const TurnOutcome& out) {
  for (const auto& ev : out.events) {
    if (ev.has_error()) return &ev.error();
  }
  return nullptr;
}

TEST(FaultsTest, NoProviderEndsTheTurnWithHowToConfigure) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = d.CreateSession();
  auto out = RunChat(*d.sessions(), s.id(), "hello");
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.stop_reason, "error");
  auto* err = FindError(out);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(err->message().find("ANTHROPIC_API_KEY"), std::string::npos) << err->message();
  EXPECT_NE(err->message().find("fwaid.yaml"), std::string::npos);
  // Everything else keeps working.
  EXPECT_FALSE(ReadAll(*d.sessions(), s.id()).empty());
}

TEST(FaultsTest, Provider401NamesTheKeyVariable) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  fake.RequireKey("another-key");
  Daemon d(
      &fake,
      "  keyed:\n    kind: anthropic\n    api_key_env: FWAI_TEST_UNSET_KEY_VAR\n    base_url: " +
          fake.anthropic_base_url() + "\n");
  // The provider above reads a variable that is not set: a clear error before any request.
  ASSERT_TRUE(d.Start()) << d.log();
  auto s = d.CreateSession("anthropic");
  auto out = RunChat(*d.sessions(), s.id(), "hello");
  ASSERT_TRUE(out.finished);
  auto* err = FindError(out);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->code(), "UNAUTHENTICATED");
  EXPECT_NE(err->message().find("invalid x-api-key"), std::string::npos) << err->message();
  EXPECT_NE(err->message().find("api_key"), std::string::npos) << err->message();
  auto s2 = d.CreateSession("keyed");
  auto out2 = RunChat(*d.sessions(), s2.id(), "hello");
  auto* err2 = FindError(out2);
  ASSERT_NE(err2, nullptr);
  EXPECT_NE(err2->message().find("FWAI_TEST_UNSET_KEY_VAR"), std::string::npos) << err2->message();
}

TEST(FaultsTest, StreamCutMidwayGivesErrorAndSessionStaysUsable) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply cut;
  cut.chunks = {"partial ", "answer ", "never ", "finished"};
  cut.cut_after_chunks = 2;
  fake.Enqueue(cut);
  auto s = d.CreateSession();
  auto out = RunChat(*d.sessions(), s.id(), "hello");
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.stop_reason, "error");
  auto* err = FindError(out);
  ASSERT_NE(err, nullptr);
  EXPECT_TRUE(err->retryable());
  EXPECT_NE(err->message().find("cut"), std::string::npos) << err->message();
  EXPECT_EQ(out.text, "partial answer ");
  auto again = RunChat(*d.sessions(), s.id(), "try again");
  ASSERT_TRUE(again.finished);
  EXPECT_EQ(again.stop_reason, "end_turn");
  // The partial answer was kept in the conversation sent next.
  auto reqs = fake.requests();
  const auto& msgs = reqs.back().body["messages"];
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(msgs[1]["content"][0]["text"], "partial answer ");
}

// A rate limit is waited out on fwaid's clock for as long as the service
// asked (Retry-After: 60): the request goes again once that clock has moved
// a minute — not before, and without a real minute passing.
TEST(FaultsTest, RateLimitIsRetriedWithRetryAfter) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply limited;
  limited.status = 429;
  limited.error_type = "rate_limit_error";
  limited.error_message = "slow down";
  limited.retry_after_s = 60;
  fake.Enqueue(limited);
  auto s = d.CreateSession();
  TurnOutcome out;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread turn([&] { out = RunChat(*d.sessions(), s.id(), "hello", /*timeout_s=*/120); });
  // The clock moves a second at a time, looked at before each step: the
  // request that came again came when the clock had been moved `moved_s - 1`
  // or `moved_s` seconds, and at most `real_s` had really passed.
  int moved_s = 0;
  const auto real_limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (fake.request_count() < 2 && std::chrono::steady_clock::now() < real_limit) {
    if (fake.request_count() == 1 && moved_s < 120) {
      d.AdvanceClock(1'000'000);
      ++moved_s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double real_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t asked = fake.request_count();
  turn.join();
  ASSERT_EQ(asked, 2u) << "not asked again within 30 s of real time, the clock " << moved_s
                       << " s ahead\n"
                       << d.log();
  EXPECT_GE(moved_s + real_s, 60.0)
      << "asked again before the Retry-After had passed on fwaid's clock (moved " << moved_s
      << " s, " << real_s << " s real)";
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.stop_reason, "end_turn");
  EXPECT_NE(d.log().find("retrying in 60000 ms"), std::string::npos) << d.log();
}

TEST(FaultsTest, Kill9MidTurnKeepsEveryEventWrittenBefore) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply r;
  for (int i = 0; i < 500; ++i) r.chunks.push_back("c" + std::to_string(i) + " ");
  r.chunk_delay_ms = 5;
  fake.Enqueue(r);
  auto s = d.CreateSession();
  std::vector<pb::ServerEvent> seen;
  {
    grpc::ClientContext ctx;
    auto stub = d.sessions();
    auto stream = OpenChat(*stub, &ctx, s.id(), "go");
    pb::ServerEvent ev;
    while (stream->Read(&ev)) {
      seen.push_back(ev);
      if (seen.size() == 60) d.Kill9();
    }
  }
  ASSERT_GE(seen.size(), 60u);
  ASSERT_TRUE(d.Start()) << d.log();
  auto stored = ReadAll(*d.sessions(), s.id());
  ASSERT_GE(stored.size(), seen.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(stored[i].SerializeAsString(), seen[i].SerializeAsString()) << i;
  }
  // The interrupted session takes a new turn.
  auto out = RunChat(*d.sessions(), s.id(), "after the crash");
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.events.front().seq(), stored.back().seq() + 1);
}

// A turn cut by kill -9 used to stay open forever: no turn_finished, so a
// follower waited on it and `sessions show` did not list it.
TEST(FaultsTest, ATurnCutByKill9EndsAsInterruptedWithItsUsage) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  // The first model call finishes (a tool call, 40 in / 9 out); the second is
  // cut while it streams.
  FakeReply first;
  first.tool_calls.push_back({"call-1", "todoRead", nlohmann::json::object()});
  first.input_tokens = 40;
  first.output_tokens = 9;
  fake.Enqueue(first);
  FakeReply second;
  for (int i = 0; i < 500; ++i) second.chunks.push_back("c" + std::to_string(i) + " ");
  second.chunk_delay_ms = 10;
  fake.Enqueue(second);
  auto s = d.CreateSession();
  std::string turn_id;
  {
    grpc::ClientContext ctx;
    auto stub = d.sessions();
    auto stream = OpenChat(*stub, &ctx, s.id(), "go");
    pb::ServerEvent ev;
    int deltas = 0;
    while (stream->Read(&ev)) {
      turn_id = ev.turn_id();
      if (ev.has_text_delta() && ++deltas == 20) d.Kill9();
    }
    ASSERT_EQ(deltas, 20);
  }
  ASSERT_TRUE(d.Start()) << d.log();
  auto stored = ReadAll(*d.sessions(), s.id());
  ASSERT_FALSE(stored.empty());
  const auto& last = stored.back();
  ASSERT_TRUE(last.has_turn_finished()) << last.DebugString();
  EXPECT_EQ(last.turn_id(), turn_id);
  EXPECT_EQ(last.turn_finished().stop_reason(), "interrupted");
  EXPECT_NE(last.turn_finished().detail().find("killed or crashed"), std::string::npos);
  EXPECT_EQ(last.turn_finished().usage().input_tokens(), 40);
  EXPECT_EQ(last.turn_finished().usage().output_tokens(), 9);
  int finished = 0;
  for (const auto& ev : stored) finished += ev.has_turn_finished();
  EXPECT_EQ(finished, 1);
  // Its usage counts in the session's totals; a second restart adds nothing.
  {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(s.id());
    pb::Session info;
    ASSERT_TRUE(d.sessions()->Get(&ctx, req, &info).ok());
    EXPECT_EQ(info.usage().input_tokens(), 40);
    EXPECT_FALSE(info.turn_running());
  }
  ASSERT_EQ(d.Stop(), 0);
  ASSERT_TRUE(d.Start()) << d.log();
  EXPECT_EQ(ReadAll(*d.sessions(), s.id()).size(), stored.size());
  // The session takes a new turn normally.
  auto out = RunChat(*d.sessions(), s.id(), "after the crash");
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.stop_reason, "end_turn");
}

TEST(FaultsTest, SigtermCancelsRunningTurnsAndExitsZero) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake);
  ASSERT_TRUE(d.Start()) << d.log();
  FakeReply r;
  for (int i = 0; i < 1000; ++i) r.chunks.push_back("z");
  r.chunk_delay_ms = 20;
  fake.Enqueue(r);
  auto s = d.CreateSession();
  grpc::Status stream_status;
  std::thread client([&] {
    auto stub = d.sessions();
    grpc::ClientContext ctx;
    auto stream = OpenChat(*stub, &ctx, s.id(), "go");
    pb::ServerEvent ev;
    while (stream->Read(&ev)) {
    }
    stream_status = stream->Finish();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d.Stop(), 0) << d.log();
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  client.join();
  EXPECT_LT(ms, 5000);
  EXPECT_EQ(stream_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << stream_status.error_message();
  ASSERT_TRUE(d.Start()) << d.log();
  auto stored = ReadAll(*d.sessions(), s.id());
  ASSERT_FALSE(stored.empty());
  ASSERT_TRUE(stored.back().has_turn_finished());
  EXPECT_EQ(stored.back().turn_finished().stop_reason(), "cancelled");
}

TEST(FaultsTest, MalformedConfigIsRefusedNamingFileAndLine) {
  Daemon d(nullptr, "agent:\n  max_iterations: many\n");
  EXPECT_FALSE(d.Start());
  std::string log = d.log();
  EXPECT_NE(log.find("fwaid.yaml:7"), std::string::npos) << log;
  EXPECT_NE(log.find("agent.max_iterations"), std::string::npos) << log;
}

TEST(FaultsTest, SecondDaemonOnSameSocketIsRefused) {
  Daemon d(nullptr);
  ASSERT_TRUE(d.Start()) << d.log();
  std::string out, err;
  int rc = RunCommand({std::string(FWAI_BIN_DIR) + "/fwaid", "--listen", d.address(), "--data-dir",
                       d.dir() + "/other-data"},
                      &out, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("already listening"), std::string::npos) << err;
}

TEST(FaultsTest, StuckClientIsDroppedWithoutSlowingOthers) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  Daemon d(&fake, "subscribers:\n  high_water: 8\n  max_queue: 64\n");
  ASSERT_TRUE(d.Start()) << d.log();
  // Deltas of different origins cannot be coalesced, so use tool events too:
  // plain text deltas are big enough to fill gRPC's flow-control window.
  FakeReply r;
  for (int i = 0; i < 20000; ++i) r.chunks.push_back(std::string(64, 'a' + i % 26));
  fake.Enqueue(r);
  auto s = d.CreateSession();
  // A client that attaches and never reads.
  auto stuck_stub = d.sessions();
  grpc::ClientContext stuck_ctx;
  pb::AttachRequest areq;
  areq.set_session_id(s.id());
  auto stuck = stuck_stub->Attach(&stuck_ctx, areq);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto t0 = std::chrono::steady_clock::now();
  auto out = RunChat(*d.sessions(), s.id(), "flood", 60);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(out.finished) << out.status.error_message();
  EXPECT_EQ(out.text.size(), 20000u * 64);
  EXPECT_LT(ms, 30000);
  // The stuck client now reads: it gets some events, then RESOURCE_EXHAUSTED,
  // or (if coalescing kept it under the limit) the complete text.
  pb::ServerEvent ev;
  std::string got;
  bool finished = false;
  while (stuck->Read(&ev)) {
    if (ev.has_text_delta()) got += ev.text_delta().text();
    if (ev.has_turn_finished()) {
      finished = true;
      break;
    }
  }
  if (finished) {
    EXPECT_EQ(got, out.text);
    stuck_ctx.TryCancel();
    stuck->Finish();
  } else {
    auto st = stuck->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_NE(st.error_message().find("re-attach"), std::string::npos);
  }
}

}  // namespace
}  // namespace fwai::testing
