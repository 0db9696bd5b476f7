#include "server/agent/tool_call.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/edit_approval.h"
#include "server/agent/events.h"
#include "server/agent/plan_mode.h"
#include "server/agent/questions.h"
#include "server/agent/subagents.h"
#include "server/agent/todos.h"
#include "server/agent/tool_offer.h"
#include "server/project/project.h"
#include "server/project/secrets.h"
#include "server/session/session_manager.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

using json = nlohmann::json;
using fwai::v1::ServerEvent;

namespace {

json ResultBlock(const std::string& call_id, const ToolResult& tr) {
  json r = {{"type", "tool_result"}, {"tool_use_id", call_id}, {"content", tr.content}};
  if (tr.is_error) r["is_error"] = true;
  return r;
}

// At most 16 KiB of a tool's output go to the clients.
std::string ForClients(const std::string& output) {
  return output.size() > 16384 ? output.substr(0, 16384) + "\n... (truncated)" : output;
}

}  // namespace

json ToolCaller::Run(const json& call) {
  const Agent& a = agent_;
  const std::string call_id = call.value("id", "");
  const std::string tool_name = call.value("name", "");
  const json input = call.value("input", json::object());
  if (a.cancel->cancelled()) return ResultBlock(call_id, {"cancelled by the user", true});
  // execute_tool {name}: what the tool does (a build, a sub-agent) nests under
  // it. Its arguments only with telemetry.capture_content, redacted.
  telemetry::ActiveSpan span("execute_tool", tool_name);
  if (span) {
    span->Set("gen_ai.operation.name", "execute_tool");
    span->Set("gen_ai.tool.name", tool_name);
    span->Set("gen_ai.tool.call.id", call_id);
    span->Set("gen_ai.tool.type", "function");
    span->Set("gen_ai.agent.name", a.name);
    if (telemetry::CaptureContent()) {
      span->Set("gen_ai.tool.call.arguments", deps_.secrets.Redact(input.dump()));
    }
  }
  {
    ServerEvent ev;
    auto* s = ev.mutable_tool_call_started();
    s->mutable_origin()->set_agent(a.name);
    s->mutable_origin()->set_parent_call_id(a.parent_call_id);
    s->set_call_id(call_id);
    s->set_parent_call_id(a.parent_call_id);
    s->set_agent(a.name);
    s->set_tool(tool_name);
    s->set_input_json(input.dump());
    a.turn->sink.Emit(std::move(ev));
  }
  const int64_t t0 = MonotonicNanos();
  ToolResult tr = Dispatch(call_id, tool_name, input);
  // Secrets never reach the provider, the history or the evidence.
  if (int found = 0; (tr.content = deps_.secrets.Redact(tr.content, &found)), found > 0) {
    tr.content += absl::StrCat("\n(", found, found == 1 ? " secret" : " secrets", " redacted)");
  }
  {
    ServerEvent ev;
    auto* f = ev.mutable_tool_call_finished();
    f->set_call_id(call_id);
    f->set_parent_call_id(a.parent_call_id);
    f->set_agent(a.name);
    f->set_is_error(tr.is_error);
    f->set_output(ForClients(tr.content));
    f->set_duration_ms((MonotonicNanos() - t0) / 1000000);
    a.turn->sink.Emit(std::move(ev));
  }
  if (tr.is_error) span->Fail("the tool returned an error");
  Log(call_id, tool_name, input, tr, t0);
  return ResultBlock(call_id, tr);
}

ToolResult ToolCaller::Dispatch(const std::string& call_id, const std::string& tool_name,
                                const json& input) {
  Agent& a = agent_;
  if (a.turn->await_checkpoint) a.turn->await_checkpoint();
  const bool is_main = a.is_main();
  Tool* tool = offer_.Find(tool_name);
  const bool offered_now = offer_.OfferedNow(tool_name);
  if (++calls_made_ > a.max_tool_calls) {
    return {absl::StrCat(a.name, " used its ", a.max_tool_calls,
                         " tool calls; answer with what you have"),
            true};
  }
  if (offer_.selecting() && tool_name == kToolSearch) {
    return offer_.Search(input.value("query", ""));
  }
  if (is_main && tool_name == kTodoWrite) {
    return WriteTodos(deps_.sessions, a.turn->sink, a.turn->session.id, input);
  }
  if (is_main && tool_name == kTodoRead) return ReadTodos(deps_.sessions, a.turn->session.id);
  if (is_main && tool_name == kAskQuestion) return AskQuestion(deps_, a, call_id, input);
  if (is_main && tool_name == kSubmitPlan) {
    const bool was_planning = InPlanMode(a);
    ToolResult tr = SubmitPlan(deps_, a, call_id);
    // Approved: act mode offers every tool.
    if (was_planning && !InPlanMode(a)) offer_.Rebuild();
    return tr;
  }
  if (tool_name == kDelegate && offered_now) return Delegate(deps_, a, call_id, input);
  if (tool == nullptr || !(offered_now || offer_.Selected(*tool))) {
    ToolResult refused{Refusal(tool, tool_name), true};
    refused.content += offer_.AfterWrongCall(tool_name, tool, /*ran=*/false);
    return refused;
  }
  // A selected tool may be called without being offered on this very call,
  // so the mode and project rules are checked again here, not only in the offer.
  if (tool->needs_project() && !a.turn->account) {
    return {
        absl::StrCat("'", tool_name,
                     "' needs a project: this session has none (or no local account to act as)"),
        true};
  }
  if (!tool->read_only() && (a.read_only || InPlanMode(a)) &&
      !(InPlanMode(a) && is_main && PlanWritable(tool_name))) {
    return {InPlanMode(a) && is_main
                ? PlanModeRefusal(tool_name, a.turn->session.id)
                : absl::StrCat("'", tool_name, "' is not allowed for the ", a.name, " agent"),
            true};
  }
  if (absl::Status s = a.turn->policy.CheckTool(tool_name); !s.ok()) {
    return {std::string(s.message()), true};
  }
  if (NeedsEditApproval(a, tool_name)) {
    if (auto refused = AskEditApproval(deps_, a, call_id, tool_name, input)) return *refused;
  }
  ToolResult tr = RunTool(*tool, call_id, input);
  if (tr.is_error && !a.cancel->cancelled()) {
    tr.content += offer_.AfterWrongCall(tool_name, tool, /*ran=*/true);
  }
  return tr;
}

std::string ToolCaller::Refusal(const Tool* tool, const std::string& tool_name) const {
  const Agent& a = agent_;
  if (tool != nullptr && tool->needs_project() && !a.turn->account) {
    return absl::StrCat("'", tool_name,
                        "' needs a project: this session has none (or no local account to act as)");
  }
  if (tool != nullptr && a.is_main() && InPlanMode(a) && !tool->read_only()) {
    return PlanModeRefusal(tool_name, a.turn->session.id);
  }
  if (tool != nullptr && (a.read_only || !offer_.Allowed(tool_name))) {
    return absl::StrCat("'", tool_name, "' is not allowed for the ", a.name, " agent");
  }
  if (tool != nullptr && offer_.selecting() && !ToolOffer::IsCore(*tool)) {
    return absl::StrCat("tool '", tool_name, "' was not offered on this call");
  }
  return absl::StrCat("unknown tool '", tool_name, "'");
}

ToolResult ToolCaller::RunTool(Tool& tool, const std::string& call_id, const json& input) {
  const Agent& a = agent_;
  const SessionInfo& session = a.turn->session;
  ToolContext tctx;
  tctx.session_id = session.id;
  tctx.turn_id = a.turn->sink.turn_id();
  tctx.call_id = call_id;
  tctx.project_root = session.project_root;
  tctx.owner = session.owner;
  tctx.account = a.turn->account ? &*a.turn->account : nullptr;
  tctx.limits = &deps_.config.tools;
  tctx.cancel = a.cancel;
  TurnPolicy* policy = &a.turn->policy;
  tctx.network_allowed = policy->network_allowed();
  tctx.policy = [in_plan = InPlanMode(a), plan_file = PlanPath(session.id),
                 policy](const PolicyQuery& q) -> absl::Status {
    if (in_plan) {
      if (absl::Status s = CheckPlanModeAction(plan_file, q); !s.ok()) return s;
    }
    return policy->CheckAction(q);
  };
  tctx.output = [&a, call_id](std::string_view text) {
    ServerEvent ev;
    auto* d = ev.mutable_tool_call_output_delta();
    d->set_call_id(call_id);
    d->set_parent_call_id(a.parent_call_id);
    d->set_agent(a.name);
    d->set_text(std::string(text));
    a.turn->sink.Emit(std::move(ev));
  };
  ToolResult tr = tool.Run(input, tctx);
  if (a.cancel->cancelled() && !tr.is_error) tr.content += "\n(turn cancelled)";
  return tr;
}

void ToolCaller::Log(const std::string& call_id, const std::string& tool_name, const json& input,
                     const ToolResult& tr, int64_t t0) {
  const Agent& a = agent_;
  std::string in = input.dump();
  if (in.size() > 2000) in = in.substr(0, 2000) + "...";
  std::string log_file;
  const std::string& log_dir = a.turn->log_dir;
  if (!log_dir.empty() && a.turn->account) {
    // The log lives in the project: written as its account.
    ScopedFsIdentity as(*a.turn->account);
    std::error_code ec;
    if (!std::filesystem::is_directory(log_dir, ec)) {
      PruneRunDirs(std::filesystem::path(log_dir).parent_path().string(), kKeptRunDirs - 1);
      std::filesystem::create_directories(log_dir, ec);
    }
    log_file = absl::StrCat(log_dir, "/", call_id, ".log");
    if (as.status().ok())
      std::ofstream(log_file) << "$ " << tool_name << " " << deps_.secrets.Redact(in) << "\n"
                              << tr.content << "\n";
  }
  a.turn->LogCall({{"call_id", call_id},
                   {"tool", tool_name},
                   {"agent", a.name},
                   {"parent_call_id", a.parent_call_id},
                   {"input", in},
                   {"is_error", tr.is_error},
                   {"duration_ms", (MonotonicNanos() - t0) / 1000000},
                   {"log_file", log_file}});
}

}  // namespace fwai
