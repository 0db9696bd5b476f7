#include "server/agent/turn_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/clock.h"
#include "common/ids.h"
#include "fwai/v1/events.pb.h"
#include "server/llm/provider.h"
#include "server/project/policy.h"
#include "server/project/project.h"
#include "server/project/secrets.h"
#include "server/session/session_manager.h"
#include "server/tools/tool.h"

namespace fwai {

using json = nlohmann::json;

Provider* ProviderSet::Find(const std::string& name) const {
  auto it = providers.find(name.empty() ? default_name : name);
  return it == providers.end() ? nullptr : it->second.get();
}

void PriceFor(const std::string& model, double* in, double* out) {
  struct P {
    const char* prefix;
    double in, out;
  };
  static const P kPrices[] = {
      {"claude-opus-4", 15, 75},     {"claude-sonnet-4", 3, 15}, {"claude-3-7-sonnet", 3, 15},
      {"claude-3-5-sonnet", 3, 15},  {"claude-haiku-4", 1, 5},   {"claude-3-5-haiku", 0.8, 4},
      {"gpt-4o-mini", 0.15, 0.6},    {"gpt-4o", 2.5, 10},        {"gpt-4.1-mini", 0.4, 1.6},
      {"gpt-4.1-nano", 0.1, 0.4},    {"gpt-4.1", 2, 8},          {"o3-mini", 1.1, 4.4},
      {"o4-mini", 1.1, 4.4},         {"gpt-5-mini", 0.25, 2},    {"gpt-5", 1.25, 10},
  };
  *in = *out = 0;
  for (const auto& p : kPrices) {
    if (absl::StartsWith(model, p.prefix)) {
      *in = p.in;
      *out = p.out;
      return;
    }
  }
}

int64_t ContextWindowFor(const std::string& model, int64_t configured) {
  struct W {
    const char* prefix;
    int64_t tokens;
  };
  static const W kWindows[] = {
      {"claude-", 200000},      {"gpt-4o", 128000},       {"gpt-4.1", 1047576},   {"gpt-5", 400000},
      {"o3", 200000},           {"o4-mini", 200000},      {"gemini-2.5", 1048576}, {"gemini-2.0", 1048576},
      {"gemini-1.5-pro", 2097152}, {"llama3.1", 131072},  {"llama3.2", 131072},    {"qwen2.5-coder", 32768},
      {"mistral", 32768},
  };
  for (const auto& w : kWindows) {
    if (absl::StartsWith(model, w.prefix)) return w.tokens;
  }
  return configured > 0 ? configured : 128000;
}

struct TurnManager::Turn {
  CancelToken cancel;
  std::thread thread;
  std::atomic<bool> done{false};
};

TurnManager::TurnManager(SessionManager& sessions, const DaemonConfig& config,
                         const ProviderSet& providers, const ToolRegistry& tools, ToolRetriever retriever)
    : sessions_(sessions),
      config_(config),
      providers_(providers),
      tools_(tools),
      retriever_(std::move(retriever)),
      secrets_(SecretScanner::Default()) {}

TurnManager::~TurnManager() { Shutdown(); }

void TurnManager::ReapLocked() {
  for (auto it = turns_.begin(); it != turns_.end();) {
    if (it->second->done) {
      if (it->second->thread.joinable()) it->second->thread.join();
      it = turns_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status TurnManager::Start(TurnRequest req) {
  if (req.text.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("message: empty");
  }
  if (static_cast<int64_t>(req.text.size()) > config_.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("message: ", req.text.size(),
                                                   " bytes is over the limit of ",
                                                   config_.max_message_bytes, " bytes"));
  }
  auto info = sessions_.Get(req.session_id);
  if (!info.ok()) return info.status();
  if (req.turn_id.empty()) req.turn_id = NewId("t-");
  if (req.turn_id.size() > 64) return absl::InvalidArgumentError("turn_id: at most 64 characters");
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return absl::UnavailableError("fwaid is shutting down");
  ReapLocked();
  if (turns_.count(req.session_id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", req.session_id, " already has a turn running; wait for it or cancel it"));
  }
  auto turn = std::make_unique<Turn>();
  Turn* raw = turn.get();
  turns_[req.session_id] = std::move(turn);
  raw->thread = std::thread([this, raw, req = std::move(req)]() mutable { Run(raw, std::move(req)); });
  return absl::OkStatus();
}

void TurnManager::Cancel(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = turns_.find(session_id);
  if (it != turns_.end()) it->second->cancel.Cancel();
}

bool TurnManager::Running(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = turns_.find(session_id);
  return it != turns_.end() && !it->second->done;
}

size_t TurnManager::RunningCount() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [id, t] : turns_) n += t->done ? 0 : 1;
  return n;
}

void TurnManager::Shutdown() {
  std::map<std::string, std::unique_ptr<Turn>> turns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    turns.swap(turns_);
  }
  for (auto& [id, t] : turns) t->cancel.Cancel();
  for (auto& [id, t] : turns) {
    if (t->thread.joinable()) t->thread.join();
  }
}

namespace {

using fwai::v1::ServerEvent;

// Publishes the events of one turn.
class EventSink {
 public:
  EventSink(SessionManager& sessions, std::string session_id, std::string turn_id)
      : sessions_(sessions), session_id_(std::move(session_id)), turn_id_(std::move(turn_id)) {}
  void Emit(ServerEvent ev) {
    ev.set_turn_id(turn_id_);
    auto s = sessions_.Publish(session_id_, ev.SerializeAsString());
    if (!s.ok()) spdlog::warn("session {}: cannot publish event: {}", session_id_, s.status().ToString());
  }
  void Error(const absl::Status& s, bool retryable) {
    ServerEvent ev;
    auto* e = ev.mutable_error();
    e->set_code(absl::StatusCodeToString(s.code()));
    e->set_message(std::string(s.message()));
    e->set_retryable(retryable);
    Emit(std::move(ev));
  }
  const std::string& session_id() const { return session_id_; }

 private:
  SessionManager& sessions_;
  const std::string session_id_;
  const std::string turn_id_;
};

// Streams one agent's text to the clients, tagged with the agent and the
// tool call that started it.
class AgentObserver final : public StreamObserver {
 public:
  AgentObserver(EventSink& sink, std::string agent, std::string parent_call_id)
      : sink_(sink), agent_(std::move(agent)), parent_(std::move(parent_call_id)) {}
  void OnText(std::string_view text) override {
    partial_.append(text);
    Send(text, false);
  }
  void OnThinking(std::string_view text) override { Send(text, true); }
  void OnRetry(int attempt, int delay_ms, const std::string& why) override {
    spdlog::info("session {} ({}): provider attempt {} failed ({}); retrying in {} ms", sink_.session_id(), agent_,
                 attempt, why, delay_ms);
  }
  std::string TakePartial() { return std::exchange(partial_, {}); }

 private:
  void Send(std::string_view text, bool thinking) {
    ServerEvent ev;
    auto* d = ev.mutable_text_delta();
    d->mutable_origin()->set_agent(agent_);
    d->mutable_origin()->set_parent_call_id(parent_);
    d->set_text(std::string(text));
    d->set_thinking(thinking);
    sink_.Emit(std::move(ev));
  }
  EventSink& sink_;
  const std::string agent_, parent_;
  std::string partial_;
};

// Gives every tool_use without a following tool_result an "interrupted"
// result, so a history cut by a crash or cancel stays valid for providers.
std::vector<LlmMessage> RepairHistory(std::vector<LlmMessage> msgs) {
  std::vector<LlmMessage> out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    out.push_back(msgs[i]);
    if (msgs[i].role != "assistant") continue;
    std::vector<std::string> ids;
    for (const auto& b : msgs[i].content) {
      if (b.value("type", "") == "tool_use") ids.push_back(b.value("id", ""));
    }
    if (ids.empty()) continue;
    std::set<std::string> answered;
    if (i + 1 < msgs.size() && msgs[i + 1].role == "user") {
      for (const auto& b : msgs[i + 1].content) {
        if (b.value("type", "") == "tool_result") answered.insert(b.value("tool_use_id", ""));
      }
    }
    json missing = json::array();
    for (const auto& id : ids) {
      if (!answered.count(id)) {
        missing.push_back({{"type", "tool_result"},
                           {"tool_use_id", id},
                           {"content", "interrupted: the tool did not run to completion"},
                           {"is_error", true}});
      }
    }
    if (missing.empty()) continue;
    if (i + 1 < msgs.size() && msgs[i + 1].role == "user") {
      for (auto& m : missing) msgs[i + 1].content.insert(msgs[i + 1].content.begin(), m);
    } else {
      out.push_back({"user", missing});
    }
  }
  // Merge adjacent messages of the same role (providers require alternation).
  std::vector<LlmMessage> merged;
  for (auto& m : out) {
    if (!merged.empty() && merged.back().role == m.role) {
      for (auto& b : m.content) merged.back().content.push_back(b);
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}


std::string SystemPrompt(const SessionInfo& s, const std::vector<ToolSpec>& tools) {
  std::string p =
      "You are fwai, an assistant for firmware engineers, running inside the fwaid daemon.\n"
      "You help with embedded C/C++, microcontrollers, peripherals, toolchains, debugging and "
      "datasheets. Be precise; cite file paths and line numbers when you use project files.\n";
  absl::StrAppend(&p, "Project root: ", s.project_root, "\n");
  absl::StrAppend(&p, "Mode: ", s.mode, "\n");
  if (!tools.empty()) {
    absl::StrAppend(&p, "Tools available:");
    for (const auto& t : tools) absl::StrAppend(&p, " ", t.name);
    absl::StrAppend(&p, ". Paths are relative to the project root; nothing outside it is visible.\n");
  }
  return p;
}

constexpr char kToolSearch[] = "toolSearch";
constexpr char kSubmitPlan[] = "submitPlan";
constexpr char kTodoWrite[] = "todoWrite";
constexpr char kTodoRead[] = "todoRead";
constexpr char kAskQuestion[] = "askQuestion";
constexpr char kDelegate[] = "delegateSubagent";

std::string PlanPath(const std::string& session_id) { return ".fwai/plans/" + session_id + ".md"; }

// Built-in sub-agent types; agent.subagents may add or override them.
std::map<std::string, SubagentConfig> SubagentTypes(const DaemonConfig& config) {
  std::map<std::string, SubagentConfig> out;
  SubagentConfig c;
  c.name = "codebase-explorer";
  c.description = "Explores the project's source: finds where things are defined and used, reports file:line.";
  c.tools = {"read_file", "list_dir", "grep", "glob", "codeSearch"};
  c.prompt = "You explore a firmware codebase to answer one task. Search, read, and report concrete findings "
             "with file paths and line numbers. Be brief.";
  out[c.name] = c;
  c.name = "document-explorer";
  c.description = "Searches datasheets, reference manuals and notes in the knowledge base.";
  c.tools = {"documentSearch", "read_file", "list_dir", "grep"};
  c.prompt = "You look things up in datasheets and manuals for one task. Quote the passages you rely on with "
             "their source and page.";
  out[c.name] = c;
  c.name = "planning-agent";
  c.description = "Produces a step-by-step plan for a change; may delegate exploration.";
  c.tools = {"read_file", "list_dir", "grep", "glob", "documentSearch", "codeSearch", kDelegate};
  c.prompt = "You write a concrete, numbered plan for the task: files to change, steps, how to verify on the "
             "target. Do not change anything.";
  out[c.name] = c;
  for (const auto& [name, sc] : config.subagents) out[name] = sc;
  return out;
}

ToolSpec SpecSubmitPlan() {
  return {kSubmitPlan,
          "Submit the plan you wrote to the plan file for the user's approval. Waits for their decision: on "
          "approval the session switches to act mode and you carry the plan out.",
          {{"type", "object"}, {"properties", json::object()}}};
}
ToolSpec SpecTodoWrite() {
  return {kTodoWrite,
          "Replace the session's todo list. Items: {id, content, status: pending|in_progress|completed|cancelled, "
          "parent_id?}. Ids unique, content non-empty, at most one in_progress.",
          {{"type", "object"},
           {"properties",
            {{"todos",
              {{"type", "array"},
               {"items",
                {{"type", "object"},
                 {"properties",
                  {{"id", {{"type", "string"}}},
                   {"content", {{"type", "string"}}},
                   {"status", {{"type", "string"}, {"enum", {"pending", "in_progress", "completed", "cancelled"}}}},
                   {"parent_id", {{"type", "string"}}}}},
                 {"required", {"id", "content", "status"}}}}}}}},
           {"required", {"todos"}}}};
}
ToolSpec SpecTodoRead() {
  return {kTodoRead, "Read the session's todo list.", {{"type", "object"}, {"properties", json::object()}}};
}
ToolSpec SpecAskQuestion() {
  return {kAskQuestion,
          "Ask the user one or more questions and wait for the answers. Each question may offer options (single "
          "or multiple choice) and/or free text.",
          {{"type", "object"},
           {"properties",
            {{"questions",
              {{"type", "array"},
               {"items",
                {{"type", "object"},
                 {"properties",
                  {{"text", {{"type", "string"}}},
                   {"options", {{"type", "array"}, {"items", {{"type", "string"}}}}},
                   {"multiple", {{"type", "boolean"}}},
                   {"allow_free_text", {{"type", "boolean"}}}}},
                 {"required", {"text"}}}}}}}},
           {"required", {"questions"}}}};
}
ToolSpec SpecDelegate(const std::map<std::string, SubagentConfig>& types) {
  std::string desc = "Hand a self-contained task to a sub-agent with its own context; returns its report. "
                     "Several calls in one message run in parallel. Types:";
  json names = json::array();
  for (const auto& [n, t] : types) {
    absl::StrAppend(&desc, "\n- ", n, ": ", t.description);
    names.push_back(n);
  }
  return {kDelegate, desc,
          {{"type", "object"},
           {"properties",
            {{"agent_type", {{"type", "string"}, {"enum", names}}},
             {"task", {{"type", "string"}, {"description", "What to do and what to report back"}}}}},
           {"required", {"agent_type", "task"}}}};
}

// Checks a todo list against the rules; the message names the rule broken.
absl::Status ValidateTodos(const json& todos) {
  if (!todos.is_array()) return absl::InvalidArgumentError("todos: expected a list");
  std::set<std::string> ids;
  int in_progress = 0;
  static const std::set<std::string> kStatus = {"pending", "in_progress", "completed", "cancelled"};
  for (const auto& t : todos) {
    if (!t.is_object()) return absl::InvalidArgumentError("todos: every item must be an object");
    const std::string id = t.value("id", "");
    if (id.empty()) return absl::InvalidArgumentError("todos: every item needs a non-empty id");
    if (!ids.insert(id).second) return absl::InvalidArgumentError(absl::StrCat("todos: id '", id, "' is used twice; ids must be unique"));
    if (t.value("content", "").find_first_not_of(" \t\n") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("todos: item '", id, "' has empty content"));
    }
    const std::string st = t.value("status", "");
    if (!kStatus.count(st)) {
      return absl::InvalidArgumentError(absl::StrCat("todos: item '", id, "' has status '", st,
                                                     "'; expected pending, in_progress, completed or cancelled"));
    }
    in_progress += st == "in_progress";
  }
  if (in_progress > 1) return absl::InvalidArgumentError("todos: at most one item may be in_progress");
  for (const auto& t : todos) {
    const std::string parent = t.value("parent_id", "");
    if (!parent.empty() && !ids.count(parent)) {
      return absl::InvalidArgumentError(absl::StrCat("todos: item '", t.value("id", ""), "' has unknown parent_id '", parent, "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct TurnManager::Pending {
  std::string id;
  bool is_plan = false;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Interaction> reply;
};

// One agent's loop: the main agent of a turn, or a sub-agent under a call.
struct TurnManager::Agent {
  std::string name = "main";
  std::string parent_call_id;
  std::string request;  // the user's message (tool retrieval)
  int depth = 0;
  Provider* provider = nullptr;
  std::string model;
  std::string system;
  int max_tokens = 4096;
  double temperature = -1;
  int max_tool_calls = 1 << 30;
  std::vector<LlmMessage> messages;
  bool persist = false;  // the main agent keeps the session's history
  std::set<std::string> allowed;  // empty: all (subject to mode)
  bool read_only = false;
  CancelToken* cancel = nullptr;
  // Per turn:
  EventSink* sink = nullptr;
  const SessionInfo* session = nullptr;
  std::string* mode = nullptr;  // the session's mode, changed by an approved plan
  int64_t* in_tokens = nullptr;
  int64_t* out_tokens = nullptr;
  double* cost = nullptr;
  std::mutex* usage_mu = nullptr;
  std::string stop_reason = "end_turn";
  int iterations = 0;
  int64_t context_window = 200000;
  int64_t last_input_tokens = 0;
  // Every tool call of the turn, sub-agents included (for the run record).
  json* calls_log = nullptr;
  std::mutex* calls_mu = nullptr;
  // The project's policy for this turn, and what it decided.
  struct Policy {
    PolicyRules rules;
    std::set<std::string> files_written;
    int lines_changed = 0;
    json refusals = json::array();
  };
  Policy* policy = nullptr;
  // Tools of the project's own MCP servers (offered besides the registry's).
  const std::vector<Tool*>* project_tools = nullptr;
  // Where each tool call's output is logged (.fwai/runs/<run_id>/), "" for none.
  const std::string* log_dir = nullptr;
};

namespace {
class NullObserver final : public StreamObserver {
 public:
  void OnText(std::string_view) override {}
};

std::string Transcript(const std::vector<LlmMessage>& msgs) {
  std::string out;
  for (const auto& m : msgs) {
    for (const auto& b : m.content) {
      const std::string t = b.value("type", "");
      if (t == "text") {
        absl::StrAppend(&out, m.role, ": ", b.value("text", ""), "\n");
      } else if (t == "tool_use") {
        absl::StrAppend(&out, "assistant called ", b.value("name", ""), " ", b.value("input", json::object()).dump(), "\n");
      } else if (t == "tool_result") {
        std::string c = b.contains("content") && b["content"].is_string() ? b["content"].get<std::string>() : b.dump();
        if (c.size() > 600) c = c.substr(0, 600) + " ...";
        absl::StrAppend(&out, "tool result: ", c, "\n");
      }
    }
  }
  return out;
}
}  // namespace

absl::StatusOr<int> TurnManager::Compact(Agent& a, bool forced) {
  // Keep the last turns (2 normally, 1 when asked): a turn starts at a user
  // message with text (tool results are not turns).
  std::vector<size_t> starts;
  for (size_t i = 0; i < a.messages.size(); ++i) {
    if (a.messages[i].role != "user") continue;
    for (const auto& b : a.messages[i].content) {
      if (b.value("type", "") == "text") {
        starts.push_back(i);
        break;
      }
    }
  }
  const size_t keep = forced ? 1 : 2;
  if (starts.size() <= keep) return 0;
  const size_t cut = starts[starts.size() - keep];
  std::vector<LlmMessage> older(a.messages.begin(), a.messages.begin() + static_cast<ptrdiff_t>(cut));
  std::vector<LlmMessage> kept(a.messages.begin() + static_cast<ptrdiff_t>(cut), a.messages.end());
  ChatRequest creq;
  creq.model = a.model;
  creq.system = "You summarise a conversation between a firmware engineer and an assistant so it can continue "
                "without the full text. Keep decisions, facts found (files, registers, values), what was changed, "
                "and what is still open. Be concise.";
  creq.messages.push_back({"user", json::array({{{"type", "text"},
                                                 {"text", "Summarise this conversation:\n\n" + Transcript(older)}}})});
  creq.max_tokens = 2048;
  NullObserver quiet;
  auto result = a.provider->Stream(creq, quiet, *a.cancel);
  if (!result.ok()) return result.status();
  {
    std::lock_guard<std::mutex> lock(*a.usage_mu);
    *a.in_tokens += result->input_tokens;
    *a.out_tokens += result->output_tokens;
  }
  std::string summary;
  for (const auto& b : result->content) {
    if (b.value("type", "") == "text") summary += b.value("text", "");
  }
  if (summary.empty()) return absl::UnavailableError("compaction: the provider returned no summary");
  // Open todos survive compaction word for word.
  std::string todos_text;
  auto fresh = sessions_.Get(a.session->id);
  if (fresh.ok()) {
    auto todos = json::parse(fresh->todos_json, nullptr, false);
    if (todos.is_array()) {
      for (const auto& t : todos) {
        const std::string st = t.value("status", "");
        if (st == "pending" || st == "in_progress") {
          absl::StrAppend(&todos_text, "- [", st, "] ", t.value("id", ""), ": ", t.value("content", ""), "\n");
        }
      }
    }
  }
  std::string head = absl::StrCat("Summary of the earlier conversation (compacted):\n", summary);
  if (!todos_text.empty()) absl::StrAppend(&head, "\n\nOpen todos:\n", todos_text);
  std::vector<LlmMessage> next;
  next.push_back({"user", json::array({{{"type", "text"}, {"text", head}}})});
  next.push_back({"assistant", json::array({{{"type", "text"}, {"text", "Understood; continuing from the summary."}}})});
  for (auto& m : kept) next.push_back(std::move(m));
  if (a.persist) {
    std::vector<HistoryEntry> entries;
    for (const auto& m : next) entries.push_back({m.role, m.content.dump()});
    if (auto s = sessions_.ReplaceHistory(a.session->id, entries); !s.ok()) return s;
  }
  const int dropped = static_cast<int>(older.size());
  a.messages = std::move(next);
  a.last_input_tokens = 0;
  ServerEvent ev;
  ev.mutable_compacted()->set_dropped_messages(dropped);
  ev.mutable_compacted()->set_summary(summary);
  a.sink->Emit(std::move(ev));
  return dropped;
}

absl::Status TurnManager::Reply(const std::string& session_id, Interaction reply) {
  std::shared_ptr<Pending> p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(session_id);
    if (it != pending_.end()) p = it->second;
    auto done = answered_.find(session_id);
    if (done != answered_.end() && !reply.id.empty() && (!p || p->id != reply.id)) {
      for (const auto& [id, by] : done->second) {
        if (id == reply.id) {
          return absl::FailedPreconditionError(absl::StrCat(reply.is_plan ? "plan " : "question ",
                                                            id, ": already answered by ", by));
        }
      }
    }
  }
  if (!p || (!reply.id.empty() && reply.id != p->id) || p->is_plan != reply.is_plan) {
    return absl::NotFoundError(absl::StrCat(reply.is_plan ? "plan " : "question ", reply.id,
                                            ": nothing in session ", session_id, " is waiting for it"));
  }
  std::lock_guard<std::mutex> lock(p->mu);
  if (p->reply) {
    // The first answer wins; the session's clients see which one it was.
    return absl::FailedPreconditionError(absl::StrCat(reply.is_plan ? "plan " : "question ", p->id,
                                                      ": already answered by ", p->reply->by));
  }
  p->reply = std::move(reply);
  p->cv.notify_all();
  return absl::OkStatus();
}

absl::Status TurnManager::SetMode(const std::string& session_id, const std::string& mode, const std::string& reason) {
  if (mode != "plan" && mode != "act") return absl::InvalidArgumentError(absl::StrCat("mode: expected plan or act, got '", mode, "'"));
  if (Running(session_id)) return absl::FailedPreconditionError("a turn is running; change the mode after it ends");
  auto info = sessions_.Get(session_id);
  if (!info.ok()) return info.status();
  if (info->mode == mode) return absl::OkStatus();
  info->mode = mode;
  if (auto s = sessions_.Update(*info); !s.ok()) return s;
  ServerEvent ev;
  ev.mutable_mode_changed()->set_mode(mode);
  ev.mutable_mode_changed()->set_reason(reason);
  return sessions_.Publish(session_id, ev.SerializeAsString()).status();
}

std::shared_ptr<TurnManager::Pending> TurnManager::Expect(const std::string& session_id, const std::string& id,
                                                          bool is_plan) {
  auto p = std::make_shared<Pending>();
  p->id = id;
  p->is_plan = is_plan;
  std::lock_guard<std::mutex> lock(mu_);
  pending_[session_id] = p;
  return p;
}

std::optional<Interaction> TurnManager::Wait(Turn* turn, const std::string& session_id,
                                             const std::shared_ptr<Pending>& p) {
  std::optional<Interaction> out;
  {
    std::unique_lock<std::mutex> lock(p->mu);
    while (!p->reply && !turn->cancel.cancelled()) p->cv.wait_for(lock, std::chrono::milliseconds(100));
    out = p->reply;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_[session_id] == p) pending_.erase(session_id);
  if (out) {
    auto& done = answered_[session_id];
    done.emplace_back(p->id, out->by);
    if (done.size() > 16) done.pop_front();
  }
  return out;
}

void TurnManager::Run(Turn* turn, TurnRequest req) {
  const int64_t start_ns = MonotonicNanos();
  EventSink sink(sessions_, req.session_id, req.turn_id);
  int64_t in_tokens = 0, out_tokens = 0;
  double cost = 0;
  std::mutex usage_mu;
  std::string stop_reason = "end_turn";
  int iterations = 0;

  auto finish = [&]() {
    // Done before the event is visible: a client that starts the next turn the
    // moment it sees turn_finished must not be refused. Start() joins this
    // thread, so the next turn's events still come after this one.
    turn->done = true;
    ServerEvent ev;
    auto* f = ev.mutable_turn_finished();
    f->mutable_usage()->set_input_tokens(in_tokens);
    f->mutable_usage()->set_output_tokens(out_tokens);
    f->mutable_usage()->set_cost_usd(cost);
    f->set_stop_reason(stop_reason);
    f->set_iterations(iterations);
    f->set_duration_ms((MonotonicNanos() - start_ns) / 1000000);
    sink.Emit(std::move(ev));
  };

  {
    ServerEvent ev;
    ev.mutable_user_message()->set_text(req.text);
    ev.mutable_user_message()->set_sender(req.sender);
    sink.Emit(std::move(ev));
  }
  auto info = sessions_.Get(req.session_id);
  if (!info.ok()) {
    stop_reason = "error";
    sink.Error(info.status(), false);
    return finish();
  }
  const std::string provider_name = !req.provider.empty() ? req.provider : info->provider;
  Provider* provider = providers_.Find(provider_name);
  json user_content = json::array({{{"type", "text"}, {"text", req.text}}});
  absl::Status hs = req.compact_only ? absl::OkStatus()
                                     : sessions_.AppendHistory(req.session_id, {"user", user_content.dump()});
  if (!hs.ok()) {
    stop_reason = "error";
    sink.Error(hs, false);
    return finish();
  }
  if (provider == nullptr) {
    stop_reason = "error";
    if (providers_.providers.empty()) {
      sink.Error(absl::FailedPreconditionError(
                     "no LLM provider is configured. Set ANTHROPIC_API_KEY or OPENAI_API_KEY "
                     "(and optionally ANTHROPIC_BASE_URL / OPENAI_BASE_URL) in fwaid's environment "
                     "and restart it (fwai daemon stop; the next fwai command starts it), or add a "
                     "providers: section to fwaid.yaml. Sessions, history and attach work without one."),
                 false);
    } else {
      std::string names;
      for (const auto& [n, p] : providers_.providers) absl::StrAppend(&names, names.empty() ? "" : ", ", n);
      sink.Error(absl::InvalidArgumentError(absl::StrCat("provider '", provider_name,
                                                         "' is not configured; configured: ", names)),
                 false);
    }
    return finish();
  }
  const ProviderConfig& pc = provider->config();
  const std::string model = !req.model.empty() ? req.model : (!info->model.empty() ? info->model : pc.model);
  {
    ServerEvent ev;
    ev.mutable_turn_started()->set_provider(pc.name);
    ev.mutable_turn_started()->set_model(model);
    sink.Emit(std::move(ev));
  }
  auto history = sessions_.LoadHistory(req.session_id);
  if (!history.ok()) {
    stop_reason = "error";
    sink.Error(history.status(), false);
    return finish();
  }
  Agent main;
  for (const auto& h : *history) {
    main.messages.push_back({h.role, json::parse(h.content_json, nullptr, false)});
    if (main.messages.back().content.is_discarded()) main.messages.pop_back();
  }
  main.messages = RepairHistory(std::move(main.messages));
  std::string mode = info->mode;
  main.provider = provider;
  main.model = model;
  main.max_tokens = info->max_tokens > 0 ? info->max_tokens : pc.max_tokens;
  main.temperature = info->temperature >= 0 ? info->temperature : pc.temperature;
  main.persist = true;
  main.cancel = &turn->cancel;
  main.sink = &sink;
  main.session = &*info;
  main.mode = &mode;
  main.in_tokens = &in_tokens;
  main.out_tokens = &out_tokens;
  main.cost = &cost;
  main.usage_mu = &usage_mu;
  main.request = req.text;
  json calls_log = json::array();
  std::mutex calls_mu;
  main.calls_log = &calls_log;
  main.calls_mu = &calls_mu;
  Agent::Policy policy;
  {
    // A policy that cannot be read stops the turn: it fails closed.
    auto rules = LoadPolicy(info->project_root, config_.policy_file);
    if (!rules.ok()) {
      stop_reason = "error";
      sink.Error(absl::FailedPreconditionError(absl::StrCat("policy: ", rules.status().message())), false);
      return finish();
    }
    policy.rules = *rules;
  }
  main.policy = &policy;
  std::vector<Tool*> project_tools;
  std::shared_ptr<const void> project_tools_owner;
  if (project_tools_) {
    // The project's MCP servers (started on first use); a broken section stops the turn.
    auto pt = project_tools_(*info);
    if (!pt.ok()) {
      stop_reason = "error";
      sink.Error(absl::FailedPreconditionError(absl::StrCat("mcp_servers: ", pt.status().message())), false);
      return finish();
    }
    project_tools = std::move(pt->tools);
    project_tools_owner = std::move(pt->owner);
  }
  main.project_tools = &project_tools;
  // Tool outputs are logged under the project (.fwai/runs/<run_id>/<call_id>.log).
  const std::string run_id = absl::StrCat("run-", req.turn_id);
  // (The directory is made with the first log; old runs are pruned then.)
  std::string log_dir = recorder_ ? info->project_root + "/.fwai/runs/" + run_id : "";
  main.log_dir = &log_dir;
  main.context_window = ContextWindowFor(model, pc.context_window);
  {
    size_t best = 0;
    for (const auto& [prefix, tokens] : config_.context_windows) {
      if (absl::StartsWith(model, prefix) && prefix.size() >= best) {
        best = prefix.size();
        main.context_window = tokens;
      }
    }
  }
  if (req.compact_only) {
    auto n = Compact(main, /*forced=*/true);
    if (!n.ok()) {
      stop_reason = absl::IsCancelled(n.status()) ? "cancelled" : "error";
      if (stop_reason == "error") sink.Error(n.status(), false);
    } else {
      stop_reason = "compacted";
      if (*n == 0) sink.Error(absl::FailedPreconditionError("nothing to compact: the conversation is short"), false);
    }
    return finish();
  }
  RunAgent(turn, main);
  stop_reason = main.stop_reason;
  iterations = main.iterations;
  if (recorder_) {
    json rec = {{"kind", "agent_turn"},
                {"run_id", run_id},
                {"log_dir", calls_log.empty() ? "" : log_dir},
                {"session_id", req.session_id},
                {"turn_id", req.turn_id},
                {"project_root", info->project_root},
                {"owner", info->owner},
                {"provider", pc.name},
                {"model", model},
                {"mode", mode},
                {"llm_calls", {{"model_calls", main.iterations}, {"input_tokens", in_tokens},
                               {"output_tokens", out_tokens}, {"cost_usd", cost}}},
                {"tools", calls_log},
                {"stop_reason", main.stop_reason},
                {"policy_refusals", policy.refusals},
                {"duration_ms", (MonotonicNanos() - start_ns) / 1000000}};
    // Files changed: the numstat of the project's git diff, when it is a repository.
    std::error_code ec;
    if (std::filesystem::exists(info->project_root + "/.git", ec)) {
      ProcessOptions po;
      po.timeout_ms = 5000;
      auto r = RunProcess({"git", "-C", info->project_root, "diff", "--numstat"}, po);
      if (r.ok() && r->exit_code == 0) {
        json files = json::array();
        for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
          std::vector<std::string> f = absl::StrSplit(line, '\t');
          if (f.size() == 3) files.push_back({{"path", f[2]}, {"added", f[0]}, {"removed", f[1]}});
        }
        rec["files_changed"] = files;
      }
    }
    secrets_->RedactJson(rec);
    recorder_(rec);
  }
  auto fresh = sessions_.Get(req.session_id);
  if (fresh.ok()) {
    if (fresh->mode != mode) fresh->mode = mode;
    fresh->input_tokens += in_tokens;
    fresh->output_tokens += out_tokens;
    fresh->cost_usd += cost;
    (void)sessions_.Update(*fresh);
  }
  finish();
}

std::string TurnManager::RunAgent(Turn* turn, Agent& a) {
  EventSink& sink = *a.sink;
  const SessionInfo& session = *a.session;
  const bool is_main = a.name == "main";
  const auto types = SubagentTypes(config_);
  double price_in = 0, price_out = 0;
  PriceFor(a.model, &price_in, &price_out);
  size_t best = 0;
  for (const auto& [prefix, pr] : config_.prices) {
    if (absl::StartsWith(a.model, prefix) && prefix.size() >= best) {
      best = prefix.size();
      price_in = pr.first;
      price_out = pr.second;
    }
  }
  AgentObserver observer(sink, a.name, a.parent_call_id);

  // The tools offered. With many tools (MCP servers, ...), the main agent gets
  // the core (built-in) tools, the ones retrieved for the request and those it
  // found with toolSearch. Plan mode offers only what cannot change anything.
  std::vector<Tool*> all_tools = tools_.All();
  if (a.project_tools) all_tools.insert(all_tools.end(), a.project_tools->begin(), a.project_tools->end());
  auto find_tool = [&](const std::string& name) -> Tool* {
    if (Tool* t = tools_.Find(name)) return t;
    if (a.project_tools) {
      for (Tool* t : *a.project_tools) {
        if (t->name() == name) return t;
      }
    }
    return nullptr;
  };
  const bool select = is_main && retriever_ && static_cast<int>(all_tools.size()) > config_.tool_threshold;
  std::set<std::string> offered;
  // The project's own MCP tools are always offered (the shared catalog does not hold them).
  if (a.project_tools) {
    for (Tool* t : *a.project_tools) offered.insert(t->name());
  }
  auto is_core = [](const Tool* t) { return t->name().rfind("mcp_", 0) != 0; };
  if (select) {
    for (const std::string& name : retriever_(a.request, config_.tools_top_k * 3)) {
      if (static_cast<int>(offered.size()) >= config_.tools_top_k) break;
      if (Tool* t = find_tool(name); t && !is_core(t)) offered.insert(name);
    }
    // The tools the session called lately stay offered: a follow-up ("now
    // the same for bank 1") seldom names them again.
    int recent = 0;
    const size_t lookback = std::min<size_t>(a.messages.size(), 40);
    for (size_t i = a.messages.size(); i > a.messages.size() - lookback && recent < config_.tools_top_k; --i) {
      const LlmMessage& m = a.messages[i - 1];
      if (m.role != "assistant" || !m.content.is_array()) continue;
      for (const auto& b : m.content) {
        if (b.value("type", "") != "tool_use" || !b.contains("name") || !b["name"].is_string()) continue;
        const std::string name = b["name"].get<std::string>();
        if (Tool* t = find_tool(name); t && !is_core(t) && offered.insert(name).second) ++recent;
      }
    }
  }
  auto plan_mode = [&] { return *a.mode == "plan"; };
  auto allowed_builtin = [&](const std::string& name) { return a.allowed.empty() || a.allowed.count(name); };
  // write_file / edit_file stay offered in plan mode: they may write the plan file only.
  auto plan_writable = [](const std::string& name) { return name == "write_file" || name == "edit_file"; };
  auto build_specs = [&]() {
    std::vector<ToolSpec> out;
    for (Tool* t : all_tools) {
      if (!allowed_builtin(t->name())) continue;
      if ((a.read_only || plan_mode()) && !t->read_only() && !(plan_mode() && is_main && plan_writable(t->name()))) continue;
      if (!select || is_core(t) || offered.count(t->name())) out.push_back({t->name(), t->description(), t->input_schema()});
    }
    if (select) {
      out.push_back({kToolSearch,
                     "Find more tools for a task among the ones not offered yet (MCP servers and others). "
                     "Found tools become callable for the rest of this turn.",
                     {{"type", "object"},
                      {"properties", {{"query", {{"type", "string"}, {"description", "What the tool must do"}}}}},
                      {"required", {"query"}}}});
    }
    if (is_main) {
      out.push_back(SpecTodoWrite());
      out.push_back(SpecTodoRead());
      out.push_back(SpecAskQuestion());
      if (plan_mode()) out.push_back(SpecSubmitPlan());
    }
    if (allowed_builtin(kDelegate) && a.depth < config_.max_subagent_depth) out.push_back(SpecDelegate(types));
    return out;
  };
  auto announce = [&](const std::vector<ToolSpec>& specs, const std::string& reason) {
    if (!select) return;
    ServerEvent ev;
    auto* o = ev.mutable_tools_offered();
    o->mutable_origin()->set_agent(a.name);
    for (const auto& s : specs) o->add_tools(s.name);
    o->set_reason(reason);
    sink.Emit(std::move(ev));
  };
  std::vector<ToolSpec> specs = build_specs();
  announce(specs, "retrieved for the request");
  auto system_prompt = [&] {
    std::string p = a.system.empty() ? SystemPrompt(session, specs) : a.system;
    if (is_main && plan_mode()) {
      absl::StrAppend(&p, "\nThe session is in PLAN mode: investigate with read-only tools, write your plan to ",
                      PlanPath(session.id),
                      " with write_file (no other file may be changed), then call submitPlan and wait for the "
                      "user's decision. Tools that change anything are refused until the plan is approved.\n");
    }
    return p;
  };
  auto append = [&](const std::string& role, const json& content) {
    if (a.persist) (void)sessions_.AppendHistory(session.id, {role, content.dump()});
    a.messages.push_back({role, content});
  };
  int tool_calls = 0;
  std::string last_text;

  while (true) {
    if (a.iterations >= config_.max_iterations) {
      a.stop_reason = "max_iterations";
      sink.Error(absl::ResourceExhaustedError(absl::StrCat(
                     a.name, " stopped after ", config_.max_iterations,
                     " model calls in one turn (agent.max_iterations); send another message to go on")),
                 false);
      break;
    }
    ++a.iterations;
    if (is_main) {
      // Near the model's window: summarise older turns first.
      int64_t estimate = 0;
      for (const auto& m : a.messages) estimate += static_cast<int64_t>(m.content.dump().size()) / 4;
      if (std::max(a.last_input_tokens, estimate) > a.context_window * 8 / 10) {
        auto n = Compact(a, /*forced=*/false);
        if (!n.ok()) spdlog::warn("session {}: compaction failed: {}", session.id, n.status().ToString());
      }
    }
    ChatRequest creq;
    creq.model = a.model;
    creq.system = system_prompt();
    creq.messages = std::move(a.messages);  // no copy of the whole conversation per call
    creq.tools = specs;
    creq.max_tokens = a.max_tokens;
    creq.temperature = a.temperature;
    auto result = a.provider->Stream(creq, observer, *a.cancel);
    a.messages = std::move(creq.messages);
    if (!result.ok()) {
      std::string partial = observer.TakePartial();
      if (!partial.empty() && a.persist) {
        json content = json::array({{{"type", "text"}, {"text", partial}}});
        (void)sessions_.AppendHistory(session.id, {"assistant", content.dump()});
      }
      if (absl::IsCancelled(result.status()) || a.cancel->cancelled()) {
        a.stop_reason = "cancelled";
      } else {
        a.stop_reason = "error";
        const auto code = result.status().code();
        sink.Error(result.status(), code == absl::StatusCode::kUnavailable ||
                                        code == absl::StatusCode::kResourceExhausted ||
                                        code == absl::StatusCode::kDeadlineExceeded);
      }
      break;
    }
    observer.TakePartial();
    {
      std::lock_guard<std::mutex> lock(*a.usage_mu);
      *a.in_tokens += result->input_tokens;
      *a.out_tokens += result->output_tokens;
      *a.cost += (result->input_tokens * price_in + result->output_tokens * price_out) / 1e6;
    }
    a.last_input_tokens = result->input_tokens;
    // Drop empty text blocks: providers reject them when the history is sent back.
    json content = json::array();
    for (auto& b : result->content) {
      if (b.value("type", "") == "text" && b.value("text", "").empty()) continue;
      content.push_back(b);
      if (b.value("type", "") == "text") last_text = b.value("text", "");
    }
    if (!content.empty()) append("assistant", content);
    {
      ServerEvent ev;
      ev.mutable_message_done()->mutable_origin()->set_agent(a.name);
      ev.mutable_message_done()->mutable_origin()->set_parent_call_id(a.parent_call_id);
      ev.mutable_message_done()->set_role("assistant");
      ev.mutable_message_done()->set_stop_reason(result->stop_reason);
      ev.mutable_message_done()->set_model(a.model);
      auto* u = ev.mutable_message_done()->mutable_usage();
      u->set_input_tokens(result->input_tokens);
      u->set_output_tokens(result->output_tokens);
      u->set_cost_usd((result->input_tokens * price_in + result->output_tokens * price_out) / 1e6);
      sink.Emit(std::move(ev));
    }
    std::vector<json> calls;
    for (const auto& b : content) {
      if (b.value("type", "") == "tool_use") calls.push_back(b);
    }
    if (calls.empty()) {
      a.stop_reason = result->stop_reason.empty() ? "end_turn" : result->stop_reason;
      break;
    }
    std::vector<json> results(calls.size());
    // Runs one call; safe to run several delegations in parallel.
    auto run_call = [&](size_t index) {
      const json& call = calls[index];
      const std::string call_id = call.value("id", "");
      const std::string tool_name = call.value("name", "");
      const json input = call.value("input", json::object());
      auto emit_started = [&] {
        ServerEvent ev;
        auto* s = ev.mutable_tool_call_started();
        s->mutable_origin()->set_agent(a.name);
        s->mutable_origin()->set_parent_call_id(a.parent_call_id);
        s->set_call_id(call_id);
        s->set_parent_call_id(a.parent_call_id);
        s->set_agent(a.name);
        s->set_tool(tool_name);
        s->set_input_json(input.dump());
        sink.Emit(std::move(ev));
      };
      if (a.cancel->cancelled()) {
        results[index] = {{"type", "tool_result"}, {"tool_use_id", call_id}, {"content", "cancelled by the user"}, {"is_error", true}};
        return;
      }
      emit_started();
      const int64_t t0 = MonotonicNanos();
      ToolResult tr;
      Tool* tool = find_tool(tool_name);
      const bool offered_now = std::any_of(specs.begin(), specs.end(), [&](const ToolSpec& s) { return s.name == tool_name; });
      if (++tool_calls > a.max_tool_calls) {
        tr = {absl::StrCat(a.name, " used its ", a.max_tool_calls, " tool calls; answer with what you have"), true};
      } else if (select && tool_name == kToolSearch) {
        const std::string q = input.value("query", "");
        std::string found;
        int added = 0;
        for (const std::string& name : q.empty() ? std::vector<std::string>{} : retriever_(q, config_.tools_top_k * 3)) {
          Tool* t = find_tool(name);
          if (!t || is_core(t) || added >= config_.tools_top_k) continue;
          offered.insert(name);
          ++added;
          absl::StrAppend(&found, name, ": ", t->description(), "\n");
        }
        tr = found.empty() ? ToolResult{"no further tools match", false}
                           : ToolResult{absl::StrCat("These tools are now available:\n", found), false};
        specs = build_specs();
        announce(specs, "after toolSearch");
      } else if (is_main && tool_name == kTodoWrite) {
        const json todos = input.value("todos", json());
        if (auto v = ValidateTodos(todos); !v.ok()) {
          tr = {std::string(v.message()), true};
        } else {
          auto fresh = sessions_.Get(session.id);
          if (fresh.ok()) {
            fresh->todos_json = todos.dump();
            (void)sessions_.Update(*fresh);
          }
          ServerEvent ev;
          for (const auto& t : todos) {
            auto* o = ev.mutable_todos_updated()->add_todos();
            o->set_id(t.value("id", ""));
            o->set_content(t.value("content", ""));
            o->set_status(t.value("status", ""));
            o->set_parent_id(t.value("parent_id", ""));
          }
          if (todos.empty()) ev.mutable_todos_updated();
          sink.Emit(std::move(ev));
          tr = {absl::StrCat("todo list saved (", todos.size(), " items)"), false};
        }
      } else if (is_main && tool_name == kTodoRead) {
        auto fresh = sessions_.Get(session.id);
        tr = {fresh.ok() ? json::parse(fresh->todos_json, nullptr, false).dump(1) : "[]", false};
      } else if (is_main && tool_name == kAskQuestion) {
        const json qs = input.value("questions", json());
        if (!qs.is_array() || qs.empty()) {
          tr = {"questions: expected a non-empty list", true};
        } else {
          const std::string qid = NewId("q-");
          ServerEvent ev;
          auto* q = ev.mutable_question_asked();
          q->set_question_id(qid);
          q->set_call_id(call_id);
          int n = 0;
          for (const auto& item : qs) {
            auto* one = q->add_questions();
            one->set_id(absl::StrCat(qid, ".", ++n));
            one->set_text(item.value("text", ""));
            for (const auto& opt : item.value("options", json::array())) {
              if (opt.is_string()) one->add_options()->set_label(opt.get<std::string>());
            }
            one->set_multiple(item.value("multiple", false));
            one->set_allow_free_text(item.value("allow_free_text", one->options_size() == 0));
          }
          // Waiting before the question is visible: an answer cannot arrive too early.
          auto pending = Expect(session.id, qid, false);
          sink.Emit(std::move(ev));
          auto reply = Wait(turn, session.id, pending);
          if (!reply) {
            tr = {"the question was not answered (turn cancelled)", true};
          } else {
            ServerEvent answered;
            auto* qa = answered.mutable_question_answered();
            qa->set_question_id(qid);
            for (const auto& sel : reply->selected) qa->add_selected(sel);
            qa->set_text(reply->text);
            qa->set_answered_by(reply->by);
            qa->set_call_id(call_id);
            sink.Emit(std::move(answered));
            json ans = {{"selected", reply->selected}, {"text", reply->text}};
            tr = {absl::StrCat("The user answered: ", ans.dump()), false};
          }
        }
      } else if (is_main && tool_name == kSubmitPlan) {
        if (!plan_mode()) {
          tr = {"submitPlan: the session is not in plan mode", true};
        } else {
          std::error_code ec;
          const std::string path = session.project_root + "/" + PlanPath(session.id);
          std::ifstream in(path);
          std::stringstream ss;
          ss << in.rdbuf();
          std::string plan = ss.str();
          if (!in && plan.empty()) {
            tr = {absl::StrCat("submitPlan: write the plan to ", PlanPath(session.id), " first"), true};
          } else if (plan.find_first_not_of(" \t\n") == std::string::npos || plan.size() < 50) {
            tr = {absl::StrCat("submitPlan: the plan in ", PlanPath(session.id), " has ", plan.size(),
                               " characters; a plan needs at least 50"),
                  true};
          } else {
            const std::string plan_id = NewId("p-");
            ServerEvent ev;
            ev.mutable_plan_submitted()->set_plan_id(plan_id);
            ev.mutable_plan_submitted()->set_text(plan);
            ev.mutable_plan_submitted()->set_path(PlanPath(session.id));
            ev.mutable_plan_submitted()->set_call_id(call_id);
            std::shared_ptr<Pending> pending;
            if (!session.auto_approve_plan) pending = Expect(session.id, plan_id, true);
            sink.Emit(std::move(ev));
            std::optional<Interaction> d;
            if (session.auto_approve_plan) {
              d = Interaction{plan_id, {}, "", true, true, "", "auto_approve_plan"};
            } else {
              d = Wait(turn, session.id, pending);
            }
            if (d) {
              ServerEvent decided;
              auto* pd = decided.mutable_plan_decided();
              pd->set_plan_id(plan_id);
              pd->set_approved(d->approve);
              pd->set_edited(d->approve && !d->edited_plan.empty() && d->edited_plan != plan);
              pd->set_feedback(d->text);
              pd->set_decided_by(d->by);
              sink.Emit(std::move(decided));
            }
            if (!d) {
              tr = {"the plan was not decided (turn cancelled)", true};
            } else if (d->approve) {
              if (!d->edited_plan.empty()) {
                plan = d->edited_plan;
                std::ofstream(path) << plan;
              }
              *a.mode = "act";
              auto fresh = sessions_.Get(session.id);
              if (fresh.ok()) {
                fresh->mode = "act";
                (void)sessions_.Update(*fresh);
              }
              ServerEvent mc;
              mc.mutable_mode_changed()->set_mode("act");
              mc.mutable_mode_changed()->set_reason(session.auto_approve_plan ? "plan auto-approved" : "plan approved");
              sink.Emit(std::move(mc));
              specs = build_specs();
              tr = {absl::StrCat("The plan is approved", d->edited_plan.empty() ? "" : " (as edited by the user)",
                                 ". You are now in act mode with all tools. Carry it out:\n\n", plan),
                    false};
            } else {
              tr = {absl::StrCat("The user did not approve the plan. ",
                                 d->text.empty() ? std::string("Revise it.") : "Their words: " + d->text,
                                 " You are still in plan mode."),
                    false};
            }
          }
        }
      } else if (tool_name == kDelegate && offered_now) {
        const std::string type = input.value("agent_type", "");
        const std::string task = input.value("task", "");
        auto it = types.find(type);
        if (it == types.end()) {
          tr = {absl::StrCat("agent_type: unknown type '", type, "'"), true};
        } else if (task.empty()) {
          tr = {"task: empty", true};
        } else {
          const SubagentConfig& sc = it->second;
          Agent sub;
          sub.name = type;
          sub.parent_call_id = call_id;
          sub.depth = a.depth + 1;
          sub.provider = sc.provider.empty() ? a.provider : providers_.Find(sc.provider);
          if (sub.provider == nullptr) sub.provider = a.provider;
          sub.model = !sc.model.empty() ? sc.model : (sub.provider == a.provider ? a.model : sub.provider->config().model);
          sub.max_tokens = sc.max_tokens;
          sub.temperature = sc.temperature;
          sub.max_tool_calls = sc.max_tool_calls;
          sub.allowed = std::set<std::string>(sc.tools.begin(), sc.tools.end());
          sub.read_only = sc.read_only || plan_mode();
          sub.system = absl::StrCat("You are fwai's ", type, " sub-agent, working for another agent in project ",
                                    session.project_root, ". ", sc.prompt,
                                    " Finish with a concise report: it is all the delegating agent sees.\n");
          sub.messages.push_back({"user", json::array({{{"type", "text"}, {"text", task}}})});
          CancelToken sub_cancel;
          a.cancel->OnCancel([&sub_cancel] { sub_cancel.Cancel(); });
          std::atomic<bool> finished{false};
          std::thread watchdog([&] {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(sc.timeout_s);
            while (!finished && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (!finished) sub_cancel.Cancel();
          });
          sub.cancel = &sub_cancel;
          sub.sink = a.sink;
          sub.session = a.session;
          sub.project_tools = a.project_tools;
          sub.log_dir = a.log_dir;
          std::string sub_mode = *a.mode;
          sub.mode = &sub_mode;
          sub.in_tokens = a.in_tokens;
          sub.out_tokens = a.out_tokens;
          sub.cost = a.cost;
          sub.usage_mu = a.usage_mu;
          sub.calls_log = a.calls_log;
          sub.calls_mu = a.calls_mu;
          sub.policy = a.policy;
          std::string report = RunAgent(turn, sub);
          finished = true;
          watchdog.join();
          if (sub.stop_reason == "cancelled") {
            tr = {a.cancel->cancelled() ? "the sub-agent was cancelled"
                                        : absl::StrCat("the sub-agent hit its ", sc.timeout_s, " s timeout; partial report:\n", report),
                  true};
          } else if (sub.stop_reason == "error") {
            tr = {absl::StrCat("the sub-agent failed; partial report:\n", report), true};
          } else {
            tr = {report.empty() ? "(the sub-agent reported nothing)" : report, false};
          }
        }
      } else if (tool == nullptr || (!offered_now && !(select && !is_core(tool) && offered.count(tool_name)))) {
        if (tool != nullptr && is_main && plan_mode() && !tool->read_only()) {
          tr = {absl::StrCat("plan mode: '", tool_name, "' changes things and is refused until the plan is approved; "
                             "write the plan to ", PlanPath(session.id), " and call submitPlan"),
                true};
        } else if (tool != nullptr && (a.read_only || !allowed_builtin(tool_name))) {
          tr = {absl::StrCat("'", tool_name, "' is not allowed for the ", a.name, " agent"), true};
        } else if (tool != nullptr && select && !is_core(tool)) {
          tr = {absl::StrCat("tool '", tool_name, "' was not offered in this turn; find it with toolSearch first"), true};
        } else {
          tr = {absl::StrCat("unknown tool '", tool_name, "'"), true};
        }
      } else if (PolicyDecision pd = a.policy ? CheckPolicy(a.policy->rules, "tool", tool_name) : PolicyDecision{};
                 !pd.allowed) {
        tr = {absl::StrCat("refused by policy (", pd.rule, "): ", pd.reason), true};
        std::lock_guard<std::mutex> lock(*a.calls_mu);
        a.policy->refusals.push_back({{"kind", "tool"}, {"target", tool_name}, {"rule", pd.rule}});
      } else {
        ToolContext tctx;
        tctx.session_id = session.id;
        tctx.project_root = session.project_root;
        tctx.owner = session.owner;
        tctx.limits = &config_.tools;
        tctx.cancel = a.cancel;
        const std::string plan_file = PlanPath(session.id);
        const bool in_plan = plan_mode();
        Agent::Policy* pol = a.policy;
        std::mutex* mu = a.calls_mu;
        tctx.network_allowed = pol && pol->rules.network;
        tctx.policy = [in_plan, plan_file, pol, mu](const PolicyQuery& q) -> absl::Status {
          if (in_plan && !(q.kind == "write" && q.target == plan_file)) {
            return absl::PermissionDeniedError(absl::StrCat(
                "plan mode: only the plan file ", plan_file, " may be written until the plan is approved (",
                q.kind == "command" ? "commands are refused" : q.target + " is not the plan file", ")"));
          }
          if (!pol) return absl::OkStatus();
          std::lock_guard<std::mutex> lock(*mu);
          PolicyDecision d = CheckPolicy(pol->rules, q.kind, q.target);
          if (d.allowed && q.kind == "write" && pol->rules.max_files_per_turn > 0 && !pol->files_written.count(q.target) &&
              static_cast<int>(pol->files_written.size()) >= pol->rules.max_files_per_turn) {
            d = {false, absl::StrCat("change_budget: max_files ", pol->rules.max_files_per_turn), "",
                 absl::StrCat("this turn already changed ", pol->files_written.size(), " files")};
          }
          if (d.allowed && q.kind == "write" && pol->rules.max_lines_per_turn > 0 &&
              pol->lines_changed + q.lines > pol->rules.max_lines_per_turn) {
            d = {false, absl::StrCat("change_budget: max_lines ", pol->rules.max_lines_per_turn), "",
                 absl::StrCat("this write changes ", q.lines, " lines and the turn already changed ", pol->lines_changed)};
          }
          if (!d.allowed) {
            pol->refusals.push_back({{"kind", q.kind}, {"target", q.target}, {"rule", d.rule}});
            return absl::PermissionDeniedError(absl::StrCat("refused by policy (", d.rule, "): ", d.reason));
          }
          if (q.kind == "write") {
            pol->files_written.insert(q.target);
            pol->lines_changed += q.lines;
          }
          return absl::OkStatus();
        };
        tctx.output = [&, call_id](std::string_view text) {
          ServerEvent ev;
          auto* d = ev.mutable_tool_call_output_delta();
          d->set_call_id(call_id);
          d->set_parent_call_id(a.parent_call_id);
          d->set_agent(a.name);
          d->set_text(std::string(text));
          sink.Emit(std::move(ev));
        };
        tr = tool->Run(input, tctx);
        if (a.cancel->cancelled() && !tr.is_error) tr.content += "\n(turn cancelled)";
      }
      // Secrets never reach the provider, the history or the evidence.
      if (int found = 0; (tr.content = secrets_->Redact(tr.content, &found)), found > 0) {
        tr.content += absl::StrCat("\n(", found, found == 1 ? " secret" : " secrets", " redacted)");
      }
      {
        ServerEvent ev;
        auto* f = ev.mutable_tool_call_finished();
        f->set_call_id(call_id);
        f->set_parent_call_id(a.parent_call_id);
        f->set_agent(a.name);
        f->set_is_error(tr.is_error);
        f->set_output(tr.content.size() > 16384 ? tr.content.substr(0, 16384) + "\n... (truncated)" : tr.content);
        f->set_duration_ms((MonotonicNanos() - t0) / 1000000);
        sink.Emit(std::move(ev));
      }
      json r = {{"type", "tool_result"}, {"tool_use_id", call_id}, {"content", tr.content}};
      if (tr.is_error) r["is_error"] = true;
      results[index] = r;
      if (a.calls_log) {
        std::string in = input.dump();
        if (in.size() > 2000) in = in.substr(0, 2000) + "...";
        std::string log_file;
        if (a.log_dir && !a.log_dir->empty()) {
          std::error_code ec;
          if (!std::filesystem::is_directory(*a.log_dir, ec)) {
            PruneRunDirs(std::filesystem::path(*a.log_dir).parent_path().string(), kKeptRunDirs - 1);
            std::filesystem::create_directories(*a.log_dir, ec);
          }
          log_file = absl::StrCat(*a.log_dir, "/", call_id, ".log");
          std::ofstream(log_file) << "$ " << tool_name << " " << secrets_->Redact(in) << "\n" << tr.content << "\n";
        }
        std::lock_guard<std::mutex> lock(*a.calls_mu);
        a.calls_log->push_back({{"call_id", call_id}, {"tool", tool_name}, {"agent", a.name},
                                {"parent_call_id", a.parent_call_id}, {"input", in}, {"is_error", tr.is_error},
                                {"duration_ms", (MonotonicNanos() - t0) / 1000000}, {"log_file", log_file}});
      }
    };
    // Delegations run in parallel; everything else in order.
    std::vector<std::thread> parallel;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].value("name", "") == kDelegate) {
        parallel.emplace_back(run_call, i);
      } else {
        run_call(i);
      }
    }
    for (auto& t : parallel) t.join();
    append("user", json(results));
    if (a.cancel->cancelled()) {
      a.stop_reason = "cancelled";
      break;
    }
  }
  return last_text;
}

}  // namespace fwai
