// agent: the conversation as the providers see it. Reads a session's history,
// repairs one cut by a crash or cancel, and renders it as plain text for a
// summary.
#pragma once

#include <string>
#include <vector>

#include "server/llm/provider.h"

namespace fwai {

struct HistoryEntry;

// Gives every tool_use without a following tool_result an "interrupted"
// result, and merges adjacent messages of one role, so the history stays
// valid for providers.
std::vector<LlmMessage> RepairHistory(std::vector<LlmMessage> msgs);

// A session's history (as SessionManager::LoadHistory gives it) and, when
// not null, `then` after it, as the providers see it, repaired; entries that
// do not parse are skipped.
std::vector<LlmMessage> ConversationOf(const std::vector<HistoryEntry>& history,
                                       const HistoryEntry* then = nullptr);

// One line per text, tool call and (shortened) tool result.
std::string Transcript(const std::vector<LlmMessage>& msgs);

}  // namespace fwai
