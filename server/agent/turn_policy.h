// agent: the project's policy applied to one turn: which tools, writes and
// commands are allowed, the change budget (files and lines per turn), and the
// refusals made, for the run record. Thread-safe: sub-agents run in parallel.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "server/project/policy.h"
#include "server/tools/tool.h"

namespace fwai {

class TurnPolicy {
 public:
  explicit TurnPolicy(PolicyRules rules) : rules_(std::move(rules)) {}
  TurnPolicy(const TurnPolicy&) = delete;
  TurnPolicy& operator=(const TurnPolicy&) = delete;

  bool network_allowed() const { return rules_.network; }
  // OK, or PERMISSION_DENIED naming the rule that refuses calling `tool`.
  [[nodiscard]] absl::Status CheckTool(const std::string& tool);
  // The same for a tool's write or command; an allowed write counts against
  // the change budget.
  [[nodiscard]] absl::Status CheckAction(const PolicyQuery& q);
  // [{kind, target, rule}] of every refusal so far.
  nlohmann::json refusals() const;

 private:
  const PolicyRules rules_;
  mutable Mutex mu_;
  std::set<std::string> files_written_ ABSL_GUARDED_BY(mu_);
  int lines_changed_ ABSL_GUARDED_BY(mu_) = 0;
  nlohmann::json refusals_ ABSL_GUARDED_BY(mu_) = nlohmann::json::array();
};

}  // namespace fwai
