// Agent tools over the hardware broker: serialMonitor, serialReadHistory,
// serialSendCommand and gdb. Writes and debugging need the session's lease
// (held by the session or by its owner), checked by the broker.
#pragma once

#include "server/hardware/broker.h"
#include "server/tools/tool.h"

namespace fwai {

void RegisterHardwareTools(ToolRegistry& registry, HardwareBroker& broker);

}  // namespace fwai
