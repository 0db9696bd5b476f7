// The built-in reranker's features, and the HTTP and LLM rerankers over real
// HTTP against the fake service, with their fallback.
#include "server/knowledge/reranker.h"

#include <gtest/gtest.h>

#include "server/knowledge/embedder.h"
#include "server/knowledge/remote_rerankers.h"
#include "server/llm/http_client.h"
#include "server/llm/provider.h"
#include "tests/fakes/fake_llm_server.h"

namespace fwai {
namespace {

using testing::FakeLlmServer;
using testing::FakeReply;

std::vector<RerankCandidate> Candidates() {
  return {
      {"The watchdog timer resets the chip.", "wdt.md", 0.2, 0.3, 0.5, 0},
      {"RCC_AHB1ENR bit 0 (GPIOAEN) enables the GPIOA clock.", "rm.pdf > RCC", 0.4, 1.0, 1.0, 0},
      {"GPIOA clock gating is described elsewhere.", "notes.md", 0.3, 0.5, 0.7, 0}};
}

TEST(BuiltinRerankerTest, ExactIdentifierAndCoverageWin) {
  auto r = MakeBuiltinReranker();
  auto s = r->Score("which bit in RCC_AHB1ENR enables the GPIOA clock", Candidates());
  ASSERT_TRUE(s.ok());
  EXPECT_GT((*s)[1], (*s)[2]);
  EXPECT_GT((*s)[2], (*s)[0]);
  for (double x : *s) {
    EXPECT_GE(x, 0);
    EXPECT_LE(x, 1);
  }
  auto f = ComputeRerankFeatures("RCC_AHB1ENR GPIOA", Candidates()[1]);
  EXPECT_DOUBLE_EQ(f.identifier, 1.0);
  EXPECT_DOUBLE_EQ(f.coverage, 1.0);
}

TEST(BuiltinRerankerTest, WeightsByNameChangeTheOrder) {
  // Only the fused rank counts: the candidate fusion liked best wins.
  RerankWeights w;
  for (const char* f : {"identifier", "coverage", "proximity", "context", "vector", "lexical",
                        "doc", "doc_text", "named"}) {
    ASSERT_TRUE(SetRerankWeight(w, f, 0.0)) << f;
  }
  ASSERT_TRUE(SetRerankWeight(w, "fused", 1.0));
  EXPECT_FALSE(SetRerankWeight(w, "lexcial", 1.0));
  auto cands = Candidates();
  cands[0].fused_norm = 0.9;  // the watchdog passage, fused above the GPIOA note
  const std::string q = "which bit in RCC_AHB1ENR enables the GPIOA clock";
  auto by_default = MakeBuiltinReranker()->Score(q, cands);
  auto fused_only = MakeBuiltinReranker(w)->Score(q, cands);
  ASSERT_TRUE(by_default.ok() && fused_only.ok());
  EXPECT_GT((*by_default)[2], (*by_default)[0]);  // it names GPIOA and the clock
  EXPECT_GT((*fused_only)[0], (*fused_only)[2]);
  // Whole-document match and part naming are features too.
  RerankCandidate named = Candidates()[2];
  named.doc_text = 0.9;
  named.named = 1.0;
  auto f = ComputeRerankFeatures("GPIOA clock on the STM32F407", named);
  EXPECT_DOUBLE_EQ(f.doc_text, 0.9);
  EXPECT_DOUBLE_EQ(f.named, 1.0);
}

class RemoteRerankerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_GT(fake_.Start(), 0);
    http_ = MakeCurlHttpClient();
  }
  FakeLlmServer fake_;
  std::unique_ptr<HttpClient> http_;
  std::unique_ptr<Reranker> builtin_ = MakeBuiltinReranker();
};

TEST_P(RemoteRerankerTest, ScoresFromTheServiceInItsWireFormat) {
  HttpRerankerConfig c;
  c.style = GetParam();
  c.base_url = fake_.anthropic_base_url() + (GetParam() == "cohere" ? "/v1" : "");
  c.model = "rerank-test";
  c.api_key = "rk";
  auto r = MakeHttpReranker(c, *http_, *builtin_);
  auto s = r->Score("GPIOA clock", Candidates());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ((*s)[0], 0.0);
  EXPECT_DOUBLE_EQ((*s)[1], 1.0);
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].Header("authorization"), "Bearer rk");
  if (GetParam() == "tei") {
    EXPECT_EQ(reqs[0].path, "/rerank");
    EXPECT_EQ(reqs[0].body["texts"].size(), 3u);
  } else {
    EXPECT_EQ(reqs[0].path, "/v1/rerank");
    EXPECT_EQ(reqs[0].body["documents"].size(), 3u);
    EXPECT_EQ(reqs[0].body["model"], "rerank-test");
  }
}

TEST_P(RemoteRerankerTest, UnreachableServiceFallsBackToBuiltin) {
  HttpRerankerConfig c;
  c.style = GetParam();
  c.base_url = fake_.anthropic_base_url();
  fake_.Stop();
  auto r = MakeHttpReranker(c, *http_, *builtin_);
  auto s = r->Score("RCC_AHB1ENR GPIOA clock", Candidates());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, *builtin_->Score("RCC_AHB1ENR GPIOA clock", Candidates()));
}

INSTANTIATE_TEST_SUITE_P(Styles, RemoteRerankerTest, ::testing::Values("tei", "cohere"),
                         [](const auto& i) { return i.param; });

TEST(LlmRerankerTest, ModelOrdersThePassages) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  auto http = MakeCurlHttpClient();
  ProviderConfig pc;
  pc.name = pc.kind = "anthropic";
  pc.api_key = "k";
  pc.base_url = fake.anthropic_base_url();
  pc.model = "claude-test";
  auto provider = MakeProvider(pc, RetryConfig{1, 10, 10}, *http);
  auto builtin = MakeBuiltinReranker();
  auto r = MakeLlmReranker(*provider, "", *builtin);
  FakeReply reply;
  reply.chunks = {"Ranking: [2, ", "0]"};
  fake.Enqueue(reply);
  auto s = r->Score("gpio clock", Candidates());
  ASSERT_TRUE(s.ok());
  EXPECT_GT((*s)[2], (*s)[0]);
  EXPECT_GT((*s)[0], (*s)[1]);  // not ranked by the model: lowest
  auto prompt = fake.requests()[0].body["messages"][0]["content"][0]["text"].get<std::string>();
  EXPECT_NE(prompt.find("[1] rm.pdf > RCC"), std::string::npos) << prompt;
  FakeReply nonsense;
  nonsense.chunks = {"I cannot rank these."};
  fake.Enqueue(nonsense);
  auto fb = r->Score("RCC_AHB1ENR GPIOA clock", Candidates());
  ASSERT_TRUE(fb.ok());
  EXPECT_EQ(*fb, *builtin->Score("RCC_AHB1ENR GPIOA clock", Candidates()));
}

TEST(HttpEmbedderTest, BatchesLearnsDimensionAndNormalises) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  auto http = MakeCurlHttpClient();
  HttpEmbedderConfig c;
  c.base_url = fake.openai_base_url();
  c.model = "nomic-embed-text";
  c.batch_size = 2;
  c.max_attempts = 2;
  auto e = MakeHttpEmbedder(c, *http);
  auto v = e->Embed({"aa", "bb", "abc"}, false);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->size(), 3u);
  EXPECT_EQ(e->dimension(), 8);
  double norm = 0;
  for (float x : (*v)[2]) norm += x * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  auto reqs = fake.requests();
  ASSERT_EQ(reqs.size(), 2u);  // batches of 2
  EXPECT_EQ(reqs[0].path, "/v1/embeddings");
  EXPECT_EQ(reqs[0].body["model"], "nomic-embed-text");
  fake.Stop();
  auto down = e->Embed({"x"}, false);
  ASSERT_FALSE(down.ok());
  EXPECT_NE(down.status().message().find("/v1/embeddings"), std::string::npos) << down.status();
}

TEST(LlmQueryRewriterTest, VariantsFromTheModelAreCached) {
  FakeLlmServer fake;
  ASSERT_GT(fake.Start(), 0);
  auto http = MakeCurlHttpClient();
  ProviderConfig pc;
  pc.name = pc.kind = "openai";
  pc.api_key = "k";
  pc.base_url = fake.openai_base_url();
  pc.model = "gpt-test";
  auto provider = MakeProvider(pc, RetryConfig{1, 10, 10}, *http);
  auto rewrite = MakeLlmQueryRewriter(*provider, "");
  FakeReply reply;
  reply.chunks = {"[\"GPIOx_MODER pin mode\", \"GPIO port mode ",
                  "register\", \"MODER bits\", \"extra\"]"};
  fake.Enqueue(reply);
  auto v = rewrite("pin mode");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0], "GPIOx_MODER pin mode");
  EXPECT_EQ(rewrite("pin mode"), v);
  EXPECT_EQ(fake.request_count(), 1u);  // cached
  fake.Stop();
  EXPECT_TRUE(rewrite("other query").empty());  // failure: no variants
}

}  // namespace
}  // namespace fwai
