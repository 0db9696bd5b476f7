#include "server/agent/loop.h"

#include <spdlog/spdlog.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/compaction.h"
#include "server/agent/events.h"
#include "server/agent/models.h"
#include "server/agent/subagents.h"
#include "server/agent/system_prompt.h"
#include "server/agent/tool_call.h"
#include "server/agent/tool_offer.h"
#include "server/project/secrets.h"
#include "server/session/session_manager.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

using json = nlohmann::json;

namespace {

// Adds a message to the agent's conversation (and the session's history).
void Append(SessionManager& sessions, Agent& a, const std::string& role, const json& content) {
  if (a.persist) (void)sessions.AppendHistory(a.turn->session.id, {role, content.dump()});
  a.messages.push_back({role, content});
}

absl::StatusOr<ChatResult> CallModel(Agent& a, const std::vector<ToolSpecPtr>& tools,
                                     StreamObserver& observer) {
  ChatRequest creq;
  creq.model = a.model;
  creq.system = SystemPromptFor(a, tools);
  creq.messages = std::move(a.messages);  // no copy of the whole conversation per call
  creq.tools = tools;
  creq.max_tokens = a.max_tokens;
  creq.temperature = a.temperature;
  auto result = a.provider->Stream(creq, observer, *a.cancel);
  a.messages = std::move(creq.messages);
  return result;
}

// The model call failed: keep what it streamed, say why the agent stops.
void StopOnModelError(SessionManager& sessions, Agent& a, AgentObserver& observer,
                      const absl::Status& error) {
  std::string partial = observer.TakePartial();
  if (!partial.empty() && a.persist) {
    json content = json::array({{{"type", "text"}, {"text", partial}}});
    (void)sessions.AppendHistory(a.turn->session.id, {"assistant", content.dump()});
  }
  if (absl::IsCancelled(error) || a.cancel->cancelled()) {
    a.stop_reason = "cancelled";
    return;
  }
  a.stop_reason = "error";
  const auto code = error.code();
  a.turn->sink.Error(error, code == absl::StatusCode::kUnavailable ||
                                code == absl::StatusCode::kResourceExhausted ||
                                code == absl::StatusCode::kDeadlineExceeded);
}

// The reply's blocks without empty texts (providers reject them when the
// history is sent back); `last_text` is set to its last text.
json KeptBlocks(const json& blocks, std::string* last_text) {
  json content = json::array();
  for (const auto& b : blocks) {
    if (b.value("type", "") == "text" && b.value("text", "").empty()) continue;
    content.push_back(b);
    if (b.value("type", "") == "text") *last_text = b.value("text", "");
  }
  return content;
}

void EmitMessageDone(const Agent& a, const ChatResult& result, const ModelPrice& price) {
  v1::ServerEvent ev;
  auto* done = ev.mutable_message_done();
  done->mutable_origin()->set_agent(a.name);
  done->mutable_origin()->set_parent_call_id(a.parent_call_id);
  done->set_role("assistant");
  done->set_stop_reason(result.stop_reason);
  done->set_model(a.model);
  auto* u = done->mutable_usage();
  u->set_input_tokens(result.input_tokens);
  u->set_output_tokens(result.output_tokens);
  u->set_cost_usd(price.CostUsd(result.input_tokens, result.output_tokens));
  a.turn->sink.Emit(std::move(ev));
}

std::vector<json> ToolUses(const json& content) {
  std::vector<json> calls;
  for (const auto& b : content) {
    if (b.value("type", "") == "tool_use") calls.push_back(b);
  }
  return calls;
}

// Every other call first, in order; then the delegations, in parallel. A
// call that changes what is offered (toolSearch, submitPlan) thus never runs
// while a delegation reads the offer. Results keep the calls' order.
json RunToolCalls(ToolCaller& caller, const std::vector<json>& calls) {
  std::vector<json> results(calls.size());
  std::vector<size_t> delegations;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].value("name", "") == kDelegate) {
      delegations.push_back(i);
    } else {
      results[i] = caller.Run(calls[i]);
    }
  }
  std::vector<std::thread> parallel;
  const telemetry::Span agent_span = telemetry::Current();  // the delegations' parent
  for (size_t i : delegations) {
    parallel.emplace_back([&, i] {
      telemetry::Scope scope(agent_span);
      results[i] = caller.Run(calls[i]);
    });
  }
  for (auto& t : parallel) t.join();
  return json(results);
}

}  // namespace

std::string RunAgent(const AgentDeps& deps, Agent& a) {
  const ModelPrice price = ConfiguredPrice(deps.config, a.model);
  AgentObserver observer(a.turn->sink, a.name, a.parent_call_id);
  ToolOffer offer(deps, a);
  offer.Announce("retrieved for the request");
  ToolCaller caller(deps, a, offer);
  std::string last_text;

  while (true) {
    if (a.iterations >= deps.config.max_iterations) {
      a.stop_reason = "max_iterations";
      a.turn->sink.Error(absl::ResourceExhaustedError(absl::StrCat(
                             a.name, " stopped after ", deps.config.max_iterations,
                             " model calls in one turn (agent.max_iterations); send another "
                             "message to go on")),
                         false);
      break;
    }
    ++a.iterations;
    // Near the model's window: summarise older turns first.
    if (a.is_main() && NearContextLimit(a)) {
      auto n = Compact(deps.sessions, a, /*forced=*/false);
      if (!n.ok()) {
        spdlog::warn("session {}: compaction failed: {}", a.turn->session.id,
                     n.status().ToString());
      }
    }
    // chat {model}: one model call; the provider's key and the prompt never
    // become attributes.
    const telemetry::Span chat = telemetry::Span::Start("chat", a.model, telemetry::Kind::kClient);
    const std::string_view provider_kind = a.provider->config().kind;
    const int64_t call_start_ns = chat ? MonotonicNanos() : 0;
    if (chat) {
      chat.Set("gen_ai.operation.name", "chat");
      chat.Set("gen_ai.provider.name", telemetry::ProviderName(provider_kind));
      chat.Set("gen_ai.system", telemetry::ProviderName(provider_kind));
      chat.Set("gen_ai.request.model", a.model);
      chat.SetInt("gen_ai.request.max_tokens", a.max_tokens);
      if (a.temperature >= 0) chat.SetDouble("gen_ai.request.temperature", a.temperature);
      chat.Set("gen_ai.agent.name", a.name);
    }
    auto result = CallModel(a, offer.specs(), observer);
    if (!result.ok()) {
      chat.Fail(deps.secrets.Redact(std::string(result.status().message())));
      chat.End();
      StopOnModelError(deps.sessions, a, observer, result.status());
      break;
    }
    observer.TakePartial();
    const double cost = price.CostUsd(result->input_tokens, result->output_tokens);
    if (chat) {
      chat.SetInt("gen_ai.usage.input_tokens", result->input_tokens);
      chat.SetInt("gen_ai.usage.output_tokens", result->output_tokens);
      chat.SetDouble("fwai.usage.cost_usd", cost);
      if (!result->stop_reason.empty())
        chat.Set("gen_ai.response.finish_reasons", result->stop_reason);
      telemetry::RecordModelCall(provider_kind, a.model, result->input_tokens,
                                 result->output_tokens, cost,
                                 static_cast<double>(MonotonicNanos() - call_start_ns) / 1e9);
    }
    chat.End();
    a.turn->AddUsage(result->input_tokens, result->output_tokens, cost);
    a.last_input_tokens = result->input_tokens;
    const json content = KeptBlocks(result->content, &last_text);
    if (!content.empty()) Append(deps.sessions, a, "assistant", content);
    EmitMessageDone(a, *result, price);
    const std::vector<json> calls = ToolUses(content);
    if (calls.empty()) {
      a.stop_reason = result->stop_reason.empty() ? "end_turn" : result->stop_reason;
      break;
    }
    Append(deps.sessions, a, "user", RunToolCalls(caller, calls));
    if (a.cancel->cancelled()) {
      a.stop_reason = "cancelled";
      break;
    }
  }
  return last_text;
}

}  // namespace fwai
