#include "server/agent/turn_manager.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/clock.h"
#include "common/ids.h"
#include "fwai/v1/events.pb.h"
#include "server/llm/provider.h"
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

struct TurnManager::Turn {
  CancelToken cancel;
  std::thread thread;
  std::atomic<bool> done{false};
};

TurnManager::TurnManager(SessionManager& sessions, const DaemonConfig& config,
                         const ProviderSet& providers, const ToolRegistry& tools, ToolRetriever retriever)
    : sessions_(sessions), config_(config), providers_(providers), tools_(tools), retriever_(std::move(retriever)) {}

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

// Publishes events of one turn and collects streamed text.
class TurnContext final : public StreamObserver {
 public:
  TurnContext(SessionManager& sessions, std::string session_id, std::string turn_id)
      : sessions_(sessions), session_id_(std::move(session_id)), turn_id_(std::move(turn_id)) {}

  void Emit(ServerEvent ev) {
    ev.set_turn_id(turn_id_);
    auto s = sessions_.Publish(session_id_, ev.SerializeAsString());
    if (!s.ok()) spdlog::warn("session {}: cannot publish event: {}", session_id_, s.status().ToString());
  }

  void OnText(std::string_view text) override {
    partial_text_.append(text);
    ServerEvent ev;
    auto* d = ev.mutable_text_delta();
    d->mutable_origin()->set_agent("main");
    d->set_text(std::string(text));
    Emit(std::move(ev));
  }
  void OnThinking(std::string_view text) override {
    ServerEvent ev;
    auto* d = ev.mutable_text_delta();
    d->mutable_origin()->set_agent("main");
    d->set_text(std::string(text));
    d->set_thinking(true);
    Emit(std::move(ev));
  }
  void OnRetry(int attempt, int delay_ms, const std::string& why) override {
    spdlog::info("session {}: provider attempt {} failed ({}); retrying in {} ms", session_id_,
                 attempt, why, delay_ms);
  }

  void Error(const absl::Status& s, bool retryable) {
    ServerEvent ev;
    auto* e = ev.mutable_error();
    e->set_code(absl::StatusCodeToString(s.code()));
    e->set_message(std::string(s.message()));
    e->set_retryable(retryable);
    Emit(std::move(ev));
  }

  std::string TakePartialText() { return std::exchange(partial_text_, {}); }

 private:
  SessionManager& sessions_;
  const std::string session_id_;
  const std::string turn_id_;
  std::string partial_text_;
};

std::string SystemPrompt(const SessionInfo& s, const std::vector<ToolSpec>& tools) {
  std::string p =
      "You are fwai, an assistant for firmware engineers, running inside the fwaid daemon.\n"
      "You help with embedded C/C++, microcontrollers, peripherals, toolchains, debugging and "
      "datasheets. Be precise; cite file paths and line numbers when you use project files.\n";
  absl::StrAppend(&p, "Project root: ", s.project_root, "\n");
  if (!tools.empty()) {
    absl::StrAppend(&p, "Tools available:");
    for (const auto& t : tools) absl::StrAppend(&p, " ", t.name);
    absl::StrAppend(&p, ". Paths are relative to the project root; nothing outside it is visible.\n");
  }
  return p;
}

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

}  // namespace

void TurnManager::Run(Turn* turn, TurnRequest req) {
  const int64_t start_ns = MonotonicNanos();
  TurnContext ctx(sessions_, req.session_id, req.turn_id);
  int iterations = 0;
  int64_t in_tokens = 0, out_tokens = 0;
  double cost = 0;
  std::string stop_reason = "end_turn";

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
    ctx.Emit(std::move(ev));
  };

  {
    ServerEvent ev;
    ev.mutable_user_message()->set_text(req.text);
    ev.mutable_user_message()->set_sender(req.sender);
    ctx.Emit(std::move(ev));
  }
  auto info = sessions_.Get(req.session_id);
  if (!info.ok()) {
    stop_reason = "error";
    ctx.Error(info.status(), false);
    return finish();
  }
  const std::string provider_name = !req.provider.empty() ? req.provider : info->provider;
  Provider* provider = providers_.Find(provider_name);
  json user_content = json::array({{{"type", "text"}, {"text", req.text}}});
  absl::Status hs = sessions_.AppendHistory(req.session_id, {"user", user_content.dump()});
  if (!hs.ok()) {
    stop_reason = "error";
    ctx.Error(hs, false);
    return finish();
  }
  if (provider == nullptr) {
    stop_reason = "error";
    if (providers_.providers.empty()) {
      ctx.Error(absl::FailedPreconditionError(
                    "no LLM provider is configured. Set ANTHROPIC_API_KEY or OPENAI_API_KEY "
                    "(and optionally ANTHROPIC_BASE_URL / OPENAI_BASE_URL) in fwaid's environment "
                    "and restart it (fwai daemon stop; the next fwai command starts it), or add a "
                    "providers: section to fwaid.yaml. Sessions, history and attach work without one."),
                false);
    } else {
      std::string names;
      for (const auto& [n, p] : providers_.providers) absl::StrAppend(&names, names.empty() ? "" : ", ", n);
      ctx.Error(absl::InvalidArgumentError(absl::StrCat("provider '", provider_name,
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
    ctx.Emit(std::move(ev));
  }
  double price_in = 0, price_out = 0;
  PriceFor(model, &price_in, &price_out);

  // The tools offered to the model. With many tools (MCP servers, ...), each
  // call gets the core (built-in) tools, the ones retrieved for the request,
  // and those the model found with toolSearch.
  const std::vector<Tool*> all_tools = tools_.All();
  const bool select = retriever_ && static_cast<int>(all_tools.size()) > config_.tool_threshold;
  std::set<std::string> offered;
  auto is_core = [](const Tool* t) { return t->name().rfind("mcp_", 0) != 0; };
  if (select) {
    for (const std::string& name : retriever_(req.text, config_.tools_top_k * 3)) {
      if (static_cast<int>(offered.size()) >= config_.tools_top_k) break;
      if (Tool* t = tools_.Find(name); t && !is_core(t)) offered.insert(name);
    }
  }
  const std::string kToolSearch = "toolSearch";
  auto build_specs = [&]() {
    std::vector<ToolSpec> out;
    for (Tool* t : all_tools) {
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
    return out;
  };
  auto announce = [&](const std::vector<ToolSpec>& specs, const std::string& reason) {
    if (!select) return;
    ServerEvent ev;
    auto* o = ev.mutable_tools_offered();
    o->mutable_origin()->set_agent("main");
    for (const auto& s : specs) o->add_tools(s.name);
    o->set_reason(reason);
    ctx.Emit(std::move(ev));
  };
  std::vector<ToolSpec> specs = build_specs();
  announce(specs, "retrieved for the request");

  auto history = sessions_.LoadHistory(req.session_id);
  if (!history.ok()) {
    stop_reason = "error";
    ctx.Error(history.status(), false);
    return finish();
  }
  std::vector<LlmMessage> messages;
  for (const auto& h : *history) {
    messages.push_back({h.role, json::parse(h.content_json, nullptr, false)});
    if (messages.back().content.is_discarded()) messages.pop_back();
  }
  messages = RepairHistory(std::move(messages));

  while (true) {
    if (iterations >= config_.max_iterations) {
      stop_reason = "max_iterations";
      ctx.Error(absl::ResourceExhaustedError(absl::StrCat(
                    "stopped after ", config_.max_iterations,
                    " model calls in one turn (agent.max_iterations); send another message to go on")),
                false);
      break;
    }
    ++iterations;
    ChatRequest creq;
    creq.model = model;
    creq.system = SystemPrompt(*info, specs);
    creq.messages = messages;
    creq.tools = specs;
    creq.max_tokens = pc.max_tokens;
    creq.temperature = pc.temperature;
    auto result = provider->Stream(creq, ctx, turn->cancel);
    if (!result.ok()) {
      std::string partial = ctx.TakePartialText();
      if (!partial.empty()) {
        json content = json::array({{{"type", "text"}, {"text", partial}}});
        (void)sessions_.AppendHistory(req.session_id, {"assistant", content.dump()});
      }
      if (absl::IsCancelled(result.status()) || turn->cancel.cancelled()) {
        stop_reason = "cancelled";
      } else {
        stop_reason = "error";
        const auto code = result.status().code();
        ctx.Error(result.status(), code == absl::StatusCode::kUnavailable ||
                                       code == absl::StatusCode::kResourceExhausted ||
                                       code == absl::StatusCode::kDeadlineExceeded);
      }
      break;
    }
    ctx.TakePartialText();
    in_tokens += result->input_tokens;
    out_tokens += result->output_tokens;
    cost += (result->input_tokens * price_in + result->output_tokens * price_out) / 1e6;
    // Drop empty text blocks: providers reject them when the history is sent back.
    json content = json::array();
    for (auto& b : result->content) {
      if (b.value("type", "") == "text" && b.value("text", "").empty()) continue;
      content.push_back(b);
    }
    if (!content.empty()) {
      (void)sessions_.AppendHistory(req.session_id, {"assistant", content.dump()});
      messages.push_back({"assistant", content});
    }
    {
      ServerEvent ev;
      ev.mutable_message_done()->mutable_origin()->set_agent("main");
      ev.mutable_message_done()->set_role("assistant");
      ev.mutable_message_done()->set_stop_reason(result->stop_reason);
      ctx.Emit(std::move(ev));
    }
    std::vector<json> calls;
    for (const auto& b : content) {
      if (b.value("type", "") == "tool_use") calls.push_back(b);
    }
    if (calls.empty()) {
      stop_reason = result->stop_reason.empty() ? "end_turn" : result->stop_reason;
      break;
    }
    json results = json::array();
    for (const auto& call : calls) {
      const std::string call_id = call.value("id", "");
      const std::string tool_name = call.value("name", "");
      const json input = call.value("input", json::object());
      if (turn->cancel.cancelled()) {
        results.push_back({{"type", "tool_result"}, {"tool_use_id", call_id},
                           {"content", "cancelled by the user"}, {"is_error", true}});
        continue;
      }
      {
        ServerEvent ev;
        auto* s = ev.mutable_tool_call_started();
        s->mutable_origin()->set_agent("main");
        s->set_call_id(call_id);
        s->set_agent("main");
        s->set_tool(tool_name);
        s->set_input_json(input.dump());
        ctx.Emit(std::move(ev));
      }
      const int64_t t0 = MonotonicNanos();
      ToolResult tr;
      Tool* tool = tools_.Find(tool_name);
      if (select && tool_name == kToolSearch) {
        const std::string q = input.value("query", "");
        std::string found;
        int added = 0;
        for (const std::string& name : q.empty() ? std::vector<std::string>{} : retriever_(q, config_.tools_top_k * 3)) {
          Tool* t = tools_.Find(name);
          if (!t || is_core(t) || added >= config_.tools_top_k) continue;
          offered.insert(name);
          ++added;
          absl::StrAppend(&found, name, ": ", t->description(), "\n");
        }
        tr = found.empty() ? ToolResult{"no further tools match", false}
                           : ToolResult{absl::StrCat("These tools are now available:\n", found), false};
        specs = build_specs();
        announce(specs, "after toolSearch");
      } else if (select && tool && !is_core(tool) && !offered.count(tool_name)) {
        tr = {absl::StrCat("tool '", tool_name, "' was not offered in this turn; find it with toolSearch first"), true};
      } else if (tool == nullptr) {
        tr = {absl::StrCat("unknown tool '", tool_name, "'"), true};
      } else {
        ToolContext tctx;
        tctx.session_id = req.session_id;
        tctx.project_root = info->project_root;
        tctx.owner = info->owner;
        tctx.limits = &config_.tools;
        tctx.cancel = &turn->cancel;
        tctx.output = [&](std::string_view text) {
          ServerEvent ev;
          auto* d = ev.mutable_tool_call_output_delta();
          d->set_call_id(call_id);
          d->set_agent("main");
          d->set_text(std::string(text));
          ctx.Emit(std::move(ev));
        };
        tr = tool->Run(input, tctx);
        if (turn->cancel.cancelled() && !tr.is_error) {
          tr.content += "\n(turn cancelled)";
        }
      }
      {
        ServerEvent ev;
        auto* f = ev.mutable_tool_call_finished();
        f->set_call_id(call_id);
        f->set_agent("main");
        f->set_is_error(tr.is_error);
        f->set_output(tr.content.size() > 16384 ? tr.content.substr(0, 16384) + "\n... (truncated)"
                                                : tr.content);
        f->set_duration_ms((MonotonicNanos() - t0) / 1000000);
        ctx.Emit(std::move(ev));
      }
      json r = {{"type", "tool_result"}, {"tool_use_id", call_id}, {"content", tr.content}};
      if (tr.is_error) r["is_error"] = true;
      results.push_back(r);
    }
    (void)sessions_.AppendHistory(req.session_id, {"user", results.dump()});
    messages.push_back({"user", results});
    if (turn->cancel.cancelled()) {
      stop_reason = "cancelled";
      break;
    }
  }
  auto fresh = sessions_.Get(req.session_id);
  if (fresh.ok()) (void)sessions_.Update(*fresh);
  finish();
}

}  // namespace fwai
