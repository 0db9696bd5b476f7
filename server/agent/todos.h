// agent: the session's todo list, kept by the main agent with todoWrite and
// todoRead. A list is saved only when it passes ValidateTodos; every saved
// list is published (todos_updated). Open items survive compaction.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "server/llm/provider.h"
#include "server/tools/tool.h"

namespace fwai {

class EventSink;
class SessionManager;

inline constexpr char kTodoWrite[] = "todoWrite";
inline constexpr char kTodoRead[] = "todoRead";

ToolSpecPtr SpecTodoWrite();
ToolSpecPtr SpecTodoRead();

// Checks a todo list against the rules; the message names the rule broken.
[[nodiscard]] absl::Status ValidateTodos(const nlohmann::json& todos);

// todoWrite: replaces the session's list with input.todos.
ToolResult WriteTodos(SessionManager& sessions, EventSink& sink, const std::string& session_id,
                      const nlohmann::json& input);
// todoRead: the session's list as JSON.
ToolResult ReadTodos(SessionManager& sessions, const std::string& session_id);

// "- [status] id: content" lines for the pending and in-progress items of a
// stored list; "" when there are none or the list does not parse.
std::string OpenTodos(const std::string& todos_json);

}  // namespace fwai
