#include "tests/fakes/fake_llm_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace fwai::testing {

using json = nlohmann::json;

std::string RecordedRequest::Header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "";
}

FakeLlmServer::FakeLlmServer() = default;
FakeLlmServer::~FakeLlmServer() { Stop(); }

int FakeLlmServer::Start() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  listen(listen_fd_, 128);
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return port_;
}

void FakeLlmServer::Stop() {
  if (listen_fd_ < 0) return;
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  listen_fd_ = -1;
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads) t.join();
}

std::string FakeLlmServer::anthropic_base_url() const {
  return absl::StrCat("http://127.0.0.1:", port_);
}
std::string FakeLlmServer::openai_base_url() const {
  return absl::StrCat("http://127.0.0.1:", port_, "/v1");
}

void FakeLlmServer::Enqueue(FakeReply reply) {
  std::lock_guard<std::mutex> lock(mu_);
  replies_.push_back(std::move(reply));
}

void FakeLlmServer::RequireKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  required_key_ = key;
}

std::vector<RecordedRequest> FakeLlmServer::requests() {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

size_t FakeLlmServer::request_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_.size();
}

namespace {
bool WriteAll(int fd, const std::string& s);
}  // namespace

size_t FakeLlmServer::pending_replies() {
  std::lock_guard<std::mutex> lock(mu_);
  return replies_.size();
}

namespace {

// The text of the first user message of a request in any of the wire formats
// (Anthropic/OpenAI/Ollama "messages", Gemini "contents").
std::string FirstUserText(const json& body) {
  if (!body.is_object()) return "";
  const json* msgs = nullptr;
  if (body.contains("messages") && body["messages"].is_array()) msgs = &body["messages"];
  if (body.contains("contents") && body["contents"].is_array()) msgs = &body["contents"];
  if (msgs == nullptr) return "";
  for (const auto& m : *msgs) {
    if (!m.is_object() || m.value("role", "") != "user") continue;
    std::string out;
    const json& c = m.contains("content") ? m["content"]
                    : m.contains("parts") ? m["parts"]
                                          : json();
    if (c.is_string()) return c.get<std::string>();
    for (const auto& b : c.is_array() ? c : json::array()) {
      if (b.is_object() && b.contains("text") && b["text"].is_string()) {
        out += b["text"].get<std::string>();
      }
    }
    return out;
  }
  return "";
}

}  // namespace

FakeReply FakeLlmServer::Next(const json& body) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string first = FirstUserText(body);
  for (auto it = replies_.begin(); it != replies_.end(); ++it) {
    if (!it->match.empty() && first.find(it->match) == std::string::npos) continue;
    FakeReply r = std::move(*it);
    replies_.erase(it);
    return r;
  }
  FakeReply r;
  r.chunks = {"ok"};
  return r;
}

bool FakeReplyFromJson(const json& j, FakeReply* out, std::string* error) {
  if (!j.is_object()) {
    *error = "a reply must be a JSON object";
    return false;
  }
  FakeReply r;
  try {
    for (const auto& [key, v] : j.items()) {
      if (key == "chunks") {
        r.chunks = v.get<std::vector<std::string>>();
      } else if (key == "text") {
        r.chunks = {v.get<std::string>()};
      } else if (key == "tool_calls") {
        int n = 0;
        for (const auto& tc : v) {
          FakeToolCall c;
          c.id = tc.value("id", absl::StrCat("toolu_fake_", ++n));
          c.name = tc.at("name").get<std::string>();
          c.input = tc.value("input", json::object());
          r.tool_calls.push_back(std::move(c));
        }
      } else if (key == "status") {
        r.status = v.get<int>();
      } else if (key == "error_type") {
        r.error_type = v.get<std::string>();
      } else if (key == "error_message") {
        r.error_message = v.get<std::string>();
      } else if (key == "retry_after_s") {
        r.retry_after_s = v.get<int>();
      } else if (key == "retry_after_ms") {
        r.retry_after_ms = v.get<int>();
      } else if (key == "chunk_delay_ms") {
        r.chunk_delay_ms = v.get<int>();
      } else if (key == "cut_after_chunks") {
        r.cut_after_chunks = v.get<int>();
      } else if (key == "stop_reason") {
        r.stop_reason = v.get<std::string>();
      } else if (key == "input_tokens") {
        r.input_tokens = v.get<int64_t>();
      } else if (key == "output_tokens") {
        r.output_tokens = v.get<int64_t>();
      } else if (key == "bench_chunks") {
        r.bench_chunks = v.get<int>();
      } else if (key == "bench_chunk_bytes") {
        r.bench_chunk_bytes = v.get<int>();
      } else if (key == "match") {
        r.match = v.get<std::string>();
      } else {
        *error = absl::StrCat("unknown key '", key, "'");
        return false;
      }
    }
  } catch (const json::exception& e) {
    *error = e.what();
    return false;
  }
  *out = std::move(r);
  return true;
}

void FakeLlmServer::ServeControl(int fd, const RecordedRequest& req) {
  auto reply = [fd](int status, const json& body) {
    const std::string b = body.dump();
    WriteAll(fd, absl::StrCat("HTTP/1.1 ", status, status == 200 ? " OK" : " Bad Request",
                              "\r\nContent-Type: application/json\r\nContent-Length: ", b.size(),
                              "\r\nConnection: close\r\n\r\n", b));
    close(fd);
  };
  if (req.path == "/_fake/replies") {
    json items = req.body.is_array() ? req.body : json::array({req.body});
    std::vector<FakeReply> parsed;
    for (size_t i = 0; i < items.size(); ++i) {
      FakeReply r;
      std::string error;
      if (!FakeReplyFromJson(items[i], &r, &error)) {
        reply(400, {{"error", absl::StrCat("reply ", i, ": ", error)}});
        return;
      }
      parsed.push_back(std::move(r));
    }
    for (auto& r : parsed) Enqueue(std::move(r));
    reply(200, {{"queued", parsed.size()}});
  } else if (req.path == "/_fake/requests") {
    json arr = json::array();
    for (const auto& r : requests()) arr.push_back({{"path", r.path}, {"body", r.body}});
    reply(200, arr);
  } else if (req.path == "/_fake/state") {
    reply(200, {{"requests", request_count()}, {"pending", pending_replies()}});
  } else if (req.path == "/_fake/reset") {
    {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.clear();
      requests_.clear();
    }
    reply(200, json::object());
  } else {
    reply(400, {{"error", absl::StrCat("unknown control path ", req.path)}});
  }
}

void FakeLlmServer::AcceptLoop() {
  while (!stopping_) {
    int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (stopping_) break;
      if (errno == EINTR) continue;
      break;
    }
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    conn_threads_.emplace_back([this, c] {
      Serve(c);
      timespec cpu{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
      served_cpu_ns_ += int64_t{cpu.tv_sec} * 1000000000 + cpu.tv_nsec;
    });
  }
}

namespace {

bool WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += n;
  }
  return true;
}

// A complete JSON response, then the connection closes.
void WriteJson(int fd, const std::string& body) {
  WriteAll(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ",
                            body.size(), "\r\nConnection: close\r\n\r\n", body));
  close(fd);
}

std::string Sse(const std::string& event, const json& data) {
  std::string out;
  if (!event.empty()) absl::StrAppend(&out, "event: ", event, "\n");
  absl::StrAppend(&out, "data: ", data.dump(), "\n\n");
  return out;
}

void Sleep(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

std::string BenchChunk(int bytes) {
  std::string s = absl::StrCat(MonotonicNanos(), ";");
  if (static_cast<int>(s.size()) < bytes) s.append(bytes - s.size(), 'x');
  return s;
}

// Splits a JSON text in two to exercise partial tool-input deltas.
std::vector<std::string> SplitInTwo(const std::string& s) {
  if (s.size() < 2) return {s};
  return {s.substr(0, s.size() / 2), s.substr(s.size() / 2)};
}

}  // namespace

// A rerank service: score = share of the query's words found in the passage.
// TEI shape when the body has "texts", Cohere/Jina shape for "documents".
void FakeLlmServer::ServeRerank(int fd, const RecordedRequest& req) {
  const bool tei = req.body.contains("texts");
  const json& docs = tei ? req.body["texts"] : req.body["documents"];
  std::vector<std::string> words;
  {
    std::string w;
    for (char c : req.body.value("query", "") + " ") {
      if (std::isalnum(static_cast<unsigned char>(c))) {
        w.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
      } else if (!w.empty()) {
        words.push_back(w);
        w.clear();
      }
    }
  }
  json items = json::array();
  for (size_t i = 0; docs.is_array() && i < docs.size(); ++i) {
    std::string text = docs[i].get<std::string>();
    for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    int hits = 0;
    for (const auto& w : words) hits += text.find(w) != std::string::npos ? 1 : 0;
    double score = words.empty() ? 0 : static_cast<double>(hits) / words.size();
    items.push_back(tei ? json{{"index", i}, {"score", score}}
                        : json{{"index", i}, {"relevance_score", score}});
  }
  std::string b = tei ? items.dump() : json{{"results", items}}.dump();
  WriteJson(fd, b);
}

void FakeLlmServer::Serve(int fd) {
  // Read the request head and body.
  std::string buf;
  char tmp[8192];
  size_t head_end;
  while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
    ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) {
      close(fd);
      return;
    }
    buf.append(tmp, n);
  }
  RecordedRequest req;
  std::string head = buf.substr(0, head_end);
  size_t line_end = head.find("\r\n");
  std::string request_line = head.substr(0, line_end);
  size_t sp1 = request_line.find(' ');
  size_t sp2 = request_line.find(' ', sp1 + 1);
  req.path = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  size_t content_length = 0;
  size_t pos = line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string::npos) e = head.size();
    std::string line = head.substr(pos, e - pos);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = absl::AsciiStrToLower(line.substr(0, colon));
      std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      if (name == "content-length") content_length = std::stoul(value);
      req.headers.emplace_back(name, value);
    }
    pos = e + 2;
  }
  std::string body = buf.substr(head_end + 4);
  while (body.size() < content_length) {
    ssize_t n = recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) break;
    body.append(tmp, n);
  }
  req.received_ns = MonotonicNanos();
  req.body = json::parse(body, nullptr, false);
  if (req.path.rfind("/_fake/", 0) == 0) {
    ServeControl(fd, req);
    return;
  }
  const bool anthropic = req.path == "/v1/messages";
  const bool gemini = req.path.find(":streamGenerateContent") != std::string::npos;
  const bool ollama = req.path == "/api/chat";
  if (req.path.size() >= 11 && req.path.compare(req.path.size() - 11, 11, "/embeddings") == 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(req);
    }
    // Deterministic 8-dimensional vectors from the text's letters.
    json data = json::array();
    const json& input = req.body["input"];
    for (size_t i = 0; input.is_array() && i < input.size(); ++i) {
      std::vector<double> v(8, 0.0);
      for (char c : input[i].get<std::string>()) v[static_cast<unsigned char>(c) % 8] += 1.0;
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", v}});
    }
    std::string b =
        json{{"object", "list"}, {"data", data}, {"model", req.body.value("model", "")}}.dump();
    WriteJson(fd, b);
    return;
  }
  if (req.path == "/context") {
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(req);
    }
    std::string b =
        json{{"results",
              json::array({{{"title", "HAL docs"},
                            {"url", "https://example.invalid/hal"},
                            {"text", "HAL_UART_Init() configures the UART from its handle."}}})}}
            .dump();
    WriteJson(fd, b);
    return;
  }
  if (req.path.size() >= 7 && req.path.compare(req.path.size() - 7, 7, "/rerank") == 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(req);
    }
    ServeRerank(fd, req);
    return;
  }
  std::string required_key;
  size_t request_index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request_index = requests_.size();
    requests_.push_back(req);
    required_key = required_key_;
  }
  const std::string model =
      req.body.is_object() ? req.body.value("model", "fake-model") : "fake-model";

  FakeReply r;
  if (!required_key.empty()) {
    std::string got = anthropic ? req.Header("x-api-key")
                      : gemini  ? req.Header("x-goog-api-key")
                                : req.Header("authorization");
    std::string want = anthropic || gemini ? required_key : "Bearer " + required_key;
    if (got != want) {
      r.status = 401;
      r.error_type = anthropic ? "authentication_error" : "invalid_request_error";
      r.error_message = anthropic ? "invalid x-api-key" : "Incorrect API key provided";
    } else {
      r = Next(req.body);
    }
  } else {
    r = Next(req.body);
  }

  if (r.status != 200) {
    json err;
    if (anthropic) {
      err = {{"type", "error"}, {"error", {{"type", r.error_type}, {"message", r.error_message}}}};
    } else if (gemini) {
      err = {
          {"error", {{"code", r.status}, {"message", r.error_message}, {"status", r.error_type}}}};
    } else if (ollama) {
      err = {{"error", r.error_message}};
    } else {
      err = {{"error",
              {{"message", r.error_message},
               {"type", r.error_type},
               {"param", nullptr},
               {"code", nullptr}}}};
    }
    std::string b = err.dump();
    std::string resp =
        absl::StrCat("HTTP/1.1 ", r.status, " Error\r\nContent-Type: application/json\r\n",
                     "Content-Length: ", b.size(), "\r\nConnection: close\r\n");
    if (r.retry_after_s >= 0) absl::StrAppend(&resp, "retry-after: ", r.retry_after_s, "\r\n");
    if (r.retry_after_ms >= 0) absl::StrAppend(&resp, "retry-after-ms: ", r.retry_after_ms, "\r\n");
    absl::StrAppend(&resp, "\r\n", b);
    WriteAll(fd, resp);
    close(fd);
    return;
  }

  if (!WriteAll(
          fd,
          ollama
              ? "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"
              : "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                "Connection: close\r\n\r\n")) {
    close(fd);
    return;
  }
  if (!r.raw_body.empty()) {  // a broken or hostile server: the body as scripted
    WriteAll(fd, r.raw_body);
    close(fd);
    return;
  }
  const int n_chunks = r.bench_chunks > 0 ? r.bench_chunks : static_cast<int>(r.chunks.size());
  auto chunk_text = [&](int i) {
    return r.bench_chunks > 0 ? BenchChunk(r.bench_chunk_bytes) : r.chunks[i];
  };
  const std::string stop =
      !r.stop_reason.empty() ? r.stop_reason : (r.tool_calls.empty() ? "end_turn" : "tool_use");
  bool ok = true;
  // Streams the text chunks, each encoded in the provider's format; false
  // when the script cuts the connection part-way.
  //
  // A benchmark's chunks keep to their schedule (chunk i is due i + 1
  // pauses after the first), as a provider on a machine of its own would,
  // however late this process runs; and each is the frame of the first with
  // its text written over, not encoded again (the text needs no escaping),
  // so that the provider's own cost stays small beside the daemon's.
  auto send_chunks = [&](const std::function<std::string(const std::string&)>& encode,
                         const char* malformed) {
    const auto first = std::chrono::steady_clock::now();
    std::string frame;
    size_t text_at = std::string::npos;
    if (r.bench_chunks > 0) {
      frame = encode(std::string(r.bench_chunk_bytes, '#'));
      text_at = frame.find(std::string(r.bench_chunk_bytes, '#'));
    }
    for (int i = 0; i < n_chunks && ok; ++i) {
      if (i == r.cut_after_chunks) return false;
      if (r.bench_chunks > 0 && r.chunk_delay_ms > 0) {
        std::this_thread::sleep_until(first +
                                      std::chrono::milliseconds(r.chunk_delay_ms) * (i + 1));
      } else {
        Sleep(r.chunk_delay_ms);
      }
      if (r.malformed && i == n_chunks / 2) {
        ok = WriteAll(fd, malformed);
        continue;
      }
      const std::string text = chunk_text(i);
      if (text_at != std::string::npos && text.size() == static_cast<size_t>(r.bench_chunk_bytes)) {
        std::string out = frame;
        out.replace(text_at, text.size(), text);
        ok = WriteAll(fd, out);
      } else {
        ok = WriteAll(fd, encode(text));
      }
    }
    return true;
  };

  if (gemini || ollama) {
    // Gemini: SSE of GenerateContentResponse, ending at EOF. Ollama: one JSON
    // object per line, the last with done: true.
    auto line = [&](const json& j) { return gemini ? Sse("", j) : j.dump() + "\n"; };
    auto text_msg = [&](const std::string& t) {
      if (gemini) {
        return json{{"candidates",
                     json::array({{{"content",
                                    {{"role", "model"}, {"parts", json::array({{{"text", t}}})}}},
                                   {"index", 0}}})}};
      }
      return json{
          {"model", model}, {"message", {{"role", "assistant"}, {"content", t}}}, {"done", false}};
    };
    if (!send_chunks([&](const std::string& t) { return line(text_msg(t)); },
                     gemini ? "data: {not json\n\n" : "{not json\n")) {
      close(fd);
      return;
    }
    if (r.cut_after_chunks >= n_chunks) {
      close(fd);
      return;
    }
    if (!r.tool_calls.empty() && ok) {
      json parts = json::array(), calls = json::array();
      for (const auto& tc : r.tool_calls) {
        parts.push_back({{"functionCall", {{"name", tc.name}, {"args", tc.input}}}});
        calls.push_back({{"function", {{"name", tc.name}, {"arguments", tc.input}}}});
      }
      ok = WriteAll(
          fd, line(gemini ? json{{"candidates",
                                  json::array({{{"content", {{"role", "model"}, {"parts", parts}}},
                                                {"index", 0}}})}}
                          : json{{"model", model},
                                 {"message",
                                  {{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}}},
                                 {"done", false}}));
    }
    const std::string finish =
        stop == "max_tokens" ? (gemini ? "MAX_TOKENS" : "length") : (gemini ? "STOP" : "stop");
    if (gemini) {
      ok = ok &&
           WriteAll(
               fd,
               line({{"candidates",
                      json::array({{{"content",
                                     {{"role", "model"}, {"parts", json::array({{{"text", ""}}})}}},
                                    {"finishReason", finish},
                                    {"index", 0}}})},
                     {"usageMetadata",
                      {{"promptTokenCount", r.input_tokens},
                       {"candidatesTokenCount", r.output_tokens},
                       {"totalTokenCount", r.input_tokens + r.output_tokens}}}}));
    } else {
      ok = ok && WriteAll(fd, line({{"model", model},
                                    {"message", {{"role", "assistant"}, {"content", ""}}},
                                    {"done", true},
                                    {"done_reason", finish},
                                    {"prompt_eval_count", r.input_tokens},
                                    {"eval_count", r.output_tokens}}));
    }
  } else if (anthropic) {
    ok = WriteAll(fd,
                  Sse("message_start",
                      {{"type", "message_start"},
                       {"message",
                        {{"id", "msg_fake"},
                         {"type", "message"},
                         {"role", "assistant"},
                         {"content", json::array()},
                         {"model", model},
                         {"stop_reason", nullptr},
                         {"stop_sequence", nullptr},
                         {"usage", {{"input_tokens", r.input_tokens}, {"output_tokens", 1}}}}}}));
    int index = 0;
    if (n_chunks > 0 && ok) {
      ok = WriteAll(
          fd, Sse("content_block_start", {{"type", "content_block_start"},
                                          {"index", 0},
                                          {"content_block", {{"type", "text"}, {"text", ""}}}}));
      ok = ok && WriteAll(fd, Sse("ping", {{"type", "ping"}}));
      if (!send_chunks(
              [&](const std::string& t) {
                return Sse("content_block_delta",
                           {{"type", "content_block_delta"},
                            {"index", 0},
                            {"delta", {{"type", "text_delta"}, {"text", t}}}});
              },
              "event: content_block_delta\ndata: {not json\n\n")) {
        close(fd);
        return;
      }
      ok = ok &&
           WriteAll(fd, Sse("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}));
      index = 1;
    }
    if (r.cut_after_chunks >= n_chunks) {
      close(fd);
      return;
    }
    for (const auto& tc : r.tool_calls) {
      if (!ok) break;
      ok = WriteAll(fd, Sse("content_block_start", {{"type", "content_block_start"},
                                                    {"index", index},
                                                    {"content_block",
                                                     {{"type", "tool_use"},
                                                      {"id", tc.id},
                                                      {"name", tc.name},
                                                      {"input", json::object()}}}}));
      for (const auto& part : SplitInTwo(tc.input.dump())) {
        ok = ok &&
             WriteAll(fd, Sse("content_block_delta",
                              {{"type", "content_block_delta"},
                               {"index", index},
                               {"delta", {{"type", "input_json_delta"}, {"partial_json", part}}}}));
      }
      ok = ok && WriteAll(fd, Sse("content_block_stop",
                                  {{"type", "content_block_stop"}, {"index", index}}));
      ++index;
    }
    ok = ok && WriteAll(fd, Sse("message_delta",
                                {{"type", "message_delta"},
                                 {"delta", {{"stop_reason", stop}, {"stop_sequence", nullptr}}},
                                 {"usage", {{"output_tokens", r.output_tokens}}}}));
    ok = ok && WriteAll(fd, Sse("message_stop", {{"type", "message_stop"}}));
  } else {
    auto chunk = [&](const json& delta, const json& finish) {
      return Sse("", {{"id", "chatcmpl-fake"},
                      {"object", "chat.completion.chunk"},
                      {"created", 1700000000},
                      {"model", model},
                      {"choices", json::array({{{"index", 0},
                                                {"delta", delta},
                                                {"logprobs", nullptr},
                                                {"finish_reason", finish}}})}});
    };
    ok = WriteAll(fd, chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
    if (!send_chunks(
            [&](const std::string& t) {
              return chunk({{"content", t}}, nullptr);
            },
            "data: {not json\n\n")) {
      close(fd);
      return;
    }
    if (r.cut_after_chunks >= n_chunks) {
      close(fd);
      return;
    }
    int idx = 0;
    for (const auto& tc : r.tool_calls) {
      if (!ok) break;
      ok = WriteAll(fd,
                    chunk({{"tool_calls",
                            json::array({{{"index", idx},
                                          {"id", tc.id},
                                          {"type", "function"},
                                          {"function", {{"name", tc.name}, {"arguments", ""}}}}})}},
                          nullptr));
      for (const auto& part : SplitInTwo(tc.input.dump())) {
        ok = ok &&
             WriteAll(
                 fd, chunk({{"tool_calls",
                             json::array({{{"index", idx}, {"function", {{"arguments", part}}}}})}},
                           nullptr));
      }
      ++idx;
    }
    const std::string finish = stop == "tool_use"     ? "tool_calls"
                               : stop == "max_tokens" ? "length"
                                                      : "stop";
    ok = ok && WriteAll(fd, chunk(json::object(), finish));
    ok = ok && WriteAll(fd, Sse("", {{"id", "chatcmpl-fake"},
                                     {"object", "chat.completion.chunk"},
                                     {"created", 1700000000},
                                     {"model", model},
                                     {"choices", json::array()},
                                     {"usage",
                                      {{"prompt_tokens", r.input_tokens},
                                       {"completion_tokens", r.output_tokens},
                                       {"total_tokens", r.input_tokens + r.output_tokens}}}}));
    ok = ok && WriteAll(fd, "data: [DONE]\n\n");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (request_index < requests_.size()) requests_[request_index].responded_ns = MonotonicNanos();
  }
  shutdown(fd, SHUT_WR);
  // Drain until the client closes so it sees a clean end of stream.
  while (recv(fd, tmp, sizeof(tmp), 0) > 0) {
  }
  close(fd);
}

}  // namespace fwai::testing
