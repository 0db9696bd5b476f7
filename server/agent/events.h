// agent: how a turn's steps reach the clients. EventSink publishes a turn's
// events to its session's event log; AgentObserver streams one agent's text as
// it arrives. A failed publish is logged; it never stops the turn.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "server/llm/provider.h"

namespace fwai {

namespace v1 {
class ServerEvent;
}  // namespace v1

class SessionManager;

// Publishes the events of one turn, each tagged with the turn's id.
class EventSink {
 public:
  EventSink(SessionManager& sessions, std::string session_id, std::string turn_id)
      : sessions_(sessions), session_id_(std::move(session_id)), turn_id_(std::move(turn_id)) {}
  // With `wait`, returns once the event is stored; without, once it is queued
  // (it is stored before any later event of the session).
  void Emit(v1::ServerEvent ev, bool wait = true);
  void Error(const absl::Status& s, bool retryable);
  const std::string& session_id() const { return session_id_; }
  const std::string& turn_id() const { return turn_id_; }

 private:
  SessionManager& sessions_;
  const std::string session_id_;
  const std::string turn_id_;
};

// Streams one agent's text to the clients, tagged with the agent and the
// tool call that started it, and keeps the text of the message under way.
class AgentObserver final : public StreamObserver {
 public:
  AgentObserver(EventSink& sink, std::string agent, std::string parent_call_id)
      : sink_(sink), agent_(std::move(agent)), parent_(std::move(parent_call_id)) {}
  void OnText(std::string_view text) override;
  void OnThinking(std::string_view text) override { Send(text, true); }
  void OnRetry(int attempt, int delay_ms, const std::string& why) override;
  // The text streamed since the last call.
  std::string TakePartial() { return std::exchange(partial_, {}); }

 private:
  void Send(std::string_view text, bool thinking);
  EventSink& sink_;
  const std::string agent_, parent_;
  std::string partial_;
};

}  // namespace fwai
