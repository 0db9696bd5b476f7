// Runs a unary RPC's work on the pool (reactions never block) and finishes
// the call with its status. Internal to server/api.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

#include "common/thread_pool.h"
#include "server/api/api.h"

namespace fwai {

inline grpc::ServerUnaryReactor* OffloadUnary(grpc::CallbackServerContext* ctx, ThreadPool* pool,
                                              bool available,
                                              const std::string& unavailable_message,
                                              std::function<absl::Status()> work) {
  auto* r = ctx->DefaultReactor();
  if (!available) {
    r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, unavailable_message));
    return r;
  }
  if (!pool->Submit([r, work = std::move(work)] { r->Finish(ToGrpcStatus(work())); })) {
    r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fwaid is shutting down"));
  }
  return r;
}

}  // namespace fwai
