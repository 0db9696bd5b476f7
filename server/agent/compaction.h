// agent: compaction. When the main agent's conversation nears the model's
// context window (or the person asks), the older turns are replaced by a
// summary the model writes; the latest turns and the open todos are kept word
// for word, and the session's stored history is replaced to match.
#pragma once

#include "absl/status/statusor.h"

namespace fwai {

struct Agent;
class SessionManager;

// True when the conversation (by the last call's input tokens, or an estimate
// of 4 bytes a token) fills more than 80% of the agent's context window.
bool NearContextLimit(const Agent& a);

// Summarises all but the last 2 turns (1 when `forced`); returns how many
// messages were dropped (0: too short to compact). Publishes `compacted`.
[[nodiscard]] absl::StatusOr<int> Compact(SessionManager& sessions, Agent& a, bool forced);

}  // namespace fwai
