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
  const TurnManager::ProjectToolsFn& project_tools;
  // Receives the main agent's final text (session id, turn id, text).
  const std::function<void(const std::string&, const std::string&, const std::string&)>&
      reply_observer;
  // Records the project before the turn changes it (session, the turn's
  // account or null, turn id, the history before the turn's message), beside
  // the first model request; every tool call of the turn waits for it.
  const TurnManager::CheckpointFn& checkpoint;
  // Called once the user's message is stored, before the turn's first model
  // request is prepared (the CPU work a burst of starts takes a few at a
  // time); what it returns is held until the turn ends. May be empty.
  const std::function<std::shared_ptr<void>()>& preparing;
};

// Runs `req`; calls `finishing` just before turn_finished is published. It
// returns who cancelled the turn (empty: nobody did, or fwaid itself).
void RunTurn(const AgentDeps& deps, const TurnHooks& hooks, CancelToken& cancel,
             const TurnRequest& req, const std::function<Author()>& finishing);

}  // namespace fwai
