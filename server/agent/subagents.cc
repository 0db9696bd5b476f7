#include "server/agent/subagents.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/mutex.h"
#include "server/agent/agent.h"
#include "server/agent/loop.h"
#include "server/agent/plan_mode.h"
#include "server/session/session_manager.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

using json = nlohmann::json;

namespace {

SubagentConfig BuiltinType(std::string name, std::string description,
                           std::vector<std::string> tools, std::string prompt) {
  SubagentConfig c;
  c.name = std::move(name);
  c.description = std::move(description);
  c.tools = std::move(tools);
  c.prompt = std::move(prompt);
  return c;
}

// Cancels `cancel` unless destroyed within `timeout_s` seconds.
class Watchdog {
 public:
  Watchdog(CancelToken& cancel, int timeout_s)
      : thread_([this, &cancel, timeout_s] {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
          while (!finished_ && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
          if (!finished_) cancel.Cancel();
        }) {}
  ~Watchdog() {
    finished_ = true;
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::atomic<bool> finished_{false};
  std::thread thread_;  // after finished_: it reads it
};

}  // namespace

std::map<std::string, SubagentConfig> SubagentTypes(const DaemonConfig& config) {
  std::map<std::string, SubagentConfig> out;
  for (SubagentConfig& c : std::vector<SubagentConfig>{
           BuiltinType("codebase-explorer",
                       "Explores the project's source: finds where things are defined and used, "
                       "reports file:line.",
                       {"read_file", "list_dir", "grep", "glob", "codeSearch"},
                       "You explore a firmware codebase to answer one task. Search, read, and "
                       "report concrete findings with file paths and line numbers. Be brief."),
           BuiltinType("document-explorer",
                       "Searches datasheets, reference manuals and notes in the knowledge base.",
                       {"documentSearch", "documentFeedback", "read_file", "list_dir", "grep"},
                       "You look things up in datasheets and manuals for one task. Quote the "
                       "passages you rely on with their source and page."),
           BuiltinType(
               "planning-agent",
               "Produces a step-by-step plan for a change; may delegate exploration.",
               {"read_file", "list_dir", "grep", "glob", "documentSearch", "codeSearch", kDelegate},
               "You write a concrete, numbered plan for the task: files to change, steps, "
               "how to verify on the target. Do not change anything."),
       }) {
    out[c.name] = std::move(c);
  }
  for (const auto& [name, sc] : config.subagents) out[name] = sc;
  return out;
}

namespace {

// The delegate tool's spec for the types last offered: the types come from
// the daemon's config, so a turn nearly always offers the same spec again.
struct DelegateSpecCache {
  Mutex mu;
  ToolSpecPtr spec ABSL_GUARDED_BY(mu);
};

DelegateSpecCache& DelegateSpecs() {
  static auto* cache = new DelegateSpecCache;  // never destroyed: used until exit
  return *cache;
}

}  // namespace

ToolSpecPtr SpecDelegate(const std::map<std::string, SubagentConfig>& types) {
  std::string desc =
      "Hand a self-contained task to a sub-agent with its own context; returns its report. "
      "Several calls in one message run in parallel. Types:";
  json names = json::array();
  for (const auto& [n, t] : types) {
    absl::StrAppend(&desc, "\n- ", n, ": ", t.description);
    names.push_back(n);
  }
  DelegateSpecCache& cache = DelegateSpecs();
  MutexLock lock(&cache.mu);
  if (cache.spec && cache.spec->description == desc) return cache.spec;
  cache.spec = MakeToolSpec(
      kDelegate, std::move(desc),
      {{"type", "object"},
       {"properties",
        {{"agent_type", {{"type", "string"}, {"enum", names}}},
         {"task", {{"type", "string"}, {"description", "What to do and what to report back"}}}}},
       {"required", {"agent_type", "task"}}});
  return cache.spec;
}

ToolResult Delegate(const AgentDeps& deps, Agent& a, const std::string& call_id,
                    const json& input) {
  const auto types = SubagentTypes(deps.config);
  const std::string type = input.value("agent_type", "");
  const std::string task = input.value("task", "");
  auto it = types.find(type);
  if (it == types.end()) return {absl::StrCat("agent_type: unknown type '", type, "'"), true};
  if (task.empty()) return {"task: empty", true};
  const SubagentConfig& sc = it->second;
  Agent sub;
  sub.name = type;
  sub.parent_call_id = call_id;
  sub.depth = a.depth + 1;
  sub.provider = sc.provider.empty() ? a.provider : deps.providers.Find(sc.provider);
  if (sub.provider == nullptr) sub.provider = a.provider;
  sub.model = !sc.model.empty()
                  ? sc.model
                  : (sub.provider == a.provider ? a.model : sub.provider->config().model);
  sub.max_tokens = sc.max_tokens;
  sub.temperature = sc.temperature;
  sub.max_tool_calls = sc.max_tool_calls;
  sub.allowed = std::set<std::string>(sc.tools.begin(), sc.tools.end());
  sub.read_only = sc.read_only || InPlanMode(a);
  sub.system =
      absl::StrCat("You are fwai's ", type, " sub-agent, working for another agent in project ",
                   a.turn->session.project_root, ". ", sc.prompt,
                   " Finish with a concise report: it is all the delegating agent sees.\n");
  sub.messages.push_back({"user", json::array({{{"type", "text"}, {"text", task}}})});
  // The turn's token keeps its callback after this call returns: it holds
  // the sub-agent's token weakly.
  auto sub_cancel_owner = std::make_shared<CancelToken>();
  a.cancel->OnCancel([weak = std::weak_ptr<CancelToken>(sub_cancel_owner)] {
    if (auto t = weak.lock()) t->Cancel();
  });
  CancelToken& sub_cancel = *sub_cancel_owner;
  sub.cancel = &sub_cancel;
  sub.turn = a.turn;
  std::string sub_mode = *a.mode;
  sub.mode = &sub_mode;
  std::string report;
  // The sub-agent's own invoke_agent, under the delegating tool call's span.
  telemetry::ActiveSpan span("invoke_agent", type);
  if (span) {
    span->Set("gen_ai.operation.name", "invoke_agent");
    span->Set("gen_ai.agent.name", type);
    span->Set("gen_ai.conversation.id", a.turn->session.id);
    span->Set("gen_ai.request.model", sub.model);
    span->Set("gen_ai.provider.name", telemetry::ProviderName(sub.provider->config().kind));
    span->Set("fwai.parent_call_id", call_id);
  }
  {
    Watchdog watchdog(sub_cancel, sc.timeout_s);
    report = RunAgent(deps, sub);
  }
  span->Set("fwai.stop_reason", sub.stop_reason);
  span->SetInt("fwai.agent.iterations", sub.iterations);
  if (sub.stop_reason == "error" || sub.stop_reason == "cancelled") span->Fail(sub.stop_reason);
  if (sub.stop_reason == "cancelled") {
    return {a.cancel->cancelled() ? "the sub-agent was cancelled"
                                  : absl::StrCat("the sub-agent hit its ", sc.timeout_s,
                                                 " s timeout; partial report:\n", report),
            true};
  }
  if (sub.stop_reason == "error") {
    return {absl::StrCat("the sub-agent failed; partial report:\n", report), true};
  }
  return {report.empty() ? "(the sub-agent reported nothing)" : report, false};
}

}  // namespace fwai
