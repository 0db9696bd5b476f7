#include "server/mcp/mcp_client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "server/llm/http_client.h"
#include "server/llm/line_splitter.h"
#include "server/llm/sse_parser.h"
#include "server/mcp/mcp_messages.h"

namespace fwai {

using json = nlohmann::json;

struct McpClient::Impl {
  // config, http, the fds and the threads are set in Start() before the
  // handshake (and before any thread that reads them), read-only after.
  McpServerConfig config;
  HttpClient* http = nullptr;  // streamable HTTP transport when set
  mutable Mutex mu;
  // Mcp-Session-Id from the initialize answer.
  std::string session_id ABSL_GUARDED_BY(mu);
  std::atomic<pid_t> pid{-1};  // -1 once reaped (by the reader or the destructor)
  int to_child = -1;
  int from_child = -1;
  int err_child = -1;
  std::thread reader, err_reader;
  Mutex write_mu;  // one message written to the server at a time

  // A call's answer. Its fields are under `mu` (the owner's).
  struct Pending {
    bool done = false;
    json result;
    absl::Status error;
  };
  CondVar cv;
  std::map<int64_t, std::shared_ptr<Pending>> pending ABSL_GUARDED_BY(mu);
  int64_t next_id ABSL_GUARDED_BY(mu) = 1;
  std::atomic<bool> tools_changed{false};  // the server sent notifications/tools/list_changed
  std::thread listener;                    // streamable HTTP: the server's own stream
  CancelToken listen_cancel;
  bool listener_settled ABSL_GUARDED_BY(mu) = false;
  bool dead ABSL_GUARDED_BY(mu) = false;
  absl::Status death ABSL_GUARDED_BY(mu);
  std::string stderr_tail ABSL_GUARDED_BY(mu);
  json server_info ABSL_GUARDED_BY(mu);

  absl::Status Send(const json& msg) {
    std::string line = msg.dump() + "\n";
    MutexLock lock(&write_mu);
    size_t off = 0;
    while (off < line.size()) {
      ssize_t n = write(to_child, line.data() + off, line.size() - off);
      if (n <= 0) {
        if (errno == EINTR) continue;
        return absl::UnavailableError(
            absl::StrCat("mcp server ", config.name, ": cannot write: ", std::strerror(errno)));
      }
      off += n;
    }
    return absl::OkStatus();
  }

  void Die(absl::Status why) {
    MutexLock lock(&mu);
    if (dead) return;
    dead = true;
    death = why;
    for (auto& [id, p] : pending) {
      p->done = true;
      p->error = why;
    }
    pending.clear();
    cv.SignalAll();
  }

  // A request from the server: answer ping, refuse the rest.
  static json ReplyTo(const JsonRpcMessage& request) {
    json reply = {{"jsonrpc", "2.0"}, {"id", request.id}};
    if (request.method == "ping") {
      reply["result"] = json::object();
    } else {
      reply["error"] = {{"code", -32601}, {"message", "method not supported by this client"}};
    }
    return reply;
  }

  absl::Status ErrorStatus(const JsonRpcMessage& m) const {
    return absl::UnavailableError(
        absl::StrCat("mcp server ", config.name, ": error ", m.error_code, ": ", m.error_message));
  }

  void Dispatch(const JsonRpcMessage& msg) {
    switch (msg.kind) {
      case JsonRpcMessage::Kind::kResponse: {
        if (!msg.id.is_number_integer()) return;  // not an id this client gave
        MutexLock lock(&mu);
        auto it = pending.find(msg.id.get<int64_t>());
        if (it == pending.end()) return;  // late answer to a cancelled call
        auto p = it->second;
        pending.erase(it);
        p->done = true;
        if (msg.is_error) {
          p->error = ErrorStatus(msg);
        } else {
          p->result = msg.result;
        }
        cv.SignalAll();
        return;
      }
      case JsonRpcMessage::Kind::kRequest:
        (void)Send(ReplyTo(msg));
        return;
      case JsonRpcMessage::Kind::kNotification:
        NoteNotification(msg);
        return;
    }
  }

  // Notifications need no answer; a changed tool list is noted for the
  // supervisor to read again (logging and progress are ignored).
  void NoteNotification(const JsonRpcMessage& msg) {
    if (msg.kind == JsonRpcMessage::Kind::kNotification &&
        msg.method == "notifications/tools/list_changed") {
      tools_changed = true;
    }
  }

  void ReadLoop() {
    LineSplitter lines;
    char chunk[65536];
    bool broken = false;
    while (!broken) {
      ssize_t n = read(from_child, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      lines.Feed(std::string_view(chunk, static_cast<size_t>(n)), [&](std::string_view line) {
        if (broken) return;
        auto msg = ParseJsonRpcMessage(line);
        if (!msg.ok()) {
          Die(absl::UnavailableError(absl::StrCat(
              "mcp server ", config.name, " wrote something that is not a JSON-RPC message (",
              msg.status().message(), "): ", AV(line.substr(0, 200)))));
          kill(pid, SIGTERM);
          broken = true;
          return;
        }
        Dispatch(*msg);
      });
    }
    if (broken) return;
    int status = 0;
    std::string how = "closed its output";
    // The output closes a moment before the exit can be reaped: wait a little
    // (bounded; a server may close stdout and live on).
    bool reaped = false;
    for (int i = 0; i < 100 && !reaped; ++i) {
      reaped = waitpid(pid, &status, WNOHANG) == pid;
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (reaped) {
      how = WIFEXITED(status) ? absl::StrCat("exited with code ", WEXITSTATUS(status))
                              : absl::StrCat("was killed by signal ", WTERMSIG(status));
      pid = -1;
    }
    std::string tail;
    {
      MutexLock lock(&mu);
      tail = stderr_tail;
    }
    Die(absl::UnavailableError(absl::StrCat("mcp server ", config.name, " ", how,
                                            tail.empty() ? "" : absl::StrCat(": ", tail))));
  }

  void ErrLoop() {
    char chunk[4096];
    while (true) {
      ssize_t n = read(err_child, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      MutexLock lock(&mu);
      stderr_tail.append(chunk, n);
      if (stderr_tail.size() > 2000) stderr_tail.erase(0, stderr_tail.size() - 2000);
    }
  }

  // Streamable HTTP: one POST per message; the answer comes as JSON or as an
  // SSE stream carrying JSON-RPC messages.
  absl::StatusOr<json> HttpPost(const json& msg, CancelToken* cancel, int timeout_ms,
                                bool expect_answer) {
    HttpRequest req;
    req.url = config.url;
    req.headers = {"Content-Type: application/json", "Accept: application/json, text/event-stream"};
    for (const auto& h : config.headers) req.headers.push_back(h);
    std::string sent_session;  // the session this request belongs to
    {
      MutexLock lock(&mu);
      sent_session = session_id;
    }
    if (!sent_session.empty()) req.headers.push_back("Mcp-Session-Id: " + sent_session);
    req.body = msg.dump();
    req.idle_timeout_s = std::max(1, timeout_ms / 1000);
    std::string body;
    JsonRpcMessage answer;
    bool have = false;
    SseParser sse;
    bool is_sse = false;
    CancelToken never;
    auto resp = http->PostStream(
        req,
        [&](std::string_view d) {
          body.append(d);
          if (is_sse || body.rfind("event:", 0) == 0 || body.rfind("data:", 0) == 0 ||
              body.rfind(":", 0) == 0) {
            is_sse = true;
            sse.Feed(d, [&](const SseEvent& ev) {
              auto m = ParseJsonRpcMessage(ev.data);
              if (!m.ok()) return;  // not a message of ours: keep-alives and the like
              if (m->kind == JsonRpcMessage::Kind::kResponse && m->id == msg.value("id", json())) {
                answer = *std::move(m);
                have = true;
              } else {
                NoteNotification(*m);
              }
            });
          }
        },
        cancel ? *cancel : never, nullptr);
    if (!resp.ok()) {
      if (absl::IsCancelled(resp.status())) {
        (void)HttpPost(
            {{"jsonrpc", "2.0"},
             {"method", "notifications/cancelled"},
             {"params",
              {{"requestId", msg.value("id", json())}, {"reason", "cancelled by the user"}}}},
            nullptr, 5000, false);
        return absl::CancelledError(absl::StrCat("mcp ", msg.value("method", ""), " cancelled"));
      }
      if (absl::IsDeadlineExceeded(resp.status())) {
        return absl::DeadlineExceededError(
            absl::StrCat("mcp server ", config.name, ": no answer in ", timeout_ms, " ms"));
      }
      return absl::UnavailableError(absl::StrCat("mcp server ", config.name, " at ", config.url,
                                                 ": ", resp.status().message()));
    }
    if (resp->status == 404 && !sent_session.empty()) {
      return absl::UnavailableError(
          absl::StrCat("mcp server ", config.name, ": session expired (HTTP 404)"));
    }
    if (resp->status < 200 || resp->status >= 300) {
      return absl::UnavailableError(absl::StrCat("mcp server ", config.name, ": HTTP ",
                                                 resp->status, ": ", resp->body.substr(0, 200)));
    }
    auto sid = resp->headers.find("mcp-session-id");
    if (sid != resp->headers.end()) {
      MutexLock lock(&mu);
      session_id = sid->second;
    }
    if (!expect_answer) return json::object();
    if (!have) {
      auto m = ParseJsonRpcMessage(body);
      if (!m.ok() || m->kind != JsonRpcMessage::Kind::kResponse) {
        return absl::UnavailableError(absl::StrCat(
            "mcp server ", config.name, " answered with something that is not a JSON-RPC answer (",
            m.ok() ? "a request or notification" : m.status().message(),
            "): ", body.substr(0, 200)));
      }
      answer = *std::move(m);
    }
    if (answer.is_error) return ErrorStatus(answer);
    return answer.result;
  }

  // The first attempt to open the server's stream has an answer (open, or
  // refused, or failed): Start waits for it so that nothing the server sends
  // right after is missed.
  void ListenerSettled() {
    MutexLock lock(&mu);
    listener_settled = true;
    cv.SignalAll();
  }
  void AwaitListener(std::chrono::milliseconds limit) {
    MutexLock lock(&mu);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!listener_settled) {
      if (cv.WaitWithDeadline(&mu, deadline)) break;
    }
  }

  // Streamable HTTP: the stream a server may open for messages of its own
  // (a GET on the endpoint; notifications such as tools/list_changed, pings).
  // Reopened with backoff when it drops; not at all if the server offers none.
  void Listen() {
    int backoff_ms = 500;
    while (!listen_cancel.cancelled()) {
      HttpRequest req;
      req.method = "GET";
      req.url = config.url;
      req.headers = {"Accept: text/event-stream"};
      for (const auto& h : config.headers) req.headers.push_back(h);
      {
        MutexLock lock(&mu);
        if (!session_id.empty()) req.headers.push_back("Mcp-Session-Id: " + session_id);
      }
      req.idle_timeout_s = 24 * 3600;  // a quiet server is not a broken one
      req.on_headers = [this](int) { ListenerSettled(); };
      SseParser sse;
      auto resp = http->PostStream(
          req,
          [&](std::string_view d) {
            sse.Feed(d, [&](const SseEvent& ev) {
              auto m = ParseJsonRpcMessage(ev.data);
              if (!m.ok()) return;
              if (m->kind == JsonRpcMessage::Kind::kRequest) {
                (void)HttpPost(ReplyTo(*m), nullptr, 5000, false);
                return;
              }
              NoteNotification(*m);
            });
          },
          listen_cancel, nullptr);
      ListenerSettled();
      if (listen_cancel.cancelled()) return;
      if (resp.ok() && (resp->status == 405 || resp->status == 404 || resp->status == 400))
        return;  // none offered
      if (resp.ok() && resp->status >= 200 && resp->status < 300)
        backoff_ms = 500;  // it ran; reopen soon
      if (listen_cancel.WaitFor(std::chrono::milliseconds(backoff_ms))) return;
      backoff_ms = std::min(backoff_ms * 2, 30000);
    }
  }

  // initialize, then notifications/initialized, over whichever transport.
  absl::Status Handshake() {
    auto init = Request("initialize",
                        {{"protocolVersion", "2025-03-26"},
                         {"capabilities", json::object()},
                         {"clientInfo", {{"name", "fwai"}, {"version", "0.1.0"}}}},
                        nullptr, config.init_timeout_ms);
    if (!init.ok()) return init.status();
    {
      MutexLock lock(&mu);
      server_info = ServerInfoFromInitialize(*init);
    }
    const json initialized = {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}};
    if (http) return HttpPost(initialized, nullptr, 5000, false).status();
    return Send(initialized);
  }

  absl::StatusOr<json> Request(const std::string& method, const json& params, CancelToken* cancel,
                               int timeout_ms) {
    if (http) {
      int64_t id;
      {
        MutexLock lock(&mu);
        if (dead) return death;
        id = next_id++;
      }
      auto r = HttpPost({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}},
                        cancel, timeout_ms, true);
      if (!r.ok() && absl::IsUnavailable(r.status())) Die(r.status());
      return r;
    }
    auto p = std::make_shared<Pending>();
    int64_t id;
    {
      MutexLock lock(&mu);
      if (dead) return death;
      id = next_id++;
      pending[id] = p;
    }
    absl::Status s = Send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    if (!s.ok()) {
      Die(s);
      return s;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    MutexLock lock(&mu);
    while (!p->done) {
      if (cancel && cancel->cancelled()) {
        pending.erase(id);
        lock.Unlock();
        (void)Send({{"jsonrpc", "2.0"},
                    {"method", "notifications/cancelled"},
                    {"params", {{"requestId", id}, {"reason", "cancelled by the user"}}}});
        return absl::CancelledError(absl::StrCat("mcp ", method, " cancelled"));
      }
      if (cv.WaitWithDeadline(&mu, std::min(deadline, std::chrono::steady_clock::now() +
                                                          std::chrono::milliseconds(50))) &&
          std::chrono::steady_clock::now() >= deadline && !p->done) {
        pending.erase(id);
        lock.Unlock();
        (void)Send({{"jsonrpc", "2.0"},
                    {"method", "notifications/cancelled"},
                    {"params", {{"requestId", id}, {"reason", "timed out"}}}});
        return absl::DeadlineExceededError(absl::StrCat("mcp server ", config.name, ": ", method,
                                                        " gave no answer in ", timeout_ms, " ms"));
      }
    }
    if (!p->error.ok()) return p->error;
    return p->result;
  }
};

McpClient::McpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

McpClient::~McpClient() {
  Impl& m = *impl_;
  if (m.http != nullptr) {
    m.listen_cancel.Cancel();
    if (m.listener.joinable()) m.listener.join();
    std::string sid;
    {
      MutexLock lock(&m.mu);
      if (!m.dead) sid = m.session_id;
    }
    if (!sid.empty()) {
      // End the session on the server (best effort, briefly).
      HttpRequest req;
      req.method = "DELETE";
      req.url = m.config.url;
      req.headers = {"Mcp-Session-Id: " + sid};
      for (const auto& h : m.config.headers) req.headers.push_back(h);
      req.connect_timeout_s = 2;
      req.idle_timeout_s = 2;
      CancelToken never;
      (void)m.http->PostStream(
          req, [](std::string_view) {}, never, nullptr);
    }
  }
  if (m.to_child >= 0) close(m.to_child);
  if (m.pid > 0) {
    kill(-m.pid, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
        m.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (m.pid > 0) {
      kill(-m.pid, SIGKILL);
      waitpid(m.pid, nullptr, 0);
    }
  }
  if (m.reader.joinable()) m.reader.join();
  if (m.err_reader.joinable()) m.err_reader.join();
  if (m.from_child >= 0) close(m.from_child);
  if (m.err_child >= 0) close(m.err_child);
}

absl::StatusOr<std::unique_ptr<McpClient>> McpClient::Start(McpServerConfig config,
                                                            HttpClient* http) {
  if (!config.url.empty()) {
    if (http == nullptr)
      return absl::InternalError("mcp: an HTTP client is needed for url servers");
    auto impl = std::make_unique<Impl>();
    impl->config = config;
    impl->http = http;
    Impl* raw = impl.get();
    std::unique_ptr<McpClient> client(new McpClient(std::move(impl)));
    if (auto s = raw->Handshake(); !s.ok()) return s;
    raw->listener = std::thread([raw] { raw->Listen(); });
    raw->AwaitListener(std::chrono::milliseconds(2000));
    return client;
  }
  if (config.command.empty())
    return absl::InvalidArgumentError(absl::StrCat("mcp server ", config.name, ": no command"));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  int in[2], out[2], err[2], ex[2];
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
      pipe2(ex, O_CLOEXEC)) {
    return absl::InternalError("pipe failed");
  }
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (config.run_as && BecomeAccountInChild(*config.run_as) != 0) _exit(126);
    for (const auto& [k, v] : config.env) setenv(k.c_str(), v.c_str(), 1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> argv;
    for (auto& a : config.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    int e = errno;
    (void)!write(ex[1], &e, sizeof(e));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  close(ex[1]);
  int e = 0;
  if (read(ex[0], &e, sizeof(e)) == sizeof(e)) {
    close(ex[0]);
    close(in[1]);
    close(out[0]);
    close(err[0]);
    waitpid(pid, nullptr, 0);
    return absl::NotFoundError(absl::StrCat("mcp server ", config.name, ": cannot run ",
                                            config.command[0], ": ", std::strerror(e)));
  }
  close(ex[0]);
  signal(SIGPIPE, SIG_IGN);
  impl->pid = pid;
  impl->to_child = in[1];
  impl->from_child = out[0];
  impl->err_child = err[0];
  Impl* raw = impl.get();
  impl->reader = std::thread([raw] { raw->ReadLoop(); });
  impl->err_reader = std::thread([raw] { raw->ErrLoop(); });
  std::unique_ptr<McpClient> client(new McpClient(std::move(impl)));
  if (auto s = raw->Handshake(); !s.ok()) return s;
  return client;
}

absl::StatusOr<std::vector<McpTool>> McpClient::ListTools(int timeout_ms) {
  impl_->tools_changed = false;  // what changed before now is in this answer
  std::vector<McpTool> tools;
  json cursor;
  for (int page = 0; page < 100; ++page) {
    json params = json::object();
    if (!cursor.is_null()) params["cursor"] = cursor;
    auto r = impl_->Request("tools/list", params, nullptr, timeout_ms);
    if (!r.ok()) return r.status();
    json next;
    auto page_tools = ToolsFromListResult(impl_->config.name, *r, &next);
    if (!page_tools.ok()) return page_tools.status();
    for (auto& t : *page_tools) tools.push_back(std::move(t));
    if (next.is_null()) break;
    cursor = std::move(next);
  }
  return tools;
}

absl::StatusOr<McpCallResult> McpClient::CallTool(const std::string& tool, const json& arguments,
                                                  CancelToken* cancel, int timeout_ms) {
  auto r =
      impl_->Request("tools/call", {{"name", tool}, {"arguments", arguments}}, cancel, timeout_ms);
  if (!r.ok()) return r.status();
  return CallResultFromJson(impl_->config.name, *r);
}

bool McpClient::TakeToolsChanged() { return impl_->tools_changed.exchange(false); }

bool McpClient::alive() const {
  MutexLock lock(&impl_->mu);
  return !impl_->dead;
}

const std::string& McpClient::name() const { return impl_->config.name; }

int McpClient::pid() const { return impl_->pid.load(); }

std::string McpClient::server_info() const {
  MutexLock lock(&impl_->mu);
  return impl_->server_info.dump();
}

}  // namespace fwai
