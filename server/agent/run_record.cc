#include "server/agent/run_record.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/local_account.h"
#include "common/subprocess.h"
#include "server/agent/agent.h"
#include "server/session/session_manager.h"

namespace fwai {

using json = nlohmann::json;

namespace {

// [{path, added, removed}] of `git diff --numstat`; null when the project is
// not a git repository or git fails.
json FilesChanged(const std::string& project_root, const LocalAccount* account) {
  if (project_root.empty() || account == nullptr) return nullptr;
  std::error_code ec;
  {
    ScopedFsIdentity as(*account);
    if (!as.status().ok() || !std::filesystem::exists(project_root + "/.git", ec)) return nullptr;
  }
  // git runs as the project's account: its config and hooks are the user's.
  ProcessOptions po;
  po.timeout_ms = 5000;
  po.run_as = account;
  auto r = RunProcess({"git", "-C", project_root, "diff", "--numstat"}, po);
  if (!r.ok() || r->exit_code != 0) return nullptr;
  json files = json::array();
  for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    if (f.size() == 3) files.push_back({{"path", f[2]}, {"added", f[0]}, {"removed", f[1]}});
  }
  return files;
}

}  // namespace

json RunRecord(const TurnRequest& req, const Agent& main, const std::string& run_id,
               int64_t duration_ms) {
  const TurnState& turn = *main.turn;
  const Usage usage = turn.usage();
  const json calls = turn.calls();
  json rec = {{"kind", "agent_turn"},
              {"run_id", run_id},
              {"log_dir", calls.empty() ? "" : turn.log_dir},
              {"session_id", req.session_id},
              {"turn_id", req.turn_id},
              {"project_root", turn.session.project_root},
              {"owner", turn.session.owner},
              {"principal", req.owner},
              {"author",
               {{"principal", req.author.principal},
                {"user", req.author.user},
                {"owner", req.author.owner}}},
              {"decisions", turn.decisions()},
              {"peer", req.peer},
              {"provider", main.provider->config().name},
              {"model", main.model},
              {"mode", *main.mode},
              {"llm_calls",
               {{"model_calls", main.iterations},
                {"input_tokens", usage.input_tokens},
                {"output_tokens", usage.output_tokens},
                {"cost_usd", usage.cost_usd}}},
              {"tools", calls},
              {"stop_reason", main.stop_reason},
              {"policy_refusals", turn.policy.refusals()},
              {"duration_ms", duration_ms}};
  if (json files = FilesChanged(turn.session.project_root, turn.account ? &*turn.account : nullptr);
      !files.is_null()) {
    rec["files_changed"] = std::move(files);
  }
  return rec;
}

}  // namespace fwai
