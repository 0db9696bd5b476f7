// agent: one tool call of an agent's reply, start to finish: the
// tool_call_started event, the agent's call budget, dispatch to the agent's
// own tools (toolSearch, todos, questions, plan, delegation) or to a tool of
// the registry once mode and policy allow it, secret redaction, the
// tool_call_finished event, and the call's log for the run record.
#pragma once

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "server/tools/tool.h"

namespace fwai {

struct AgentDeps;
struct Agent;
class ToolOffer;

// One per agent loop; the arguments must outlive it.
class ToolCaller {
 public:
  ToolCaller(const AgentDeps& deps, Agent& agent, ToolOffer& offer)
      : deps_(deps), agent_(agent), offer_(offer) {}
  ToolCaller(const ToolCaller&) = delete;
  ToolCaller& operator=(const ToolCaller&) = delete;

  // Runs a tool_use block; returns its tool_result block. Delegations may run
  // on several threads at once; every other call runs alone.
  nlohmann::json Run(const nlohmann::json& call);

 private:
  ToolResult Dispatch(const std::string& call_id, const std::string& tool_name,
                      const nlohmann::json& input);
  // Why `tool_name` may not be called by this agent now.
  std::string Refusal(const Tool* tool, const std::string& tool_name) const;
  ToolResult RunTool(Tool& tool, const std::string& call_id, const nlohmann::json& input);
  void Log(const std::string& call_id, const std::string& tool_name, const nlohmann::json& input,
           const ToolResult& tr, int64_t t0);

  const AgentDeps& deps_;
  Agent& agent_;
  ToolOffer& offer_;
  std::atomic<int> calls_made_{0};  // delegations count from several threads
};

}  // namespace fwai
