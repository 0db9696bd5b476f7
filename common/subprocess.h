// Runs a program (no shell) with a time limit, capturing its output.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string out;  // stdout (capped)
  std::string err;  // stderr (capped)
};

struct LocalAccount;

struct ProcessOptions {
  int timeout_ms = 60000;
  size_t max_output = 64 << 20;
  std::string stdin_data;
  std::string cwd;
  // The account the program runs as (null: fwaid's own); it becomes that
  // account for good before chdir and exec.
  const LocalAccount* run_as = nullptr;
};

// The full path of `name` on $PATH (or `name` itself if it contains a slash
// and is executable); "" if there is none.
std::string FindProgram(const std::string& name);

// In a forked child, before exec: stdin/stdout/stderr from the given fds (-1:
// /dev/null for stdin, unchanged otherwise), every other fd closed, signals
// unblocked, and the child killed if fwaid dies.
void PrepareChild(int stdin_fd, int stdout_fd, int stderr_fd);

// An argv for exec built before the fork: a forked child of a threaded
// process must not allocate (another thread may have held the allocator's
// lock at the fork). Points into `args`, which must outlive it (exec reads
// the strings, never writes them).
std::vector<char*> ExecArgv(const std::vector<std::string>& args);

// In a forked child: PrepareChild, then exec `argv` (null-terminated, PATH
// searched); exits 127 if it cannot. Makes system calls only.
[[noreturn]] void ExecChild(char* const* argv, int stdin_fd, int stdout_fd, int stderr_fd);

// fork() for children that outlive the calling thread (simulators, debuggers,
// servers): PrepareChild's parent-death signal fires when the thread that
// forked exits, so these are forked on one thread that lives as long as the
// process. `in_child` runs in the child and must exec or _exit. Returns the
// pid, or -1 with errno set.
pid_t ForkLongLived(const std::function<void()>& in_child);

// NOT_FOUND if the program does not exist; otherwise the result, whatever
// its exit code.
[[nodiscard]] absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                                       const ProcessOptions& options = {});

}  // namespace fwai
