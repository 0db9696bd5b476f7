// agent: which tools an agent is offered on each model call. With many tools
// (MCP servers, ...) the main agent gets the core (built-in) tools, the ones
// retrieved for the request, those the session called lately and those it
// finds with toolSearch. Read-only agents and plan mode get only what cannot
// change anything; the agent's own tools (todos, questions, plan, delegation)
// are added by its role and mode.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "server/llm/provider.h"
#include "server/tools/tool.h"

namespace fwai {

struct AgentDeps;
struct Agent;

inline constexpr char kToolSearch[] = "toolSearch";

// One per agent loop; `deps` and `agent` must outlive it. Not thread-safe.
class ToolOffer {
 public:
  ToolOffer(const AgentDeps& deps, const Agent& agent);
  ToolOffer(const ToolOffer&) = delete;
  ToolOffer& operator=(const ToolOffer&) = delete;

  // What the next model call offers.
  const std::vector<ToolSpec>& specs() const { return specs_; }
  // Offers what the agent's current mode allows (after a mode change).
  void Rebuild() { specs_ = Build(); }
  // Tells the clients what is offered (only when tools are selected per call).
  void Announce(const std::string& reason) const;

  // True when the tools are selected per call (many tools).
  bool selecting() const { return select_; }
  // A registry or project tool by name; null if none.
  Tool* Find(const std::string& name) const;
  bool OfferedNow(const std::string& name) const;
  // True when `tool` is a non-core tool selected for this agent, offered or not.
  bool Selected(const Tool& tool) const;
  // True when the agent's allowed list admits `name`.
  bool Allowed(const std::string& name) const;
  // Built-in tools are core; MCP tools (mcp_*) are selected per call.
  static bool IsCore(const Tool& tool);

  // toolSearch: selects up to agent.tools_top_k more tools for `query`, offers and announces them.
  ToolResult Search(const std::string& query);

 private:
  std::vector<ToolSpec> Build() const;

  const AgentDeps& deps_;
  const Agent& agent_;
  std::vector<Tool*> all_tools_;
  bool select_ = false;
  std::set<std::string> selected_;
  std::vector<ToolSpec> specs_;
};

}  // namespace fwai
