#include "server/agent/turn.h"

#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "common/thread_priority.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/compaction.h"
#include "server/agent/events.h"
#include "server/agent/history.h"
#include "server/agent/loop.h"
#include "server/agent/models.h"
#include "server/agent/run_record.h"
#include "server/project/policy.h"
#include "server/project/secrets.h"
#include "server/session/session_manager.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

using json = nlohmann::json;
using fwai::v1::ServerEvent;

namespace {

struct TurnEnd {
  std::string stop_reason = "end_turn";
  int iterations = 0;
  Usage usage;
  // Keeps the project's tools alive until the turn has finished.
  std::shared_ptr<const void> project_tools_owner;
};

TurnEnd Failed(EventSink& sink, const absl::Status& error) {
  sink.Error(error, false);
  TurnEnd end;
  end.stop_reason = "error";
  return end;
}

absl::Status NoProvider(const ProviderSet& providers, const std::string& name) {
  if (providers.providers.empty()) {
    return absl::FailedPreconditionError(
        "no LLM provider is configured. Set ANTHROPIC_API_KEY or OPENAI_API_KEY "
        "(and optionally ANTHROPIC_BASE_URL / OPENAI_BASE_URL) in fwaid's environment "
        "and restart it (fwai daemon stop; the next fwai command starts it), or add a "
        "providers: section to fwaid.yaml. Sessions, history and attach work without one.");
  }
  std::string names;
  for (const auto& [n, p] : providers.providers) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("provider '", name, "' is not configured; configured: ", names));
}

// Adds the turn's usage to the session's totals and keeps its mode (an
// approved plan changes it).
void SaveToSession(SessionManager& sessions, const std::string& session_id, const std::string& mode,
                   const Usage& usage) {
  auto fresh = sessions.Get(session_id);
  if (!fresh.ok()) return;
  if (fresh->mode != mode) fresh->mode = mode;
  fresh->input_tokens += usage.input_tokens;
  fresh->output_tokens += usage.output_tokens;
  fresh->cost_usd += usage.cost_usd;
  (void)sessions.Update(*fresh);
}

// compact_only: summarise the older turns, nothing else.
TurnEnd CompactOnly(SessionManager& sessions, Agent& main) {
  TurnEnd end;
  auto n = Compact(sessions, main, /*forced=*/true);
  if (!n.ok()) {
    end.stop_reason = absl::IsCancelled(n.status()) ? "cancelled" : "error";
    if (end.stop_reason == "error") main.turn->sink.Error(n.status(), false);
  } else {
    end.stop_reason = "compacted";
    if (*n == 0) {
      main.turn->sink.Error(
          absl::FailedPreconditionError("nothing to compact: the conversation is short"), false);
    }
  }
  end.usage = main.turn->usage();
  return end;
}

// A turn's checkpoint of its project, taken on a thread of its own at
// background priority while the turn's first model request is prepared and
// sent: the request does not wait for the project's listing and hashing, nor
// queue behind them in a burst of turns. Await returns once it is recorded;
// every tool call awaits it first (TurnState::await_checkpoint), and so does
// the destructor, before anything the checkpoint reads goes away.
class DeferredCheckpoint {
 public:
  DeferredCheckpoint() = default;
  DeferredCheckpoint(const DeferredCheckpoint&) = delete;
  DeferredCheckpoint& operator=(const DeferredCheckpoint&) = delete;
  ~DeferredCheckpoint() { Await(); }

  void Start(std::function<void()> take) {
    thread_ = std::thread([take = std::move(take)] {
      NameThisThread("fwaid-checkpt");
      (void)SetThisThreadPriority(ThreadPriority::kBackground);  // best effort
      take();
    });
  }
  // From any thread, any number of times (sub-agents call tools in parallel).
  void Await() {
    std::call_once(joined_, [this] {
      if (thread_.joinable()) thread_.join();
    });
  }

 private:
  std::thread thread_;
  std::once_flag joined_;
};

// Everything between the user's message and turn_finished.
TurnEnd PlayTurn(const AgentDeps& deps, const TurnHooks& hooks, CancelToken& cancel,
                 const TurnRequest& req, EventSink& sink, int64_t start_ns) {
  auto info = deps.sessions.Get(req.session_id);
  if (!info.ok()) return Failed(sink, info.status());
  const std::string provider_name = !req.provider.empty() ? req.provider : info->provider;
  Provider* provider = deps.providers.Find(provider_name);
  // The project is read, written and run as the session's account: looked
  // up once for the turn (its checkpoint, policy and tools); an account that
  // is gone fails the turn once the message is in the history.
  std::optional<LocalAccount> account;
  absl::Status account_error;
  if (!info->account.empty() && !info->project_root.empty()) {
    auto acct = LookupAccount(info->account);
    if (acct.ok()) {
      account = *std::move(acct);
    } else {
      account_error = absl::FailedPreconditionError(
          absl::StrCat("the session's account ", info->account, ": ", acct.status().message()));
    }
  }
  const LocalAccount* as = account ? &*account : nullptr;
  // The history is read once a turn: the checkpoint hashes it as it is,
  // before the message; the conversation is it and the message.
  auto history = deps.sessions.LoadHistory(req.session_id);
  std::shared_ptr<const std::vector<HistoryEntry>> loaded;
  if (history.ok()) loaded = std::make_shared<const std::vector<HistoryEntry>>(std::move(*history));
  DeferredCheckpoint checkpoint;
  if (!req.compact_only && hooks.checkpoint && !info->project_root.empty() && account_error.ok() &&
      loaded) {
    checkpoint.Start([&hooks, &session = *info, as, &turn_id = req.turn_id, loaded] {
      hooks.checkpoint(session, as, turn_id, *loaded);
    });
  }
  HistoryEntry message{"user", json::array({{{"type", "text"}, {"text", req.text}}}).dump()};
  if (!req.compact_only) {
    if (auto s = deps.sessions.AppendHistory(req.session_id, message); !s.ok()) {
      return Failed(sink, s);
    }
  }
  if (provider == nullptr) return Failed(sink, NoProvider(deps.providers, provider_name));
  const ProviderConfig& pc = provider->config();
  const std::string model =
      !req.model.empty() ? req.model : (!info->model.empty() ? info->model : pc.model);
  if (const telemetry::Span span = telemetry::Current()) {
    span.Set("gen_ai.provider.name", telemetry::ProviderName(pc.kind));
    span.Set("gen_ai.system", telemetry::ProviderName(pc.kind));
    span.Set("gen_ai.request.model", model);
    span.Set("fwai.principal", info->owner);
    if (telemetry::CaptureContent())
      span.Set("gen_ai.input.messages", deps.secrets.Redact(req.text));
  }
  {
    ServerEvent ev;
    ev.mutable_turn_started()->set_provider(pc.name);
    ev.mutable_turn_started()->set_model(model);
    // Not waited for: the appender stores it in its order with what else is
    // queued; the first request need not wait for that.
    sink.Emit(std::move(ev), /*wait=*/false);
  }
  if (!account_error.ok()) return Failed(sink, account_error);
  if (!history.ok()) return Failed(sink, history.status());
  std::vector<LlmMessage> conversation =
      req.compact_only ? ConversationOf(*loaded) : ConversationOf(*loaded, &message);
  loaded.reset();  // the conversation is its copy now (the checkpoint keeps its own)
  // A policy that cannot be read stops the turn: it fails closed. The
  // project's own policy file is read as the account.
  auto rules = LoadPolicy(info->project_root, deps.config.policy_file, as);
  if (!rules.ok()) {
    return Failed(
        sink, absl::FailedPreconditionError(absl::StrCat("policy: ", rules.status().message())));
  }
  // The project's MCP servers (started on first use); a broken section stops the turn.
  TurnManager::ProjectToolSet project_tools;
  if (hooks.project_tools) {
    auto pt = hooks.project_tools(*info, as);
    if (!pt.ok()) {
      return Failed(sink, absl::FailedPreconditionError(
                              absl::StrCat("mcp_servers: ", pt.status().message())));
    }
    project_tools = *std::move(pt);
  }
  // Tool outputs are logged under the project (.fwai/runs/<run_id>/<call_id>.log);
  // the directory is made with the first log, and old runs are pruned then.
  const std::string run_id = absl::StrCat("run-", req.turn_id);
  TurnState turn(*info, sink, cancel, *std::move(rules), std::move(project_tools.tools),
                 hooks.recorder && account ? info->project_root + "/.fwai/runs/" + run_id : "");
  turn.account = account;
  turn.await_checkpoint = [&checkpoint] { checkpoint.Await(); };

  std::string mode = info->mode;
  Agent main;
  main.messages = std::move(conversation);
  main.provider = provider;
  main.model = model;
  main.max_tokens = info->max_tokens > 0 ? info->max_tokens : pc.max_tokens;
  main.temperature = info->temperature >= 0 ? info->temperature : pc.temperature;
  main.persist = true;
  main.cancel = &cancel;
  main.mode = &mode;
  main.turn = &turn;
  main.request = req.text;
  main.context_window = ConfiguredContextWindow(deps.config, model, pc.context_window);
  if (req.compact_only) {
    TurnEnd end = CompactOnly(deps.sessions, main);
    end.project_tools_owner = std::move(project_tools.owner);
    return end;
  }

  const std::string reply = RunAgent(deps, main);
  if (hooks.reply_observer && !reply.empty()) {
    hooks.reply_observer(req.session_id, req.turn_id, reply);
  }
  TurnEnd end{main.stop_reason, main.iterations, turn.usage(), std::move(project_tools.owner)};
  if (hooks.recorder) {
    json rec = RunRecord(req, main, run_id, (MonotonicNanos() - start_ns) / 1000000);
    deps.secrets.RedactJson(rec);
    hooks.recorder(rec);
  }
  SaveToSession(deps.sessions, req.session_id, mode, end.usage);
  return end;
}

}  // namespace

void RunTurn(const AgentDeps& deps, const TurnHooks& hooks, CancelToken& cancel,
             const TurnRequest& req, const std::function<Author()>& finishing) {
  const int64_t start_ns = MonotonicNanos();
  // invoke_agent: the whole turn; the turn's run record notes its hash here.
  telemetry::ActiveSpan span("invoke_agent", "main", telemetry::Kind::kInternal, &req.parent_span);
  span->Set("gen_ai.operation.name", "invoke_agent");
  span->Set("gen_ai.agent.name", "main");
  span->Set("gen_ai.conversation.id", req.session_id);
  span->Set("fwai.turn.id", req.turn_id);
  EventSink sink(deps.sessions, req.session_id, req.turn_id);
  {
    ServerEvent ev;
    ev.mutable_user_message()->set_text(req.text);
    ev.mutable_user_message()->set_sender(req.sender);
    req.author.ToProto(ev.mutable_user_message()->mutable_author());
    sink.Emit(std::move(ev));
  }
  // The message is stored (it opens the turn); preparing the first request
  // is the start work a burst takes a few at a time.
  const std::shared_ptr<void> preparing = hooks.preparing ? hooks.preparing() : nullptr;
  const TurnEnd end = PlayTurn(deps, hooks, cancel, req, sink, start_ns);
  span->SetInt("gen_ai.usage.input_tokens", end.usage.input_tokens);
  span->SetInt("gen_ai.usage.output_tokens", end.usage.output_tokens);
  span->SetDouble("fwai.usage.cost_usd", end.usage.cost_usd);
  span->SetInt("fwai.agent.iterations", end.iterations);
  span->Set("fwai.stop_reason", end.stop_reason);
  if (end.stop_reason == "error") span->Fail("the turn failed");
  telemetry::RecordTurn(end.stop_reason);
  const Author cancelled_by = finishing();
  ServerEvent ev;
  auto* f = ev.mutable_turn_finished();
  if (end.stop_reason == "cancelled") cancelled_by.ToProto(f->mutable_cancelled_by());
  f->mutable_usage()->set_input_tokens(end.usage.input_tokens);
  f->mutable_usage()->set_output_tokens(end.usage.output_tokens);
  f->mutable_usage()->set_cost_usd(end.usage.cost_usd);
  f->set_stop_reason(end.stop_reason);
  f->set_iterations(end.iterations);
  f->set_duration_ms((MonotonicNanos() - start_ns) / 1000000);
  sink.Emit(std::move(ev));
}

}  // namespace fwai
