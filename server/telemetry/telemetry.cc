#include "server/telemetry/telemetry.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/mutex.h"
#include "opentelemetry/context/context.h"
#include "opentelemetry/exporters/otlp/otlp_grpc_exporter_factory.h"
#include "opentelemetry/exporters/otlp/otlp_grpc_exporter_options.h"
#include "opentelemetry/exporters/otlp/otlp_grpc_metric_exporter_factory.h"
#include "opentelemetry/exporters/otlp/otlp_grpc_metric_exporter_options.h"
#include "opentelemetry/metrics/meter.h"
#include "opentelemetry/metrics/sync_instruments.h"
#include "opentelemetry/sdk/metrics/export/periodic_exporting_metric_reader_factory.h"
#include "opentelemetry/sdk/metrics/meter_provider.h"
#include "opentelemetry/sdk/metrics/meter_provider_factory.h"
#include "opentelemetry/sdk/metrics/view/view_registry.h"
#include "opentelemetry/sdk/resource/resource.h"
#include "opentelemetry/sdk/trace/batch_span_processor_factory.h"
#include "opentelemetry/sdk/trace/batch_span_processor_options.h"
#include "opentelemetry/sdk/trace/tracer_provider.h"
#include "opentelemetry/sdk/trace/tracer_provider_factory.h"
#include "opentelemetry/trace/span.h"
#include "opentelemetry/trace/span_startoptions.h"
#include "opentelemetry/trace/tracer.h"

namespace fwai::telemetry {

namespace otel = opentelemetry;
namespace otlp = opentelemetry::exporter::otlp;
namespace sdktrace = opentelemetry::sdk::trace;
namespace sdkmetrics = opentelemetry::sdk::metrics;

struct Span::Rep {
  otel::nostd::shared_ptr<otel::trace::Span> span;
  std::atomic<bool> ended{false};
  ~Rep() {
    if (!ended.exchange(true)) span->End();
  }
};

namespace {

// Everything export needs; built by Start, torn down by Shutdown.
struct State {
  std::unique_ptr<sdktrace::TracerProvider> tracer_provider;
  otel::nostd::shared_ptr<otel::trace::Tracer> tracer;
  std::unique_ptr<sdkmetrics::MeterProvider> meter_provider;
  otel::nostd::unique_ptr<otel::metrics::Histogram<uint64_t>> tokens;
  otel::nostd::unique_ptr<otel::metrics::Histogram<double>> operation_duration;
  otel::nostd::unique_ptr<otel::metrics::Counter<double>> cost;
  otel::nostd::unique_ptr<otel::metrics::Counter<uint64_t>> turns;
  otel::nostd::unique_ptr<otel::metrics::Counter<uint64_t>> flashes;
  otel::nostd::unique_ptr<otel::metrics::Histogram<double>> lease_duration;
  bool capture_content = false;
};

std::atomic<bool> g_enabled{false};
Mutex g_mu;  // Start and Shutdown
// Set once by Start (under g_mu, before g_enabled is stored) and kept until
// exit after Shutdown; readers load it lock-free after Enabled() (acquire),
// so it is not ABSL_GUARDED_BY(g_mu).
State* g_state = nullptr;

thread_local std::shared_ptr<Span::Rep> t_current;

otel::nostd::string_view View(std::string_view s) { return {s.data(), s.size()}; }

otel::trace::SpanKind ToKind(Kind k) {
  switch (k) {
    case Kind::kClient:
      return otel::trace::SpanKind::kClient;
    case Kind::kServer:
      return otel::trace::SpanKind::kServer;
    case Kind::kInternal:
      break;
  }
  return otel::trace::SpanKind::kInternal;
}

absl::StatusOr<std::string> HeaderValue(const TelemetryHeader& h) {
  if (!h.env.empty()) {
    const char* v = std::getenv(h.env.c_str());
    if (v == nullptr || *v == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat(h.where, ".env: variable ", h.env, " is not set"));
    }
    return std::string(v);
  }
  std::ifstream in(h.file);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(h.where, ".file: cannot read ", h.file));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string v = ss.str();
  while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
  if (v.empty())
    return absl::InvalidArgumentError(absl::StrCat(h.where, ".file: ", h.file, " is empty"));
  return v;
}

// The gRPC exporters' target: HOST:PORT, TLS for https://.
void ClientOptions(const TelemetryConfig& c, const otlp::OtlpHeaders& headers,
                   otlp::OtlpGrpcClientOptions& o) {
  const bool tls = c.endpoint.rfind("https://", 0) == 0;
  o.endpoint = c.endpoint.substr(tls ? 8 : 7);
  o.use_ssl_credentials = tls;
  o.ssl_credentials_cacert_path = tls ? c.ca_file : "";
  o.metadata = headers;  // only ours, none from OTEL_* variables
  o.timeout = std::chrono::seconds(10);
}

}  // namespace

absl::Status Start(const TelemetryConfig& config, std::string_view service_version) {
  if (!config.enabled) return absl::OkStatus();
  otlp::OtlpHeaders headers;
  for (const auto& h : config.headers) {
    auto v = HeaderValue(h);
    if (!v.ok()) return v.status();
    headers.emplace(h.name, *v);
  }
  auto state = std::make_unique<State>();
  state->capture_content = config.capture_content;
  const auto resource = otel::sdk::resource::Resource::Create(
      {{"service.name", config.service_name}, {"service.version", std::string(service_version)}});

  otlp::OtlpGrpcExporterOptions span_opts;
  ClientOptions(config, headers, span_opts);
  sdktrace::BatchSpanProcessorOptions batch;
  batch.schedule_delay_millis = std::chrono::milliseconds(config.span_batch_delay_ms);
  state->tracer_provider = sdktrace::TracerProviderFactory::Create(
      sdktrace::BatchSpanProcessorFactory::Create(otlp::OtlpGrpcExporterFactory::Create(span_opts),
                                                  batch),
      resource);
  state->tracer = state->tracer_provider->GetTracer("fwaid", View(service_version));

  otlp::OtlpGrpcMetricExporterOptions metric_opts;
  ClientOptions(config, headers, metric_opts);
  sdkmetrics::PeriodicExportingMetricReaderOptions reader_opts;
  reader_opts.export_interval_millis = std::chrono::milliseconds(config.metrics_interval_ms);
  reader_opts.export_timeout_millis =
      std::min(reader_opts.export_interval_millis, std::chrono::milliseconds(10000));
  state->meter_provider = sdkmetrics::MeterProviderFactory::Create(
      std::make_unique<sdkmetrics::ViewRegistry>(), resource);
  state->meter_provider->AddMetricReader(sdkmetrics::PeriodicExportingMetricReaderFactory::Create(
      otlp::OtlpGrpcMetricExporterFactory::Create(metric_opts), reader_opts));
  auto meter = state->meter_provider->GetMeter("fwaid", View(service_version));
  state->tokens = meter->CreateUInt64Histogram("gen_ai.client.token.usage",
                                               "Tokens used per model call", "{token}");
  state->operation_duration = meter->CreateDoubleHistogram("gen_ai.client.operation.duration",
                                                           "Duration of a model call", "s");
  state->cost = meter->CreateDoubleCounter("fwai.llm.cost", "Cost of model calls", "USD");
  state->turns = meter->CreateUInt64Counter("fwai.agent.turns", "Agent turns finished", "{turn}");
  state->flashes = meter->CreateUInt64Counter("fwai.flashes", "Boards flashed", "{flash}");
  state->lease_duration =
      meter->CreateDoubleHistogram("fwai.lease.duration", "How long a board lease was held", "s");

  MutexLock lock(&g_mu);
  if (g_state != nullptr) return absl::FailedPreconditionError("telemetry: started twice");
  g_state = state.release();
  g_enabled.store(true, std::memory_order_release);
  return absl::OkStatus();
}

void Shutdown() {
  MutexLock lock(&g_mu);
  if (g_state == nullptr || !g_enabled.exchange(false)) return;
  // Spans still open when the daemon stops are lost; the finished ones go now.
  g_state->tracer_provider->ForceFlush(std::chrono::seconds(10));
  g_state->tracer_provider->Shutdown();
  g_state->meter_provider->ForceFlush(std::chrono::seconds(10));
  g_state->meter_provider->Shutdown();
  // g_state stays: a thread may still hold an instrument pointer it loaded.
}

bool Enabled() { return g_enabled.load(std::memory_order_acquire); }

bool CaptureContent() { return Enabled() && g_state->capture_content; }

std::string_view ProviderName(std::string_view kind) {
  if (kind == "gemini") return "gcp.gemini";
  return kind;  // anthropic, openai, ollama
}

Span Span::Start(std::string_view op, std::string_view detail, Kind kind, const Span* parent) {
  if (!Enabled()) return Span();
  std::string name(op);
  if (!detail.empty()) name.append(" ").append(detail);
  otel::trace::StartSpanOptions opts;
  opts.kind = ToKind(kind);
  const Rep* under = parent != nullptr && parent->rep_ ? parent->rep_.get() : t_current.get();
  if (under != nullptr) {
    opts.parent = under->span->GetContext();
  } else {
    otel::context::Context root;
    opts.parent = root.SetValue(otel::trace::kIsRootSpanKey, true);
  }
  auto rep = std::make_shared<Rep>();
  rep->span = g_state->tracer->StartSpan(name, opts);
  return Span(std::move(rep));
}

void Span::Set(std::string_view key, std::string_view value) const {
  if (rep_) rep_->span->SetAttribute(View(key), View(value));
}

void Span::SetInt(std::string_view key, int64_t value) const {
  if (rep_) rep_->span->SetAttribute(View(key), value);
}

void Span::SetDouble(std::string_view key, double value) const {
  if (rep_) rep_->span->SetAttribute(View(key), value);
}

void Span::SetBool(std::string_view key, bool value) const {
  if (rep_) rep_->span->SetAttribute(View(key), value);
}

void Span::Fail(std::string_view message) const {
  if (!rep_) return;
  rep_->span->SetStatus(otel::trace::StatusCode::kError, View(message));
  rep_->span->SetAttribute("error.type", "error");
}

void Span::End() const {
  if (rep_ && !rep_->ended.exchange(true)) rep_->span->End();
}

Span Current() { return Span(t_current); }

Scope::Scope(Span span) : span_(std::move(span)) {
  if (!span_) return;
  previous_ = std::move(t_current);
  t_current = span_.rep_;
}

Scope::~Scope() {
  if (span_) t_current = std::move(previous_);
}

void NoteEvidence(std::string_view leaf_hash_hex) {
  if (Enabled() && t_current)
    t_current->span->SetAttribute("fwai.evidence.hash", View(leaf_hash_hex));
}

void RecordModelCall(std::string_view provider, std::string_view model, int64_t input_tokens,
                     int64_t output_tokens, double cost_usd, double seconds) {
  if (!Enabled()) return;
  const std::string p(ProviderName(provider)), m(model);
  using KV = std::pair<std::string, std::string>;
  auto attrs = [&](const char* type) {
    return std::vector<KV>{{"gen_ai.operation.name", "chat"},
                           {"gen_ai.provider.name", p},
                           {"gen_ai.request.model", m},
                           {"gen_ai.token.type", type}};
  };
  const auto ctx = otel::context::Context{};
  g_state->tokens->Record(static_cast<uint64_t>(std::max<int64_t>(input_tokens, 0)), attrs("input"),
                          ctx);
  g_state->tokens->Record(static_cast<uint64_t>(std::max<int64_t>(output_tokens, 0)),
                          attrs("output"), ctx);
  std::vector<KV> call = {
      {"gen_ai.operation.name", "chat"}, {"gen_ai.provider.name", p}, {"gen_ai.request.model", m}};
  g_state->operation_duration->Record(seconds, call, ctx);
  g_state->cost->Add(cost_usd, call);
}

void RecordTurn(std::string_view stop_reason) {
  if (!Enabled()) return;
  g_state->turns->Add(1, std::vector<std::pair<std::string, std::string>>{
                             {"fwai.stop_reason", std::string(stop_reason)}});
}

void RecordFlash(std::string_view board, bool ok) {
  if (!Enabled()) return;
  g_state->flashes->Add(
      1, std::vector<std::pair<std::string, std::string>>{{"fwai.board", std::string(board)},
                                                          {"fwai.outcome", ok ? "ok" : "failed"}});
}

void RecordLease(std::string_view board, double seconds) {
  if (!Enabled()) return;
  g_state->lease_duration->Record(
      seconds, std::vector<std::pair<std::string, std::string>>{{"fwai.board", std::string(board)}},
      otel::context::Context{});
}

}  // namespace fwai::telemetry
