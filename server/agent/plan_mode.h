// agent: plan mode. The main agent investigates with read-only tools, writes
// its plan to the session's plan file and submits it; the person approves it
// (the session switches to act), edits it, or sends it back. Until then only
// the plan file may be written and no command runs.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/llm/provider.h"
#include "server/tools/tool.h"

namespace fwai {

struct AgentDeps;
struct Agent;

inline constexpr char kSubmitPlan[] = "submitPlan";

// The plan file, relative to the project root.
std::string PlanPath(const std::string& session_id);

bool InPlanMode(const Agent& a);

// write_file / edit_file stay offered in plan mode: they may write the plan file only.
bool PlanWritable(const std::string& tool_name);

// What the system prompt says of plan mode.
std::string PlanModeRules(const std::string& session_id);

// The refusal of a tool that changes things, for the main agent in plan mode.
std::string PlanModeRefusal(const std::string& tool_name, const std::string& session_id);

// The plan-mode rule for a tool's writes and commands: OK only for a write of
// `plan_file`, else PERMISSION_DENIED.
[[nodiscard]] absl::Status CheckPlanModeAction(const std::string& plan_file, const PolicyQuery& q);

ToolSpecPtr SpecSubmitPlan();

// submitPlan: publishes the plan file and waits for the person's decision (or
// approves it at once when the session auto-approves). On approval sets
// *a.mode and the session's mode to act.
ToolResult SubmitPlan(const AgentDeps& deps, Agent& a, const std::string& call_id);

}  // namespace fwai
