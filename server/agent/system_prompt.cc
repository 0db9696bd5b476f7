#include "server/agent/system_prompt.h"

#include "absl/strings/str_cat.h"
#include "server/agent/agent.h"
#include "server/agent/plan_mode.h"
#include "server/session/session_manager.h"

namespace fwai {

std::string SystemPrompt(const SessionInfo& s, const std::vector<ToolSpecPtr>& tools) {
  std::string p =
      "You are fwai, an assistant for firmware engineers, running inside the fwaid daemon.\n"
      "You help with embedded C/C++, microcontrollers, peripherals, toolchains, debugging and "
      "datasheets. Be precise; cite file paths and line numbers when you use project files.\n";
  absl::StrAppend(&p, "Project root: ", s.project_root, "\n");
  absl::StrAppend(&p, "Mode: ", s.mode, "\n");
  if (!tools.empty()) {
    absl::StrAppend(&p, "Tools available:");
    for (const auto& t : tools) absl::StrAppend(&p, " ", t->name);
    absl::StrAppend(&p,
                    ". Paths are relative to the project root; nothing outside it is visible.\n");
  }
  return p;
}

std::string SystemPromptFor(const Agent& a, const std::vector<ToolSpecPtr>& tools) {
  std::string p = a.system.empty() ? SystemPrompt(a.turn->session, tools) : a.system;
  if (a.is_main() && InPlanMode(a)) absl::StrAppend(&p, PlanModeRules(a.turn->session.id));
  return p;
}

}  // namespace fwai
