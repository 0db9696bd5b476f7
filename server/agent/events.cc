#include "server/agent/events.h"

#include <spdlog/spdlog.h>

#include "fwai/v1/events.pb.h"
#include "server/agent/author.h"
#include "server/session/session_manager.h"

namespace fwai {

using fwai::v1::ServerEvent;

void Author::ToProto(v1::Author* out) const {
  if (empty()) return;
  out->set_principal(principal);
  out->set_user(user);
  out->set_owner(owner);
}

void EventSink::Emit(ServerEvent ev, bool wait) {
  ev.set_turn_id(turn_id_);
  // Handed over as bytes, not built: a text delta's own serialization here
  // paces the stream's thread, so the appender finds more events to store
  // together (one client streaming as fast as the provider sends: 66,000 →
  // 88,000 events/s, medians of 6 rounds, against handing the event over).
  auto s = wait ? sessions_.Publish(session_id_, ev.SerializeAsString())
                : sessions_.PublishQueued(session_id_, ev.SerializeAsString());
  if (!s.ok()) {
    spdlog::warn("session {}: cannot publish event: {}", session_id_, s.status().ToString());
  }
}

void EventSink::Error(const absl::Status& s, bool retryable) {
  ServerEvent ev;
  auto* e = ev.mutable_error();
  e->set_code(absl::StatusCodeToString(s.code()));
  e->set_message(std::string(s.message()));
  e->set_retryable(retryable);
  Emit(std::move(ev));
}

void AgentObserver::OnText(std::string_view text) {
  partial_.append(text);
  Send(text, false);
}

void AgentObserver::OnRetry(int attempt, int delay_ms, const std::string& why) {
  spdlog::info("session {} ({}): provider attempt {} failed ({}); retrying in {} ms",
               sink_.session_id(), agent_, attempt, why, delay_ms);
}

void AgentObserver::Send(std::string_view text, bool thinking) {
  ServerEvent ev;
  auto* d = ev.mutable_text_delta();
  d->mutable_origin()->set_agent(agent_);
  d->mutable_origin()->set_parent_call_id(parent_);
  d->set_text(std::string(text));
  d->set_thinking(thinking);
  // Deltas are not waited for: the next chunk's read overlaps their write,
  // and the events after them (message_done, tool calls) are stored after them.
  sink_.Emit(std::move(ev), /*wait=*/false);
}

}  // namespace fwai
