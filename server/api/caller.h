// Who is calling an RPC, as the boards and the skill runner see it (Caller,
// server/auth/caller.h).
#pragma once

#include <string>
#include <string_view>

#include "server/api/api.h"
#include "server/auth/caller.h"

namespace grpc {
class CallbackServerContext;
}

namespace fwai {

struct Principal;

// The caller of `rpc` as the broker and the skill runner see it, once the
// gate admits it: the principal's id, "alice (uid 1000) via vscode", admin,
// the local account it acts as. The status otherwise.
absl::StatusOr<Caller> AdmitCaller(const ApiDeps& deps, grpc::CallbackServerContext* ctx,
                                   std::string_view rpc, const std::string& lease_id = "",
                                   const std::string& session_id = "");
Caller CallerFor(const Principal& p, grpc::CallbackServerContext* ctx,
                 const std::string& lease_id = "", const std::string& session_id = "");

}  // namespace fwai
