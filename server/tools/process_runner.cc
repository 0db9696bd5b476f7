#include "server/tools/process_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "common/subprocess.h"

namespace fwai {

const std::string& SandboxBinary() {
  static const std::string bin = [] {
    std::string b = FindProgram("bwrap");
    if (b.empty()) return b;
    // It must also work here (user namespaces may be disabled).
    CommandOptions probe;
    probe.command = "true";
    probe.project_root = "/";
    probe.sandbox = false;
    probe.timeout_ms = 5000;
    pid_t pid = fork();
    if (pid == 0) {
      int devnull = open("/dev/null", O_RDWR);
      dup2(devnull, 1);
      dup2(devnull, 2);
      execl(b.c_str(), b.c_str(), "--ro-bind", "/", "/", "--unshare-pid", "--die-with-parent",
            "/bin/true", static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
      return std::string();
    return b;
  }();
  return bin;
}

absl::StatusOr<CommandResult> RunCommand(const CommandOptions& o) {
  if (o.command.empty()) return absl::InvalidArgumentError("command: empty");
  std::vector<std::string> args;
  const std::string& bwrap = o.sandbox ? SandboxBinary() : std::string();
  CommandResult result;
  if (!bwrap.empty()) {
    result.sandboxed = true;
    args = {bwrap,
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--bind",
            o.project_root,
            o.project_root,
            "--chdir",
            o.project_root,
            "--unshare-pid",
            "--die-with-parent",
            "--new-session"};
    if (!o.network) args.push_back("--unshare-net");
    args.insert(args.end(), {"--", "/bin/bash", "-c", o.command});
  } else {
    args = {"/bin/bash", "-c", o.command};
  }
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0)
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  std::vector<char*> argv = ExecArgv(args);
  const int64_t t0 = MonotonicNanos();
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: the whole tree is killed together
    PrepareChild(-1, pipefd[1], pipefd[1]);
    if (o.memory_mb > 0) {
      rlimit rl{static_cast<rlim_t>(o.memory_mb) << 20, static_cast<rlim_t>(o.memory_mb) << 20};
      setrlimit(RLIMIT_AS, &rl);
    }
    if (o.run_as && BecomeAccountInChild(*o.run_as) != 0) _exit(126);
    if (chdir(o.project_root.c_str()) != 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipefd[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.timeout_ms);
  bool killed = false;
  auto kill_tree = [&] {
    if (!killed) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      killed = true;
    }
  };
  char buf[8192];
  while (true) {
    if (!killed && o.cancel && o.cancel->cancelled()) {
      result.cancelled = true;
      kill_tree();
    }
    if (!killed && std::chrono::steady_clock::now() >= deadline) {
      result.timed_out = true;
      kill_tree();
    }
    pollfd p{pipefd[0], POLLIN, 0};
    int r = poll(&p, 1, 50);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) {
      // After a kill, a grandchild that escaped the group may hold the pipe.
      if (killed && std::chrono::steady_clock::now() > deadline + std::chrono::seconds(2)) break;
      continue;
    }
    ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    std::string_view chunk(buf, static_cast<size_t>(n));
    if (o.output) o.output(chunk);
    result.output.append(chunk);
    if (result.output.size() > o.max_output * 2)
      result.output.erase(0, result.output.size() - o.max_output);
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  kill(-pid, SIGKILL);  // anything left in the group
  if (result.output.size() > o.max_output) {
    result.output = absl::StrCat("... (", result.output.size() - o.max_output, " bytes cut)\n",
                                 result.output.substr(result.output.size() - o.max_output));
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
  }
  result.duration_ms = (MonotonicNanos() - t0) / 1000000;
  return result;
}

}  // namespace fwai
