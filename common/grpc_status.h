// grpc_status: absl::Status to and from grpc::Status, keeping the verdict.
//
// ToGrpc puts a status's verdict (common/verdict.h) into the call's error
// details (google.rpc.Status with a fwai.v1.FailureVerdict, see
// proto/fwai/v1/errors.proto); FromGrpc reads it back. So a lab front
// passes on the verdict its bench set, and the CLI reports it, without
// reading anything into an error's words.
//
// Thread-safety: free functions without state.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace fwai {

grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);
// The verdict in a call's error details ("" : none).
std::string VerdictOf(const grpc::Status& s);

}  // namespace fwai
