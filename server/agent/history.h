// agent: the conversation as the providers see it. Loads a session's history,
// repairs one cut by a crash or cancel, and renders it as plain text for a
// summary.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/llm/provider.h"

namespace fwai {

class SessionManager;

// Gives every tool_use without a following tool_result an "interrupted"
// result, and merges adjacent messages of one role, so the history stays
// valid for providers.
std::vector<LlmMessage> RepairHistory(std::vector<LlmMessage> msgs);

// The session's stored history, repaired; entries that do not parse are skipped.
[[nodiscard]] absl::StatusOr<std::vector<LlmMessage>> LoadConversation(
    SessionManager& sessions, const std::string& session_id);

// One line per text, tool call and (shortened) tool result.
std::string Transcript(const std::vector<LlmMessage>& msgs);

}  // namespace fwai
