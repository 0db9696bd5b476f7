#include "server/agent/plan_mode.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "common/local_account.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/events.h"
#include "server/agent/pending_replies.h"
#include "server/session/session_manager.h"
#include "server/tools/project_fs.h"

namespace fwai {

std::string PlanPath(const std::string& session_id) { return ".fwai/plans/" + session_id + ".md"; }

bool InPlanMode(const Agent& a) { return *a.mode == "plan"; }

bool PlanWritable(const std::string& name) { return name == "write_file" || name == "edit_file"; }

std::string PlanModeRules(const std::string& session_id) {
  return absl::StrCat(
      "\nThe session is in PLAN mode: investigate with read-only tools, write your plan to ",
      PlanPath(session_id),
      " with write_file (no other file may be changed), then call submitPlan and wait for the "
      "user's decision. Tools that change anything are refused until the plan is approved.\n");
}

std::string PlanModeRefusal(const std::string& tool_name, const std::string& session_id) {
  return absl::StrCat("plan mode: '", tool_name,
                      "' changes things and is refused until the plan is approved; "
                      "write the plan to ",
                      PlanPath(session_id), " and call submitPlan");
}

absl::Status CheckPlanModeAction(const std::string& plan_file, const PolicyQuery& q) {
  if (q.kind == "write" && q.target == plan_file) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "plan mode: only the plan file ", plan_file, " may be written until the plan is approved (",
      q.kind == "command" ? "commands are refused" : q.target + " is not the plan file", ")"));
}

ToolSpecPtr SpecSubmitPlan() {
  static const ToolSpecPtr spec = MakeToolSpec(
      kSubmitPlan,
      "Submit the plan you wrote to the plan file for the user's approval. Waits for their "
      "decision: on approval the session switches to act mode and you carry the plan out.",
      {{"type", "object"}, {"properties", nlohmann::json::object()}});
  return spec;
}

namespace {

// The session switches to act mode: the agent's, the stored one, and the clients'.
void SwitchToAct(const AgentDeps& deps, Agent& a, const std::string& reason) {
  *a.mode = "act";
  auto fresh = deps.sessions.Get(a.turn->session.id);
  if (fresh.ok()) {
    fresh->mode = "act";
    (void)deps.sessions.Update(*fresh);
  }
  v1::ServerEvent mc;
  mc.mutable_mode_changed()->set_mode("act");
  mc.mutable_mode_changed()->set_reason(reason);
  a.turn->sink.Emit(std::move(mc));
}

}  // namespace

ToolResult SubmitPlan(const AgentDeps& deps, Agent& a, const std::string& call_id) {
  if (!InPlanMode(a)) return {"submitPlan: the session is not in plan mode", true};
  const SessionInfo& session = a.turn->session;
  if (session.project_root.empty() || !a.turn->account) {
    return {"submitPlan: this session has no project to hold a plan file", true};
  }
  // Read beneath the project root as its account: a plan file that is a
  // link to something else is not followed out of the project.
  std::string plan;
  {
    ScopedFsIdentity as(*a.turn->account);
    if (!as.status().ok()) return {absl::StrCat("submitPlan: ", as.status().message()), true};
    auto pfs = ProjectFs::Open(session.project_root);
    if (!pfs.ok()) return {absl::StrCat("submitPlan: ", pfs.status().message()), true};
    auto text = pfs->ReadFile(PlanPath(session.id), 1u << 20);
    if (!text.ok()) {
      if (absl::IsNotFound(text.status())) {
        return {absl::StrCat("submitPlan: write the plan to ", PlanPath(session.id), " first"),
                true};
      }
      return {absl::StrCat("submitPlan: ", text.status().message()), true};
    }
    plan = *std::move(text);
    // Plans are the sessions' working notes, not the project's sources: git
    // does not list them (a .gitignore of their own, the project's untouched).
    const std::string ignore = ".fwai/plans/.gitignore";
    if (absl::IsNotFound(pfs->Stat(ignore).status())) {
      (void)pfs->WriteFile(ignore, "# fwai's plans: the sessions' working notes\n*\n");
    }
  }
  if (plan.find_first_not_of(" \t\n") == std::string::npos || plan.size() < 50) {
    return {absl::StrCat("submitPlan: the plan in ", PlanPath(session.id), " has ", plan.size(),
                         " characters; a plan needs at least 50"),
            true};
  }
  const std::string plan_id = NewId("p-");
  v1::ServerEvent ev;
  ev.mutable_plan_submitted()->set_plan_id(plan_id);
  ev.mutable_plan_submitted()->set_text(plan);
  ev.mutable_plan_submitted()->set_path(PlanPath(session.id));
  ev.mutable_plan_submitted()->set_call_id(call_id);
  std::shared_ptr<PendingReplies::Pending> pending;
  if (!session.auto_approve_plan) pending = deps.replies.Expect(session.id, plan_id, true);
  a.turn->sink.Emit(std::move(ev));
  std::optional<Interaction> d;
  if (session.auto_approve_plan) {
    d = Interaction{plan_id, {}, "", true, true, "", "auto_approve_plan", "", {}};
  } else {
    d = deps.replies.Wait(session.id, pending, a.turn->cancel);
  }
  if (d) {
    v1::ServerEvent decided;
    auto* pd = decided.mutable_plan_decided();
    pd->set_plan_id(plan_id);
    pd->set_approved(d->approve);
    pd->set_edited(d->approve && !d->edited_plan.empty() && d->edited_plan != plan);
    pd->set_feedback(d->text);
    pd->set_decided_by(d->by);
    pd->set_decided_by_user(d->by_user);
    d->author.ToProto(pd->mutable_author());
    a.turn->sink.Emit(std::move(decided));
    a.turn->LogDecision({{"kind", "plan"},
                         {"id", plan_id},
                         {"approved", d->approve},
                         {"by", d->by},
                         {"principal", d->author.principal},
                         {"user", d->author.user}});
  }
  if (!d) return {"the plan was not decided (turn cancelled)", true};
  if (!d->approve) {
    return {absl::StrCat("The user did not approve the plan. ",
                         d->text.empty() ? std::string("Revise it.") : "Their words: " + d->text,
                         " You are still in plan mode."),
            false};
  }
  if (!d->edited_plan.empty()) {
    plan = d->edited_plan;
    // The edited plan goes back to the project, written as its account.
    ScopedFsIdentity as(*a.turn->account);
    if (as.status().ok()) {
      if (auto pfs = ProjectFs::Open(session.project_root); pfs.ok())
        (void)pfs->WriteFile(PlanPath(session.id), plan);
    }
  }
  SwitchToAct(deps, a, session.auto_approve_plan ? "plan auto-approved" : "plan approved");
  return {
      absl::StrCat("The plan is approved", d->edited_plan.empty() ? "" : " (as edited by the user)",
                   ". You are now in act mode with all tools. Carry it out:\n\n", plan),
      false};
}

}  // namespace fwai
