#include "common/config.h"

#include <gtest/gtest.h>

namespace fwai {
namespace {

TEST(ConfigTest, EmptyFileGivesDefaults) {
  auto c = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_iterations, 25);
  EXPECT_TRUE(c->providers.empty());
}

TEST(ConfigTest, ParsesProvidersAndLimits) {
  auto c = ParseConfig(
      "listen: [unix:/tmp/x.sock, tcp:127.0.0.1:0]\n"
      "providers:\n"
      "  anthropic:\n    api_key_env: MY_KEY\n    model: claude-x\n"
      "  local:\n    kind: openai\n    base_url: http://127.0.0.1:8080/v1/\n"
      "agent:\n  max_iterations: 7\n",
      "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen.size(), 2u);
  EXPECT_EQ(c->providers["anthropic"].kind, "anthropic");
  EXPECT_EQ(c->providers["anthropic"].api_key_env, "MY_KEY");
  EXPECT_EQ(c->providers["local"].kind, "openai");
  EXPECT_EQ(c->max_iterations, 7);
  ApplyProviderEnvironment(*c);
  EXPECT_EQ(c->providers["local"].base_url, "http://127.0.0.1:8080/v1");  // trailing slash dropped
}

TEST(ConfigTest, UnknownKeyNamesFileLineAndField) {
  auto c = ParseConfig("agent:\n  max_iterations: 3\n  max_iteratons: 4\n", "fwaid.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("fwaid.yaml:3"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("agent.max_iteratons"), std::string::npos) << c.status();
}

TEST(ConfigTest, BadValueSaysWhatIsExpected) {
  auto c = ParseConfig("retry:\n  max_attempts: lots\n", "fwaid.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("fwaid.yaml:2"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("expected an integer"), std::string::npos) << c.status();
  auto d = ParseConfig("providers:\n  x:\n    kind: bard\n", "f.yaml");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("expected anthropic, openai, gemini or ollama"),
            std::string::npos);
  auto e = ParseConfig("listen: http://x\n", "f.yaml");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("unix:PATH"), std::string::npos);
}

TEST(ConfigTest, VectorMinRecallDefaultsToAutomaticAndIsBounded) {
  auto d = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->knowledge.vector_min_recall, -1) << "chosen by the embedder";
  auto c = ParseConfig("knowledge:\n  vector_min_recall: 0.5\n", "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->knowledge.vector_min_recall, 0.5);
  auto b = ParseConfig("knowledge:\n  vector_min_recall: 1.5\n", "fwaid.yaml");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("knowledge.vector_min_recall"), std::string::npos)
      << b.status();
  EXPECT_NE(b.status().message().find("fwaid.yaml:2"), std::string::npos) << b.status();
}

TEST(ConfigTest, TurnThreadsDefaultSetAndBounded) {
  auto d = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->turn_threads, 50);
  auto c = ParseConfig("agent:\n  turn_threads: 0\n", "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->turn_threads, 0);
  auto e = ParseConfig("agent:\n  turn_threads: 8\n", "fwaid.yaml");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->turn_threads, 8);
  for (const char* bad : {"-1", "1001", "99999999999", "many"}) {
    auto b = ParseConfig(std::string("agent:\n  max_iterations: 3\n  turn_threads: ") + bad + "\n",
                         "fwaid.yaml");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("fwaid.yaml:3"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("agent.turn_threads"), std::string::npos) << b.status();
  }
}

TEST(ConfigTest, TurnStartsDefaultSetAndBounded) {
  auto d = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->turn_starts, -1);  // half the cores
  auto c = ParseConfig("agent:\n  turn_starts: 0\n", "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->turn_starts, 0);
  auto e = ParseConfig("agent:\n  turn_starts: 3\n", "fwaid.yaml");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->turn_starts, 3);
  for (const char* bad : {"-1", "1001", "two"}) {
    auto b = ParseConfig(std::string("agent:\n  turn_threads: 3\n  turn_starts: ") + bad + "\n",
                         "fwaid.yaml");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("fwaid.yaml:3"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("agent.turn_starts"), std::string::npos) << b.status();
  }
}

TEST(ConfigTest, BatchWindowDefaultSetAndBounded) {
  auto d = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->subscribers.batch_window_us, 1000);
  auto c = ParseConfig("subscribers:\n  batch_window_us: 0\n", "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->subscribers.batch_window_us, 0);
  for (const char* bad : {"-1", "100001", "1ms"}) {
    auto b = ParseConfig(
        std::string("subscribers:\n  max_queue: 4096\n  batch_window_us: ") + bad + "\n",
        "fwaid.yaml");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.status().message().find("fwaid.yaml:3"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("subscribers.batch_window_us"), std::string::npos)
        << b.status();
  }
}

TEST(ConfigTest, SyntaxErrorHasLine) {
  auto c = ParseConfig("a: [1, 2\nb: 3\n", "broken.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("broken.yaml:"), std::string::npos) << c.status();
}

TEST(ConfigTest, EnvironmentAddsProviders) {
  setenv("OPENAI_API_KEY", "sk-test", 1);
  setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1", 1);
  DaemonConfig c;
  ApplyProviderEnvironment(c);
  unsetenv("OPENAI_API_KEY");
  unsetenv("OPENAI_BASE_URL");
  ASSERT_TRUE(c.providers.count("openai"));
  EXPECT_EQ(c.providers["openai"].base_url, "http://127.0.0.1:9/v1");
  EXPECT_EQ(c.default_provider, "openai");
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {
TEST(ConfigTest, HttpTimeoutsReachProviders) {
  auto c =
      ParseConfig("http:\n  idle_timeout_s: 7\nproviders:\n  openai:\n    api_key: x\n", "f.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ApplyProviderEnvironment(*c);
  EXPECT_EQ(c->providers["openai"].idle_timeout_s, 7);
}
TEST(ConfigTest, RerankWeightsAndDocumentLegs) {
  auto c = ParseConfig(
      "knowledge:\n  fusion: {doc_text_weight: 0.5, doc_text_b: 0.6, doc_text_candidates: 4}\n"
      "  reranker:\n    weights: {coverage: 0.7, named: 0.2}\n"
      "catalog:\n  rerank_weights: {lexical: 1.2}\n",
      "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->knowledge.doc_text_weight, 0.5);
  EXPECT_EQ(c->knowledge.doc_text_b, 0.6);
  EXPECT_EQ(c->knowledge.doc_text_candidates, 4);
  EXPECT_EQ(c->knowledge.reranker.weights,
            (std::map<std::string, double>{{"coverage", 0.7}, {"named", 0.2}}));
  EXPECT_EQ(c->catalog.reranker.weights, (std::map<std::string, double>{{"lexical", 1.2}}));
  auto bad = ParseConfig("catalog:\n  rerank_weights: {coverage: 0.3, lexcial: 1}\n", "fwaid.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("fwaid.yaml:2"), std::string::npos)
      << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("catalog.rerank_weights.lexcial"),
            std::string::npos)
      << bad.status();
  auto neg = ParseConfig("knowledge:\n  reranker:\n    weights: {coverage: -1}\n", "fwaid.yaml");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(std::string(neg.status().message()).find("knowledge.reranker.weights.coverage"),
            std::string::npos)
      << neg.status();
}
TEST(ConfigTest, PassagePlacementAndWithinDocumentRanking) {
  auto d = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->knowledge.passage_forward, -1);  // the built-in default
  EXPECT_LT(d->knowledge.passage_within_doc, 0);
  auto c =
      ParseConfig("knowledge:\n  passages: {tokens: 400, forward: false, within_doc_weight: 0.5}\n",
                  "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->knowledge.passage_forward, 0);
  EXPECT_EQ(c->knowledge.passage_within_doc, 0.5);
  auto bad = ParseConfig("knowledge:\n  passages:\n    forward: sometimes\n", "fwaid.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("fwaid.yaml:3"), std::string::npos)
      << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("knowledge.passages.forward"),
            std::string::npos)
      << bad.status();
  auto over = ParseConfig("knowledge:\n  passages: {within_doc_weight: 2}\n", "fwaid.yaml");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(std::string(over.status().message()).find("knowledge.passages.within_doc_weight"),
            std::string::npos)
      << over.status();
}
TEST(ConfigTest, WindowEvidence) {
  auto d = ParseConfig("", "fwaid.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->knowledge.window_enabled, -1);  // the built-in defaults
  EXPECT_EQ(d->knowledge.window_docs, -1);
  EXPECT_LT(d->knowledge.window_weight, 0);
  auto c = ParseConfig(
      "knowledge:\n  windows: {enabled: true, docs: 5, weight: 0.4, k: 30, identifiers: true}\n",
      "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->knowledge.window_enabled, 1);
  EXPECT_EQ(c->knowledge.window_docs, 5);
  EXPECT_EQ(c->knowledge.window_weight, 0.4);
  EXPECT_EQ(c->knowledge.window_k, 30);
  EXPECT_EQ(c->knowledge.window_identifiers, 1);
  auto off = ParseConfig("knowledge:\n  windows: {enabled: false}\n", "fwaid.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->knowledge.window_enabled, 0);
  for (const auto& [yaml, field] :
       {std::pair<std::string, std::string>{"knowledge:\n  windows:\n    docs: 0\n",
                                            "knowledge.windows.docs"},
        {"knowledge:\n  windows:\n    weight: -1\n", "knowledge.windows.weight"},
        {"knowledge:\n  windows:\n    identifiers: maybe\n", "knowledge.windows.identifiers"},
        {"knowledge:\n  windows:\n    doc: 3\n", "knowledge.windows.doc"}}) {
    auto bad = ParseConfig(yaml, "fwaid.yaml");
    ASSERT_FALSE(bad.ok()) << yaml;
    EXPECT_NE(std::string(bad.status().message()).find(field), std::string::npos) << bad.status();
    EXPECT_NE(std::string(bad.status().message()).find("fwaid.yaml:3"), std::string::npos)
        << bad.status();
  }
}
TEST(ConfigTest, CatalogHypotheticalToolIsOffUnlessAskedFor) {
  auto hyde = ParseConfig("catalog:\n  hyde: true\n  hyde_weight: 0.5\n", "fwaid.yaml");
  ASSERT_TRUE(hyde.ok()) << hyde.status();
  EXPECT_TRUE(hyde->catalog.hyde);
  EXPECT_EQ(hyde->catalog.hyde_weight, 0.5);
  auto bad_hyde = ParseConfig("catalog:\n  hyde: sometimes\n", "fwaid.yaml");
  ASSERT_FALSE(bad_hyde.ok());
  EXPECT_NE(std::string(bad_hyde.status().message()).find("catalog.hyde"), std::string::npos)
      << bad_hyde.status();
  auto heavy = ParseConfig("catalog:\n  hyde_weight: 2\n", "fwaid.yaml");
  ASSERT_FALSE(heavy.ok());
  EXPECT_NE(std::string(heavy.status().message()).find("catalog.hyde_weight"), std::string::npos)
      << heavy.status();
  auto off = ParseConfig("log_level: info\n", "fwaid.yaml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->catalog.hyde);  // off unless asked for
}

TEST(ConfigTest, CatalogRerankerIsAModelOrTheBuiltin) {
  auto c = ParseConfig(
      "catalog:\n  reranker: {kind: tei, base_url: 'http://127.0.0.1:8081', weights: {context: "
      "0.5}}\n"
      "knowledge:\n  reranker: {kind: llm, provider: anthropic, model: m}\n",
      "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->catalog.reranker.kind, "tei");
  EXPECT_EQ(c->catalog.reranker.base_url, "http://127.0.0.1:8081");
  EXPECT_EQ(c->catalog.reranker.weights, (std::map<std::string, double>{{"context", 0.5}}));
  EXPECT_EQ(c->knowledge.reranker.kind, "llm");
  EXPECT_EQ(c->knowledge.reranker.provider, "anthropic");
  EXPECT_EQ(c->knowledge.reranker.model, "m");
  auto no_url = ParseConfig("catalog:\n  reranker:\n    kind: cohere\n", "fwaid.yaml");
  ASSERT_FALSE(no_url.ok());
  EXPECT_NE(std::string(no_url.status().message()).find("catalog.reranker.base_url"),
            std::string::npos)
      << no_url.status();
  auto kind = ParseConfig("catalog:\n  reranker: {kind: bm42}\n", "fwaid.yaml");
  ASSERT_FALSE(kind.ok());
  EXPECT_NE(std::string(kind.status().message()).find("catalog.reranker.kind"), std::string::npos)
      << kind.status();
  EXPECT_NE(std::string(kind.status().message()).find("fwaid.yaml:2"), std::string::npos)
      << kind.status();
}

TEST(ConfigTest, TelemetryIsOffWithoutItsSectionAndParsedWithIt) {
  auto off = ParseConfig("log_level: info\n", "fwaid.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->telemetry.enabled);
  auto on = ParseConfig(
      "telemetry:\n  endpoint: https://otel.example:4317\n  service_name: lab-a\n"
      "  headers:\n    authorization: {env: OTLP_AUTH}\n    x-tenant: {file: /run/tenant}\n"
      "  metrics_interval_ms: 1000\n  capture_content: true\n",
      "fwaid.yaml");
  ASSERT_TRUE(on.ok()) << on.status();
  const TelemetryConfig& t = on->telemetry;
  EXPECT_TRUE(t.enabled);
  EXPECT_EQ(t.endpoint, "https://otel.example:4317");
  EXPECT_EQ(t.service_name, "lab-a");
  EXPECT_EQ(t.metrics_interval_ms, 1000);
  EXPECT_TRUE(t.capture_content);
  ASSERT_EQ(t.headers.size(), 2u);
  EXPECT_EQ(t.headers[0].name, "authorization");
  EXPECT_EQ(t.headers[0].env, "OTLP_AUTH");
  EXPECT_EQ(t.headers[0].where, "config fwaid.yaml:5: telemetry.headers.authorization");
  EXPECT_EQ(t.headers[1].file, "/run/tenant");
}

TEST(ConfigTest, TelemetryRefusesUnknownKeysLiteralHeadersAndOtherProtocols) {
  auto expect_error = [](const std::string& yaml, const std::string& what) {
    auto c = ParseConfig(yaml, "fwaid.yaml");
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_NE(c.status().message().find(what), std::string::npos) << c.status();
  };
  expect_error("telemetry:\n  endpoint: http://h:4317\n  endpont: x\n",
               "fwaid.yaml:3: telemetry.endpont: unknown key");
  expect_error("telemetry:\n  service_name: x\n", "fwaid.yaml:2: telemetry.endpoint: missing");
  expect_error("telemetry:\n  endpoint: h:4317\n",
               "fwaid.yaml:2: telemetry.endpoint: expected http://");
  expect_error("telemetry:\n  endpoint: http://h:4317\n  protocol: http/json\n",
               "fwaid.yaml:3: telemetry.protocol: expected grpc");
  expect_error(
      "telemetry:\n  endpoint: http://h:4317\n  headers:\n    authorization: Bearer s3cret\n",
      "fwaid.yaml:4: telemetry.headers.authorization: expected {env: VARIABLE} or {file: PATH}");
  expect_error("telemetry:\n  endpoint: http://h:4317\n  headers:\n    a: {env: X, file: Y}\n",
               "telemetry.headers.a: expected exactly one of env or file");
  expect_error("telemetry:\n  endpoint: http://h:4317\n  headers:\n    a: {value: Y}\n",
               "fwaid.yaml:4: telemetry.headers.a.value: unknown key");
}

}  // namespace
}  // namespace fwai
