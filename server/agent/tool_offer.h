// agent: which tools an agent is offered on each model call. With many tools
// (MCP servers, ...) the main agent gets the core (built-in) tools, the ones
// retrieved for the request, those the session called lately, those it
// finds with toolSearch and those it learns of from a wrong call (a tool that
// does not exist, one not offered, one that failed). Read-only agents and plan
// mode get only what cannot change anything; the agent's own tools (todos,
// questions, plan, delegation) are added by its role and mode. Each offered
// tool carries why it is offered (the tools_offered event says it).
#pragma once

#include <map>
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
  const std::vector<ToolSpecPtr>& specs() const { return specs_; }
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

  // A call of `name` went wrong: `tool` is null when no such tool exists;
  // `ran` when it ran and returned an error (else it was refused as not
  // offered). Selects what the mistake says the agent wants (the tool itself
  // when it exists and was not offered; else up to kAlternatives tools nearest
  // to the wrong name and the request), offers and announces them, once per
  // tool and turn. Returns a line for the call's result naming them, or "".
  std::string AfterWrongCall(const std::string& name, const Tool* tool, bool ran);
  static constexpr int kAlternatives = 3;

  // Why `name` is offered now ("built in", "retrieved for the request (#2)", ...).
  std::string Why(const std::string& name) const;

 private:
  std::vector<ToolSpecPtr> Build() const;
  // Selects up to `n` tools retrieved for `query` that are not selected yet
  // (nor `skip`), each with `why`; returns their names.
  std::vector<std::string> SelectMore(const std::string& query, int n, const std::string& skip,
                                      const std::string& why);

  const AgentDeps& deps_;
  const Agent& agent_;
  std::vector<Tool*> all_tools_;
  bool select_ = false;
  // Selects `name` for the offer, with why; false if it was selected already.
  bool Select(const std::string& name, std::string why) {
    return selected_.emplace(name, std::move(why)).second;
  }

  std::map<std::string, std::string> selected_;  // selected tool -> why it is offered
  std::set<std::string> learned_from_;           // wrong calls already learned from
  std::vector<ToolSpecPtr> specs_;
};

}  // namespace fwai
