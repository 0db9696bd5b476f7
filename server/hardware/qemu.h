// A QEMU process backing a simulated board: started paused, its UART on a
// pty, its gdb stub on a free loopback port, controlled over QMP. With
// semihosting, the firmware's semihosting console is a second pty, and QEMU
// runs in a bubblewrap sandbox (its file calls would otherwise reach every
// file fwaid may): it sees the system's /usr read-only, /dev, its own /proc,
// its run directory and the image, nothing else.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/hardware/target_memory.h"

namespace fwai {

struct QemuOptions {
  std::string binary = "qemu-system-arm";
  std::string machine;  // stm32vldiscovery | lm3s6965evb
  std::string image;    // ELF to load ...
  bool raw = false;     // ... or a flat binary placed at raw_load_addr
  uint64_t raw_load_addr = 0;
  std::string run_dir;  // where the QMP socket lives
  bool semihosting = false;
  std::string sandbox = "bwrap";  // the bubblewrap program (semihosting only)
};

class QemuInstance {
 public:
  // Starts QEMU paused; returns once the pty and QMP are ready. Call
  // Continue() after the pty is opened so no early output is lost.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<QemuInstance>> Start(
      const QemuOptions& options);
  ~QemuInstance();

  const std::string& pty() const { return pty_; }
  // The semihosting console's pty ("" without semihosting).
  const std::string& semihosting_pty() const { return semihosting_pty_; }
  // Where gdb connects: "127.0.0.1:PORT", or a sandboxed QEMU's socket.
  std::string gdb_target() const;
  // QEMU's own process (inside the sandbox's, when there is one).
  pid_t pid() const { return qemu_pid_; }
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
  // Runs a human monitor command (e.g. "info status") over QMP; its text.
  [[nodiscard]] absl::StatusOr<std::string> Hmp(const std::string& command_line);

 private:
  QemuInstance() = default;
  absl::StatusOr<std::string> Qmp(const std::string& command_json) ABSL_LOCKS_EXCLUDED(qmp_mu_);
  void RemoveOwnDir();

  // The fds, pid and paths are set in Start before the instance is shared
  // and reset only by Stop, which the owner calls with no Qmp in flight.
  pid_t pid_ = -1;       // the child fwaid started: QEMU, or the sandbox around it
  pid_t qemu_pid_ = -1;  // QEMU itself
  bool sandboxed_ = false;
  int out_fd_ = -1;
  int qmp_fd_ = -1;
  std::string pty_, semihosting_pty_;
  int gdb_port_ = 0;
  std::string qmp_path_;
  std::string own_dir_;  // a sandboxed QEMU's own directory ("" when not sandboxed)
  std::atomic<bool> exited_{false};
  std::atomic<bool> stopping_{false};
  int wait_status_ = 0;  // written by the watcher before exited_ is set
  std::thread watcher_;
  Mutex mu_;
  std::function<void(const std::string&)> on_exit_ ABSL_GUARDED_BY(mu_);
  Mutex qmp_mu_;        // one QMP exchange at a time on qmp_fd_
  std::string output_;  // Start only
};

// A guest's memory while it runs: the regions asked for (RAM, flash), read
// and written through /proc/PID/mem at the host addresses QEMU's monitor
// gives for them (gpa2hva), so the virtual CPU never stops. Needs fwaid to
// be allowed to read QEMU's memory: the same user, QEMU its child (Yama's
// ptrace_scope 0 or 1), and no -runas. Thread-safe; accesses after QEMU has
// exited fail.
class QemuTargetMemory : public TargetMemory {
 public:
  struct Region {
    uint32_t address = 0;
    uint32_t size = 0;
  };
  // Each region must be one block of QEMU's memory. Errors say which region
  // and why (not mapped, no access to the process's memory).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<QemuTargetMemory>> Open(
      QemuInstance& qemu, const std::vector<Region>& regions);
  ~QemuTargetMemory() override;
  QemuTargetMemory(const QemuTargetMemory&) = delete;
  QemuTargetMemory& operator=(const QemuTargetMemory&) = delete;

  // OUT_OF_RANGE for bytes outside the regions; PERMISSION_DENIED for a
  // write where the kernel allows fwaid only to read QEMU's memory.
  absl::Status Read(uint32_t address, std::span<uint8_t> out) override;
  absl::Status Write(uint32_t address, std::span<const uint8_t> bytes) override;

 private:
  struct Mapped {
    Region guest;
    uint64_t host = 0;
  };
  QemuTargetMemory(int fd, bool read_only, std::vector<Mapped> mapped)
      : fd_(fd), read_only_(read_only), mapped_(std::move(mapped)) {}
  absl::StatusOr<uint64_t> HostAddress(uint32_t address, size_t n) const;

  const int fd_;
  const bool read_only_;  // the kernel refuses writes to /proc/PID/mem
  const std::vector<Mapped> mapped_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
[[nodiscard]] absl::StatusOr<int> PickFreePort();

}  // namespace fwai
