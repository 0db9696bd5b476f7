// A QEMU process backing a simulated board: started paused, its UART on a
// pty, its gdb stub on a free loopback port, controlled over QMP.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace fwai {

struct QemuOptions {
  std::string binary = "qemu-system-arm";
  std::string machine;  // stm32vldiscovery | lm3s6965evb
  std::string image;    // ELF to load ...
  bool raw = false;     // ... or a flat binary placed at raw_load_addr
  uint64_t raw_load_addr = 0;
  std::string run_dir;  // where the QMP socket lives
};

class QemuInstance {
 public:
  // Starts QEMU paused; returns once the pty and QMP are ready. Call
  // Continue() after the pty is opened so no early output is lost.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<QemuInstance>> Start(
      const QemuOptions& options);
  ~QemuInstance();

  const std::string& pty() const { return pty_; }
  int gdb_port() const { return gdb_port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return !exited_; }
  // "exited with status N" / "killed by signal N" once it has exited.
  std::string exit_description() const;

  [[nodiscard]] absl::Status Continue();
  // Pauses the virtual CPU (no CPU time used) until Continue().
  [[nodiscard]] absl::Status Pause();
  [[nodiscard]] absl::Status Reset();
  // Asks QEMU to quit, kills it if it does not within a second, reaps it.
  void Stop();
  // Called once, from a watcher thread, when QEMU exits on its own.
  void SetOnExit(std::function<void(const std::string&)> fn);

 private:
  QemuInstance() = default;
  absl::StatusOr<std::string> Qmp(const std::string& command_json) ABSL_LOCKS_EXCLUDED(qmp_mu_);

  // The fds, pid and paths are set in Start before the instance is shared
  // and reset only by Stop, which the owner calls with no Qmp in flight.
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int qmp_fd_ = -1;
  std::string pty_;
  int gdb_port_ = 0;
  std::string qmp_path_;
  std::atomic<bool> exited_{false};
  std::atomic<bool> stopping_{false};
  int wait_status_ = 0;  // written by the watcher before exited_ is set
  std::thread watcher_;
  Mutex mu_;
  std::function<void(const std::string&)> on_exit_ ABSL_GUARDED_BY(mu_);
  Mutex qmp_mu_;        // one QMP exchange at a time on qmp_fd_
  std::string output_;  // Start only
};

// A TCP port on 127.0.0.1 that was free a moment ago.
[[nodiscard]] absl::StatusOr<int> PickFreePort();

}  // namespace fwai
