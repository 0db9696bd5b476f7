// A fake LLM service for tests and benchmarks: a real HTTP/1.1 server on
// 127.0.0.1 that answers the Anthropic Messages API (POST /v1/messages) and
// OpenAI Chat Completions (POST /v1/chat/completions) with their documented
// streaming wire formats (SSE event names and JSON shapes), driven by a script
// of replies; and rerank APIs (POST .../rerank, TEI and Cohere/Jina shapes).
// Every request is recorded.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace fwai::testing {

struct FakeToolCall {
  std::string id;
  std::string name;
  nlohmann::json input = nlohmann::json::object();
};

struct FakeReply {
  int status = 200;        // non-2xx: an error body in the provider's format
  std::string error_type;  // e.g. "rate_limit_error"
  std::string error_message;
  int retry_after_s = -1;           // sets the retry-after header when >= 0
  int retry_after_ms = -1;          // sets the retry-after-ms header when >= 0
  std::vector<std::string> chunks;  // text deltas, in order
  std::vector<FakeToolCall> tool_calls;
  int chunk_delay_ms = 0;     // pause before each chunk
  int cut_after_chunks = -1;  // close the connection after N text chunks
  bool malformed = false;     // send one event whose data is not JSON
  std::string raw_body;       // when set: the whole 200 body, exactly these bytes
  std::string stop_reason;    // default: end_turn / tool_use
  int64_t input_tokens = 12;
  int64_t output_tokens = 7;
  // Benchmark mode: `bench_chunks` deltas, each "<monotonic ns>;" padded to
  // `bench_chunk_bytes`, sent as fast as possible or, with `chunk_delay_ms`,
  // each when it is due (i + 1 pauses after the stream's start), however
  // late the server's thread runs.
  int bench_chunks = 0;
  int bench_chunk_bytes = 32;
  // When set, only a request whose first user message contains this text
  // takes the reply (so parallel sub-agents get their own replies whatever
  // order their requests arrive in). Replies without it serve any request.
  std::string match;
};

// A reply as JSON: {"chunks": [...], "tool_calls": [{"id", "name", "input"}],
// "status", "error_type", "error_message", "retry_after_s", "retry_after_ms",
// "chunk_delay_ms",
// "stop_reason", "input_tokens", "output_tokens", "bench_chunks",
// "bench_chunk_bytes", "match"}. Unknown keys are an error naming the key.
[[nodiscard]] bool FakeReplyFromJson(const nlohmann::json& j, FakeReply* out, std::string* error);

struct RecordedRequest {
  std::string path;
  std::vector<std::pair<std::string, std::string>> headers;  // lowercase names
  nlohmann::json body;
  int64_t received_ns = 0;   // CLOCK_MONOTONIC when the whole request was read
  int64_t responded_ns = 0;  // when the last byte of the reply was written
  std::string Header(const std::string& name) const;
};

class FakeLlmServer {
 public:
  FakeLlmServer();
  ~FakeLlmServer();
  // Binds 127.0.0.1:0 and starts serving. Returns the port.
  int Start();
  void Stop();
  int port() const { return port_; }
  std::string anthropic_base_url() const;  // http://127.0.0.1:PORT
  std::string openai_base_url() const;     // http://127.0.0.1:PORT/v1
  std::string gemini_base_url() const { return anthropic_base_url(); }
  std::string ollama_base_url() const { return anthropic_base_url(); }

  // Replies are consumed in order by any request; with none queued the
  // server answers with the text "ok".
  void Enqueue(FakeReply reply);
  // When set, requests without this key get 401 in the provider's format.
  void RequireKey(const std::string& key);
  std::vector<RecordedRequest> requests();
  size_t request_count();
  // Replies still queued.
  size_t pending_replies();
  // CPU seconds the connections' threads have used, counted as each ends
  // (a benchmark's harness tells the provider's share of its CPU from it).
  double served_cpu_s() const { return served_cpu_ns_.load() / 1e9; }

  // Besides the provider APIs the server answers a control API, for clients
  // that drive it from another process (see fwai_fake_llm):
  //   POST /_fake/replies   a JSON array of replies (or one) to enqueue
  //   GET  /_fake/requests  every provider request so far: [{path, body}]
  //   GET  /_fake/state     {"requests": N, "pending": N}
  //   POST /_fake/reset     drops queued replies and recorded requests

 private:
  void AcceptLoop();
  void Serve(int fd);
  void ServeRerank(int fd, const RecordedRequest& req);
  FakeReply Next(const nlohmann::json& body);
  void ServeControl(int fd, const RecordedRequest& req);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::deque<FakeReply> replies_;
  std::vector<RecordedRequest> requests_;
  std::string required_key_;
  std::vector<std::thread> conn_threads_;
  std::atomic<int64_t> served_cpu_ns_{0};
};

}  // namespace fwai::testing
