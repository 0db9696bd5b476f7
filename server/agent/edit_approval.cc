#include "server/agent/edit_approval.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/ids.h"
#include "common/local_account.h"
#include "common/status_macros.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/events.h"
#include "server/agent/pending_replies.h"
#include "server/agent/plan_mode.h"
#include "server/agent/questions.h"
#include "server/session/session_manager.h"
#include "server/tools/project_fs.h"

namespace fwai {

using json = nlohmann::json;

namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out = absl::StrSplit(text, '\n');
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

std::string Str(const json& input, const char* key) {
  auto it = input.find(key);
  return it != input.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The file as it is now, read beneath the project as the session's account
// ("" when it does not exist), or why it cannot be shown.
absl::StatusOr<std::string> Current(const Agent& a, const std::string& path) {
  if (!a.turn->account) return absl::FailedPreconditionError("no account to read it as");
  ScopedFsIdentity as(*a.turn->account);
  RETURN_IF_ERROR(as.status());
  ASSIGN_OR_RETURN(auto pfs, ProjectFs::Open(a.turn->session.project_root));
  ASSIGN_OR_RETURN(std::string rel, pfs.Relative(path));
  auto text = pfs.ReadFile(rel, 8u << 20);
  if (absl::IsNotFound(text.status())) return std::string();
  return text;
}

// What the call would change, for the person to judge; nullopt when the
// call will fail on its own (bad input, old_string absent or ambiguous):
// the tool then says why and nothing is asked.
std::optional<std::string> Preview(const Agent& a, const std::string& tool_name,
                                   const json& input) {
  constexpr size_t kMaxLines = 40;
  const std::string path = Str(input, "path");
  if (path.empty()) return std::nullopt;
  auto now = Current(a, path);
  if (tool_name == "write_file") {
    if (!input.contains("content") || !input["content"].is_string()) return std::nullopt;
    const std::string content = input["content"].get<std::string>();
    if (!now.ok()) {
      return absl::StrCat("(", path, " as it is now cannot be shown: ", now.status().message(),
                          ")\n", EditPreview("", content, kMaxLines));
    }
    return EditPreview(*now, content, kMaxLines);
  }
  const std::string old_s = Str(input, "old_string");
  const std::string new_s = Str(input, "new_string");
  if (!now.ok() || old_s.empty() || old_s == new_s) return std::nullopt;
  const bool all = input.contains("replace_all") && input["replace_all"].is_boolean() &&
                   input["replace_all"].get<bool>();
  std::string after;
  size_t count = 0, from = 0;
  for (size_t at = now->find(old_s); at != std::string::npos;
       at = now->find(old_s, at + old_s.size())) {
    ++count;
    if (count > 1 && !all) return std::nullopt;  // ambiguous: the tool refuses it
    after.append(*now, from, at - from).append(new_s);
    from = at + old_s.size();
  }
  if (count == 0) return std::nullopt;
  after.append(*now, from, std::string::npos);
  return EditPreview(*now, after, kMaxLines);
}

}  // namespace

std::string EditPreview(const std::string& before, const std::string& after, size_t max_lines) {
  const std::vector<std::string> b = Lines(before), f = Lines(after);
  size_t head = 0;
  while (head < b.size() && head < f.size() && b[head] == f[head]) ++head;
  size_t tail = 0;
  while (tail < b.size() - head && tail < f.size() - head &&
         b[b.size() - 1 - tail] == f[f.size() - 1 - tail]) {
    ++tail;
  }
  if (head == b.size() && head == f.size()) return "(no change)";
  std::string out = absl::StrCat("@@ line ", head + 1, " @@\n");
  auto side = [&](const std::vector<std::string>& lines, const char* mark) {
    const size_t end = lines.size() - tail;
    for (size_t i = head; i < end && i < head + max_lines; ++i) {
      absl::StrAppend(&out, mark, lines[i], "\n");
    }
    if (end > head + max_lines) {
      absl::StrAppend(&out, mark, "… ", end - head - max_lines, " more lines\n");
    }
  };
  side(b, "-");
  side(f, "+");
  return out;
}

bool NeedsEditApproval(const Agent& a, const std::string& tool_name) {
  if (!a.turn->session.ask_before_edits) return false;
  if (tool_name != "write_file" && tool_name != "edit_file") return false;
  return !InPlanMode(a);  // in plan mode only the plan file can be written
}

std::optional<ToolResult> AskEditApproval(const AgentDeps& deps, const Agent& a,
                                          const std::string& call_id, const std::string& tool_name,
                                          const json& input) {
  // One question at a time; the preview is read once the others are decided.
  MutexLock one_at_a_time(&a.turn->asking);
  if (a.cancel->cancelled()) return ToolResult{"not changed (cancelled)", true};
  std::optional<std::string> preview = Preview(a, tool_name, input);
  if (!preview) return std::nullopt;  // the tool refuses it and says why
  const std::string path = Str(input, "path");
  const std::string qid = NewId("q-");
  v1::ServerEvent ev;
  auto* q = ev.mutable_question_asked();
  q->set_question_id(qid);
  q->set_call_id(call_id);
  auto* one = q->add_questions();
  one->set_id(absl::StrCat(qid, ".1"));
  one->set_text(absl::StrCat(a.is_main() ? "The agent" : absl::StrCat("Sub-agent ", a.name),
                             " wants to ", tool_name == "write_file" ? "write " : "edit ", path,
                             ". Accept the change?"));
  one->add_options()->set_label(kAccept);
  one->add_options()->set_label(kReject);
  one->set_allow_free_text(true);  // why not, for the model
  auto* edit = q->mutable_edit();
  edit->set_call_id(call_id);
  edit->set_tool(tool_name);
  edit->set_path(path);
  edit->set_preview(*std::move(preview));
  const std::string& session_id = a.turn->session.id;
  auto pending = deps.replies.Expect(session_id, qid, false, /*approval=*/true);
  a.turn->sink.Emit(std::move(ev));
  // The agent's own token: a sub-agent's time limit ends the wait too.
  auto reply = deps.replies.Wait(session_id, pending, *a.cancel);
  if (!reply) return ToolResult{absl::StrCat(path, " was not changed (cancelled)"), true};
  EmitAnswered(a, qid, call_id, *reply);
  if (std::find(reply->selected.begin(), reply->selected.end(), kAccept) != reply->selected.end()) {
    return std::nullopt;
  }
  return ToolResult{absl::StrCat("The user rejected this ", tool_name, " of ", path,
                                 "; the file was not changed.",
                                 reply->text.empty() ? "" : " Their words: " + reply->text,
                                 " Do not make the same change again without asking."),
                    true};
}

}  // namespace fwai
