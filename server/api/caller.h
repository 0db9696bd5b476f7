// Who is calling an RPC, as the hardware broker and the skill runner see it.
#pragma once

#include <string>

#include "server/api/api.h"
#include "server/hardware/broker.h"

namespace grpc {
class CallbackServerContext;
}

namespace fwai {

// Identity (uid from the unix socket's peer credentials), display name
// ("alice (uid 1000) via vscode"), admin (root or the daemon's own user).
Caller CallerFromContext(const ApiDeps& deps, grpc::CallbackServerContext* ctx, const std::string& lease_id = "",
                         const std::string& session_id = "");

}  // namespace fwai
