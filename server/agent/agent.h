// agent (internal): the state the files of this module share. AgentDeps is
// what every turn uses from the daemon; TurnState is what the agents of one
// turn share; Agent is one agent's own loop state (the main agent, or a
// sub-agent under a tool call).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "server/agent/turn_manager.h"
#include "server/agent/turn_policy.h"
#include "server/llm/provider.h"

namespace fwai {

class CancelToken;
class EventSink;

// Owned by the TurnManager and the daemon's main; outlive every turn.
struct AgentDeps {
  SessionManager& sessions;
  const DaemonConfig& config;
  const ProviderSet& providers;
  const ToolRegistry& tools;
  const ToolRetriever& retriever;  // may be empty
  const SecretScanner& secrets;
  PendingReplies& replies;
};

// Tokens and cost of the model calls of a turn, sub-agents included.
struct Usage {
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  double cost_usd = 0;
};

// What the agents of one turn share. Lives on the turn's thread for the whole
// turn; sub-agents (on their own threads) point at it.
class TurnState {
 public:
  TurnState(const SessionInfo& session, EventSink& sink, CancelToken& cancel, PolicyRules rules,
            std::vector<Tool*> project_tools, std::string log_dir)
      : session(session),
        sink(sink),
        cancel(cancel),
        policy(std::move(rules)),
        project_tools(std::move(project_tools)),
        log_dir(std::move(log_dir)) {}
  TurnState(const TurnState&) = delete;
  TurnState& operator=(const TurnState&) = delete;

  void AddUsage(int64_t input_tokens, int64_t output_tokens, double cost_usd) {
    MutexLock lock(&mu_);
    usage_.input_tokens += input_tokens;
    usage_.output_tokens += output_tokens;
    usage_.cost_usd += cost_usd;
  }
  Usage usage() const {
    MutexLock lock(&mu_);
    return usage_;
  }
  // Every tool call of the turn, for the run record.
  void LogCall(nlohmann::json call) {
    MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
  }
  nlohmann::json calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }
  // Every answer and plan decision of the turn and who made it, for the run
  // record (evidence names the approver).
  void LogDecision(nlohmann::json decision) {
    MutexLock lock(&mu_);
    decisions_.push_back(std::move(decision));
  }
  nlohmann::json decisions() const {
    MutexLock lock(&mu_);
    return decisions_;
  }

  const SessionInfo& session;  // as loaded when the turn started
  EventSink& sink;
  CancelToken& cancel;  // the turn's; questions and plans wait on it
  TurnPolicy policy;
  // Tools of the project's own MCP servers (offered besides the registry's).
  const std::vector<Tool*> project_tools;
  // Where each tool call's output is logged (.fwai/runs/<run_id>/), "" for none.
  const std::string log_dir;
  // The local account the session's project is read, written and run as
  // (none: no file or command tools). Set before any agent runs.
  std::optional<LocalAccount> account;
  // Held while the user is asked to accept an edit: one question at a time,
  // though sub-agents run in parallel (server/agent/edit_approval.h).
  Mutex asking;
  // Returns once the turn's checkpoint of the project is recorded (or none
  // is taken). Every tool call waits for it first: a tool is the first thing
  // of a turn that may change the project. Set before any agent runs.
  std::function<void()> await_checkpoint;

 private:
  mutable Mutex mu_;
  Usage usage_ ABSL_GUARDED_BY(mu_);
  nlohmann::json calls_ ABSL_GUARDED_BY(mu_) = nlohmann::json::array();
  nlohmann::json decisions_ ABSL_GUARDED_BY(mu_) = nlohmann::json::array();
};

// One agent's loop: the main agent of a turn, or a sub-agent under a tool call.
struct Agent {
  std::string name = "main";
  std::string parent_call_id;
  std::string request;  // the user's message (tool retrieval)
  int depth = 0;
  Provider* provider = nullptr;
  std::string model;
  std::string system;  // empty: SystemPrompt()
  int max_tokens = 4096;
  double temperature = -1;
  int max_tool_calls = 1 << 30;
  std::vector<LlmMessage> messages;
  bool persist = false;           // the main agent keeps the session's history
  std::set<std::string> allowed;  // empty: all (subject to mode)
  bool read_only = false;
  CancelToken* cancel = nullptr;
  std::string* mode = nullptr;  // plan | act; the main agent's is changed by an approved plan
  TurnState* turn = nullptr;
  int64_t context_window = 200000;
  // Kept by the loop:
  std::string stop_reason = "end_turn";
  int iterations = 0;
  int64_t last_input_tokens = 0;

  bool is_main() const { return name == "main"; }
};

}  // namespace fwai
