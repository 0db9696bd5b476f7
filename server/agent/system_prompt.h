// agent: the system prompt of an agent: who fwai is, the session's project and
// mode, the tools offered, and plan mode's rules while the main agent plans.
// Sub-agents bring their own prompt.
#pragma once

#include <string>
#include <vector>

#include "server/llm/provider.h"

namespace fwai {

struct Agent;
struct SessionInfo;

std::string SystemPrompt(const SessionInfo& s, const std::vector<ToolSpecPtr>& tools);

// The prompt of agent `a` offered `tools`, for its next model call.
std::string SystemPromptFor(const Agent& a, const std::vector<ToolSpecPtr>& tools);

}  // namespace fwai
