#include "tests/integration/daemon_fixture.h"

#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"

namespace fwai::testing {

namespace pb = fwai::v1;

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  char* d = mkdtemp(tmpl.data());
  return d ? std::string(d) : std::string();
}

Daemon::Daemon(FakeLlmServer* fake, std::string extra_yaml, bool with_providers) {
  dir_ = MakeTempDir("fwaid-test-");
  socket_ = dir_ + "/run/fwaid.sock";
  data_ = dir_ + "/data";
  config_ = dir_ + "/fwaid.yaml";
  project_ = dir_ + "/project";
  log_ = dir_ + "/fwaid.log";
  clock_file_ = dir_ + "/clock-offset";
  std::filesystem::create_directories(project_);
  if (int fd = open(clock_file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600); fd >= 0) {
    if (ftruncate(fd, 8) == 0) {
      void* p = mmap(nullptr, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) clock_offset_ = static_cast<int64_t*>(p);
    }
    close(fd);
  }
  std::ofstream cfg(config_);
  cfg << "log_level: info\n";
  cfg << "retry:\n  max_attempts: 3\n  initial_backoff_ms: 20\n  max_backoff_ms: 200\n";
  if (fake && with_providers) {
    cfg << "default_provider: anthropic\n";
    cfg << "providers:\n";
    cfg << "  anthropic:\n    kind: anthropic\n    api_key: test-key\n    model: "
           "claude-sonnet-4-5\n"
        << "    base_url: " << fake->anthropic_base_url() << "\n";
    cfg << "  openai:\n    kind: openai\n    api_key: test-key\n    model: gpt-4o\n"
        << "    base_url: " << fake->openai_base_url() << "\n";
    cfg << "  gemini:\n    kind: gemini\n    api_key: test-key\n    model: gemini-2.5-flash\n"
        << "    base_url: " << fake->gemini_base_url() << "\n";
    cfg << "  ollama:\n    kind: ollama\n    model: llama3.1\n"
        << "    base_url: " << fake->ollama_base_url() << "\n";
  }
  cfg << extra_yaml;
}

Daemon::~Daemon() {
  if (pid_ > 0) Kill9();
  if (clock_offset_ != nullptr) munmap(clock_offset_, 8);
  std::error_code ec;
  if (std::getenv("FWAI_KEEP_TEST_DIRS") == nullptr) std::filesystem::remove_all(dir_, ec);
}

bool Daemon::Start() {
  channel_.reset();
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    // Provider settings come from the config only.
    unsetenv("ANTHROPIC_API_KEY");
    unsetenv("OPENAI_API_KEY");
    unsetenv("ANTHROPIC_BASE_URL");
    unsetenv("OPENAI_BASE_URL");
    setenv("FWAI_CLOCK_OFFSET_FILE", clock_file_.c_str(), 1);  // (common/clock.cc)
    std::string bin = binary_.empty() ? std::string(FWAI_BIN_DIR) + "/fwaid" : binary_;
    std::vector<std::string> args = {
        bin, "--config", config_, "--listen", "unix:" + socket_, "--data-dir", data_};
    for (const auto& l : extra_listen_) {
      args.push_back("--listen");
      args.push_back(l);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  auto addr = ResolveDaemonAddress(address());
  for (int i = 0; i < 500; ++i) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    auto ch = ConnectToDaemon(*addr, false, 100);
    if (ch.ok()) {
      channel_ = *ch;
      // Its "ready" line comes after every listener is up (TCP ports included).
      const std::string ready = "fwaid: ready (pid " + std::to_string(pid_) + ",";
      for (int k = 0; k < 500 && log().find(ready) == std::string::npos; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void Daemon::AdvanceClock(int64_t us) {
  if (clock_offset_ == nullptr) {
    std::fprintf(stderr, "AdvanceClock: no clock-offset file in %s\n", dir_.c_str());
    std::abort();
  }
  __atomic_fetch_add(clock_offset_, us, __ATOMIC_RELAXED);
}

int Daemon::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 1500; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      channel_.reset();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Kill9();
  return -1;
}

bool Daemon::Exited() {
  if (pid_ <= 0) return true;
  int status;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  channel_.reset();
  return true;
}

void Daemon::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  channel_.reset();
}

int Daemon::TcpPort() const {
  // "fwaid: listening on tls:127.0.0.1:40123" (the last start's line).
  const std::string text = log();
  int port = 0;
  for (size_t at = text.find("listening on t"); at != std::string::npos;
       at = text.find("listening on t", at + 1)) {
    size_t eol = text.find('\n', at);
    std::string line = text.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    port = std::atoi(line.substr(line.rfind(':') + 1).c_str());
  }
  return port;
}

std::string Daemon::log() const {
  std::ifstream f(log_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::shared_ptr<grpc::Channel> Daemon::channel() { return channel_; }
std::unique_ptr<pb::Sessions::Stub> Daemon::sessions() { return pb::Sessions::NewStub(channel_); }
std::unique_ptr<pb::Daemon::Stub> Daemon::daemon() { return pb::Daemon::NewStub(channel_); }

pb::Session Daemon::CreateSession(const std::string& provider) {
  auto stub = sessions();
  grpc::ClientContext ctx;
  pb::CreateSessionRequest req;
  req.set_title("test");
  req.set_project_root(project_);
  req.set_provider(provider);
  pb::Session s;
  grpc::Status st = stub->Create(&ctx, req, &s);
  if (!st.ok()) s.set_id("create-failed: " + st.error_message());
  return s;
}

std::unique_ptr<grpc::ClientReaderWriter<pb::ClientEvent, pb::ServerEvent>> OpenChat(
    pb::Sessions::Stub& stub, grpc::ClientContext* ctx, const std::string& session_id,
    const std::string& text, const std::string& provider, const std::string& turn_id) {
  auto stream = stub.Chat(ctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(session_id);
  stream->Write(open);
  pb::ClientEvent msg;
  msg.mutable_message()->set_text(text);
  msg.mutable_message()->set_provider(provider);
  msg.mutable_message()->set_turn_id(turn_id);
  stream->Write(msg);
  return stream;
}

grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::string& bytes) {
  class Once final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Once(const std::string& bytes) : slice_(bytes), out_(&slice_, 1) {}
    void Go() {
      StartWriteLast(&out_, grpc::WriteOptions());  // and the client is done
      StartRead(&in_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (ok) StartRead(&in_);
    }
    void OnDone(const grpc::Status& s) override { done.set_value(s); }
    std::promise<grpc::Status> done;

   private:
    grpc::Slice slice_;
    grpc::ByteBuffer out_, in_;
  };
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  Once call(bytes);
  stub.PrepareBidiStreamingCall(&ctx, method, grpc::StubOptions(), &call);
  call.Go();
  auto status = call.done.get_future();
  if (status.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    ctx.TryCancel();
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the server never ended the stream");
  }
  return status.get();
}

TurnOutcome RunChat(pb::Sessions::Stub& stub, const std::string& session_id,
                    const std::string& text, int timeout_s, const std::string& provider) {
  TurnOutcome out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  auto stream = OpenChat(stub, &ctx, session_id, text, provider, "t-test");
  pb::ServerEvent ev;
  while (stream->Read(&ev)) {
    out.events.push_back(ev);
    if (ev.has_text_delta() && ev.text_delta().origin().parent_call_id().empty()) {
      out.text += ev.text_delta().text();
    }
    if (ev.has_turn_finished()) {
      out.stop_reason = ev.turn_finished().stop_reason();
      out.finished = true;
      break;
    }
  }
  stream->WritesDone();
  out.status = stream->Finish();
  return out;
}

std::vector<pb::ServerEvent> ReadAll(pb::Sessions::Stub& stub, const std::string& session_id,
                                     uint64_t after) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::AttachRequest req;
  req.set_session_id(session_id);
  req.set_after_seq(after);
  req.set_no_follow(true);
  auto reader = stub.Attach(&ctx, req);
  std::vector<pb::ServerEvent> out;
  pb::ServerEvent ev;
  while (reader->Read(&ev)) out.push_back(ev);
  reader->Finish();
  return out;
}

int RunCommand(const std::vector<std::string>& argv, std::string* out, std::string* err,
               const std::vector<std::string>& env, int timeout_s, const std::string& stdin_path) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    int devnull = open(stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY);
    dup2(devnull, 0);
    for (const auto& e : env) putenv(strdup(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string o, e;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
    if (poll(fds, 2, 100) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP))) {
        ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        } else {
          (i == 0 ? o : e).append(buf, n);
        }
      }
    }
  }
  if (open_fds > 0) kill(pid, SIGKILL);
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (out) *out = o;
  if (err) *err = e;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct BackgroundCommand::Rep {
  pid_t pid = -1;
  int exit_code = -1;
  bool exited = false;
  std::thread reader;
  std::mutex mu;
  std::condition_variable cv;
  std::string out, err;
  bool eof = false;
};

BackgroundCommand::BackgroundCommand(const std::vector<std::string>& argv,
                                     const std::vector<std::string>& env)
    : rep_(std::make_unique<Rep>()) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return;
  rep_->pid = fork();
  if (rep_->pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    for (const auto& e : env) putenv(strdup(e.c_str()));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Rep* r = rep_.get();
  r->reader = std::thread([r, o = out_pipe[0], e = err_pipe[0]] {
    pollfd fds[2] = {{o, POLLIN, 0}, {e, POLLIN, 0}};
    int open_fds = 2;
    char buf[4096];
    while (open_fds > 0) {
      if (poll(fds, 2, 200) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof buf);
        std::lock_guard<std::mutex> lock(r->mu);
        if (n <= 0) {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        } else {
          (i == 0 ? r->out : r->err).append(buf, n);
        }
        r->cv.notify_all();
      }
    }
    std::lock_guard<std::mutex> lock(r->mu);
    r->eof = true;
    r->cv.notify_all();
  });
}

BackgroundCommand::~BackgroundCommand() {
  if (rep_->pid > 0 && !rep_->exited) {
    kill(rep_->pid, SIGKILL);
    int status;
    waitpid(rep_->pid, &status, 0);
  }
  if (rep_->reader.joinable()) rep_->reader.join();
}

bool BackgroundCommand::WaitForOutput(const std::string& text, int timeout_s) {
  std::unique_lock<std::mutex> lock(rep_->mu);
  return rep_->cv.wait_for(lock, std::chrono::seconds(timeout_s), [&] {
    return rep_->out.find(text) != std::string::npos || rep_->err.find(text) != std::string::npos ||
           rep_->eof;
  }) && (rep_->out.find(text) != std::string::npos || rep_->err.find(text) != std::string::npos);
}

int BackgroundCommand::Wait(int timeout_s) {
  if (rep_->pid <= 0) return -1;
  if (rep_->exited) return rep_->exit_code;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (waitpid(rep_->pid, &status, WNOHANG) != rep_->pid) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  rep_->exited = true;
  rep_->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (rep_->reader.joinable()) rep_->reader.join();
  return rep_->exit_code;
}

pid_t BackgroundCommand::pid() const { return rep_->pid; }

std::string BackgroundCommand::out() {
  std::lock_guard<std::mutex> lock(rep_->mu);
  return rep_->out;
}

std::string BackgroundCommand::err() {
  std::lock_guard<std::mutex> lock(rep_->mu);
  return rep_->err;
}

}  // namespace fwai::testing
