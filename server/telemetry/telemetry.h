// telemetry: OpenTelemetry traces and metrics exported over OTLP, following
// the GenAI semantic conventions (invoke_agent, chat, execute_tool) plus
// fwai's own spans (skill steps, flashes, serial waits, tests). Off unless the
// daemon's config has a `telemetry:` section; while off every call returns at
// once and nothing is allocated. The OpenTelemetry SDK stays in telemetry.cc.
//
// Spans nest through a per-thread current span: a span started without an
// explicit parent hangs under the thread's current one. Work handed to
// another thread carries its parent along (Current() there, Scope here).
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fwai {
struct TelemetryConfig;
}  // namespace fwai

namespace fwai::telemetry {

// Starts export as `config` says; OK and nothing when it is disabled. Header
// values are read here (their environment variables or files); an error names
// the config line. Call once, before any span.
[[nodiscard]] absl::Status Start(const TelemetryConfig& config, std::string_view service_version);
// Ends open work, flushes spans and metrics to the collector and stops.
void Shutdown();
// True while spans and metrics are recorded.
bool Enabled();
// True when prompt text and tool arguments may be recorded (redacted by the
// caller): telemetry.capture_content.
bool CaptureContent();

enum class Kind { kInternal, kClient, kServer };

// A handle on a span; copies share it. A default one, or any while telemetry
// is off, records nothing and each call returns at once.
class Span {
 public:
  Span() = default;
  // Starts "`op` `detail`" (just `op` when detail is empty) under `parent` if
  // it records, else under this thread's current span, else as a new trace.
  static Span Start(std::string_view op, std::string_view detail = {}, Kind kind = Kind::kInternal,
                    const Span* parent = nullptr);

  explicit operator bool() const { return rep_ != nullptr; }
  void Set(std::string_view key, std::string_view value) const;
  void SetInt(std::string_view key, int64_t value) const;
  void SetDouble(std::string_view key, double value) const;
  void SetBool(std::string_view key, bool value) const;
  // Marks the span failed with `message` (error.type "error").
  void Fail(std::string_view message) const;
  // Ends it now (later calls do nothing).
  void End() const;

  struct Rep;

 private:
  explicit Span(std::shared_ptr<Rep> rep) : rep_(std::move(rep)) {}
  friend class Scope;
  friend Span Current();
  std::shared_ptr<Rep> rep_;
};

// This thread's current span (a non-recording one if none).
Span Current();

// Makes `span` this thread's current span until destroyed; the previous one
// comes back then. Nothing happens for a span that does not record.
class Scope {
 public:
  explicit Scope(Span span);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Span span_;
  std::shared_ptr<Span::Rep> previous_;
};

// A span that is current on this thread for its lifetime and ends with it.
class ActiveSpan {
 public:
  ActiveSpan(std::string_view op, std::string_view detail = {}, Kind kind = Kind::kInternal,
             const Span* parent = nullptr)
      : span_(Span::Start(op, detail, kind, parent)), scope_(span_) {}
  ~ActiveSpan() { span_.End(); }
  ActiveSpan(const ActiveSpan&) = delete;
  ActiveSpan& operator=(const ActiveSpan&) = delete;

  const Span& span() const { return span_; }
  const Span* operator->() const { return &span_; }
  explicit operator bool() const { return static_cast<bool>(span_); }

 private:
  Span span_;
  Scope scope_;  // after span_: made from it
};

// gen_ai.provider.name for a provider kind (anthropic, openai, gemini, ollama).
std::string_view ProviderName(std::string_view kind);

// The evidence record the current span's work produced: sets
// fwai.evidence.hash (the record's leaf hash, hex) on this thread's span.
void NoteEvidence(std::string_view leaf_hash_hex);

// Metrics (each a no-op while off).
// gen_ai.client.token.usage, gen_ai.client.operation.duration, fwai.llm.cost.
void RecordModelCall(std::string_view provider, std::string_view model, int64_t input_tokens,
                     int64_t output_tokens, double cost_usd, double seconds);
// fwai.agent.turns (main agents' turns).
void RecordTurn(std::string_view stop_reason);
// fwai.flashes.
void RecordFlash(std::string_view board, bool ok);
// fwai.lease.duration: how long a board lease was held.
void RecordLease(std::string_view board, double seconds);

}  // namespace fwai::telemetry
