// One runner for every command the agent or a workflow starts: bubblewrap
// when available (read-only root, writable project root, private /tmp, new
// PID namespace, no network unless allowed), time and memory limits, output
// streamed as it comes, the whole process tree killed on cancel or timeout.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/cancel.h"

namespace fwai {

struct LocalAccount;

struct CommandOptions {
  std::string command;       // run by /bin/bash -c
  std::string project_root;  // working directory; the only writable tree in the sandbox
  bool network = false;
  bool sandbox = true;  // false: run directly (still limited)
  int timeout_ms = 120000;
  int64_t memory_mb = 4096;        // address-space limit of the command
  size_t max_output = 256 * 1024;  // kept for the result (the tail); everything is streamed
  std::function<void(std::string_view)> output;
  const CancelToken* cancel = nullptr;
  // The account the command runs as (null: fwaid's own). It becomes that
  // account for good before exec, so the project's permissions apply.
  const LocalAccount* run_as = nullptr;
};

struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  bool cancelled = false;
  bool sandboxed = false;
  std::string output;  // stdout and stderr interleaved (the tail past max_output)
  int64_t duration_ms = 0;
};

// The bubblewrap binary if it is installed and works here, else "".
const std::string& SandboxBinary();

[[nodiscard]] absl::StatusOr<CommandResult> RunCommand(const CommandOptions& options);

}  // namespace fwai
