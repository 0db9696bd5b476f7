// agent: one chat turn, start to finish, on the calling thread: the user's
// message, the main agent set up with the session's history, model, policy and
// project tools, its loop, the run record, and the session's usage totals.
// Publishes user_message first and turn_finished last, whatever happens.
#pragma once

#include <functional>

#include "server/agent/turn_manager.h"

namespace fwai {

class CancelToken;
struct AgentDeps;

// What the daemon hooks into every turn (any may be empty).
struct TurnHooks {
  const std::function<void(const nlohmann::json&)>& recorder;
  const std::function<absl::StatusOr<TurnManager::ProjectToolSet>(const SessionInfo&)>&
      project_tools;
  // Receives the main agent's final text (session id, turn id, text).
  const std::function<void(const std::string&, const std::string&, const std::string&)>&
      reply_observer;
  // Records the project before the turn changes it (session, turn id).
  const std::function<void(const SessionInfo&, const std::string&)>& checkpoint;
};

// Runs `req`; calls `finishing` just before turn_finished is published. It
// returns who cancelled the turn (empty: nobody did, or fwaid itself).
void RunTurn(const AgentDeps& deps, const TurnHooks& hooks, CancelToken& cancel,
             const TurnRequest& req, const std::function<Author()>& finishing);

}  // namespace fwai
