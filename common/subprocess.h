// Runs a program (no shell) with a time limit, capturing its output.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct ProcessResult {
  int exit_code = -1;     // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string out;        // stdout (capped)
  std::string err;        // stderr (capped)
};

struct ProcessOptions {
  int timeout_ms = 60000;
  size_t max_output = 64 << 20;
  std::string stdin_data;
  std::string cwd;
};

// NOT_FOUND if the program does not exist; otherwise the result, whatever
// its exit code.
[[nodiscard]] absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                                       const ProcessOptions& options = {});

}  // namespace fwai
