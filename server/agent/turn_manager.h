// agent: runs chat turns. One turn at a time per session, each on a thread of
// its TurnThreads (agent.turn_threads of them started with it, kept between
// turns): stream the model's reply, run the tools it asks for, send the
// results back, until it stops or the iteration bound is hit. Every step is
// published to the session's event log as it happens.
//
// Thread-safe. Cancel() stops the HTTP stream and the running tool promptly.
//
// Inside, one file per part: turn (one turn, start to finish), loop (an
// agent's model/tool loop), tool_offer and tool_call (which tools, and one
// call), subagents, plan_mode, todos, questions, compaction, system_prompt,
// history, models (prices, context windows), events, turn_policy,
// turn_threads (the threads turns run on); agent.h
// holds the state they share.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mutex.h"
#include "server/agent/author.h"
#include "server/agent/models.h"
#include "server/agent/pending_replies.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

class SessionManager;
class ToolRegistry;
class Provider;
class SecretScanner;
class StartGate;
class TurnThreads;
class Tool;
struct SessionInfo;
struct LocalAccount;
struct HistoryEntry;

// Providers by name plus the default one. Owned by the daemon's main.
struct ProviderSet {
  std::map<std::string, std::unique_ptr<Provider>> providers;
  std::string default_name;
  Provider* Find(const std::string& name) const;
};

// Finds tools for a request: names of catalog tools, best first.
using ToolRetriever = std::function<std::vector<std::string>(const std::string& query, int k)>;

struct TurnRequest {
  std::string session_id;
  std::string turn_id;  // client-chosen (so it can follow its own turn) or generated
  std::string text;
  std::string provider;  // overrides for this turn
  std::string model;
  std::string sender;
  Author author;              // who sent it, as verified (UserMessage.author)
  std::string owner;          // the principal that started it (limits count per owner)
  std::string peer;           // where its request came from (for the record)
  bool compact_only = false;  // summarise older turns, nothing else
  // The span the turn's invoke_agent span hangs under (a skill's step); none:
  // the turn starts a trace.
  telemetry::Span parent_span;
};

class TurnManager {
 public:
  // `retriever` (may be null) picks tools per call once the registry holds
  // more than agent.tool_threshold tools.
  TurnManager(SessionManager& sessions, const DaemonConfig& config, const ProviderSet& providers,
              const ToolRegistry& tools, ToolRetriever retriever = nullptr);
  ~TurnManager();
  TurnManager(const TurnManager&) = delete;
  TurnManager& operator=(const TurnManager&) = delete;

  // Starts a turn, or — while one runs in the session — queues it to start
  // after the turns already queued (messages of people sharing a session
  // run in the order they came, each as its own turn). INVALID_ARGUMENT for
  // an empty/oversized message, NOT_FOUND for an unknown session,
  // RESOURCE_EXHAUSTED once kMaxQueued wait, FAILED_PRECONDITION while the
  // session is held (HoldStarts).
  [[nodiscard]] absl::Status Start(TurnRequest request) ABSL_LOCKS_EXCLUDED(mu_);
  // Receives one run record per finished turn (the evidence log).
  void SetRunRecorder(std::function<void(const nlohmann::json&)> recorder) {
    recorder_ = std::move(recorder);
  }
  // The tools of a session's project (its own MCP servers) for its account
  // (looked up once per turn; null: the session has none); called once per
  // turn. `owner` keeps them alive for the turn.
  struct ProjectToolSet {
    std::shared_ptr<const void> owner;
    std::vector<Tool*> tools;
  };
  using ProjectToolsFn =
      std::function<absl::StatusOr<ProjectToolSet>(const SessionInfo&, const LocalAccount*)>;
  void SetProjectTools(ProjectToolsFn fn) { project_tools_ = std::move(fn); }
  // Receives the main agent's final text of each turn (the retrieval log
  // reads which passages it cites). Set before the first turn.
  void SetReplyObserver(std::function<void(const std::string& session_id,
                                           const std::string& turn_id, const std::string& text)>
                            fn) {
    reply_observer_ = std::move(fn);
  }
  // Records a session's project before each of its turns (session, its
  // account as looked up for the turn or null, turn id, and the history as
  // the turn loaded it, before its message); a failure is the hook's to
  // report. Called on a thread of its own, at background priority, beside
  // the turn's first model request; the turn's tool calls wait for it. Set
  // before the first turn.
  using CheckpointFn = std::function<void(const SessionInfo&, const LocalAccount*,
                                          const std::string&, const std::vector<HistoryEntry>&)>;
  void SetCheckpointer(CheckpointFn fn) { checkpoint_ = std::move(fn); }
  // Redacts tool output before the provider, the history and the evidence see it.
  void SetSecretScanner(std::shared_ptr<const SecretScanner> scanner) {
    secrets_ = std::move(scanner);
  }
  // While the returned hold lives no turn starts in `session_id` (Start says
  // why). FAILED_PRECONDITION when a turn runs there or another hold is held.
  class Hold {
   public:
    Hold(TurnManager* m, std::string session) : m_(m), session_(std::move(session)) {}
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold();

   private:
    TurnManager* const m_;
    const std::string session_;
  };
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Hold>> HoldStarts(const std::string& session_id,
                                                                 const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the running turn of the session, if any; its TurnFinished names
  // `by` (none: fwaid cancelled it, e.g. the session was deleted).
  void Cancel(const std::string& session_id, const Author& by = {}) ABSL_LOCKS_EXCLUDED(mu_);
  // Delivers a reply to the question or plan the session's turn waits on.
  // NOT_FOUND when nothing with that id is waiting.
  // Hands an answer to the question or plan the session waits for. The first
  // answer wins: one for an id answered already is FAILED_PRECONDITION naming
  // who answered; an id nothing waits for is NOT_FOUND.
  [[nodiscard]] absl::Status Reply(const std::string& session_id, Interaction reply);
  // Whether the session waits for a plan's decision or an approval (an
  // edit's accept) rather than an answer.
  bool AwaitsApproval(const std::string& session_id) { return replies_.AwaitsApproval(session_id); }
  // plan | act; refused while a turn runs (the model's tools would change mid-call).
  [[nodiscard]] absl::Status SetMode(const std::string& session_id, const std::string& mode,
                                     const std::string& reason, const Author& by = {});
  // Ask before edits on or off; refused while a turn runs, as the mode is.
  [[nodiscard]] absl::Status SetEditApproval(const std::string& session_id, bool ask,
                                             const std::string& by, const Author& author = {});
  bool Running(const std::string& session_id) ABSL_LOCKS_EXCLUDED(mu_);
  size_t RunningCount() ABSL_LOCKS_EXCLUDED(mu_);
  // Running turns whose starter `owned` accepts.
  size_t RunningOwnedBy(const std::function<bool(const std::string& owner)>& owned)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels every turn and waits for them to finish. Start() fails afterwards.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Turn;
  struct Ended;
  static constexpr size_t kMaxQueued = 16;  // messages waiting per session
  // The body of a turn's job.
  void Run(Turn* turn, TurnRequest request);
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `req` as the session's turn now.
  void LaunchLocked(TurnRequest req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the session's next queued message, if no turn runs and nothing
  // holds it (a turn ended, a hold went).
  void StartQueued(const std::string& session_id) ABSL_LOCKS_EXCLUDED(mu_);

  SessionManager& sessions_;
  const DaemonConfig& config_;
  const ProviderSet& providers_;
  const ToolRegistry& tools_;
  const ToolRetriever retriever_;
  // Set (by the Set* calls) before the first turn, read-only after.
  std::function<void(const nlohmann::json&)> recorder_;
  std::function<void(const std::string&, const std::string&, const std::string&)> reply_observer_;
  std::shared_ptr<const SecretScanner> secrets_;
  CheckpointFn checkpoint_;
  ProjectToolsFn project_tools_;
  Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Turn>> turns_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> held_ ABSL_GUARDED_BY(mu_);  // session -> why
  std::map<std::string, std::deque<TurnRequest>> queued_ ABSL_GUARDED_BY(mu_);
  PendingReplies replies_;
  std::unique_ptr<StartGate> starts_;     // agent.turn_starts; outlives the threads
  std::unique_ptr<TurnThreads> threads_;  // last: its threads end first
};

}  // namespace fwai
