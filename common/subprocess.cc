#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>  // std::once_flag, std::call_once
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/local_account.h"
#include "common/mutex.h"

namespace fwai {

std::string FindProgram(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "/usr/bin:/bin";
  while (!rest.empty()) {
    size_t c = rest.find(':');
    std::string full = std::string(rest.substr(0, c)) + "/" + name;
    rest = c == std::string_view::npos ? std::string_view() : rest.substr(c + 1);
    if (access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

pid_t ForkLongLived(const std::function<void()>& in_child) {
  // pid, err and done are guarded by Shared::mu (a local struct's field
  // cannot name it for the analysis).
  struct Job {
    const std::function<void()>* fn;
    pid_t pid = -1;
    int err = 0;
    bool done = false;
  };
  // Never destroyed: the forking thread waits on them until the process ends
  // (destroying a condition variable with a waiter blocks exit).
  struct Shared {
    Mutex mu;
    CondVar cv;
    std::deque<Job*> queue ABSL_GUARDED_BY(mu);
  };
  static Shared* const shared = new Shared;
  static std::once_flag started;
  std::call_once(started, [] {
    std::thread([] {
      MutexLock lock(&shared->mu);
      while (true) {
        while (shared->queue.empty()) shared->cv.Wait(&shared->mu);
        Job* j = shared->queue.front();
        shared->queue.pop_front();
        pid_t pid = fork();
        if (pid == 0) {
          (*j->fn)();
          _exit(127);
        }
        j->pid = pid;
        j->err = pid < 0 ? errno : 0;
        j->done = true;
        shared->cv.SignalAll();
      }
    }).detach();
  });
  Job job{&in_child};
  MutexLock lock(&shared->mu);
  shared->queue.push_back(&job);
  shared->cv.SignalAll();
  while (!job.done) shared->cv.Wait(&shared->mu);
  if (job.pid < 0) errno = job.err;
  return job.pid;
}

void PrepareChild(int stdin_fd, int stdout_fd, int stderr_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (stdin_fd < 0) stdin_fd = open("/dev/null", O_RDONLY);
  if (stdin_fd >= 0) dup2(stdin_fd, 0);
  if (stdout_fd >= 0) dup2(stdout_fd, 1);
  if (stderr_fd >= 0) dup2(stderr_fd, 2);
  close_range(3, ~0U, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
}

std::vector<char*> ExecArgv(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

void ExecChild(char* const* argv, int stdin_fd, int stdout_fd, int stderr_fd) {
  PrepareChild(stdin_fd, stdout_fd, stderr_fd);
  execvp(argv[0], argv);
  // write(2) only: formatting may allocate.
  const char* why = errno == ENOENT ? ": not found\n" : ": cannot be run\n";
  (void)!write(2, "exec ", 5);
  (void)!write(2, argv[0], strlen(argv[0]));
  (void)!write(2, why, strlen(why));
  _exit(127);
}

namespace {

// Under TSan the child is forked: TSan's interceptors must not run in a
// child that shares the caller's memory.
#if defined(__SANITIZE_THREAD__)
#define FWAI_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FWAI_UNDER_TSAN 1
#endif
#endif
#ifdef FWAI_UNDER_TSAN
constexpr bool kShareMemoryWithChild = false;
#else
constexpr bool kShareMemoryWithChild = true;
#endif

// What the child of RunProcess needs, built before it starts: between the
// clone and the exec it shares the caller's memory, so it may not allocate.
struct ChildPlan {
  char* const* argv;
  int in_fd, out_fd, err_fd, exec_err_fd;
  const LocalAccount* run_as;
  const char* cwd;  // null: stay
};

// Runs in the child: only system calls, nothing that allocates or locks.
[[noreturn]] void RunChild(const ChildPlan& p) {
  // Handlers are the caller's code; the exec resets them anyway, but a
  // signal before it must not run one on the caller's memory.
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction sa;
    if (sigaction(sig, nullptr, &sa) != 0 || sa.sa_handler == SIG_IGN || sa.sa_handler == SIG_DFL)
      continue;
    sa.sa_handler = SIG_DFL;
    sa.sa_flags &= ~SA_SIGINFO;
    sigaction(sig, &sa, nullptr);
  }
  setpgid(0, 0);
  dup2(p.in_fd, 0);
  dup2(p.out_fd, 1);
  dup2(p.err_fd, 2);
  if (p.run_as && BecomeAccountInChild(*p.run_as) != 0) _exit(126);
  if (p.cwd && chdir(p.cwd) != 0) _exit(126);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execvp(p.argv[0], p.argv);
  int e = errno;
  (void)!write(p.exec_err_fd, &e, sizeof(e));
  _exit(127);
}

int ChildEntry(void* plan) { RunChild(*static_cast<const ChildPlan*>(plan)); }

// Starts the child. Without sanitizers it shares the caller's memory until
// it execs (clone with CLONE_VM | CLONE_VFORK, as posix_spawn does): the
// cost does not grow with fwaid's heap, and no page of it becomes
// copy-on-write. All signals stay blocked in the caller meanwhile.
pid_t StartChild(const ChildPlan& plan) {
  if (!kShareMemoryWithChild) {
    const pid_t pid = fork();
    if (pid == 0) RunChild(plan);
    return pid;
  }
  constexpr size_t kStack = 256 << 10;  // execvp may copy PATH entries onto it
  void* stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
  if (stack == MAP_FAILED) return -1;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = clone(ChildEntry, static_cast<char*>(stack) + kStack,
                          CLONE_VM | CLONE_VFORK | SIGCHLD, const_cast<ChildPlan*>(&plan));
  const int err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  munmap(stack, kStack);
  errno = err;
  return pid;
}

}  // namespace

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         const ProcessOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("RunProcess: empty argv");
  std::vector<char*> args = ExecArgv(argv);
  int in_pipe[2], out_pipe[2], err_pipe[2], exec_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) || pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) ||
      pipe2(exec_pipe, O_CLOEXEC)) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const ChildPlan plan{args.data(),
                       in_pipe[0],
                       out_pipe[1],
                       err_pipe[1],
                       exec_pipe[1],
                       options.run_as,
                       options.cwd.empty() ? nullptr : options.cwd.c_str()};
  const pid_t pid = StartChild(plan);
  if (pid < 0) {
    const int e = errno;
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1],
                   exec_pipe[0], exec_pipe[1]})
      close(fd);
    return absl::InternalError(absl::StrCat("starting ", argv[0], ": ", std::strerror(e)));
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  int exec_errno = 0;
  if (read(exec_pipe[0], &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno)) {
    close(exec_pipe[0]);
    close(in_pipe[1]);
    close(out_pipe[0]);
    close(err_pipe[0]);
    waitpid(pid, nullptr, 0);
    if (exec_errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(argv[0], ": program not found"));
    return absl::FailedPreconditionError(absl::StrCat(argv[0], ": ", std::strerror(exec_errno)));
  }
  close(exec_pipe[0]);
  // Feed stdin (small inputs) then close it.
  if (!options.stdin_data.empty()) {
    size_t off = 0;
    signal(SIGPIPE, SIG_IGN);
    while (off < options.stdin_data.size()) {
      ssize_t n =
          write(in_pipe[1], options.stdin_data.data() + off, options.stdin_data.size() - off);
      if (n <= 0) break;
      off += n;
    }
  }
  close(in_pipe[1]);
  ProcessResult res;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
  char buf[65536];
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      res.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000))) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      std::string& dst = i == 0 ? res.out : res.err;
      if (dst.size() < options.max_output)
        dst.append(buf, std::min<size_t>(n, options.max_output - dst.size()));
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) {
    res.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    res.signal = WTERMSIG(status);
  }
  return res;
}

}  // namespace fwai
