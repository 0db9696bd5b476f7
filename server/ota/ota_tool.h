// The agent's view of over-the-air updates: otaStatus (read-only) reports what
// each board runs, what its slots hold and how recent rollouts went.
#pragma once

#include "server/ota/rollout.h"
#include "server/tools/tool.h"

namespace fwai {

void RegisterOtaTools(ToolRegistry& registry, RolloutManager& rollouts);

}  // namespace fwai
