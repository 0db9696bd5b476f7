// Shared pieces of the fwai command groups: global flags, exit codes,
// connecting, and error reporting.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fwai {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;
constexpr int kExitTurnFailed = 4;

struct Globals {
  std::string daemon;
  bool json = false;
  std::string project;
};

// Prints "fwai: MSG" (and a JSON error line with --json); returns `code`.
int Fail(const Globals& g, int code, const std::string& msg);
// UNAVAILABLE -> exit 3, anything else -> exit 1.
int FailGrpc(const Globals& g, const grpc::Status& s);
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectChannel(const Globals& g, bool autostart = true);

}  // namespace fwai
