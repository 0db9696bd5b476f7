#include "server/agent/tool_offer.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/events.h"
#include "server/agent/plan_mode.h"
#include "server/agent/questions.h"
#include "server/agent/subagents.h"
#include "server/agent/todos.h"

namespace fwai {

namespace {

ToolSpecPtr SpecToolSearch() {
  static const ToolSpecPtr spec = MakeToolSpec(
      kToolSearch,
      "Find more tools for a task among the ones not offered yet (MCP servers and others). "
      "Found tools become callable for the rest of this turn.",
      {{"type", "object"},
       {"properties", {{"query", {{"type", "string"}, {"description", "What the tool must do"}}}}},
       {"required", {"query"}}});
  return spec;
}

// "mcp_lab_flashBoard" -> "lab flash board": a tool name's words, as a query.
std::string NameWords(const std::string& name) {
  std::string out;
  std::string_view n = name;
  if (n.rfind("mcp_", 0) == 0) n.remove_prefix(4);
  char prev = ' ';
  for (char c : n) {
    const bool sep = c == '_' || c == '-' || c == '.' || c == ' ';
    if (sep) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      if (std::isupper(static_cast<unsigned char>(c)) &&
          std::islower(static_cast<unsigned char>(prev)) && !out.empty() && out.back() != ' ') {
        out += ' ';
      }
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    prev = c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

bool OwnTool(const std::string& name) {
  return name == kToolSearch || name == kTodoWrite || name == kTodoRead || name == kAskQuestion ||
         name == kSubmitPlan || name == kDelegate;
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
  for (Tool* t : project) Select(t->name(), "a tool of this project's MCP servers");
  if (select_) {
    int rank = 0;
    for (const std::string& name : deps.retriever(a.request, config.tools_top_k * 3)) {
      if (static_cast<int>(selected_.size()) >= config.tools_top_k) break;
      ++rank;
      if (Tool* t = Find(name); t && !IsCore(*t)) {
        Select(name, absl::StrCat("retrieved for the request (#", rank, ")"));
      }
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
        if (Tool* t = Find(name);
            t && !IsCore(*t) && Select(name, "called lately in this session")) {
          ++recent;
        }
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
                     [&](const ToolSpecPtr& s) { return s->name == name; });
}

bool ToolOffer::Selected(const Tool& tool) const {
  return select_ && !IsCore(tool) && selected_.count(tool.name());
}

bool ToolOffer::Allowed(const std::string& name) const {
  return agent_.allowed.empty() || agent_.allowed.count(name);
}

bool ToolOffer::IsCore(const Tool& tool) { return tool.name().rfind("mcp_", 0) != 0; }

std::vector<ToolSpecPtr> ToolOffer::Build() const {
  const Agent& a = agent_;
  const bool plan_mode = InPlanMode(a);
  std::vector<ToolSpecPtr> out;
  for (Tool* t : all_tools_) {
    if (!Allowed(t->name())) continue;
    if (t->needs_project() && !a.turn->account) continue;
    if ((a.read_only || plan_mode) && !t->read_only() &&
        !(plan_mode && a.is_main() && PlanWritable(t->name()))) {
      continue;
    }
    if (!select_ || IsCore(*t) || selected_.count(t->name())) {
      out.push_back(t->spec());
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
  for (const auto& s : specs_) {
    o->add_tools(s->name);
    auto* t = o->add_offered();
    t->set_name(s->name);
    t->set_why(Why(s->name));
  }
  o->set_reason(reason);
  // Not waited for: it is stored in its order before the call's text, and
  // the request need not wait for the disk.
  agent_.turn->sink.Emit(std::move(ev), /*wait=*/false);
}

ToolResult ToolOffer::Search(const std::string& query) {
  const int top_k = deps_.config.tools_top_k;
  std::string found;
  int added = 0;
  for (const std::string& name :
       query.empty() ? std::vector<std::string>{} : deps_.retriever(query, top_k * 3)) {
    Tool* t = Find(name);
    if (!t || IsCore(*t) || added >= top_k) continue;
    Select(name, absl::StrCat("found by toolSearch for '", query, "'"));
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

std::string ToolOffer::Why(const std::string& name) const {
  if (auto it = selected_.find(name); it != selected_.end()) return it->second;
  if (OwnTool(name)) return "the agent's own";
  return "built in";
}

std::vector<std::string> ToolOffer::SelectMore(const std::string& query, int n,
                                               const std::string& skip, const std::string& why) {
  std::vector<std::string> added;
  if (query.empty() || n <= 0) return added;
  for (const std::string& name : deps_.retriever(query, deps_.config.tools_top_k * 3 + n)) {
    if (static_cast<int>(added.size()) >= n) break;
    Tool* t = Find(name);
    if (!t || IsCore(*t) || name == skip || !Allowed(name)) continue;
    if (Select(name, why)) added.push_back(name);
  }
  return added;
}

std::string ToolOffer::AfterWrongCall(const std::string& name, const Tool* tool, bool ran) {
  if (!select_ || OwnTool(name) || (tool && IsCore(*tool))) return "";
  if (!learned_from_.insert(name).second) return "";
  std::vector<std::string> added;
  if (tool && !ran) {
    // Asked for by its exact name: the agent knows what it wants.
    if (Allowed(name) && Select(name, "called by name before it was offered")) {
      added.push_back(name);
    }
  } else if (!tool) {
    // The name the agent made up says what it wanted done.
    added = SelectMore(absl::StrCat(NameWords(name), " ", agent_.request), kAlternatives, name,
                       absl::StrCat("nearest to '", name, "', a tool that does not exist"));
  } else {
    added = SelectMore(agent_.request, kAlternatives, name,
                       absl::StrCat("next best for the request after ", name, " failed"));
  }
  if (added.empty()) return "";
  specs_ = Build();
  Announce("after a wrong call");
  return absl::StrCat("\nOffered from the next call: ", absl::StrJoin(added, ", "));
}

}  // namespace fwai
