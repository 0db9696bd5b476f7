#include "server/agent/tool_offer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/events.h"
#include "server/agent/plan_mode.h"
#include "server/agent/questions.h"
#include "server/agent/subagents.h"
#include "server/agent/todos.h"

namespace fwai {

namespace {

ToolSpec SpecToolSearch() {
  return {
      kToolSearch,
      "Find more tools for a task among the ones not offered yet (MCP servers and others). "
      "Found tools become callable for the rest of this turn.",
      {{"type", "object"},
       {"properties", {{"query", {{"type", "string"}, {"description", "What the tool must do"}}}}},
       {"required", {"query"}}}};
}

}  // namespace

ToolOffer::ToolOffer(const AgentDeps& deps, const Agent& a)
    : deps_(deps), agent_(a), all_tools_(deps.tools.All()) {
  const std::vector<Tool*>& project = a.turn->project_tools;
  all_tools_.insert(all_tools_.end(), project.begin(), project.end());
  const DaemonConfig& config = deps.config;
  select_ =
      a.is_main() && deps.retriever && static_cast<int>(all_tools_.size()) > config.tool_threshold;
  // The project's own MCP tools are always offered (the shared catalog does not hold them).
  for (Tool* t : project) selected_.insert(t->name());
  if (select_) {
    for (const std::string& name : deps.retriever(a.request, config.tools_top_k * 3)) {
      if (static_cast<int>(selected_.size()) >= config.tools_top_k) break;
      if (Tool* t = Find(name); t && !IsCore(*t)) selected_.insert(name);
    }
    // The tools the session called lately stay offered: a follow-up ("now
    // the same for bank 1") seldom names them again.
    int recent = 0;
    const size_t lookback = std::min<size_t>(a.messages.size(), 40);
    for (size_t i = a.messages.size();
         i > a.messages.size() - lookback && recent < config.tools_top_k; --i) {
      const LlmMessage& m = a.messages[i - 1];
      if (m.role != "assistant" || !m.content.is_array()) continue;
      for (const auto& b : m.content) {
        if (b.value("type", "") != "tool_use" || !b.contains("name") || !b["name"].is_string()) {
          continue;
        }
        const std::string name = b["name"].get<std::string>();
        if (Tool* t = Find(name); t && !IsCore(*t) && selected_.insert(name).second) ++recent;
      }
    }
  }
  specs_ = Build();
}

Tool* ToolOffer::Find(const std::string& name) const {
  if (Tool* t = deps_.tools.Find(name)) return t;
  for (Tool* t : agent_.turn->project_tools) {
    if (t->name() == name) return t;
  }
  return nullptr;
}

bool ToolOffer::OfferedNow(const std::string& name) const {
  return std::any_of(specs_.begin(), specs_.end(),
                     [&](const ToolSpec& s) { return s.name == name; });
}

bool ToolOffer::Selected(const Tool& tool) const {
  return select_ && !IsCore(tool) && selected_.count(tool.name());
}

bool ToolOffer::Allowed(const std::string& name) const {
  return agent_.allowed.empty() || agent_.allowed.count(name);
}

bool ToolOffer::IsCore(const Tool& tool) { return tool.name().rfind("mcp_", 0) != 0; }

std::vector<ToolSpec> ToolOffer::Build() const {
  const Agent& a = agent_;
  const bool plan_mode = InPlanMode(a);
  std::vector<ToolSpec> out;
  for (Tool* t : all_tools_) {
    if (!Allowed(t->name())) continue;
    if (t->needs_project() && !a.turn->account) continue;
    if ((a.read_only || plan_mode) && !t->read_only() &&
        !(plan_mode && a.is_main() && PlanWritable(t->name()))) {
      continue;
    }
    if (!select_ || IsCore(*t) || selected_.count(t->name())) {
      out.push_back({t->name(), t->description(), t->input_schema()});
    }
  }
  if (select_) out.push_back(SpecToolSearch());
  if (a.is_main()) {
    out.push_back(SpecTodoWrite());
    out.push_back(SpecTodoRead());
    out.push_back(SpecAskQuestion());
    if (plan_mode) out.push_back(SpecSubmitPlan());
  }
  if (Allowed(kDelegate) && a.depth < deps_.config.max_subagent_depth) {
    out.push_back(SpecDelegate(SubagentTypes(deps_.config)));
  }
  return out;
}

void ToolOffer::Announce(const std::string& reason) const {
  if (!select_) return;
  v1::ServerEvent ev;
  auto* o = ev.mutable_tools_offered();
  o->mutable_origin()->set_agent(agent_.name);
  for (const auto& s : specs_) o->add_tools(s.name);
  o->set_reason(reason);
  agent_.turn->sink.Emit(std::move(ev));
}

ToolResult ToolOffer::Search(const std::string& query) {
  const int top_k = deps_.config.tools_top_k;
  std::string found;
  int added = 0;
  for (const std::string& name :
       query.empty() ? std::vector<std::string>{} : deps_.retriever(query, top_k * 3)) {
    Tool* t = Find(name);
    if (!t || IsCore(*t) || added >= top_k) continue;
    selected_.insert(name);
    ++added;
    absl::StrAppend(&found, name, ": ", t->description(), "\n");
  }
  ToolResult tr = found.empty()
                      ? ToolResult{"no further tools match", false}
                      : ToolResult{absl::StrCat("These tools are now available:\n", found), false};
  specs_ = Build();
  Announce("after toolSearch");
  return tr;
}

}  // namespace fwai
