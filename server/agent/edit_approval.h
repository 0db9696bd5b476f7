// agent: "ask before edits". In a session that asks before edits, every
// write_file / edit_file call (the main agent's and its sub-agents') waits
// for the user's accept before it runs: the daemon asks (a question_asked
// event carrying an EditProposal with a "-"/"+" preview), any client of the
// session may answer, and anything but "Accept" leaves the file untouched
// and tells the model it was rejected (with the user's words, if any). The
// plan file in plan mode is not asked about.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/tools/tool.h"

namespace fwai {

struct AgentDeps;
struct Agent;

inline constexpr char kAccept[] = "Accept";
inline constexpr char kReject[] = "Reject";

// The call `tool_name` must wait for the user's accept.
bool NeedsEditApproval(const Agent& a, const std::string& tool_name);

// Asks and blocks until answered or the agent is cancelled. nullopt: run the
// tool (accepted, or a call the tool refuses by itself - bad input,
// old_string absent or ambiguous - which is not asked about); otherwise the
// result the model gets instead.
std::optional<ToolResult> AskEditApproval(const AgentDeps& deps, const Agent& a,
                                          const std::string& call_id, const std::string& tool_name,
                                          const nlohmann::json& input);

// The "-"/"+" lines of replacing `before` by `after` (common leading and
// trailing lines left out, each side cut to `max_lines`), headed by the
// first changed line's number.
std::string EditPreview(const std::string& before, const std::string& after, size_t max_lines);

}  // namespace fwai
