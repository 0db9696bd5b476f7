// The agent's `build` tool: runs the project's build skill (the same run,
// record and evidence as `fwai run build`) and answers with the diagnostics,
// the images made with their SHA-256, the memory use with its change since
// the previous build, and whether the toolchain verified — what the agent
// needs to know before it asks to flash.
#pragma once

#include "server/skills/runner.h"
#include "server/tools/tool.h"

namespace fwai {

void RegisterSkillTools(ToolRegistry& registry, SkillRunner& runner);

}  // namespace fwai
