// Shared pieces of the fwai command groups: global flags, exit codes,
// connecting, and error reporting.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "client/lib/client.h"

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
  CredentialFlags credentials;  // --ca-cert, --client-cert, --client-key, --token-file
  bool verbose = false;         // --verbose: gRPC's own log lines on stderr
};

// Prints "fwai: MSG" (and a JSON error line with --json); returns `code`.
int Fail(const Globals& g, int code, const std::string& msg);
// UNAVAILABLE -> exit 3, anything else -> exit 1.
int FailGrpc(const Globals& g, const grpc::Status& s);
// --project (default: here) as an absolute, normalised path.
std::string ProjectRoot(const Globals& g);
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectChannel(const Globals& g,
                                                              bool autostart = true,
                                                              int timeout_ms = 5000);

// --batch FILE: JSON lines with a "query" field. For each, `run` returns
// {took_ms, results}; one JSON line is printed per query ({query, id?,
// took_ms, results} or {query, error}). UNAVAILABLE stops the batch (exit 3).
int RunBatch(const Globals& g, const std::string& file,
             const std::function<absl::StatusOr<nlohmann::json>(const std::string& query)>& run);

}  // namespace fwai
