// Runs a real fwaid process (unix socket, temp data dir) against a fake LLM
// server, for integration, end-to-end tests and benchmarks.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fwai/v1/daemon.grpc.pb.h"
#include "fwai/v1/sessions.grpc.pb.h"
#include "tests/fakes/fake_llm_server.h"

namespace fwai::testing {

std::string MakeTempDir(const std::string& prefix);

class Daemon {
 public:
  // `extra_yaml` is appended to the generated fwaid.yaml (whose providers
  // point at `fake`, if given).
  Daemon(FakeLlmServer* fake, std::string extra_yaml = "", bool with_providers = true);
  ~Daemon();

  // Also listen on `address` (tcp:HOST:0, tls:HOST:0, another unix:PATH).
  void AddListen(const std::string& address) { extra_listen_.push_back(address); }
  // Runs `path` instead of the build's fwaid (another build's, to compare
  // two daemons under the same clients). Takes effect at the next Start.
  void SetBinary(std::string path) { binary_ = std::move(path); }
  // The port fwaid bound for its first TCP listener (0 if none).
  int TcpPort() const;
  // Starts fwaid and waits until it answers. Returns false on failure.
  bool Start();
  // SIGTERM and wait; returns the exit status (or -1).
  int Stop();
  // SIGKILL and reap.
  void Kill9();
  bool running() const { return pid_ > 0; }
  // True once the process has exited (it is reaped then).
  bool Exited();
  pid_t pid() const { return pid_; }

  const std::string& dir() const { return dir_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& data_dir() const { return data_; }
  const std::string& config_path() const { return config_; }
  const std::string& project_dir() const { return project_; }
  std::string address() const { return "unix:" + socket_; }
  std::string log() const;

  std::shared_ptr<grpc::Channel> channel();
  std::unique_ptr<fwai::v1::Sessions::Stub> sessions();
  std::unique_ptr<fwai::v1::Daemon::Stub> daemon();

  // Creates a session on the project dir.
  fwai::v1::Session CreateSession(const std::string& provider = "");

  // Moves fwaid's wall clock ahead by `us` microseconds (its lease TTLs,
  // token expiry and record times; waits measured in real time are not
  // shortened): the offset file fwaid maps (FWAI_CLOCK_OFFSET_FILE). Takes
  // effect at once, also across restarts.
  void AdvanceClock(int64_t us);

 private:
  std::string dir_, socket_, data_, config_, project_, log_;
  std::string clock_file_;
  int64_t* clock_offset_ = nullptr;  // the file, mapped shared
  std::string binary_;               // empty: FWAI_BIN_DIR/fwaid
  std::vector<std::string> extra_listen_;
  pid_t pid_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
};

// Collected result of one chat turn.
struct TurnOutcome {
  std::vector<fwai::v1::ServerEvent> events;  // all events seen on the stream
  grpc::Status status;                        // the stream's final status
  std::string text;                           // concatenated main-agent text
  std::string stop_reason;
  bool finished = false;
};

// Opens a Chat stream on `session_id` and sends `text` (with `turn_id` if given).
std::unique_ptr<grpc::ClientReaderWriter<fwai::v1::ClientEvent, fwai::v1::ServerEvent>> OpenChat(
    fwai::v1::Sessions::Stub& stub, grpc::ClientContext* ctx, const std::string& session_id,
    const std::string& text, const std::string& provider = "", const std::string& turn_id = "");

// Opens Chat, sends `text` and reads until the turn finishes.
TurnOutcome RunChat(fwai::v1::Sessions::Stub& stub, const std::string& session_id,
                    const std::string& text, int timeout_s = 30, const std::string& provider = "");

// Reads Attach(session, after, no_follow=true) fully.
std::vector<fwai::v1::ServerEvent> ReadAll(fwai::v1::Sessions::Stub& stub,
                                           const std::string& session_id, uint64_t after = 0);

// Opens a stream to `method` on `channel` (no credentials of its own), writes
// `bytes` as its one message, half-closes and reads until the server ends
// the stream; its status (DEADLINE_EXCEEDED if that takes over 30 s).
grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::string& bytes);

// Runs a command, returns exit code and stdout (stderr goes to `err`).
// `stdin_path`: a file to read standard input from ("" : /dev/null).
int RunCommand(const std::vector<std::string>& argv, std::string* out, std::string* err,
               const std::vector<std::string>& env = {}, int timeout_s = 60,
               const std::string& stdin_path = "");

// A command running in the background (a client that outlives a daemon, a
// follower); its standard output and error are collected as they come.
class BackgroundCommand {
 public:
  BackgroundCommand(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  ~BackgroundCommand();  // kills it if it still runs
  BackgroundCommand(const BackgroundCommand&) = delete;
  BackgroundCommand& operator=(const BackgroundCommand&) = delete;

  // Waits until stdout or stderr holds `text`; false if the command ended
  // (or `timeout_s` passed) without it.
  bool WaitForOutput(const std::string& text, int timeout_s = 60);
  // Waits for the exit: the exit code (128 + signal when killed), -1 on timeout.
  int Wait(int timeout_s = 60);
  std::string out();
  std::string err();
  pid_t pid() const;

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace fwai::testing
