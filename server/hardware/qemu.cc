#include "server/hardware/qemu.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/subprocess.h"

namespace fwai {

absl::StatusOr<int> PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("no free port: ", std::strerror(err)));
  }
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

namespace {

// Reads from fd until `done(buffer)` or the deadline; false on timeout/EOF.
bool ReadUntil(int fd, std::string& buffer, const std::function<bool(const std::string&)>& done,
               int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done(buffer)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    buffer.append(buf, static_cast<size_t>(n));
  }
  return true;
}

// QEMU's command line for `o`: paused, the UART (and the semihosting
// console) on ptys, QMP on a unix socket, the gdb stub on loopback.
std::vector<std::string> QemuCommand(const QemuOptions& o, const std::string& qmp_path,
                                     const std::string& gdb) {
  std::vector<std::string> args = {o.binary, "-M", o.machine};
  if (o.raw) {
    args.insert(args.end(), {"-device", absl::StrCat("loader,file=", o.image,
                                                     ",addr=", o.raw_load_addr, ",force-raw=on")});
  } else {
    args.insert(args.end(), {"-kernel", o.image});
  }
  args.insert(args.end(), {"-display", "none", "-monitor", "none", "-serial", "pty", "-S", "-qmp",
                           absl::StrCat("unix:", qmp_path, ",server=on,wait=off"), "-gdb", gdb});
  if (o.semihosting) {
    args.insert(args.end(), {"-chardev", "pty,id=semihosting", "-semihosting-config",
                             "enable=on,target=native,chardev=semihosting"});
  }
  return args;
}

// `qemu` inside bubblewrap: the system's programs and libraries read-only,
// a /dev and a /proc of its own (its ptys are reached through its root),
// `dir` (its own, for the QMP and gdb sockets) and the image; no home, no
// /etc, no data directory, not the other boards' files, no network, no
// capabilities. It dies with fwaid.
absl::StatusOr<std::vector<std::string>> Sandboxed(const QemuOptions& o, const std::string& dir,
                                                   const std::vector<std::string>& qemu) {
  const std::string bwrap = FindProgram(o.sandbox);
  if (bwrap.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "semihosting runs QEMU in a sandbox, and ", o.sandbox,
        " is not found (install bubblewrap): without it the firmware could read and write every "
        "file fwaid may"));
  }
  const std::vector<std::vector<std::string>> parts = {
      {bwrap, "--die-with-parent", "--new-session", "--unshare-all"},
      {"--ro-bind", "/usr", "/usr"},
      {"--symlink", "usr/lib", "/lib"},
      {"--symlink", "usr/lib64", "/lib64"},
      {"--symlink", "usr/bin", "/bin"},
      {"--dev", "/dev"},
      {"--proc", "/proc"},
      {"--bind", dir, dir},
      {"--ro-bind", o.image, o.image},
      {"--chdir", dir, "--"}};
  std::vector<std::string> args;
  for (const auto& p : parts) args.insert(args.end(), p.begin(), p.end());
  args.insert(args.end(), qemu.begin(), qemu.end());
  return args;
}

// QEMU's process under `sandbox` (bubblewrap, its init, then QEMU), once
// it is there; -1 after `timeout_ms`.
pid_t QemuUnder(pid_t sandbox, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t p = sandbox;
    for (int depth = 0; p > 0 && depth < 4; ++depth) {
      std::string comm;
      std::getline(std::ifstream(absl::StrCat("/proc/", p, "/comm")), comm);
      if (p != sandbox && comm.rfind("qemu-system", 0) == 0) return p;
      std::ifstream in(absl::StrCat("/proc/", p, "/task/", p, "/children"));
      if (!(in >> p)) p = -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// The pty of each char device QEMU said it redirected, by label.
std::map<std::string, std::string> Ptys(const std::string& output) {
  static const std::regex kPty(R"(char device redirected to (/dev/pts/\d+) \(label ([\w-]+)\))");
  std::map<std::string, std::string> out;
  for (std::sregex_iterator it(output.begin(), output.end(), kPty), end; it != end; ++it) {
    out[(*it)[2]] = (*it)[1];
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<QemuInstance>> QemuInstance::Start(const QemuOptions& o) {
  std::error_code ec;
  if (o.image.empty() || !std::filesystem::is_regular_file(o.image, ec)) {
    return absl::NotFoundError(
        absl::StrCat("firmware image ", o.image.empty() ? "<none>" : o.image, ": not found"));
  }
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  std::unique_ptr<QemuInstance> q(new QemuInstance());
  q->gdb_port_ = *port;
  std::filesystem::create_directories(o.run_dir, ec);
  const std::string id = NewId("q");
  q->qmp_path_ = absl::StrCat(o.run_dir, "/qmp-", id, ".sock");
  if (o.semihosting) {
    // A sandboxed QEMU sees a directory of its own, not the other boards'.
    q->own_dir_ = absl::StrCat(o.run_dir, "/", id);
    std::filesystem::create_directories(q->own_dir_, ec);
    q->qmp_path_ = q->own_dir_ + "/qmp.sock";
  }
  std::vector<std::string> args =
      QemuCommand(o, q->qmp_path_,
                  o.semihosting ? absl::StrCat("unix:", q->own_dir_, "/gdb.sock,server=on,wait=off")
                                : absl::StrCat("tcp:127.0.0.1:", q->gdb_port_));
  if (o.semihosting) {
    auto sandboxed = Sandboxed(o, q->own_dir_, args);
    if (!sandboxed.ok()) return sandboxed.status();
    args = *std::move(sandboxed);
    q->sandboxed_ = true;
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  std::vector<char*> argv = ExecArgv(args);
  pid_t pid = ForkLongLived([&] { ExecChild(argv.data(), -1, pipefd[1], pipefd[1]); });
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  close(pipefd[1]);
  q->pid_ = q->qemu_pid_ = pid;
  q->out_fd_ = pipefd[0];
  std::map<std::string, std::string> ptys;
  bool ok = ReadUntil(
      q->out_fd_, q->output_,
      [&](const std::string& b) {
        ptys = Ptys(b);
        return ptys.count("serial0") && (!o.semihosting || ptys.count("semihosting"));
      },
      10000);
  if (ok && q->sandboxed_) {
    q->qemu_pid_ = QemuUnder(pid, 5000);
    ok = q->qemu_pid_ > 0;
    if (!ok) q->output_ += "QEMU's process was not found in its sandbox";
  }
  if (!ok) {
    std::string out = q->output_;
    q->Stop();
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    if (out.find("exec ") == 0)
      return absl::NotFoundError(absl::StrCat(o.binary, ": not found (install qemu-system-arm)"));
    return absl::UnavailableError(
        absl::StrCat("QEMU (", o.machine, ") did not start: ", out.empty() ? "no output" : out));
  }
  // A sandboxed QEMU's ptys are in its own /dev, seen through its root.
  const std::string root = q->sandboxed_ ? absl::StrCat("/proc/", q->qemu_pid_, "/root") : "";
  q->pty_ = root + ptys["serial0"];
  if (o.semihosting) q->semihosting_pty_ = root + ptys["semihosting"];
  // QMP: connect, read the greeting, negotiate.
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, q->qmp_path_.c_str(), sizeof(addr.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      q->qmp_fd_ = fd;
      break;
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (q->qmp_fd_ < 0) {
    q->Stop();
    return absl::UnavailableError("QEMU started but its QMP socket did not answer");
  }
  std::string greeting;
  if (!ReadUntil(
          q->qmp_fd_, greeting,
          [](const std::string& b) { return b.find('\n') != std::string::npos; }, 5000)) {
    q->Stop();
    return absl::UnavailableError("QEMU's QMP socket sent no greeting");
  }
  if (auto r = q->Qmp(R"({"execute":"qmp_capabilities"})"); !r.ok()) {
    q->Stop();
    return r.status();
  }
  // Watch for QEMU exiting by itself (killed, crashed).
  QemuInstance* self = q.get();
  q->watcher_ = std::thread([self] {
    std::string sink;
    char buf[1024];
    while (true) {
      ssize_t n = read(self->out_fd_, buf, sizeof buf);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    int status = 0;
    while (waitpid(self->pid_, &status, 0) < 0 && errno == EINTR) {
    }
    self->wait_status_ = status;
    self->exited_ = true;
    std::function<void(const std::string&)> cb;
    {
      MutexLock lock(&self->mu_);
      cb = self->on_exit_;
    }
    if (cb && !self->stopping_) cb(self->exit_description());
  });
  return q;
}

QemuInstance::~QemuInstance() { Stop(); }

void QemuInstance::RemoveOwnDir() {
  if (own_dir_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(own_dir_, ec);
}

std::string QemuInstance::gdb_target() const {
  return own_dir_.empty() ? absl::StrCat("127.0.0.1:", gdb_port_) : own_dir_ + "/gdb.sock";
}

std::string QemuInstance::exit_description() const {
  if (!exited_) return "running";
  if (WIFSIGNALED(wait_status_))
    return absl::StrCat("QEMU was killed by signal ", WTERMSIG(wait_status_));
  // bubblewrap exits 128 + N when what it ran was killed by signal N.
  if (sandboxed_ && WEXITSTATUS(wait_status_) > 128)
    return absl::StrCat("QEMU was killed by signal ", WEXITSTATUS(wait_status_) - 128);
  return absl::StrCat("QEMU exited with status ", WEXITSTATUS(wait_status_));
}

void QemuInstance::SetOnExit(std::function<void(const std::string&)> fn) {
  MutexLock lock(&mu_);
  on_exit_ = std::move(fn);
}

absl::StatusOr<std::string> QemuInstance::Qmp(const std::string& command_json) {
  MutexLock lock(&qmp_mu_);
  if (qmp_fd_ < 0 || exited_) return absl::UnavailableError("QEMU is not running");
  std::string line = command_json + "\n";
  if (send(qmp_fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return absl::UnavailableError(absl::StrCat("QMP write: ", std::strerror(errno)));
  }
  // Skip asynchronous events until the command's return or error.
  std::string buf;
  while (true) {
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string msg = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      auto j = nlohmann::json::parse(msg, nullptr, false);
      if (j.is_discarded() || j.contains("event")) continue;
      if (j.contains("error")) {
        return absl::InternalError(absl::StrCat("QMP: ", j["error"].value("desc", msg)));
      }
      return msg;
    }
    if (!ReadUntil(
            qmp_fd_, buf, [](const std::string& b) { return b.find('\n') != std::string::npos; },
            5000)) {
      return absl::DeadlineExceededError("QMP: no answer from QEMU");
    }
  }
}

absl::StatusOr<std::string> QemuInstance::Hmp(const std::string& command_line) {
  const nlohmann::json cmd = {{"execute", "human-monitor-command"},
                              {"arguments", {{"command-line", command_line}}}};
  auto reply = Qmp(cmd.dump());
  if (!reply.ok()) return reply.status();
  auto j = nlohmann::json::parse(*reply, nullptr, false);
  if (!j.is_object() || !j.contains("return") || !j["return"].is_string())
    return absl::InternalError(absl::StrCat("QMP: unexpected answer to '", command_line, "'"));
  return j["return"].get<std::string>();
}

absl::Status QemuInstance::Continue() { return Qmp(R"({"execute":"cont"})").status(); }

absl::Status QemuInstance::Pause() { return Qmp(R"({"execute":"stop"})").status(); }

absl::Status QemuInstance::Reset() { return Qmp(R"({"execute":"system_reset"})").status(); }

void QemuInstance::Stop() {
  if (pid_ <= 0) {
    RemoveOwnDir();  // a start refused before QEMU ran
    return;
  }
  stopping_ = true;
  if (!exited_) {
    (void)Qmp(R"({"execute":"quit"})");
    for (int i = 0; i < 50 && !exited_ && watcher_.joinable(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited_) {
      if (qemu_pid_ > 0 && qemu_pid_ != pid_) kill(qemu_pid_, SIGKILL);
      kill(pid_, SIGKILL);
    }
  }
  if (watcher_.joinable()) {
    watcher_.join();
  } else if (!exited_) {
    int status;
    waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (qmp_fd_ >= 0) close(qmp_fd_);
  out_fd_ = qmp_fd_ = -1;
  unlink(qmp_path_.c_str());
  RemoveOwnDir();
  pid_ = qemu_pid_ = -1;
}

}  // namespace fwai

namespace fwai {
namespace {

// The host address QEMU gives for guest physical address `address`.
absl::StatusOr<uint64_t> Gpa2Hva(QemuInstance& qemu, uint64_t address) {
  auto text = qemu.Hmp("gpa2hva " + AddressHex(address));
  if (!text.ok()) return text.status();
  static const std::regex kIs(R"(is (0x[0-9a-fA-F]+))");
  std::smatch m;
  if (!std::regex_search(*text, m, kIs)) {
    std::string said = *text;
    while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
    return absl::FailedPreconditionError(absl::StrCat("the simulator has no memory at ",
                                                      AddressHex(address), " (QEMU: ", said, ")"));
  }
  uint64_t host = 0;
  if (!absl::SimpleHexAtoi(m[1].str(), &host)) {
    return absl::InternalError(absl::StrCat("QEMU's gpa2hva said ", m[1].str()));
  }
  return host;
}

// Moves `size` bytes at guest `address` with `io(done)`, a pread or pwrite
// of what is left from `done` on; goes on after a short or interrupted one.
absl::Status Transfer(uint32_t address, size_t size, const char* verb,
                      const std::function<ssize_t(size_t done)>& io) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = io(done);
    const int err = errno;
    if (n < 0 && err == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat(verb, " the simulator's memory at ",
                                                 AddressHex(address + done), ": ",
                                                 n < 0 ? std::strerror(err) : "it has exited"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<QemuTargetMemory>> QemuTargetMemory::Open(
    QemuInstance& qemu, const std::vector<Region>& regions) {
  std::vector<Mapped> mapped;
  for (const Region& r : regions) {
    if (r.size == 0) continue;
    auto first = Gpa2Hva(qemu, r.address);
    if (!first.ok()) return first.status();
    auto last = Gpa2Hva(qemu, uint64_t{r.address} + r.size - 1);
    if (!last.ok()) return last.status();
    // The two ends one block apart: QEMU maps a memory region as one host
    // block, so what lies between is that block's too.
    if (*last != *first + r.size - 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("the simulator's memory at ", AddressHex(r.address), "..",
                       AddressHex(uint64_t{r.address} + r.size), " is not one block"));
    }
    mapped.push_back({r, *first});
  }
  const std::string path = absl::StrCat("/proc/", qemu.pid(), "/mem");
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  bool read_only = false;
  if (fd < 0 && (errno == EACCES || errno == EPERM)) {
    // A kernel that refuses writes to /proc/PID/mem (proc_mem.force_override)
    // may still allow reads.
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    read_only = fd >= 0;
  }
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("reading the simulator's memory needs ", path, ": ", std::strerror(errno),
                     " (fwaid must be QEMU's parent and the same user)"));
  }
  std::unique_ptr<QemuTargetMemory> mem(new QemuTargetMemory(fd, read_only, std::move(mapped)));
  // Opening may succeed where reading does not (a process that is not
  // ours to trace): try one byte of each region.
  for (const Mapped& m : mem->mapped_) {
    uint8_t byte;
    if (auto s = mem->Read(m.guest.address, {&byte, 1}); !s.ok()) return s;
  }
  return mem;
}

QemuTargetMemory::~QemuTargetMemory() { close(fd_); }

absl::StatusOr<uint64_t> QemuTargetMemory::HostAddress(uint32_t address, size_t n) const {
  for (const Mapped& m : mapped_) {
    if (address >= m.guest.address &&
        uint64_t{address} + n <= uint64_t{m.guest.address} + m.guest.size)
      return m.host + (address - m.guest.address);
  }
  return absl::OutOfRangeError(absl::StrCat("target memory ", AddressHex(address), "..",
                                            AddressHex(uint64_t{address} + n),
                                            " is outside the regions fwai reads"));
}

absl::Status QemuTargetMemory::Read(uint32_t address, std::span<uint8_t> out) {
  auto host = HostAddress(address, out.size());
  if (!host.ok()) return host.status();
  return Transfer(address, out.size(), "reading", [&](size_t done) {
    return pread(fd_, out.data() + done, out.size() - done, *host + done);
  });
}

absl::Status QemuTargetMemory::Write(uint32_t address, std::span<const uint8_t> bytes) {
  auto host = HostAddress(address, bytes.size());
  if (!host.ok()) return host.status();
  if (read_only_) {
    return absl::PermissionDeniedError(absl::StrCat(
        "writing the simulator's memory at ", AddressHex(address),
        ": this kernel lets fwaid read QEMU's memory but not write it (proc_mem.force_override)"));
  }
  return Transfer(address, bytes.size(), "writing", [&](size_t done) {
    return pwrite(fd_, bytes.data() + done, bytes.size() - done, *host + done);
  });
}

}  // namespace fwai
