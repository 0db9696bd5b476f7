// llm: the Provider interface and the request/response types every adapter
// converts to and from. Content blocks are Anthropic-style JSON objects
// ({"type":"text"|"tool_use"|"tool_result", ...}).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "common/config.h"
#include "common/tool_spec.h"

namespace fwai {

struct LlmMessage {
  std::string role;  // "user" | "assistant"
  nlohmann::json content = nlohmann::json::array();
};

struct ChatRequest {
  std::string model;
  std::string system;
  std::vector<LlmMessage> messages;
  std::vector<ToolSpecPtr> tools;  // shared: offering a tool copies no schema
  int max_tokens = 4096;
  double temperature = -1;  // < 0: provider default
};

struct ChatResult {
  nlohmann::json content = nlohmann::json::array();  // assistant content blocks
  std::string stop_reason;  // end_turn | tool_use | max_tokens | stop_sequence
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
};

// Receives the stream as it arrives. Called on the turn's thread.
class StreamObserver {
 public:
  virtual ~StreamObserver() = default;
  virtual void OnText(std::string_view text) = 0;
  virtual void OnThinking(std::string_view text) {}
  virtual void OnToolUseStart(const std::string& id, const std::string& name) {}
  // A retry is about to happen after `delay_ms` because of `why`.
  virtual void OnRetry(int attempt, int delay_ms, const std::string& why) {}
};

class Provider {
 public:
  virtual ~Provider() = default;
  // Streams one assistant message. Errors carry the provider's own message:
  // UNAUTHENTICATED (names the key variable), RESOURCE_EXHAUSTED (rate limit
  // after retries), UNAVAILABLE (connection / 5xx after retries, stream cut),
  // CANCELLED, INVALID_ARGUMENT (request refused).
  [[nodiscard]] virtual absl::StatusOr<ChatResult> Stream(const ChatRequest& request,
                                                          StreamObserver& observer,
                                                          CancelToken& cancel) = 0;
  virtual const ProviderConfig& config() const = 0;
};

class Clock;
class HttpClient;

// Builds a provider from its config. `http` must outlive the provider, and
// so must `clock` (null: the system's), on which it waits between attempts
// (a backoff, a Retry-After).
std::unique_ptr<Provider> MakeProvider(const ProviderConfig& config, const RetryConfig& retry,
                                       HttpClient& http, const Clock* clock = nullptr);

}  // namespace fwai
