// The agent's board tools over the board contract: serialMonitor,
// serialReadHistory, serialSendCommand and gdb. They work the same on a
// board of this node and on a bench's board of the lab: writes and
// debugging need the session's lease (held by the session or by its owner,
// through this node for a lab board), checked by the board's host.
#pragma once

#include "server/tools/tool.h"

namespace fwai {

class Boards;

void RegisterHardwareTools(ToolRegistry& registry, Boards& boards);

}  // namespace fwai
