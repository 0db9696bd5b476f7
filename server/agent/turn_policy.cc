#include "server/agent/turn_policy.h"

#include "absl/strings/str_cat.h"

namespace fwai {

absl::Status TurnPolicy::CheckTool(const std::string& tool) {
  const PolicyDecision d = CheckPolicy(rules_, "tool", tool);
  if (d.allowed) return absl::OkStatus();
  MutexLock lock(&mu_);
  refusals_.push_back({{"kind", "tool"}, {"target", tool}, {"rule", d.rule}});
  return absl::PermissionDeniedError(absl::StrCat("refused by policy (", d.rule, "): ", d.reason));
}

absl::Status TurnPolicy::CheckAction(const PolicyQuery& q) {
  MutexLock lock(&mu_);
  PolicyDecision d = CheckPolicy(rules_, q.kind, q.target);
  if (d.allowed && q.kind == "write" && rules_.max_files_per_turn > 0 &&
      !files_written_.count(q.target) &&
      static_cast<int>(files_written_.size()) >= rules_.max_files_per_turn) {
    d = {false, absl::StrCat("change_budget: max_files ", rules_.max_files_per_turn), "",
         absl::StrCat("this turn already changed ", files_written_.size(), " files")};
  }
  if (d.allowed && q.kind == "write" && rules_.max_lines_per_turn > 0 &&
      lines_changed_ + q.lines > rules_.max_lines_per_turn) {
    d = {false, absl::StrCat("change_budget: max_lines ", rules_.max_lines_per_turn), "",
         absl::StrCat("this write changes ", q.lines, " lines and the turn already changed ",
                      lines_changed_)};
  }
  if (!d.allowed) {
    refusals_.push_back({{"kind", q.kind}, {"target", q.target}, {"rule", d.rule}});
    return absl::PermissionDeniedError(
        absl::StrCat("refused by policy (", d.rule, "): ", d.reason));
  }
  if (q.kind == "write") {
    files_written_.insert(q.target);
    lines_changed_ += q.lines;
  }
  return absl::OkStatus();
}

nlohmann::json TurnPolicy::refusals() const {
  MutexLock lock(&mu_);
  return refusals_;
}

}  // namespace fwai
