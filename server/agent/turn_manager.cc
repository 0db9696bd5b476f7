#include "server/agent/turn_manager.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/ids.h"
#include "common/mutex.h"
#include "common/start_gate.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/turn.h"
#include "server/agent/turn_threads.h"
#include "server/llm/provider.h"
#include "server/project/secrets.h"
#include "server/session/session_manager.h"

namespace fwai {

Provider* ProviderSet::Find(const std::string& name) const {
  auto it = providers.find(name.empty() ? default_name : name);
  return it == providers.end() ? nullptr : it->second.get();
}

// Set by the turn's job as its last step; the job holds its own reference.
struct TurnManager::Ended {
  Mutex mu;
  CondVar cv;
  bool ended ABSL_GUARDED_BY(mu) = false;
  void Set() {
    MutexLock lock(&mu);
    ended = true;
    cv.SignalAll();
  }
  void Wait() {
    MutexLock lock(&mu);
    while (!ended) cv.Wait(&mu);
  }
};

namespace {

size_t TurnStartSlots(int configured) {
  if (configured >= 0) return static_cast<size_t>(configured);
  return std::max<size_t>(1, std::thread::hardware_concurrency() / 2);
}

}  // namespace

struct TurnManager::Turn {
  std::string owner;  // set before the turn is in turns_, read-only after
  CancelToken cancel;
  Mutex mu;
  Author cancelled_by ABSL_GUARDED_BY(mu);  // the first who cancelled it
  std::shared_ptr<Ended> ended = std::make_shared<Ended>();
  std::atomic<bool> done{false};
};

TurnManager::TurnManager(SessionManager& sessions, const DaemonConfig& config,
                         const ProviderSet& providers, const ToolRegistry& tools,
                         ToolRetriever retriever)
    : sessions_(sessions),
      config_(config),
      providers_(providers),
      tools_(tools),
      retriever_(std::move(retriever)),
      secrets_(SecretScanner::Default()),
      starts_(std::make_unique<StartGate>(TurnStartSlots(config.turn_starts),
                                          std::chrono::milliseconds(50))),
      threads_(std::make_unique<TurnThreads>(static_cast<size_t>(config.turn_threads))) {}

TurnManager::~TurnManager() { Shutdown(); }

void TurnManager::ReapLocked() {
  for (auto it = turns_.begin(); it != turns_.end();) {
    if (it->second->done) {
      it->second->ended->Wait();
      it = turns_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status TurnManager::Start(TurnRequest req) {
  if (req.text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("message: empty");
  }
  if (static_cast<int64_t>(req.text.size()) > config_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message: ", req.text.size(),
                                                   " bytes is over the limit of ",
                                                   config_.max_message_bytes, " bytes"));
  }
  auto info = sessions_.Get(req.session_id);
  if (!info.ok()) return info.status();
  if (req.turn_id.empty()) req.turn_id = NewId("t-");
  if (req.turn_id.size() > 64) return absl::InvalidArgumentError("turn_id: at most 64 characters");
  MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("fwaid is shutting down");
  ReapLocked();
  if (auto h = held_.find(req.session_id); h != held_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", req.session_id, " is ", h->second, "; start the turn after it"));
  }
  auto q = queued_.find(req.session_id);
  if (turns_.count(req.session_id) || (q != queued_.end() && !q->second.empty())) {
    auto& waiting = queued_[req.session_id];
    if (waiting.size() >= kMaxQueued) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "session ", req.session_id, " has ", waiting.size(),
          " messages waiting for the turn that runs; send this one after they have run"));
    }
    waiting.push_back(std::move(req));
    return absl::OkStatus();
  }
  LaunchLocked(std::move(req));
  return absl::OkStatus();
}

void TurnManager::LaunchLocked(TurnRequest req) {
  auto turn = std::make_unique<Turn>();
  turn->owner = req.owner;
  Turn* raw = turn.get();
  turns_[req.session_id] = std::move(turn);
  threads_->Run([this, raw, ended = raw->ended, req = std::move(req)]() mutable {
    const std::string session_id = req.session_id;
    Run(raw, std::move(req));
    ended->Set();
    StartQueued(session_id);
  });
}

void TurnManager::StartQueued(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto q = queued_.find(session_id);
  if (q == queued_.end()) return;
  if (shutting_down_ || !sessions_.Get(session_id).ok()) {
    queued_.erase(q);  // fwaid stops, or the session was deleted
    return;
  }
  ReapLocked();
  if (turns_.count(session_id) || held_.count(session_id)) return;
  TurnRequest next = std::move(q->second.front());
  q->second.pop_front();
  if (q->second.empty()) queued_.erase(q);
  LaunchLocked(std::move(next));
}

void TurnManager::Run(Turn* turn, TurnRequest req) {
  const AgentDeps deps{sessions_, config_, providers_, tools_, retriever_, *secrets_, replies_};
  // Preparing the first model request is CPU work: a burst of turns takes
  // it a few at a time (the HTTP client gives the slot up as it sends). The
  // user's message is stored first, outside the slot: a burst's messages are
  // written together.
  const std::function<std::shared_ptr<void>()> preparing = [this, turn] {
    return std::make_shared<StartGate::Hold>(starts_->Enter(&turn->cancel));  // a cancel stops it
  };
  // Done before turn_finished is visible: a client that starts the next turn
  // the moment it sees turn_finished must not be refused. Start() joins this
  // waits for this job to end, so the next turn's events still come after this one.
  RunTurn(deps, TurnHooks{recorder_, project_tools_, reply_observer_, checkpoint_, preparing},
          turn->cancel, req, [turn] {
            turn->done = true;
            MutexLock lock(&turn->mu);
            return turn->cancelled_by;
          });
}

absl::StatusOr<std::unique_ptr<TurnManager::Hold>> TurnManager::HoldStarts(
    const std::string& session_id, const std::string& why) {
  MutexLock lock(&mu_);
  ReapLocked();
  if (auto t = turns_.find(session_id); t != turns_.end() && !t->second->done) {
    return absl::FailedPreconditionError(
        absl::StrCat("a turn is running in session ", session_id, "; wait for it or cancel it"));
  }
  if (auto h = held_.find(session_id); h != held_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " is ", h->second, " already"));
  }
  held_[session_id] = why;
  return std::make_unique<Hold>(this, session_id);
}

TurnManager::Hold::~Hold() {
  {
    MutexLock lock(&m_->mu_);
    m_->held_.erase(session_);
  }
  m_->StartQueued(session_);
}

void TurnManager::Cancel(const std::string& session_id, const Author& by) {
  MutexLock lock(&mu_);
  auto it = turns_.find(session_id);
  if (it == turns_.end()) return;
  {
    Turn& t = *it->second;
    MutexLock turn_lock(&t.mu);
    if (!t.cancel.cancelled() && t.cancelled_by.empty()) t.cancelled_by = by;
  }
  it->second->cancel.Cancel();
}

absl::Status TurnManager::Reply(const std::string& session_id, Interaction reply) {
  return replies_.Reply(session_id, std::move(reply));
}

absl::Status TurnManager::SetMode(const std::string& session_id, const std::string& mode,
                                  const std::string& reason, const Author& by) {
  if (mode != "plan" && mode != "act") {
    return absl::InvalidArgumentError(absl::StrCat("mode: expected plan or act, got '", mode, "'"));
  }
  if (Running(session_id)) {
    return absl::FailedPreconditionError("a turn is running; change the mode after it ends");
  }
  auto info = sessions_.Get(session_id);
  if (!info.ok()) return info.status();
  if (info->mode == mode) return absl::OkStatus();
  info->mode = mode;
  if (auto s = sessions_.Update(*info); !s.ok()) return s;
  v1::ServerEvent ev;
  ev.mutable_mode_changed()->set_mode(mode);
  ev.mutable_mode_changed()->set_reason(reason);
  by.ToProto(ev.mutable_mode_changed()->mutable_author());
  return sessions_.Publish(session_id, std::move(ev)).status();
}

absl::Status TurnManager::SetEditApproval(const std::string& session_id, bool ask,
                                          const std::string& by, const Author& author) {
  // No turn starts between the check and the change.
  auto hold = HoldStarts(session_id, "changing whether it asks before edits");
  if (!hold.ok()) return hold.status();
  auto info = sessions_.Get(session_id);
  if (!info.ok()) return info.status();
  if (info->ask_before_edits == ask) return absl::OkStatus();
  info->ask_before_edits = ask;
  if (auto s = sessions_.Update(*info); !s.ok()) return s;
  v1::ServerEvent ev;
  ev.mutable_edit_approval_changed()->set_ask_before_edits(ask);
  ev.mutable_edit_approval_changed()->set_by(by);
  author.ToProto(ev.mutable_edit_approval_changed()->mutable_author());
  return sessions_.Publish(session_id, std::move(ev)).status();
}

bool TurnManager::Running(const std::string& session_id) {
  MutexLock lock(&mu_);
  auto it = turns_.find(session_id);
  return it != turns_.end() && !it->second->done;
}

size_t TurnManager::RunningCount() {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, t] : turns_) n += t->done ? 0 : 1;
  return n;
}

size_t TurnManager::RunningOwnedBy(const std::function<bool(const std::string&)>& owned) {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, t] : turns_) n += !t->done && owned(t->owner) ? 1 : 0;
  return n;
}

void TurnManager::Shutdown() {
  std::map<std::string, std::unique_ptr<Turn>> turns;
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
    turns.swap(turns_);
  }
  for (auto& [id, t] : turns) t->cancel.Cancel();
  for (auto& [id, t] : turns) t->ended->Wait();
}

}  // namespace fwai
