// Anthropic Messages API and OpenAI Chat Completions adapters, sharing one
// retrying HTTP driver.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "server/llm/http_client.h"
#include "server/llm/line_splitter.h"
#include "server/llm/provider.h"
#include "server/llm/sse_parser.h"

namespace fwai {
namespace {

using json = nlohmann::json;

bool RetryableHttp(int status) {
  return status == 408 || status == 409 || status == 429 || status == 500 || status == 502 ||
         status == 503 || status == 504 || status == 529;
}

// The provider's own error message out of an error body, if it has one.
std::string ErrorMessageFromBody(const std::string& body, std::string* type) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object()) {
      if (type && e.contains("type") && e["type"].is_string()) *type = e["type"].get<std::string>();
      if (e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    } else if (e.is_string()) {
      return e.get<std::string>();
    }
  }
  std::string s = body.substr(0, 300);
  return s;
}

// A token count from a usage object: a non-negative integer, else
// `fallback`. Usage is informational: nonsense from a server (a negative, a
// float, a string) must not break the turn, nor overflow a sum.
int64_t Count(const json& usage, const char* key, int64_t fallback = 0) {
  constexpr uint64_t kMaxCount = uint64_t{1} << 40;  // far above any context window
  if (!usage.is_object()) return fallback;
  auto it = usage.find(key);
  if (it == usage.end() || !it->is_number_integer() ||
      (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
    return fallback;
  }
  return static_cast<int64_t>(std::min(it->get<uint64_t>(), kMaxCount));
}

// Names of the tools called in a conversation, by tool_use id (Gemini and
// Ollama answer a function by name).
std::map<std::string, std::string> ToolNamesById(const std::vector<LlmMessage>& msgs) {
  std::map<std::string, std::string> out;
  for (const auto& m : msgs) {
    for (const auto& b : m.content) {
      if (b.value("type", "") == "tool_use") out[b.value("id", "")] = b.value("name", "");
    }
  }
  return out;
}

std::string ToolResultText(const json& block) {
  std::string content;
  const json& c = block.contains("content") ? block["content"] : json();
  if (c.is_string()) {
    content = c.get<std::string>();
  } else if (c.is_array()) {
    for (const auto& part : c) content += part.value("text", "");
  }
  if (block.value("is_error", false)) content = "ERROR: " + content;
  return content;
}

// A tool in the OpenAI function-calling shape (OpenAI and Ollama).
json FunctionTool(const ToolSpec& t) {
  return {{"type", "function"},
          {"function",
           {{"name", t.name}, {"description", t.description}, {"parameters", t.input_schema}}}};
}

// "[t1,t2,...]": the tools in `shape`, each tool's text rendered once and kept
// by its spec (the same tools are offered on every call).
std::string ToolsArray(const std::vector<ToolSpecPtr>& tools, ToolShape shape,
                       ToolSpec::Render render) {
  std::string out = "[";
  for (const ToolSpecPtr& t : tools) {
    if (out.size() > 1) out += ',';
    out += t->Text(shape, render);
  }
  out += ']';
  return out;
}

// Adds "key":value (`value` is JSON text) as the last member of `object`, the
// JSON text of an object.
void AddMember(std::string& object, std::string_view key, std::string_view value) {
  object.pop_back();  // the closing brace
  if (object.size() > 1) object += ',';
  object += json(std::string(key)).dump();
  object += ':';
  object += value;
  object += '}';
}

// Chat messages in the OpenAI shape (OpenAI and Ollama): the system prompt,
// then per message its tool results as role "tool" messages, followed by the
// assistant's text and tool calls or the user's text. `call` and `result`
// shape the tool parts; `null_empty` sends an assistant message without text
// as content null (OpenAI) rather than "" (Ollama).
json ChatMessages(const ChatRequest& r, const std::function<json(const json&)>& call,
                  const std::function<json(const json&)>& result, bool null_empty) {
  json msgs = json::array();
  if (!r.system.empty()) msgs.push_back({{"role", "system"}, {"content", r.system}});
  for (const auto& m : r.messages) {
    std::string text;
    json calls = json::array();
    for (const auto& block : m.content) {
      const std::string t = block.value("type", "");
      if (t == "text") {
        text += block.value("text", "");
      } else if (t == "tool_use") {
        calls.push_back(call(block));
      } else if (t == "tool_result") {
        msgs.push_back(result(block));
      }
    }
    if (m.role == "assistant") {
      json a = {{"role", "assistant"}};
      a["content"] = text.empty() && null_empty ? json(nullptr) : json(text);
      if (!calls.empty()) a["tool_calls"] = calls;
      msgs.push_back(a);
    } else if (!text.empty()) {
      msgs.push_back({{"role", "user"}, {"content", text}});
    }
  }
  return msgs;
}

// Per-attempt parse state; each provider fills `result` from stream events.
// Providers are shared by concurrent turns, so nothing per-stream lives in them.
struct ToolCallAcc {
  std::string id, name, args;
};
struct StreamState {
  ChatResult result;
  bool done = false;
  absl::Status error;
  bool emitted = false;                   // something reached the observer
  std::vector<std::string> partial_json;  // Anthropic: tool input (or text) per block
  std::vector<bool> open;                 // Anthropic: the block's deltas may still come
  std::string text;                       // OpenAI: accumulated text
  std::vector<ToolCallAcc> calls;         // OpenAI: tool calls by index
  std::string finish_reason;              // OpenAI
};

class HttpProvider : public Provider {
 public:
  HttpProvider(ProviderConfig config, RetryConfig retry, HttpClient& http, const Clock& clock)
      : config_(std::move(config)), retry_(retry), http_(http), clock_(clock) {}

  const ProviderConfig& config() const override { return config_; }

  absl::StatusOr<ChatResult> Stream(const ChatRequest& request, StreamObserver& observer,
                                    CancelToken& cancel) override {
    const std::string key = ResolveApiKey(config_);
    if (key.empty() && NeedsKey()) {
      return absl::FailedPreconditionError(absl::StrCat(
          config_.name, ": no API key; set ",
          config_.api_key_env.empty() ? "api_key" : config_.api_key_env,
          " in the daemon's environment or providers.", config_.name, ".api_key in fwaid.yaml"));
    }
    HttpRequest http_req;
    http_req.url = Url();
    http_req.headers = Headers(key);
    http_req.headers.push_back("Content-Type: application/json");
    http_req.headers.push_back(Ndjson() ? "Accept: application/x-ndjson"
                                        : "Accept: text/event-stream");
    // Text cut mid-character anywhere upstream is sent as U+FFFD, not thrown.
    http_req.body = Body(request).dump(-1, ' ', false, json::error_handler_t::replace);
    if (!request.tools.empty()) AddMember(http_req.body, "tools", ToolsValue(request.tools));
    http_req.connect_timeout_s = config_.connect_timeout_s;
    http_req.idle_timeout_s = config_.idle_timeout_s;
    int backoff = retry_.initial_backoff_ms;
    for (int attempt = 1;; ++attempt) {
      StreamState st;
      SseParser parser;
      LineSplitter lines;
      bool partial = false;
      auto on_data = [&](std::string_view bytes) {
        if (Ndjson()) {
          lines.Feed(bytes, [&](std::string_view line) {
            if (st.done || !st.error.ok()) return;
            SseEvent ev;
            ev.data = std::string(line);
            HandleEvent(ev, st, observer);
          });
          return;
        }
        parser.Feed(bytes, [&](const SseEvent& ev) {
          if (st.done || !st.error.ok()) return;
          HandleEvent(ev, st, observer);
        });
      };
      auto resp = http_.PostStream(http_req, on_data, cancel, &partial);
      const bool last = attempt >= retry_.max_attempts;
      std::string why;
      int delay = 0;
      if (!resp.ok()) {
        if (absl::IsCancelled(resp.status()) || cancel.cancelled()) {
          return absl::CancelledError("turn cancelled");
        }
        if (partial || st.emitted) {
          return absl::UnavailableError(absl::StrCat(
              config_.name, ": the response stream was cut: ", resp.status().message()));
        }
        if (last) {
          return absl::UnavailableError(absl::StrCat(config_.name, ": ", resp.status().message(),
                                                     " (after ", attempt, " attempts)"));
        }
        why = std::string(resp.status().message());
      } else if (resp->status >= 200 && resp->status < 300) {
        if (!st.error.ok()) return st.error;
        OnStreamEnd(st);
        if (!st.error.ok()) return st.error;
        if (!st.done) {
          return absl::UnavailableError(absl::StrCat(
              config_.name, ": the response stream was cut before the message was complete"));
        }
        return std::move(st.result);
      } else {
        std::string type;
        std::string msg = ErrorMessageFromBody(resp->body, &type);
        const int code = resp->status;
        std::string full =
            absl::StrCat(config_.name, ": HTTP ", code, type.empty() ? "" : " ", type, ": ", msg);
        if (code == 401 || code == 403) {
          return absl::UnauthenticatedError(absl::StrCat(
              full, " — check the API key in ",
              config_.api_key.empty() ? config_.api_key_env
                                      : absl::StrCat("providers.", config_.name, ".api_key")));
        }
        if (!RetryableHttp(code) || last) {
          if (code == 429)
            return absl::ResourceExhaustedError(
                absl::StrCat(full, " (after ", attempt, " attempts)"));
          if (code >= 500)
            return absl::UnavailableError(absl::StrCat(full, " (after ", attempt, " attempts)"));
          if (code == 404) return absl::NotFoundError(full);
          return absl::InvalidArgumentError(full);
        }
        why = full;
        auto ra = resp->headers.find("retry-after");
        if (ra != resp->headers.end()) {
          double secs = std::atof(ra->second.c_str());
          if (secs > 0) delay = static_cast<int>(std::min(secs * 1000, 120000.0));
        }
        auto ram = resp->headers.find("retry-after-ms");
        if (ram != resp->headers.end()) {
          double ms = std::atof(ram->second.c_str());
          if (ms > 0) delay = static_cast<int>(std::min(ms, 120000.0));
        }
      }
      if (delay == 0) {
        std::uniform_int_distribution<int> jitter(0, std::max(1, backoff / 4));
        // Seeded once per thread, on its first retry: a call that never
        // retries never touches it.
        thread_local std::mt19937 rng(std::random_device{}());
        delay = std::min(backoff, retry_.max_backoff_ms) + jitter(rng);
        backoff = std::min(backoff * 2, retry_.max_backoff_ms);
      }
      observer.OnRetry(attempt, delay, why);
      if (clock_.SleepFor(int64_t{delay} * 1000, &cancel)) {
        return absl::CancelledError("turn cancelled");
      }
    }
  }

 protected:
  virtual std::string Url() const = 0;
  virtual std::vector<std::string> Headers(const std::string& key) const = 0;
  // The request without its tools (they are added as ToolsValue's text).
  virtual json Body(const ChatRequest& request) const = 0;
  // The JSON text of the request's "tools" member for these (not empty) tools.
  virtual std::string ToolsValue(const std::vector<ToolSpecPtr>& tools) const = 0;
  virtual void HandleEvent(const SseEvent& ev, StreamState& st, StreamObserver& observer) = 0;
  // Newline-delimited JSON instead of SSE (each line handed over as `data`).
  virtual bool Ndjson() const { return false; }
  virtual bool NeedsKey() const { return true; }
  // The body ended cleanly; a provider may complete a message here.
  virtual void OnStreamEnd(StreamState& st) {}

  absl::Status Malformed(const std::string& what) const {
    return absl::UnavailableError(absl::StrCat(config_.name, ": malformed stream event: ", what));
  }

  // An event's data as a JSON object; on anything else `st.error` says what
  // came instead and the result is null.
  json EventJson(const SseEvent& ev, StreamState& st, const std::string& what) const {
    json j = json::parse(ev.data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      st.error = Malformed(absl::StrCat(what, " is not JSON: ", ev.data.substr(0, 200)));
      return nullptr;
    }
    return j;
  }

  const ProviderConfig config_;
  const RetryConfig retry_;
  HttpClient& http_;
  const Clock& clock_;
};

// ---------------------------------------------------------------------------
// Anthropic Messages API: POST {base}/v1/messages with "stream": true.
class AnthropicProvider final : public HttpProvider {
 public:
  using HttpProvider::HttpProvider;

 protected:
  std::string Url() const override { return config_.base_url + "/v1/messages"; }
  std::vector<std::string> Headers(const std::string& key) const override {
    return {"x-api-key: " + key, "anthropic-version: 2023-06-01"};
  }
  json Body(const ChatRequest& r) const override {
    json b;
    b["model"] = r.model;
    b["max_tokens"] = r.max_tokens;
    b["stream"] = true;
    if (!r.system.empty()) b["system"] = r.system;
    if (r.temperature >= 0) b["temperature"] = r.temperature;
    b["messages"] = json::array();
    for (const auto& m : r.messages)
      b["messages"].push_back({{"role", m.role}, {"content", m.content}});
    return b;
  }
  std::string ToolsValue(const std::vector<ToolSpecPtr>& tools) const override {
    return ToolsArray(tools, ToolShape::kAnthropic, [](const ToolSpec& t) -> json {
      return {{"name", t.name}, {"description", t.description}, {"input_schema", t.input_schema}};
    });
  }

  void HandleEvent(const SseEvent& ev, StreamState& st, StreamObserver& obs) override {
    if (ev.event == "ping") return;
    json j = EventJson(ev, st, absl::StrCat("event '", ev.event, "' data"));
    if (j.is_null()) return;
    std::string type = ev.event;
    if (auto t = j.find("type"); t != j.end() && t->is_string()) type = t->get<std::string>();
    try {
      if (type == "message_start") {
        const json& u = j.at("message").value("usage", json::object());
        st.result.input_tokens = Count(u, "input_tokens") + Count(u, "cache_read_input_tokens") +
                                 Count(u, "cache_creation_input_tokens");
        st.result.output_tokens = Count(u, "output_tokens");
      } else if (type == "content_block_start") {
        // Blocks come in order: the index names the next one.
        const json& index = j.at("index");
        const size_t next = st.result.content.size();
        if (!index.is_number_unsigned() || index.get<uint64_t>() != next) {
          st.error = Malformed(absl::StrCat("content_block_start for block ", index.dump(),
                                            " when block ", next, " comes next"));
          return;
        }
        json block = j.at("content_block");
        if (!block.is_object() || !block.contains("type") || !block["type"].is_string()) {
          st.error = Malformed("content_block_start without a block type");
          return;
        }
        const std::string btype = block["type"].get<std::string>();
        std::string text;
        if (btype == "tool_use") {
          if (!block.contains("id") || !block["id"].is_string() || !block.contains("name") ||
              !block["name"].is_string()) {
            st.error = Malformed("tool_use block without a string id and name");
            return;
          }
          block["input"] = json::object();
          obs.OnToolUseStart(block["id"].get<std::string>(), block["name"].get<std::string>());
          st.emitted = true;
        } else if (btype == "text" || btype == "thinking") {
          if (block.contains(btype)) {
            if (!block[btype].is_string()) {
              st.error = Malformed(absl::StrCat(btype, " block whose ", btype, " is not a string"));
              return;
            }
            text = block[btype].get<std::string>();
          }
          block[btype] = "";
        }
        st.partial_json.push_back(std::move(text));
        st.open.push_back(true);
        st.result.content.push_back(std::move(block));
      } else if (type == "content_block_delta") {
        const size_t index = OpenBlock(j, st, "content_block_delta");
        if (index == kNoBlock) return;
        const json& d = j.at("delta");
        const std::string dt = d.value("type", "");
        json& block = st.result.content[index];
        // Text is accumulated per block and stored in the block at its stop:
        // appending to the JSON string on every delta would be quadratic.
        if (dt == "text_delta") {
          const std::string& text = d.at("text").get_ref<const std::string&>();
          st.partial_json[index] += text;
          obs.OnText(text);
          st.emitted = true;
        } else if (dt == "input_json_delta") {
          st.partial_json[index] += d.at("partial_json").get<std::string>();
        } else if (dt == "thinking_delta") {
          const std::string& text = d.at("thinking").get_ref<const std::string&>();
          st.partial_json[index] += text;
          obs.OnThinking(text);
          st.emitted = true;
        } else if (dt == "signature_delta") {
          block["signature"] = block.value("signature", "") + d.at("signature").get<std::string>();
        }
      } else if (type == "content_block_stop") {
        const size_t index = OpenBlock(j, st, "content_block_stop");
        if (index == kNoBlock) return;
        FinishBlock(st, index);
      } else if (type == "message_delta") {
        if (j.contains("delta") && j["delta"].contains("stop_reason") &&
            j["delta"]["stop_reason"].is_string()) {
          st.result.stop_reason = j["delta"]["stop_reason"].get<std::string>();
        }
        if (j.contains("usage"))
          st.result.output_tokens = Count(j["usage"], "output_tokens", st.result.output_tokens);
      } else if (type == "message_stop") {
        // A block the server never stopped ends with the message.
        for (size_t i = 0; i < st.result.content.size() && st.error.ok(); ++i) FinishBlock(st, i);
        if (!st.error.ok()) return;
        st.done = true;
        st.partial_json.clear();
      } else if (type == "error") {
        std::string etype = j.contains("error") ? j["error"].value("type", "error") : "error";
        std::string msg = j.contains("error") ? j["error"].value("message", "") : ev.data;
        st.error = absl::UnavailableError(absl::StrCat(config_.name, ": ", etype, ": ", msg));
      }
    } catch (const json::exception& e) {
      st.error = Malformed(absl::StrCat("'", type, "': ", e.what()));
    }
  }

 private:
  static constexpr size_t kNoBlock = static_cast<size_t>(-1);

  // The started, not yet stopped block an event's "index" names; kNoBlock
  // (and `st.error` set) for any other.
  size_t OpenBlock(const json& j, StreamState& st, const char* event) const {
    const json& index = j.at("index");
    if (!index.is_number_unsigned() || index.get<uint64_t>() >= st.result.content.size() ||
        !st.open[index.get<size_t>()]) {
      st.error = Malformed(absl::StrCat(event, " for block ", index.dump(), ", which is not open"));
      return kNoBlock;
    }
    return index.get<size_t>();
  }

  // Stores what the deltas of block `i` carried into it: text, thinking, or
  // a tool call's input (which must be a JSON object).
  void FinishBlock(StreamState& st, size_t i) const {
    if (!st.open[i]) return;
    st.open[i] = false;
    json& block = st.result.content[i];
    const std::string btype = block["type"].get<std::string>();
    std::string& partial = st.partial_json[i];
    if (btype == "text" || btype == "thinking") {
      block[btype] = std::move(partial);
    } else if (btype == "tool_use") {
      json input = partial.empty() ? json::object() : json::parse(partial, nullptr, false);
      if (input.is_discarded() || !input.is_object()) {
        st.error = Malformed(
            absl::StrCat("tool_use input is not a JSON object: ", partial.substr(0, 200)));
        return;
      }
      block["input"] = std::move(input);
    }
    partial.clear();
  }
};

// ---------------------------------------------------------------------------
// OpenAI Chat Completions: POST {base}/chat/completions with "stream": true.
class OpenAiProvider final : public HttpProvider {
 public:
  using HttpProvider::HttpProvider;

 protected:
  std::string Url() const override { return config_.base_url + "/chat/completions"; }
  std::vector<std::string> Headers(const std::string& key) const override {
    return {"Authorization: Bearer " + key};
  }

  json Body(const ChatRequest& r) const override {
    json b;
    b["model"] = r.model;
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
    if (absl::StrContains(config_.base_url, "api.openai.com")) {
      b["max_completion_tokens"] = r.max_tokens;
    } else {
      b["max_tokens"] = r.max_tokens;
    }
    if (r.temperature >= 0) b["temperature"] = r.temperature;
    json msgs = ChatMessages(
        r,
        [](const json& block) -> json {
          return {{"id", block.value("id", "")},
                  {"type", "function"},
                  {"function",
                   {{"name", block.value("name", "")},
                    {"arguments", block.value("input", json::object()).dump()}}}};
        },
        [](const json& block) -> json {
          return {{"role", "tool"},
                  {"tool_call_id", block.value("tool_use_id", "")},
                  {"content", ToolResultText(block)}};
        },
        true);
    b["messages"] = msgs;
    return b;
  }
  std::string ToolsValue(const std::vector<ToolSpecPtr>& tools) const override {
    return ToolsArray(tools, ToolShape::kFunction, FunctionTool);
  }

  void HandleEvent(const SseEvent& ev, StreamState& st, StreamObserver& obs) override {
    if (ev.data == "[DONE]") {
      FinishInto(config_, st);
      return;
    }
    json j = EventJson(ev, st, "data");
    if (j.is_null()) return;
    try {
      if (j.contains("error")) {
        std::string type;
        std::string msg = ErrorMessageFromBody(ev.data, &type);
        st.error = absl::UnavailableError(
            absl::StrCat(config_.name, ": ", type.empty() ? "error" : type, ": ", msg));
        return;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        st.result.input_tokens = Count(j["usage"], "prompt_tokens");
        st.result.output_tokens = Count(j["usage"], "completion_tokens");
      }
      if (!j.contains("choices") || !j["choices"].is_array()) return;
      for (const auto& choice : j["choices"]) {
        if (!choice.is_object() || (choice.contains("index") && choice["index"] != 0)) continue;
        if (choice.contains("delta") && choice["delta"].is_object()) {
          const json& d = choice["delta"];
          if (d.contains("content") && d["content"].is_string()) {
            const std::string text = d["content"].get<std::string>();
            if (!text.empty()) {
              st.text += text;
              obs.OnText(text);
              st.emitted = true;
            }
          }
          if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
            for (const auto& tc : d["tool_calls"]) {
              // Calls come in order: an index names a call or the next one.
              const json index = tc.value("index", json(0));
              if (!index.is_number_unsigned() || index.get<uint64_t>() > st.calls.size()) {
                st.error = Malformed(absl::StrCat("tool call ", index.dump(), " when call ",
                                                  st.calls.size(), " comes next"));
                return;
              }
              const size_t idx = index.get<size_t>();
              if (idx == st.calls.size()) st.calls.emplace_back();
              ToolCallAcc& c = st.calls[idx];
              if (tc.contains("id") && tc["id"].is_string()) c.id = tc["id"].get<std::string>();
              if (tc.contains("function")) {
                const json& f = tc["function"];
                if (f.contains("name") && f["name"].is_string() && c.name.empty()) {
                  c.name = f["name"].get<std::string>();
                  obs.OnToolUseStart(c.id, c.name);
                  st.emitted = true;
                }
                if (f.contains("arguments") && f["arguments"].is_string()) {
                  c.args += f["arguments"].get<std::string>();
                }
              }
            }
          }
        }
        if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
          const std::string fr = choice["finish_reason"].get<std::string>();
          st.finish_reason = fr == "stop"         ? "end_turn"
                             : fr == "tool_calls" ? "tool_use"
                             : fr == "length"     ? "max_tokens"
                                                  : fr;
        }
      }
    } catch (const json::exception& e) {
      st.error = Malformed(e.what());
    }
  }

  // Some OpenAI-compatible servers end with a finish_reason but no [DONE].
  void OnStreamEnd(StreamState& st) override {
    if (!st.done && !st.finish_reason.empty()) FinishInto(config_, st);
  }

  static void FinishInto(const ProviderConfig& cfg, StreamState& st) {
    if (!st.text.empty()) st.result.content.push_back({{"type", "text"}, {"text", st.text}});
    for (auto& c : st.calls) {
      json input = c.args.empty() ? json::object() : json::parse(c.args, nullptr, false);
      if (input.is_discarded() || !input.is_object()) {
        st.error = absl::UnavailableError(absl::StrCat(
            cfg.name, ": malformed stream event: tool call arguments are not a JSON object: ",
            c.args.substr(0, 200)));
        break;
      }
      st.result.content.push_back(
          {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", input}});
    }
    st.result.stop_reason =
        st.finish_reason.empty() ? (st.calls.empty() ? "end_turn" : "tool_use") : st.finish_reason;
    st.done = true;
  }
};

// Gemini accepts a subset of JSON Schema (OpenAPI 3.0 style).
json GeminiSchema(const json& s) {
  if (s.is_object()) {
    json out = json::object();
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (it.key() == "additionalProperties" || it.key() == "$schema" || it.key() == "default" ||
          it.key() == "examples" || it.key() == "$ref" || it.key() == "$defs") {
        continue;
      }
      out[it.key()] = GeminiSchema(it.value());
    }
    return out;
  }
  if (s.is_array()) {
    json out = json::array();
    for (const auto& x : s) out.push_back(GeminiSchema(x));
    return out;
  }
  return s;
}

// Gemini: POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse,
// functionCall / functionResponse parts.
class GeminiProvider final : public HttpProvider {
 public:
  using HttpProvider::HttpProvider;

 protected:
  std::string Url() const override {
    // The model is per request; Body() stashes it (providers are shared, so
    // the URL is rebuilt from the request in Stream via model_for_url_).
    return config_.base_url + "/v1beta/models/" + model_ + ":streamGenerateContent?alt=sse";
  }
  std::vector<std::string> Headers(const std::string& key) const override {
    return {"x-goog-api-key: " + key};
  }

  json Body(const ChatRequest& r) const override {
    json b;
    json contents = json::array();
    const auto names = ToolNamesById(r.messages);
    for (const auto& m : r.messages) {
      json parts = json::array();
      for (const auto& block : m.content) {
        const std::string t = block.value("type", "");
        if (t == "text" && !block.value("text", "").empty()) {
          parts.push_back({{"text", block.value("text", "")}});
        } else if (t == "tool_use") {
          parts.push_back({{"functionCall",
                            {{"name", block.value("name", "")},
                             {"args", block.value("input", json::object())}}}});
        } else if (t == "tool_result") {
          auto it = names.find(block.value("tool_use_id", ""));
          parts.push_back({{"functionResponse",
                            {{"name", it == names.end() ? "unknown" : it->second},
                             {"response", {{"content", ToolResultText(block)}}}}}});
        }
      }
      if (parts.empty()) continue;
      contents.push_back({{"role", m.role == "assistant" ? "model" : "user"}, {"parts", parts}});
    }
    b["contents"] = contents;
    if (!r.system.empty())
      b["systemInstruction"] = {{"parts", json::array({{{"text", r.system}}})}};
    b["generationConfig"] = {{"maxOutputTokens", r.max_tokens}};
    if (r.temperature >= 0) b["generationConfig"]["temperature"] = r.temperature;
    return b;
  }
  std::string ToolsValue(const std::vector<ToolSpecPtr>& tools) const override {
    const std::string decls = ToolsArray(tools, ToolShape::kGemini, [](const ToolSpec& t) -> json {
      return {{"name", t.name},
              {"description", t.description},
              {"parameters", GeminiSchema(t.input_schema)}};
    });
    return absl::StrCat("[{\"functionDeclarations\":", decls, "}]");
  }

 public:
  absl::StatusOr<ChatResult> Stream(const ChatRequest& request, StreamObserver& observer,
                                    CancelToken& cancel) override {
    // One provider object serves concurrent turns: the URL's model comes from
    // a per-call copy.
    GeminiProvider call(*this);
    call.model_ = request.model.empty() ? config_.model : request.model;
    return call.HttpProvider::Stream(request, observer, cancel);
  }

 protected:
  void HandleEvent(const SseEvent& ev, StreamState& st, StreamObserver& obs) override {
    json j = EventJson(ev, st, "data");
    if (j.is_null()) return;
    try {
      if (j.contains("error")) {
        st.error = absl::UnavailableError(
            absl::StrCat(config_.name, ": ", ErrorMessageFromBody(ev.data, nullptr)));
        return;
      }
      if (j.contains("usageMetadata")) {
        st.result.input_tokens = Count(j["usageMetadata"], "promptTokenCount");
        st.result.output_tokens = Count(j["usageMetadata"], "candidatesTokenCount");
      }
      if (!j.contains("candidates") || !j["candidates"].is_array() || j["candidates"].empty())
        return;
      const json& cand = j["candidates"][0];
      if (cand.contains("content") && cand["content"].contains("parts")) {
        for (const auto& part : cand["content"]["parts"]) {
          if (part.contains("text") && part["text"].is_string()) {
            const std::string text = part["text"].get<std::string>();
            if (!text.empty()) {
              if (part.value("thought", false)) {
                obs.OnThinking(text);
              } else {
                st.text += text;
                obs.OnText(text);
              }
              st.emitted = true;
            }
          }
          if (part.contains("functionCall")) {
            const json& fc = part["functionCall"];
            ToolCallAcc c;
            c.name = fc.value("name", "");
            c.id = fc.contains("id") && fc["id"].is_string()
                       ? fc["id"].get<std::string>()
                       : absl::StrCat("call_", st.calls.size() + 1, "_", c.name);
            const json args = fc.value("args", json::object());
            if (!args.is_object()) {
              st.error = Malformed(absl::StrCat("functionCall args are not a JSON object: ",
                                                args.dump().substr(0, 200)));
              return;
            }
            c.args = args.dump();
            obs.OnToolUseStart(c.id, c.name);
            st.calls.push_back(std::move(c));
            st.emitted = true;
          }
        }
      }
      if (cand.contains("finishReason") && cand["finishReason"].is_string()) {
        const std::string fr = cand["finishReason"].get<std::string>();
        st.finish_reason = fr;
        if (fr == "SAFETY" || fr == "RECITATION" || fr == "BLOCKLIST" ||
            fr == "PROHIBITED_CONTENT") {
          st.error = absl::InvalidArgumentError(
              absl::StrCat(config_.name, ": the response was blocked (", fr, ")"));
        }
      }
    } catch (const json::exception& e) {
      st.error = Malformed(e.what());
    }
  }
  // Gemini's stream simply ends.
  void OnStreamEnd(StreamState& st) override {
    if (st.done) return;
    if (!st.text.empty()) st.result.content.push_back({{"type", "text"}, {"text", st.text}});
    for (auto& c : st.calls) {
      st.result.content.push_back(
          {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::parse(c.args)}});
    }
    st.result.stop_reason = st.finish_reason == "MAX_TOKENS"
                                ? "max_tokens"
                                : (st.calls.empty() ? "end_turn" : "tool_use");
    // Without a finishReason the stream was cut.
    st.done = !st.finish_reason.empty();
  }

 private:
  std::string model_;
};

// Ollama: POST {base}/api/chat, newline-delimited JSON, tools.
class OllamaProvider final : public HttpProvider {
 public:
  using HttpProvider::HttpProvider;

 protected:
  std::string Url() const override { return config_.base_url + "/api/chat"; }
  std::vector<std::string> Headers(const std::string& key) const override {
    if (key.empty()) return {};
    return {"Authorization: Bearer " + key};
  }
  bool Ndjson() const override { return true; }
  bool NeedsKey() const override { return false; }

  json Body(const ChatRequest& r) const override {
    json b;
    b["model"] = r.model;
    b["stream"] = true;
    b["options"] = {{"num_predict", r.max_tokens}};
    if (r.temperature >= 0) b["options"]["temperature"] = r.temperature;
    const auto names = ToolNamesById(r.messages);
    json msgs = ChatMessages(
        r,
        [](const json& block) -> json {
          return {{"function",
                   {{"name", block.value("name", "")},
                    {"arguments", block.value("input", json::object())}}}};
        },
        [&names](const json& block) -> json {
          auto it = names.find(block.value("tool_use_id", ""));
          return {{"role", "tool"},
                  {"content", ToolResultText(block)},
                  {"tool_name", it == names.end() ? "" : it->second}};
        },
        false);
    b["messages"] = msgs;
    return b;
  }
  std::string ToolsValue(const std::vector<ToolSpecPtr>& tools) const override {
    return ToolsArray(tools, ToolShape::kFunction, FunctionTool);
  }

  void HandleEvent(const SseEvent& ev, StreamState& st, StreamObserver& obs) override {
    json j = EventJson(ev, st, "line");
    if (j.is_null()) return;
    try {
      if (j.contains("error")) {
        st.error = absl::UnavailableError(
            absl::StrCat(config_.name, ": ", ErrorMessageFromBody(ev.data, nullptr)));
        return;
      }
      if (j.contains("message") && j["message"].is_object()) {
        const json& m = j["message"];
        if (m.contains("thinking") && m["thinking"].is_string() &&
            !m["thinking"].get<std::string>().empty()) {
          obs.OnThinking(m["thinking"].get<std::string>());
        }
        if (m.contains("content") && m["content"].is_string()) {
          const std::string text = m["content"].get<std::string>();
          if (!text.empty()) {
            st.text += text;
            obs.OnText(text);
            st.emitted = true;
          }
        }
        if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
          for (const auto& tc : m["tool_calls"]) {
            ToolCallAcc c;
            const json& f = tc.value("function", json::object());
            c.name = f.value("name", "");
            c.id = tc.contains("id") && tc["id"].is_string()
                       ? tc["id"].get<std::string>()
                       : absl::StrCat("call_", st.calls.size() + 1, "_", c.name);
            const json args = f.value("arguments", json::object());
            c.args = args.is_string() ? args.get<std::string>() : args.dump();
            obs.OnToolUseStart(c.id, c.name);
            st.calls.push_back(std::move(c));
            st.emitted = true;
          }
        }
      }
      if (j.value("done", false)) {
        st.result.input_tokens = Count(j, "prompt_eval_count");
        st.result.output_tokens = Count(j, "eval_count");
        const std::string reason = j.value("done_reason", "stop");
        if (!st.text.empty()) st.result.content.push_back({{"type", "text"}, {"text", st.text}});
        for (auto& c : st.calls) {
          json input = json::parse(c.args, nullptr, false);
          if (!input.is_object()) {
            st.error = Malformed("tool call arguments are not a JSON object");
            return;
          }
          st.result.content.push_back(
              {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", input}});
        }
        st.result.stop_reason =
            reason == "length" ? "max_tokens" : (st.calls.empty() ? "end_turn" : "tool_use");
        st.done = true;
      }
    } catch (const json::exception& e) {
      st.error = Malformed(e.what());
    }
  }
};

}  // namespace

std::unique_ptr<Provider> MakeProvider(const ProviderConfig& config, const RetryConfig& retry,
                                       HttpClient& http, const Clock* clock) {
  const Clock& c = clock != nullptr ? *clock : SystemClock();
  if (config.kind == "anthropic")
    return std::make_unique<AnthropicProvider>(config, retry, http, c);
  if (config.kind == "gemini") return std::make_unique<GeminiProvider>(config, retry, http, c);
  if (config.kind == "ollama") return std::make_unique<OllamaProvider>(config, retry, http, c);
  return std::make_unique<OpenAiProvider>(config, retry, http, c);
}

}  // namespace fwai
