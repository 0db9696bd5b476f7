// Provider adapters against the fake service over real HTTP.
#include "server/llm/provider.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "server/llm/http_client.h"
#include "tests/fakes/fake_llm_server.h"

namespace fwai {
namespace {

using testing::FakeLlmServer;
using testing::FakeReply;

struct Collect : StreamObserver {
  std::string text;
  std::vector<std::string> tools;
  std::atomic<int> retries{0};
  std::atomic<int> last_delay_ms{0};
  void OnText(std::string_view t) override { text.append(t); }
  void OnToolUseStart(const std::string& id, const std::string& name) override {
    tools.push_back(name);
  }
  void OnRetry(int, int delay_ms, const std::string&) override {
    last_delay_ms = delay_ms;
    ++retries;
  }
};

// A 429 as every provider's service sends it.
FakeReply RateLimited(const std::string& message = "slow down") {
  FakeReply r;
  r.status = 429;
  r.error_type = "rate_limit_error";
  r.error_message = message;
  return r;
}

// A turn streamed on a thread of its own. Start returns once the provider
// waits to retry (or the turn has ended: `done`); a turn still running when
// this goes is cancelled and joined.
class BackgroundTurn {
 public:
  ~BackgroundTurn() {
    if (!thread_.joinable()) return;
    cancel.Cancel();
    thread_.join();
  }
  void StartUntilItRetries(Provider& provider, ChatRequest request) {
    thread_ = std::thread([this, &provider, request = std::move(request)] {
      res = provider.Stream(request, obs, cancel);
      done = true;
    });
    while (obs.retries.load() == 0 && !done)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void Join() { thread_.join(); }

  Collect obs;
  CancelToken cancel;
  absl::StatusOr<ChatResult> res = absl::UnknownError("not run");
  std::atomic<bool> done{false};

 private:
  std::thread thread_;
};

class ProviderTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_GT(fake_.Start(), 0);
    http_ = MakeCurlHttpClient();
    ProviderConfig pc;
    pc.name = GetParam();
    pc.kind = GetParam();
    pc.api_key = "k-123";
    pc.api_key_env = "FAKE_KEY_VAR";
    pc.base_url = pc.kind == "openai" ? fake_.openai_base_url() : fake_.anthropic_base_url();
    pc.model = "m-1";
    config_ = pc;
    provider_ = MakeProvider(pc, Retries(), *http_);
  }
  static RetryConfig Retries() {
    RetryConfig rc;
    rc.max_attempts = 3;
    rc.initial_backoff_ms = 10;
    rc.max_backoff_ms = 50;
    return rc;
  }
  // The same provider, waiting between attempts on `clock`.
  std::unique_ptr<Provider> ProviderWithClock(const Clock* clock) {
    return MakeProvider(config_, Retries(), *http_, clock);
  }
  ChatRequest Request() {
    ChatRequest r;
    r.model = "m-1";
    r.system = "sys";
    r.messages.push_back({"user", nlohmann::json::array({{{"type", "text"}, {"text", "hi"}}})});
    r.tools.push_back(MakeToolSpec("read_file", "read", {{"type", "object"}}));
    return r;
  }
  FakeLlmServer fake_;
  ProviderConfig config_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Provider> provider_;
};

TEST_P(ProviderTest, StreamsTextAndToolCalls) {
  FakeReply r;
  r.chunks = {"Hel", "lo ", "wörld"};
  r.tool_calls = {{"call_1", "read_file", {{"path", "a.c"}}},
                  {"call_2", "grep", {{"pattern", "x"}}}};
  r.input_tokens = 100;
  r.output_tokens = 20;
  fake_.Enqueue(r);
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(obs.text, "Hello wörld");
  EXPECT_EQ(res->stop_reason, "tool_use");
  EXPECT_EQ(res->input_tokens, 100);
  EXPECT_EQ(res->output_tokens, 20);
  ASSERT_EQ(res->content.size(), 3u);
  EXPECT_EQ(res->content[0]["text"], "Hello wörld");
  EXPECT_EQ(res->content[1]["name"], "read_file");
  EXPECT_EQ(res->content[1]["input"]["path"], "a.c");  // parallel calls, partial JSON joined
  if (GetParam() == "anthropic" || GetParam() == "openai") {
    EXPECT_EQ(res->content[2]["id"], "call_2");
  } else {
    // These wire formats carry no call ids: fwai makes unique ones.
    EXPECT_NE(res->content[1]["id"], res->content[2]["id"]);
    EXPECT_FALSE(res->content[2]["id"].get<std::string>().empty());
  }
  EXPECT_EQ(obs.tools, (std::vector<std::string>{"read_file", "grep"}));
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  if (GetParam() == "gemini") {
    EXPECT_EQ(reqs[0].path, "/v1beta/models/m-1:streamGenerateContent?alt=sse");
    EXPECT_EQ(reqs[0].Header("x-goog-api-key"), "k-123");
    EXPECT_EQ(reqs[0].body["systemInstruction"]["parts"][0]["text"], "sys");
    EXPECT_EQ(reqs[0].body["contents"][0]["role"], "user");
    EXPECT_EQ(reqs[0].body["tools"][0]["functionDeclarations"][0]["name"], "read_file");
    return;
  }
  EXPECT_EQ(reqs[0].body["stream"], true);
  EXPECT_EQ(reqs[0].body["model"], "m-1");
  if (GetParam() == "ollama") {
    EXPECT_EQ(reqs[0].path, "/api/chat");
    EXPECT_EQ(reqs[0].body["messages"][0]["role"], "system");
    EXPECT_EQ(reqs[0].body["tools"][0]["function"]["name"], "read_file");
    EXPECT_EQ(reqs[0].body["options"]["num_predict"], 4096);
  } else if (GetParam() == "anthropic") {
    EXPECT_EQ(reqs[0].path, "/v1/messages");
    EXPECT_EQ(reqs[0].Header("x-api-key"), "k-123");
    EXPECT_EQ(reqs[0].Header("anthropic-version"), "2023-06-01");
    EXPECT_EQ(reqs[0].body["system"], "sys");
    EXPECT_EQ(reqs[0].body["tools"][0]["input_schema"]["type"], "object");
  } else {
    EXPECT_EQ(reqs[0].path, "/v1/chat/completions");
    EXPECT_EQ(reqs[0].Header("authorization"), "Bearer k-123");
    EXPECT_EQ(reqs[0].body["messages"][0]["role"], "system");
    EXPECT_EQ(reqs[0].body["tools"][0]["function"]["name"], "read_file");
  }
}

// Two tools as the agent offers them: shared specs, one with text that needs
// escaping (quotes, a newline, a character cut mid-way) and keys Gemini does
// not take.
std::vector<ToolSpecPtr> OfferedTools() {
  return {MakeToolSpec("read_file", "read", {{"type", "object"}}),
          MakeToolSpec("write_note", "writes a \"note\"\nü \xff",
                       {{"type", "object"},
                        {"additionalProperties", false},
                        {"properties", {{"path", {{"type", "string"}, {"default", "a.txt"}}}}},
                        {"required", {"path"}}})};
}

// What `tools` must be on the wire of `kind`, written out by hand.
nlohmann::json ToolsOnTheWire(const std::string& kind) {
  using json = nlohmann::json;
  const json read_schema = {{"type", "object"}};
  const json note_schema = {{"type", "object"},
                            {"additionalProperties", false},
                            {"properties", {{"path", {{"type", "string"}, {"default", "a.txt"}}}}},
                            {"required", {"path"}}};
  const std::string note_desc = "writes a \"note\"\nü \xEF\xBF\xBD";  // U+FFFD for the cut byte
  if (kind == "anthropic") {
    return {{{"name", "read_file"}, {"description", "read"}, {"input_schema", read_schema}},
            {{"name", "write_note"}, {"description", note_desc}, {"input_schema", note_schema}}};
  }
  if (kind == "gemini") {
    const json gemini_note = {{"type", "object"},
                              {"properties", {{"path", {{"type", "string"}}}}},
                              {"required", {"path"}}};
    return {
        {{"functionDeclarations",
          {{{"name", "read_file"}, {"description", "read"}, {"parameters", read_schema}},
           {{"name", "write_note"}, {"description", note_desc}, {"parameters", gemini_note}}}}}};
  }
  return {
      {{"type", "function"},
       {"function", {{"name", "read_file"}, {"description", "read"}, {"parameters", read_schema}}}},
      {{"type", "function"},
       {"function",
        {{"name", "write_note"}, {"description", note_desc}, {"parameters", note_schema}}}}};
}

// The tools are rendered once per spec and shape and kept: every call that
// offers the same specs sends them whole, in its provider's shape (another
// provider's shape of the same specs does not leak in), and a call that
// offers none sends no `tools` at all.
TEST_P(ProviderTest, OfferedToolsAreSentWholeInTheProvidersShapeOnEveryCall) {
  const std::vector<ToolSpecPtr> tools = OfferedTools();
  std::unique_ptr<Provider> anthropic = MakeProvider(
      [&] {
        ProviderConfig pc = config_;
        pc.name = pc.kind = "anthropic";
        pc.base_url = fake_.anthropic_base_url();
        return pc;
      }(),
      Retries(), *http_);
  FakeReply r;
  r.chunks = {"ok"};
  for (int i = 0; i < 4; ++i) fake_.Enqueue(r);
  Collect obs;
  CancelToken cancel;
  ChatRequest with_tools = Request();
  with_tools.tools = tools;
  ASSERT_TRUE(provider_->Stream(with_tools, obs, cancel).ok());
  ASSERT_TRUE(anthropic->Stream(with_tools, obs, cancel).ok());
  ASSERT_TRUE(provider_->Stream(with_tools, obs, cancel).ok());
  ChatRequest without = Request();
  without.tools.clear();
  ASSERT_TRUE(provider_->Stream(without, obs, cancel).ok());

  const auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_EQ(reqs[0].body["tools"], ToolsOnTheWire(GetParam())) << reqs[0].body.dump();
  EXPECT_EQ(reqs[1].body["tools"], ToolsOnTheWire("anthropic")) << reqs[1].body.dump();
  EXPECT_EQ(reqs[2].body["tools"], ToolsOnTheWire(GetParam())) << reqs[2].body.dump();
  EXPECT_FALSE(reqs[3].body.contains("tools")) << reqs[3].body.dump();
  // The rest of the request is untouched by the tools added to it.
  for (const auto& req : reqs) {
    if (GetParam() == "gemini" && &req != &reqs[1]) {
      EXPECT_EQ(req.body["contents"][0]["parts"][0]["text"], "hi");
    } else {
      EXPECT_EQ(req.body["model"], "m-1");
      EXPECT_EQ(req.body["stream"], true);
    }
  }
}

// A spec is rendered once per shape, by whichever thread asks first; the
// others wait for that text.
TEST(ToolSpecTest, EachShapeIsRenderedOnceHoweverManyThreadsAskAtOnce) {
  static std::atomic<int> renders{0};
  renders = 0;
  const ToolSpecPtr spec = MakeToolSpec("t", "d", {{"type", "object"}});
  const ToolSpec::Render render = [](const ToolSpec& t) -> nlohmann::json {
    ++renders;
    return {{"name", t.name}};
  };
  std::vector<std::thread> threads;
  std::vector<std::string> seen(8);
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&, i] {
      seen[i] = spec->Text(i % 2 ? ToolShape::kAnthropic : ToolShape::kGemini, render);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(renders.load(), 2);  // one per shape asked for
  for (const std::string& text : seen) EXPECT_EQ(text, R"({"name":"t"})");
  EXPECT_EQ(&spec->Text(ToolShape::kAnthropic, render), &spec->Text(ToolShape::kAnthropic, render));
  EXPECT_EQ(renders.load(), 2);
}

TEST_P(ProviderTest, ToolResultsAreSentInTheProvidersFormat) {
  ChatRequest r = Request();
  r.messages.push_back({"assistant", nlohmann::json::array({{{"type", "tool_use"},
                                                             {"id", "c1"},
                                                             {"name", "read_file"},
                                                             {"input", {{"path", "a"}}}}})});
  r.messages.push_back(
      {"user", nlohmann::json::array(
                   {{{"type", "tool_result"}, {"tool_use_id", "c1"}, {"content", "file text"}}})});
  Collect obs;
  CancelToken cancel;
  ASSERT_TRUE(provider_->Stream(r, obs, cancel).ok());
  auto body = fake_.requests()[0].body;
  if (GetParam() == "anthropic") {
    EXPECT_EQ(body["messages"][2]["content"][0]["type"], "tool_result");
  } else if (GetParam() == "gemini") {
    EXPECT_EQ(body["contents"][1]["role"], "model");
    EXPECT_EQ(body["contents"][1]["parts"][0]["functionCall"]["name"], "read_file");
    EXPECT_EQ(body["contents"][1]["parts"][0]["functionCall"]["args"]["path"], "a");
    EXPECT_EQ(body["contents"][2]["parts"][0]["functionResponse"]["name"], "read_file");
    EXPECT_EQ(body["contents"][2]["parts"][0]["functionResponse"]["response"]["content"],
              "file text");
  } else if (GetParam() == "ollama") {
    EXPECT_EQ(body["messages"][2]["tool_calls"][0]["function"]["name"], "read_file");
    EXPECT_EQ(body["messages"][2]["tool_calls"][0]["function"]["arguments"]["path"], "a");
    EXPECT_EQ(body["messages"][3]["role"], "tool");
    EXPECT_EQ(body["messages"][3]["tool_name"], "read_file");
    EXPECT_EQ(body["messages"][3]["content"], "file text");
  } else {
    EXPECT_EQ(body["messages"][2]["tool_calls"][0]["id"], "c1");
    EXPECT_EQ(body["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"path\":\"a\"}");
    EXPECT_EQ(body["messages"][3]["role"], "tool");
    EXPECT_EQ(body["messages"][3]["tool_call_id"], "c1");
    EXPECT_EQ(body["messages"][3]["content"], "file text");
  }
}

TEST_P(ProviderTest, RetriesOn429And5xxThenSucceeds) {
  FakeReply limited = RateLimited();
  limited.retry_after_s = 0;
  fake_.Enqueue(limited);
  FakeReply down;
  down.status = 503;
  down.error_type = "overloaded_error";
  down.error_message = "busy";
  fake_.Enqueue(down);
  FakeReply ok;
  ok.chunks = {"fine"};
  fake_.Enqueue(ok);
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(obs.text, "fine");
  EXPECT_EQ(obs.retries.load(), 2);
  EXPECT_EQ(fake_.request_count(), 3u);
}

// A provider waits out a rate limit on its clock, not in real time: asked
// to wait 100 ms, it has not asked again 400 real ms later while its clock
// stood still, and asks once the clock has moved the 100 ms.
TEST_P(ProviderTest, RetryAfterIsWaitedOnTheProvidersClock) {
  ManualClock clock;
  auto provider = ProviderWithClock(&clock);
  FakeReply limited = RateLimited();
  limited.retry_after_ms = 100;
  fake_.Enqueue(limited);
  FakeReply ok;
  ok.chunks = {"after the wait"};
  fake_.Enqueue(ok);
  BackgroundTurn turn;
  turn.StartUntilItRetries(*provider, Request());
  ASSERT_FALSE(turn.done) << turn.res.status();
  EXPECT_EQ(turn.obs.last_delay_ms.load(), 100);
  clock.Advance(99'000);  // a millisecond short
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(turn.done);
  EXPECT_EQ(fake_.request_count(), 1u) << "asked again before its clock had moved 100 ms";
  clock.Advance(1'000);
  turn.Join();
  ASSERT_TRUE(turn.res.ok()) << turn.res.status();
  EXPECT_EQ(turn.obs.text, "after the wait");
  EXPECT_EQ(fake_.request_count(), 2u);
}

// Cancelling the turn ends a rate-limit wait at once, without the clock
// moving and without another request.
TEST_P(ProviderTest, CancelEndsARetryWaitAtOnce) {
  ManualClock clock;
  auto provider = ProviderWithClock(&clock);
  FakeReply limited = RateLimited();
  limited.retry_after_s = 60;
  fake_.Enqueue(limited);
  BackgroundTurn turn;
  turn.StartUntilItRetries(*provider, Request());
  EXPECT_FALSE(turn.done) << turn.res.status();
  turn.cancel.Cancel();
  turn.Join();
  EXPECT_TRUE(absl::IsCancelled(turn.res.status())) << turn.res.status();
  EXPECT_EQ(fake_.request_count(), 1u);
}

TEST_P(ProviderTest, GivesUpAfterMaxAttemptsWithTheProvidersMessage) {
  for (int i = 0; i < 3; ++i) fake_.Enqueue(RateLimited("quota exceeded for org"));
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(res.status().message().find("quota exceeded for org"), std::string::npos)
      << res.status();
}

TEST_P(ProviderTest, UnauthorizedNamesTheKeyVariable) {
  fake_.RequireKey("the-right-key");
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(res.status().message().find("providers." + GetParam() + ".api_key"), std::string::npos)
      << res.status();
  EXPECT_EQ(fake_.request_count(), 1u);  // not retried
}

TEST_P(ProviderTest, StreamCutMidwayIsAnError) {
  FakeReply r;
  r.chunks = {"a", "b", "c", "d"};
  r.cut_after_chunks = 2;
  fake_.Enqueue(r);
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(obs.text, "ab");
  EXPECT_EQ(fake_.request_count(), 1u);  // text was shown: no silent retry
}

TEST_P(ProviderTest, MalformedChunkIsAnError) {
  FakeReply r;
  r.chunks = {"a", "b", "c", "d"};
  r.malformed = true;
  fake_.Enqueue(r);
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("malformed stream event"), std::string::npos)
      << res.status();
}

TEST_P(ProviderTest, CancelStopsTheStreamPromptly) {
  FakeReply r;
  for (int i = 0; i < 100; ++i) r.chunks.push_back("x");
  r.chunk_delay_ms = 50;
  fake_.Enqueue(r);
  Collect obs;
  CancelToken cancel;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.Cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto res = provider_->Stream(Request(), obs, cancel);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  t.join();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(ms, 2000);
}

TEST_P(ProviderTest, UnreachableServerIsUnavailable) {
  fake_.Stop();
  Collect obs;
  CancelToken cancel;
  auto res = provider_->Stream(Request(), obs, cancel);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(res.status().message().find("after 3 attempts"), std::string::npos) << res.status();
}

TEST_P(ProviderTest, SilentServerHitsTheIdleTimeout) {
  ProviderConfig pc = provider_->config();
  pc.idle_timeout_s = 1;
  RetryConfig rc;
  rc.max_attempts = 1;
  auto provider = MakeProvider(pc, rc, *http_);
  FakeReply r;
  r.chunks = {"a"};
  r.chunk_delay_ms = 4500;
  fake_.Enqueue(r);
  Collect obs;
  CancelToken cancel;
  auto t0 = std::chrono::steady_clock::now();
  auto res = provider->Stream(Request(), obs, cancel);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("no data"), std::string::npos) << res.status();
  EXPECT_LT(ms, 4000);  // gave up (1 s idle + curl's progress tick) before the data came
}

INSTANTIATE_TEST_SUITE_P(Providers, ProviderTest,
                         ::testing::Values("anthropic", "openai", "gemini", "ollama"),
                         [](const auto& info) { return info.param; });

// ---- the curl client: every transfer on one thread of its own

std::unique_ptr<Provider> AnthropicOn(FakeLlmServer& fake, HttpClient& http) {
  ProviderConfig pc;
  pc.name = pc.kind = "anthropic";
  pc.api_key = "k-123";
  pc.base_url = fake.anthropic_base_url();
  pc.model = "m-1";
  RetryConfig rc;
  rc.max_attempts = 1;
  return MakeProvider(pc, rc, http);
}

ChatRequest Saying(const std::string& text) {
  ChatRequest r;
  r.model = "m-1";
  r.messages.push_back({"user", nlohmann::json::array({{{"type", "text"}, {"text", text}}})});
  return r;
}

// Collects the text and the threads it arrived on.
struct ThreadsSeen : Collect {
  Mutex mu;
  std::set<std::thread::id> ids ABSL_GUARDED_BY(mu);
  void OnText(std::string_view t) override {
    Collect::OnText(t);
    MutexLock lock(&mu);
    ids.insert(std::this_thread::get_id());
  }
};

// Streams running at once are read by one thread of the client's own, not
// by their callers' threads, and each gets all of its own chunks.
TEST(CurlHttpClientTest, StreamsAtOnceAreReadByOneThreadOfTheClients) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  constexpr int kStreams = 16;
  for (int i = 0; i < kStreams; ++i) {
    FakeReply r;
    r.chunks = {"<", std::to_string(i), ">"};
    r.chunk_delay_ms = 20;
    r.match = "stream " + std::to_string(i) + ".";
    fake.Enqueue(r);
  }
  auto http = MakeCurlHttpClient();
  auto provider = AnthropicOn(fake, *http);
  std::vector<std::unique_ptr<ThreadsSeen>> seen;
  std::vector<std::thread::id> callers(kStreams);
  std::vector<absl::StatusOr<ChatResult>> results(kStreams, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) seen.push_back(std::make_unique<ThreadsSeen>());
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      callers[i] = std::this_thread::get_id();
      CancelToken cancel;
      results[i] = provider->Stream(Saying("stream " + std::to_string(i) + "."), *seen[i], cancel);
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::thread::id> readers;
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(seen[i]->text, "<" + std::to_string(i) + ">");
    MutexLock lock(&seen[i]->mu);
    readers.insert(seen[i]->ids.begin(), seen[i]->ids.end());
  }
  EXPECT_EQ(readers.size(), 1u);
  for (const auto& caller : callers) EXPECT_EQ(readers.count(caller), 0u);
}

// A request made from inside a stream's callback (as an MCP server's request
// is answered from its stream) completes, and the stream goes on after it.
TEST(CurlHttpClientTest, ARequestFromInsideAStreamsCallbackCompletes) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  FakeReply outer;
  outer.chunks = {"a", "b", "c"};
  outer.chunk_delay_ms = 20;
  outer.match = "outer";
  fake.Enqueue(outer);
  FakeReply inner;
  inner.chunks = {"inner reply"};
  inner.match = "inner";
  fake.Enqueue(inner);
  auto http = MakeCurlHttpClient();
  auto provider = AnthropicOn(fake, *http);
  struct Nesting : Collect {
    Provider* provider = nullptr;
    std::string inner_text;
    absl::Status inner_status = absl::UnknownError("not run");
    void OnText(std::string_view t) override {
      Collect::OnText(t);
      if (t != "a") return;
      Collect got;
      CancelToken cancel;
      auto r = provider->Stream(Saying("inner"), got, cancel);
      inner_status = r.status();
      inner_text = got.text;
    }
  } obs;
  obs.provider = provider.get();
  CancelToken cancel;
  auto r = provider->Stream(Saying("outer"), obs, cancel);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(obs.text, "abc");
  ASSERT_TRUE(obs.inner_status.ok()) << obs.inner_status;
  EXPECT_EQ(obs.inner_text, "inner reply");
}

// ---- what a broken or hostile server sends (found by the stream fuzz targets)

// One stream of `kind` whose whole 200 body is `body`.
absl::StatusOr<ChatResult> StreamBody(const std::string& kind, const std::string& body) {
  FakeLlmServer fake;
  EXPECT_GT(fake.Start(), 0);
  FakeReply r;
  r.raw_body = body;
  fake.Enqueue(r);
  auto http = MakeCurlHttpClient();
  ProviderConfig pc;
  pc.name = kind;
  pc.kind = kind;
  pc.api_key = "k-123";
  pc.base_url = kind == "openai" ? fake.openai_base_url() : fake.anthropic_base_url();
  pc.model = "m-1";
  RetryConfig rc;
  rc.max_attempts = 1;
  auto provider = MakeProvider(pc, rc, *http);
  ChatRequest req;
  req.model = "m-1";
  req.messages.push_back({"user", nlohmann::json::array({{{"type", "text"}, {"text", "hi"}}})});
  Collect obs;
  CancelToken cancel;
  return provider->Stream(req, obs, cancel);
}

std::string Sse(const std::string& event, const std::string& data) {
  return (event.empty() ? "" : "event: " + event + "\n") + "data: " + data + "\n\n";
}

void ExpectMalformed(const absl::StatusOr<ChatResult>& r, const std::string& why) {
  ASSERT_FALSE(r.ok()) << "accepted: " << r->content.dump();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("malformed stream event: " + why), std::string::npos)
      << r.status();
}

const std::string kStart =
    Sse("message_start", R"({"type":"message_start","message":{"usage":{}}})");
const std::string kStop = Sse("message_stop", R"({"type":"message_stop"})");

std::string BlockStart(const std::string& index, const std::string& block) {
  return Sse("content_block_start", R"({"type":"content_block_start","index":)" + index +
                                        R"(,"content_block":)" + block + "}");
}

std::string TextDelta(const std::string& index, const std::string& text) {
  return Sse("content_block_delta", R"({"type":"content_block_delta","index":)" + index +
                                        R"(,"delta":{"type":"text_delta","text":")" + text +
                                        R"("}})");
}

std::string BlockStop(const std::string& index) {
  return Sse("content_block_stop", R"({"type":"content_block_stop","index":)" + index + "}");
}

std::string TextBlock(const std::string& index) {
  return BlockStart(index, R"({"type":"text","text":""})") + TextDelta(index, "hi") +
         BlockStop(index);
}

TEST(ProviderStreamTest, AnthropicBlockIndexesOutOfOrderAreRefused) {
  // A skipped index used to leave a block without a type in the message.
  ExpectMalformed(StreamBody("anthropic", kStart + TextBlock("0") + TextBlock("2") + kStop),
                  "content_block_start for block 2 when block 1 comes next");
  // A huge one used to size a vector by it and abort the daemon.
  ExpectMalformed(StreamBody("anthropic", kStart + TextBlock("1000000000000000000") + kStop),
                  "content_block_start for block 1000000000000000000 when block 0 comes next");
  ExpectMalformed(StreamBody("anthropic", kStart + TextBlock("0") + TextDelta("1", "x") + kStop),
                  "content_block_delta for block 1, which is not open");
  auto ok = StreamBody("anthropic", kStart + TextBlock("0") + TextBlock("1") + kStop);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->content.size(), 2u);
}

TEST(ProviderStreamTest, AnthropicBlocksHoldWhatTheAgentReads) {
  // A text block whose text is no string, or a tool call without a string
  // id, used to reach the agent as it was.
  ExpectMalformed(
      StreamBody("anthropic", kStart + BlockStart("0", R"({"type":"text","text":5})") + kStop),
      "text block whose text is not a string");
  ExpectMalformed(
      StreamBody("anthropic",
                 kStart + BlockStart("0", R"({"type":"tool_use","id":7,"name":"x"})") + kStop),
      "tool_use block without a string id and name");
  // A block the server never stopped keeps its text.
  auto r = StreamBody("anthropic", kStart + BlockStart("0", R"({"type":"text","text":""})") +
                                       TextDelta("0", "kept") + kStop);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->content.size(), 1u);
  EXPECT_EQ(r->content[0]["text"], "kept");
}

TEST(ProviderStreamTest, OpenAiToolCallIndexesOutOfOrderAreRefused) {
  auto call = [](const std::string& index) {
    return Sse("", R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":)" + index +
                       R"(,"id":"c","function":{"name":"grep","arguments":"{}"}}]}}]})");
  };
  const std::string done =
      Sse("", R"({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]})") +
      Sse("", "[DONE]");
  ExpectMalformed(StreamBody("openai", call("1000000000000000000") + done),
                  "tool call 1000000000000000000 when call 0 comes next");
  ExpectMalformed(StreamBody("openai", call("-1") + done), "tool call -1 when call 0 comes next");
  auto ok = StreamBody("openai", call("0") + call("1") + done);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->content.size(), 2u);
}

TEST(ProviderStreamTest, GeminiFunctionCallArgsMustBeAnObject) {
  // Args that are not an object used to reach the agent as a tool input.
  ExpectMalformed(
      StreamBody(
          "gemini",
          Sse("",
              R"({"candidates":[{"content":{"parts":[{"functionCall":{"name":"grep","args":5}}]},)"
              R"("finishReason":"STOP"}]})")),
      "functionCall args are not a JSON object");
}

TEST(ProviderStreamTest, TokenCountsFromTheStreamAreCheckedNumbers) {
  // Sums of huge counts overflowed; floats and negatives came through as
  // nonsense (or undefined behaviour).
  auto a = StreamBody(
      "anthropic",
      Sse("message_start",
          R"({"type":"message_start","message":{"usage":{"input_tokens":9223372036854775807,)"
          R"("cache_read_input_tokens":9223372036854775807,"output_tokens":-5}}})") +
          Sse("message_delta",
              R"({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1e300}})") +
          kStop);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->input_tokens, 0);
  EXPECT_EQ(a->output_tokens, 0);
  auto o = StreamBody("ollama", R"({"message":{"role":"assistant","content":"hi"},"done":true,)"
                                R"("prompt_eval_count":-7,"eval_count":2.5e30})"
                                "\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->input_tokens, 0);
  EXPECT_EQ(o->output_tokens, 0);
}

}  // namespace
}  // namespace fwai
