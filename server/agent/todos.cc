#include "server/agent/todos.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/events.h"
#include "server/session/session_manager.h"

namespace fwai {

using json = nlohmann::json;

ToolSpecPtr SpecTodoWrite() {
  static const ToolSpecPtr spec = MakeToolSpec(
      kTodoWrite,
      "Replace the session's todo list. Items: {id, content, status: "
      "pending|in_progress|completed|cancelled, parent_id?}. Ids unique, content non-empty, "
      "at most one in_progress.",
      {{"type", "object"},
       {"properties",
        {{"todos",
          {{"type", "array"},
           {"items",
            {{"type", "object"},
             {"properties",
              {{"id", {{"type", "string"}}},
               {"content", {{"type", "string"}}},
               {"status",
                {{"type", "string"},
                 {"enum", {"pending", "in_progress", "completed", "cancelled"}}}},
               {"parent_id", {{"type", "string"}}}}},
             {"required", {"id", "content", "status"}}}}}}}},
       {"required", {"todos"}}});
  return spec;
}

ToolSpecPtr SpecTodoRead() {
  static const ToolSpecPtr spec =
      MakeToolSpec(kTodoRead, "Read the session's todo list.",
                   {{"type", "object"}, {"properties", json::object()}});
  return spec;
}

absl::Status ValidateTodos(const json& todos) {
  if (!todos.is_array()) return absl::InvalidArgumentError("todos: expected a list");
  std::set<std::string> ids;
  int in_progress = 0;
  static const std::set<std::string> kStatus = {"pending", "in_progress", "completed", "cancelled"};
  for (const auto& t : todos) {
    if (!t.is_object()) return absl::InvalidArgumentError("todos: every item must be an object");
    const std::string id = t.value("id", "");
    if (id.empty()) return absl::InvalidArgumentError("todos: every item needs a non-empty id");
    if (!ids.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("todos: id '", id, "' is used twice; ids must be unique"));
    }
    if (t.value("content", "").find_first_not_of(" \t\n") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("todos: item '", id, "' has empty content"));
    }
    const std::string st = t.value("status", "");
    if (!kStatus.count(st)) {
      return absl::InvalidArgumentError(
          absl::StrCat("todos: item '", id, "' has status '", st,
                       "'; expected pending, in_progress, completed or cancelled"));
    }
    in_progress += st == "in_progress";
  }
  if (in_progress > 1) {
    return absl::InvalidArgumentError("todos: at most one item may be in_progress");
  }
  for (const auto& t : todos) {
    const std::string parent = t.value("parent_id", "");
    if (!parent.empty() && !ids.count(parent)) {
      return absl::InvalidArgumentError(absl::StrCat("todos: item '", t.value("id", ""),
                                                     "' has unknown parent_id '", parent, "'"));
    }
  }
  return absl::OkStatus();
}

ToolResult WriteTodos(SessionManager& sessions, EventSink& sink, const std::string& session_id,
                      const json& input) {
  const json todos = input.value("todos", json());
  if (auto v = ValidateTodos(todos); !v.ok()) return {std::string(v.message()), true};
  auto fresh = sessions.Get(session_id);
  if (fresh.ok()) {
    fresh->todos_json = todos.dump();
    (void)sessions.Update(*fresh);
  }
  v1::ServerEvent ev;
  for (const auto& t : todos) {
    auto* o = ev.mutable_todos_updated()->add_todos();
    o->set_id(t.value("id", ""));
    o->set_content(t.value("content", ""));
    o->set_status(t.value("status", ""));
    o->set_parent_id(t.value("parent_id", ""));
  }
  if (todos.empty()) ev.mutable_todos_updated();
  sink.Emit(std::move(ev));
  return {absl::StrCat("todo list saved (", todos.size(), " items)"), false};
}

ToolResult ReadTodos(SessionManager& sessions, const std::string& session_id) {
  auto fresh = sessions.Get(session_id);
  return {fresh.ok() ? json::parse(fresh->todos_json, nullptr, false).dump(1) : "[]", false};
}

std::string OpenTodos(const std::string& todos_json) {
  std::string out;
  auto todos = json::parse(todos_json, nullptr, false);
  if (!todos.is_array()) return out;
  for (const auto& t : todos) {
    const std::string st = t.value("status", "");
    if (st == "pending" || st == "in_progress") {
      absl::StrAppend(&out, "- [", st, "] ", t.value("id", ""), ": ", t.value("content", ""), "\n");
    }
  }
  return out;
}

}  // namespace fwai
