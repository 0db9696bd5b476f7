// The agent's board tools over the board contract: serialMonitor,
// serialReadHistory, serialSendCommand and gdb. They work the same on a
// board of this node and on a bench's board of the lab: writes and
// debugging need the session's lease (held by the session or by its owner,
// through this node for a lab board), checked by the board's host.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "server/tools/tool.h"

namespace fwai {

class Boards;
struct LocalAccount;

void RegisterHardwareTools(ToolRegistry& registry, Boards& boards);

// Saves a fault capture into `project_root`/.fwai/captures/BOARD-TIME.fwcap
// as `account` (beneath the root only); the path relative to the project.
[[nodiscard]] absl::StatusOr<std::string> SaveCaptureInProject(const std::string& project_root,
                                                               const LocalAccount* account,
                                                               const std::string& board,
                                                               const nlohmann::json& capture);

}  // namespace fwai
