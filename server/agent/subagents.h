// agent: sub-agents. delegateSubagent hands a self-contained task to an agent
// of a configured type (built-in types, overridden or extended by
// agent.subagents) with its own context, tools and timeout; the delegating
// agent sees only its report. Several delegations of one reply run in parallel.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/config.h"
#include "server/llm/provider.h"
#include "server/tools/tool.h"

namespace fwai {

struct AgentDeps;
struct Agent;

inline constexpr char kDelegate[] = "delegateSubagent";

// The sub-agent types by name.
std::map<std::string, SubagentConfig> SubagentTypes(const DaemonConfig& config);

ToolSpecPtr SpecDelegate(const std::map<std::string, SubagentConfig>& types);

// Runs input.task on a sub-agent of input.agent_type under tool call
// `call_id` of `parent`, until it reports, fails, times out or the parent is
// cancelled. Safe to call from several threads at once.
ToolResult Delegate(const AgentDeps& deps, Agent& parent, const std::string& call_id,
                    const nlohmann::json& input);

}  // namespace fwai
