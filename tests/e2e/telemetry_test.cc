// OpenTelemetry export against a real fwaid: an OTLP collector inside the
// test (gRPC TraceService and MetricsService from the packaged OTLP protos,
// on port 0) receives what a skill run sends: a build, an agent turn with a
// tool call, a flash of the simulated board and a test step, as one span
// tree whose evidence hashes are the evidence log's. With no telemetry
// section nothing is sent; secrets never reach the collector.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "opentelemetry/proto/collector/metrics/v1/metrics_service.grpc.pb.h"
#include "opentelemetry/proto/collector/trace/v1/trace_service.grpc.pb.h"
#include "tests/fakes/fake_llm_server.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
namespace otlp_trace = opentelemetry::proto::collector::trace::v1;
namespace otlp_metrics = opentelemetry::proto::collector::metrics::v1;
namespace otlp_common = opentelemetry::proto::common::v1;

// A received span, flattened.
struct ReceivedSpan {
  std::string trace_id, span_id, parent_span_id, name;
  int kind = 0;
  bool error = false;
  std::map<std::string, std::string> attrs;  // every value as text
  std::string service;
};

std::string Hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string ValueText(const otlp_common::AnyValue& v) {
  switch (v.value_case()) {
    case otlp_common::AnyValue::kStringValue:
      return v.string_value();
    case otlp_common::AnyValue::kIntValue:
      return std::to_string(v.int_value());
    case otlp_common::AnyValue::kDoubleValue: {
      std::ostringstream o;
      o << v.double_value();
      return o.str();
    }
    case otlp_common::AnyValue::kBoolValue:
      return v.bool_value() ? "true" : "false";
    default:
      return v.DebugString();
  }
}

// The collector: keeps every export and the metadata it came with.
class Collector final : public otlp_trace::TraceService::Service,
                        public otlp_metrics::MetricsService::Service {
 public:
  Collector() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(static_cast<otlp_trace::TraceService::Service*>(this));
    b.RegisterService(static_cast<otlp_metrics::MetricsService::Service*>(this));
    server_ = b.BuildAndStart();
  }
  ~Collector() override { server_->Shutdown(); }

  grpc::Status Export(grpc::ServerContext* ctx, const otlp_trace::ExportTraceServiceRequest* req,
                      otlp_trace::ExportTraceServiceResponse*) override {
    std::lock_guard lock(mu_);
    Keep(ctx);
    traces_.push_back(*req);
    return grpc::Status::OK;
  }
  grpc::Status Export(grpc::ServerContext* ctx,
                      const otlp_metrics::ExportMetricsServiceRequest* req,
                      otlp_metrics::ExportMetricsServiceResponse*) override {
    std::lock_guard lock(mu_);
    Keep(ctx);
    metrics_.push_back(*req);
    return grpc::Status::OK;
  }

  int port() const { return port_; }
  size_t exports() {
    std::lock_guard lock(mu_);
    return traces_.size() + metrics_.size();
  }
  std::vector<ReceivedSpan> Spans() {
    std::lock_guard lock(mu_);
    std::vector<ReceivedSpan> out;
    for (const auto& req : traces_) {
      for (const auto& rs : req.resource_spans()) {
        std::string service;
        for (const auto& a : rs.resource().attributes()) {
          if (a.key() == "service.name") service = a.value().string_value();
        }
        for (const auto& ss : rs.scope_spans()) {
          for (const auto& s : ss.spans()) {
            ReceivedSpan r;
            r.trace_id = Hex(s.trace_id());
            r.span_id = Hex(s.span_id());
            r.parent_span_id = Hex(s.parent_span_id());
            r.name = s.name();
            r.kind = s.kind();
            r.error =
                s.status().code() == opentelemetry::proto::trace::v1::Status::STATUS_CODE_ERROR;
            r.service = service;
            for (const auto& a : s.attributes()) r.attrs[a.key()] = ValueText(a.value());
            out.push_back(std::move(r));
          }
        }
      }
    }
    return out;
  }
  // Metric name -> the sum of its data points (counters: values; histograms: sums).
  std::map<std::string, double> MetricTotals() {
    std::lock_guard lock(mu_);
    std::map<std::string, double> out;
    for (const auto& req : metrics_) {
      for (const auto& rm : req.resource_metrics()) {
        for (const auto& sm : rm.scope_metrics()) {
          for (const auto& m : sm.metrics()) {
            double total = 0;
            if (m.has_sum()) {
              for (const auto& p : m.sum().data_points()) {
                total += p.has_as_double() ? p.as_double() : static_cast<double>(p.as_int());
              }
            } else if (m.has_histogram()) {
              for (const auto& p : m.histogram().data_points()) total += p.sum();
            }
            out[m.name()] =
                std::max(out[m.name()], total);  // cumulative: the latest is the largest
          }
        }
      }
    }
    return out;
  }
  // Every byte the collector received (requests and metadata), for secret checks.
  std::string Everything() {
    std::lock_guard lock(mu_);
    std::string all = metadata_seen_;
    for (const auto& r : traces_) all += r.SerializeAsString();
    for (const auto& r : metrics_) all += r.SerializeAsString();
    return all;
  }
  std::set<std::string> AuthorizationHeaders() {
    std::lock_guard lock(mu_);
    return authorization_;
  }

 private:
  void Keep(grpc::ServerContext* ctx) {
    for (const auto& [k, v] : ctx->client_metadata()) {
      if (std::string(k.data(), k.size()) == "authorization") {
        authorization_.insert(std::string(v.data(), v.size()));
      }
    }
  }

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<otlp_trace::ExportTraceServiceRequest> traces_;
  std::vector<otlp_metrics::ExportMetricsServiceRequest> metrics_;
  std::set<std::string> authorization_;
  std::string metadata_seen_;
};

const char kToken[] = "Bearer otlp-token-5f0c1e";
const char kGoal[] = "Read the Makefile and name the image it builds (zebra-quartz-marker).";

class TelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_.Start(); }

  void StartDaemon(const std::string& extra_yaml, const std::string& goal = kGoal) {
    d_ = std::make_unique<Daemon>(&fake_, extra_yaml, /*with_providers=*/true);
    ASSERT_TRUE(d_->Start()) << d_->log();
    project_ = d_->dir() + "/blinky";
    fs::copy(BLINKY_SRC_DIR, project_, fs::copy_options::recursive);
    fs::remove_all(project_ + "/build");
    fs::remove_all(project_ + "/.fwai/runs");
    fs::create_directories(project_ + "/.fwai/skills");
    std::ofstream(project_ + "/.fwai/skills/traced.yaml")
        << "name: traced\nsteps:\n"
        << "  - name: build\n    tool: build\n"
        << "  - name: look\n    agentic:\n      goal: " << goal << "\n"
        << "  - name: flash\n    tool: flash\n"
        << "  - name: unit\n    tool: test\n    command: \"true\"\n";
  }

  // Queues the agent's two replies: a read_file call, then the answer.
  void ScriptAgent() {
    FakeReply look;
    look.chunks = {"Reading the Makefile.\n"};
    look.tool_calls = {{"call-read-1", "read_file", {{"path", "Makefile"}}}};
    look.input_tokens = 120;
    look.output_tokens = 30;
    fake_.Enqueue(look);
    FakeReply answer;
    answer.chunks = {"It builds blinky.elf."};
    answer.input_tokens = 200;
    answer.output_tokens = 11;
    fake_.Enqueue(answer);
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(),
                                     "--project", project_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, {}, 240);
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  std::string project_;
};

const ReceivedSpan* Find(const std::vector<ReceivedSpan>& spans, const std::string& name) {
  for (const auto& s : spans) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<const ReceivedSpan*> ChildrenOf(const std::vector<ReceivedSpan>& spans,
                                            const ReceivedSpan& p) {
  std::vector<const ReceivedSpan*> out;
  for (const auto& s : spans) {
    if (s.parent_span_id == p.span_id && s.trace_id == p.trace_id) out.push_back(&s);
  }
  return out;
}

std::vector<std::string> Names(const std::vector<const ReceivedSpan*>& spans) {
  std::vector<std::string> out;
  for (const auto* s : spans) out.push_back(s->name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Dump(const std::vector<ReceivedSpan>& spans) {
  std::string out;
  for (const auto& s : spans) {
    out += s.name + " [" + s.span_id + " <- " + s.parent_span_id + "]";
    for (const auto& [k, v] : s.attrs) out += " " + k + "=" + v;
    out += "\n";
  }
  return out;
}

TEST_F(TelemetryTest, SkillRunWithAnAgentTurnAndAFlashIsOneSpanTree) {
  Collector collector;
  const std::string token_file = MakeTempDir("fwai-otlp") + "/token";
  std::ofstream(token_file) << kToken << "\n";
  StartDaemon("telemetry:\n  endpoint: http://127.0.0.1:" + std::to_string(collector.port()) +
              "\n  service_name: fwaid-under-test\n  headers:\n    authorization: {file: " +
              token_file + "}\n");
  ScriptAgent();
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "run", "traced", "--ci", "--yes"}, &out, &err), 0) << out << err;
  std::string evidence_json;
  ASSERT_EQ(Fwai({"evidence", "export", "--format", "json"}, &evidence_json, &err), 0) << err;
  // Stopping flushes what is batched: every span has reached the collector then.
  ASSERT_EQ(d_->Stop(), 0) << d_->log();

  const std::vector<ReceivedSpan> spans = collector.Spans();
  const std::string dump = Dump(spans);
  // The evidence log's leaf hash per record kind.
  std::map<std::string, std::string> hash_of;
  const json ev = json::parse(evidence_json);
  for (const auto& r : ev["records"]) hash_of[r["record"].value("kind", "")] = r["leaf_hash"];
  ASSERT_TRUE(hash_of.count("skill_run") && hash_of.count("agent_turn") && hash_of.count("flash"))
      << evidence_json.substr(0, 2000);

  const ReceivedSpan* run = Find(spans, "run_skill traced");
  ASSERT_NE(run, nullptr) << dump;
  EXPECT_EQ(run->parent_span_id, "") << "the run is the trace's root";
  EXPECT_EQ(run->service, "fwaid-under-test");
  EXPECT_EQ(run->attrs.at("fwai.evidence.hash"), hash_of["skill_run"]);
  EXPECT_EQ(Names(ChildrenOf(spans, *run)),
            (std::vector<std::string>{"skill_step build", "skill_step flash", "skill_step look",
                                      "test unit"}))
      << dump;

  // The agent's turn under its step: two model calls and the tool call between them.
  const ReceivedSpan* look = Find(spans, "skill_step look");
  ASSERT_NE(look, nullptr);
  auto turn_spans = ChildrenOf(spans, *look);
  ASSERT_EQ(Names(turn_spans), std::vector<std::string>{"invoke_agent main"}) << dump;
  const ReceivedSpan& turn = *turn_spans[0];
  EXPECT_EQ(turn.attrs.at("gen_ai.operation.name"), "invoke_agent");
  EXPECT_EQ(turn.attrs.at("gen_ai.agent.name"), "main");
  EXPECT_FALSE(turn.attrs.at("gen_ai.conversation.id").empty());
  EXPECT_EQ(turn.attrs.at("fwai.principal"), "uid:" + std::to_string(getuid()));
  EXPECT_EQ(turn.attrs.at("gen_ai.usage.input_tokens"), "320");
  EXPECT_EQ(turn.attrs.at("gen_ai.usage.output_tokens"), "41");
  EXPECT_EQ(turn.attrs.at("fwai.evidence.hash"), hash_of["agent_turn"]);
  auto in_turn = ChildrenOf(spans, turn);
  EXPECT_EQ(Names(in_turn),
            (std::vector<std::string>{"chat claude-sonnet-4-5", "chat claude-sonnet-4-5",
                                      "execute_tool read_file"}))
      << dump;
  int64_t input_tokens = 0;
  for (const auto* s : in_turn) {
    if (s->name == "execute_tool read_file") {
      EXPECT_EQ(s->attrs.at("gen_ai.operation.name"), "execute_tool");
      EXPECT_EQ(s->attrs.at("gen_ai.tool.name"), "read_file");
      EXPECT_EQ(s->attrs.at("gen_ai.tool.call.id"), "call-read-1");
      EXPECT_FALSE(s->error);
      EXPECT_EQ(s->attrs.count("gen_ai.tool.call.arguments"), 0u) << "arguments only when captured";
    } else {
      EXPECT_EQ(s->kind, static_cast<int>(opentelemetry::proto::trace::v1::Span::SPAN_KIND_CLIENT));
      EXPECT_EQ(s->attrs.at("gen_ai.operation.name"), "chat");
      EXPECT_EQ(s->attrs.at("gen_ai.provider.name"), "anthropic");
      EXPECT_EQ(s->attrs.at("gen_ai.request.model"), "claude-sonnet-4-5");
      EXPECT_EQ(s->attrs.count("fwai.usage.cost_usd"), 1u);
      input_tokens += std::stoll(s->attrs.at("gen_ai.usage.input_tokens"));
    }
  }
  EXPECT_EQ(input_tokens, 320);

  // The flash under its step, the boot wait under the flash.
  const ReceivedSpan* flash_step = Find(spans, "skill_step flash");
  ASSERT_NE(flash_step, nullptr);
  auto flash_spans = ChildrenOf(spans, *flash_step);
  ASSERT_EQ(Names(flash_spans), std::vector<std::string>{"flash sim-stm32vl"}) << dump;
  const ReceivedSpan& flash = *flash_spans[0];
  EXPECT_EQ(flash.attrs.at("fwai.evidence.hash"), hash_of["flash"]);
  EXPECT_EQ(flash.attrs.at("fwai.flash.booted"), "true");
  EXPECT_EQ(flash.attrs.at("fwai.image.sha256").size(), 64u);
  EXPECT_EQ(Names(ChildrenOf(spans, flash)), std::vector<std::string>{"serial_wait sim-stm32vl"})
      << dump;

  // Every span of the run is in the run's trace.
  for (const auto& s : spans) EXPECT_EQ(s.trace_id, run->trace_id) << s.name;

  // Metrics: tokens, cost, turns, flashes.
  auto totals = collector.MetricTotals();
  EXPECT_EQ(totals["gen_ai.client.token.usage"], 320 + 41);
  EXPECT_GT(totals["fwai.llm.cost"], 0);
  EXPECT_EQ(totals["fwai.agent.turns"], 1);
  EXPECT_EQ(totals["fwai.flashes"], 1);
  EXPECT_EQ(totals["fwai.lease.duration"] > 0, true) << "the run's lease ended";

  // The header reached the collector; no secret and no prompt text is in any
  // span or metric, and fwaid logged neither.
  EXPECT_EQ(collector.AuthorizationHeaders(), std::set<std::string>{kToken});
  const std::string all = collector.Everything();
  EXPECT_EQ(all.find("test-key"), std::string::npos) << "the provider's API key";
  EXPECT_EQ(all.find("otlp-token-5f0c1e"), std::string::npos);
  EXPECT_EQ(all.find("zebra-quartz-marker"), std::string::npos) << "the prompt";
  EXPECT_EQ(d_->log().find("otlp-token-5f0c1e"), std::string::npos);
}

TEST_F(TelemetryTest, ASubAgentsTurnNestsUnderItsParentsToolCall) {
  Collector collector;
  StartDaemon("telemetry:\n  endpoint: http://127.0.0.1:" + std::to_string(collector.port()) +
              "\n");
  std::ofstream(d_->project_dir() + "/main.c") << "int counter = 42;\n";
  grpc::ClientContext ctx;
  fwai::v1::CreateSessionRequest creq;
  creq.set_project_root(d_->project_dir());
  creq.set_mode("act");
  fwai::v1::Session session;
  ASSERT_TRUE(d_->sessions()->Create(&ctx, creq, &session).ok());
  FakeReply m1;  // main delegates
  m1.tool_calls = {
      {"d1", "delegateSubagent", {{"agent_type", "codebase-explorer"}, {"task", "find counter"}}}};
  fake_.Enqueue(m1);
  FakeReply e1;  // the explorer reads
  e1.tool_calls = {{"r1", "read_file", {{"path", "main.c"}}}};
  fake_.Enqueue(e1);
  FakeReply e2;
  e2.chunks = {"counter is 42 in main.c:1"};
  fake_.Enqueue(e2);
  FakeReply m2;
  m2.chunks = {"It is 42."};
  fake_.Enqueue(m2);
  auto turn_out = RunChat(*d_->sessions(), session.id(), "where is counter?");
  ASSERT_TRUE(turn_out.finished) << d_->log();
  ASSERT_EQ(d_->Stop(), 0) << d_->log();

  const auto spans = collector.Spans();
  const std::string dump = Dump(spans);
  const ReceivedSpan* main_turn = Find(spans, "invoke_agent main");
  ASSERT_NE(main_turn, nullptr) << dump;
  EXPECT_EQ(main_turn->parent_span_id, "") << "a chat turn starts its own trace";
  EXPECT_EQ(main_turn->attrs.at("gen_ai.conversation.id"), session.id());
  auto under_main = ChildrenOf(spans, *main_turn);
  EXPECT_EQ(Names(under_main),
            (std::vector<std::string>{"chat claude-sonnet-4-5", "chat claude-sonnet-4-5",
                                      "execute_tool delegateSubagent"}))
      << dump;
  const ReceivedSpan* delegate = Find(spans, "execute_tool delegateSubagent");
  ASSERT_NE(delegate, nullptr);
  EXPECT_EQ(delegate->attrs.at("gen_ai.tool.call.id"), "d1");
  auto under_delegate = ChildrenOf(spans, *delegate);
  ASSERT_EQ(Names(under_delegate), std::vector<std::string>{"invoke_agent codebase-explorer"})
      << dump;
  EXPECT_EQ(under_delegate[0]->attrs.at("gen_ai.agent.name"), "codebase-explorer");
  EXPECT_EQ(Names(ChildrenOf(spans, *under_delegate[0])),
            (std::vector<std::string>{"chat claude-sonnet-4-5", "chat claude-sonnet-4-5",
                                      "execute_tool read_file"}))
      << dump;
  EXPECT_EQ(main_turn->attrs.at("fwai.evidence.hash").size(), 64u) << "the turn's run record";
}

TEST_F(TelemetryTest, NothingIsSentWithoutATelemetrySection) {
  Collector collector;
  StartDaemon("");
  ScriptAgent();
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "run", "traced", "--ci", "--yes"}, &out, &err), 0) << out << err;
  ASSERT_EQ(d_->Stop(), 0) << d_->log();
  EXPECT_EQ(collector.exports(), 0u);
}

TEST_F(TelemetryTest, CapturedContentIsRedacted) {
  Collector collector;
  StartDaemon("telemetry:\n  endpoint: http://127.0.0.1:" + std::to_string(collector.port()) +
                  "\n  capture_content: true\n",
              "Name the image (zebra-quartz-marker) and keep AKIAIOSFODNN7EXAMPLE out of it.");
  ScriptAgent();
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "run", "traced", "--ci", "--yes"}, &out, &err), 0) << out << err;
  ASSERT_EQ(d_->Stop(), 0) << d_->log();
  const auto spans = collector.Spans();
  const ReceivedSpan* turn = Find(spans, "invoke_agent main");
  ASSERT_NE(turn, nullptr) << Dump(spans);
  const std::string message = turn->attrs.at("gen_ai.input.messages");
  EXPECT_NE(message.find("zebra-quartz-marker"), std::string::npos) << message;
  EXPECT_EQ(message.find("AKIAIOSFODNN7EXAMPLE"), std::string::npos) << message;
  const ReceivedSpan* tool = Find(spans, "execute_tool read_file");
  ASSERT_NE(tool, nullptr);
  EXPECT_EQ(json::parse(tool->attrs.at("gen_ai.tool.call.arguments"))["path"], "Makefile");
  const std::string all = collector.Everything();
  EXPECT_EQ(all.find("AKIAIOSFODNN7EXAMPLE"), std::string::npos);
  EXPECT_EQ(all.find("test-key"), std::string::npos);
}

TEST_F(TelemetryTest, AMissingHeaderVariableStopsTheStartNamingTheLine) {
  StartDaemon("");
  ASSERT_EQ(d_->Stop(), 0);
  std::ofstream(d_->dir() + "/bad.yaml")
      << "log_level: info\ntelemetry:\n  endpoint: http://127.0.0.1:4317\n  headers:\n"
      << "    authorization: {env: FWAI_TEST_UNSET_OTLP_TOKEN}\n";
  std::string out, err;
  const int rc = RunCommand(
      {std::string(FWAI_BIN_DIR) + "/fwaid", "--config", d_->dir() + "/bad.yaml", "--data-dir",
       d_->dir() + "/bad-data", "--listen", "unix:" + d_->dir() + "/bad.sock"},
      &out, &err, {}, 30);
  EXPECT_NE(rc, 0);
  EXPECT_NE(err.find("bad.yaml:5: telemetry.headers.authorization.env: variable "
                     "FWAI_TEST_UNSET_OTLP_TOKEN is not set"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace fwai::testing
