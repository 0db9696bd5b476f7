// A turn's start, as RunTurn plays it: what is stored before the start work
// is waited for, and what the start's hooks are given.
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/pending_replies.h"
#include "server/agent/turn.h"
#include "server/llm/provider.h"
#include "server/project/secrets.h"
#include "server/session/checkpoints.h"
#include "server/session/session_manager.h"
#include "server/storage/storage.h"
#include "server/tools/tool.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

class TurnStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::filesystem::temp_directory_path() / "fwai-turn-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    std::filesystem::create_directories(dir_ + "/proj");
    auto db = Storage::Open(dir_ + "/db");
    ASSERT_TRUE(db.ok()) << db.status();
    storage_ = *std::move(db);
    sessions_ = std::make_unique<SessionManager>(*storage_, SubscriberConfig{});
  }
  void TearDown() override {
    sessions_.reset();
    storage_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A session on the project, owned by `owner` and run as `account`; "" if
  // it could not be made (the test fails).
  std::string ProjectSession(const std::string& owner, const std::string& account) {
    NewSession params;
    params.project_root = dir_ + "/proj";
    params.account = account;
    auto s = sessions_->Create(owner, params);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->id : "";
  }
  // Runs turn t-1 (`text`) in `session` to its end.
  static void RunOne(const AgentDeps& deps, const TurnHooks& hooks, const std::string& session,
                     const std::string& text) {
    TurnRequest req;
    req.session_id = session;
    req.turn_id = "t-1";
    req.text = text;
    CancelToken cancel;
    RunTurn(deps, hooks, cancel, req, [] { return Author{}; });
  }
  // The session's stored events, oldest first.
  std::vector<pb::ServerEvent> Stored(const std::string& id) {
    std::vector<pb::ServerEvent> out;
    auto sub = sessions_->Subscribe(id, 0, /*replay=*/true, /*follow=*/false, [] {});
    if (!sub.ok()) return out;
    std::string bytes;
    absl::Status st;
    while ((*sub)->Pull(&bytes, &st) == Subscriber::PullResult::kEvent) {
      pb::ServerEvent ev;
      ev.ParseFromString(bytes);
      out.push_back(ev);
    }
    return out;
  }
  std::string dir_;
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<SessionManager> sessions_;
};

// The user's message is stored before the turn waits for a start slot (a
// burst's messages are written together, not one per slot), and the account
// is looked up once and handed to the checkpoint.
TEST_F(TurnStartTest, TheMessageIsStoredBeforeTheStartWorkAndTheAccountIsLookedUpOnce) {
  auto me = LookupAccount(getuid());
  ASSERT_TRUE(me.ok()) << me.status();
  NewSession params;
  params.project_root = dir_ + "/proj";
  params.account = me->name;
  auto s = sessions_->Create(me->name, params);
  ASSERT_TRUE(s.ok()) << s.status();

  DaemonConfig config;
  ProviderSet providers;  // none: the turn ends with an error after its start
  ToolRegistry tools;
  ToolRetriever retriever;
  PendingReplies replies;
  const auto secrets = SecretScanner::Default();
  const AgentDeps deps{*sessions_, config, providers, tools, retriever, *secrets, replies};

  std::vector<std::string> steps;
  const std::function<void(const nlohmann::json&)> recorder;
  const TurnManager::ProjectToolsFn project_tools;
  const std::function<void(const std::string&, const std::string&, const std::string&)> replies_fn;
  const TurnManager::CheckpointFn checkpoint = [&](const SessionInfo& info,
                                                   const LocalAccount* account,
                                                   const std::string& turn_id,
                                                   const std::vector<HistoryEntry>&) {
    steps.push_back("checkpoint of " + info.id + " for " + turn_id + " as " +
                    (account ? account->name + " uid " + std::to_string(account->uid) : "nobody"));
  };
  const std::function<std::shared_ptr<void>()> preparing = [&]() -> std::shared_ptr<void> {
    std::string seen;
    for (const auto& ev : Stored(s->id)) {
      if (ev.has_user_message()) seen += "user_message(" + ev.user_message().text() + ") ";
      if (ev.has_turn_started()) seen += "turn_started ";
    }
    steps.push_back("preparing; stored: " + seen);
    return nullptr;
  };
  TurnRequest req;
  req.session_id = s->id;
  req.turn_id = "t-1";
  req.text = "blink the led";
  CancelToken cancel;
  RunTurn(deps, TurnHooks{recorder, project_tools, replies_fn, checkpoint, preparing}, cancel, req,
          [] { return Author{}; });

  EXPECT_EQ(steps, (std::vector<std::string>{"preparing; stored: user_message(blink the led) ",
                                             "checkpoint of " + s->id + " for t-1 as " + me->name +
                                                 " uid " + std::to_string(getuid())}));
  // No provider: the message is kept, the turn says why it stopped.
  std::vector<std::string> kinds;
  for (const auto& ev : Stored(s->id)) {
    if (ev.has_user_message()) kinds.push_back("user_message");
    if (ev.has_error()) kinds.push_back("error: " + ev.error().message().substr(0, 24));
    if (ev.has_turn_finished())
      kinds.push_back("turn_finished " + ev.turn_finished().stop_reason());
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"user_message", "error: no LLM provider is confi",
                                             "turn_finished error"}));
  auto history = sessions_->LoadHistory(s->id);
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 1u);
  EXPECT_EQ((*history)[0].role, "user");
}

// A provider that answers every request with one text, counting them.
class OneLineProvider : public Provider {
 public:
  OneLineProvider() {
    config_.name = "one-line";
    config_.kind = "anthropic";
    config_.model = "m";
  }
  absl::StatusOr<ChatResult> Stream(const ChatRequest& req, StreamObserver& observer,
                                    CancelToken&) override {
    ++requests;
    last_messages = req.messages;
    observer.OnText("done");
    ChatResult r;
    r.content = nlohmann::json::array({{{"type", "text"}, {"text", "done"}}});
    r.stop_reason = "end_turn";
    return r;
  }
  const ProviderConfig& config() const override { return config_; }
  int requests = 0;
  std::vector<LlmMessage> last_messages;

 private:
  ProviderConfig config_;
};

// What RunTurn needs for turns answered by a OneLineProvider (`model`), with
// no hooks but the checkpoint, which each test gives.
struct OneLineTurns {
  explicit OneLineTurns(SessionManager& sessions)
      : deps{sessions, config, providers, tools, retriever, *secrets, replies} {
    auto provider = std::make_unique<OneLineProvider>();
    model = provider.get();
    providers.providers["one-line"] = std::move(provider);
    providers.default_name = "one-line";
  }
  TurnHooks Hooks(const TurnManager::CheckpointFn& checkpoint) const {
    return TurnHooks{recorder, project_tools, replies_fn, checkpoint, preparing};
  }
  DaemonConfig config;
  ProviderSet providers;
  ToolRegistry tools;
  ToolRetriever retriever;
  PendingReplies replies;
  const std::shared_ptr<const SecretScanner> secrets = SecretScanner::Default();
  const AgentDeps deps;
  OneLineProvider* model = nullptr;
  const std::function<void(const nlohmann::json&)> recorder;
  const TurnManager::ProjectToolsFn project_tools;
  const std::function<void(const std::string&, const std::string&, const std::string&)> replies_fn;
  const std::function<std::shared_ptr<void>()> preparing;
};

// A session whose account is gone: the turn keeps the message, takes no
// checkpoint (nothing may be read as nobody), asks the model nothing and
// says which account; a known account's turn reaches the model.
TEST_F(TurnStartTest, AnAccountThatIsGoneFailsTheTurnAfterTheMessageIsKept) {
  auto me = LookupAccount(getuid());
  ASSERT_TRUE(me.ok()) << me.status();
  OneLineTurns t(*sessions_);
  OneLineProvider* model = t.model;
  int checkpoints = 0;
  const TurnManager::CheckpointFn checkpoint =
      [&](const SessionInfo&, const LocalAccount*, const std::string&,
          const std::vector<HistoryEntry>&) { ++checkpoints; };

  for (const std::string& account : {std::string("fwai-no-such-account"), me->name}) {
    SCOPED_TRACE(account);
    const std::string id = ProjectSession(me->name, account);
    ASSERT_FALSE(id.empty());
    const int requests_before = model->requests;
    RunOne(t.deps, t.Hooks(checkpoint), id, "read the map file");
    std::string errors;
    std::string finished;
    for (const auto& ev : Stored(id)) {
      if (ev.has_error()) errors += ev.error().message();
      if (ev.has_turn_finished()) finished = ev.turn_finished().stop_reason();
    }
    auto history = sessions_->LoadHistory(id);
    ASSERT_TRUE(history.ok()) << history.status();
    ASSERT_GE(history->size(), 1u);
    EXPECT_EQ((*history)[0].role, "user");
    if (account == me->name) {
      EXPECT_EQ(errors, "");
      EXPECT_EQ(finished, "end_turn");
      EXPECT_EQ(checkpoints, 1);
      EXPECT_EQ(model->requests, requests_before + 1);
    } else {
      EXPECT_NE(errors.find("the session's account fwai-no-such-account"), std::string::npos)
          << errors;
      EXPECT_EQ(finished, "error");
      EXPECT_EQ(checkpoints, 0);
      EXPECT_EQ(model->requests, requests_before);
      EXPECT_EQ(history->size(), 1u);
    }
  }
}

// The history is read once for a turn: the checkpoint is given it as it was
// before the turn's message, and the model gets it with the message.
TEST_F(TurnStartTest, TheCheckpointGetsTheHistoryBeforeTheMessageAndTheModelGetsItWithTheMessage) {
  auto me = LookupAccount(getuid());
  ASSERT_TRUE(me.ok()) << me.status();
  OneLineTurns t(*sessions_);
  OneLineProvider* model = t.model;
  std::vector<std::vector<HistoryEntry>> given;
  const TurnManager::CheckpointFn checkpoint =
      [&](const SessionInfo&, const LocalAccount*, const std::string&,
          const std::vector<HistoryEntry>& history) { given.push_back(history); };

  NewSession params;
  params.project_root = dir_ + "/proj";
  params.account = me->name;
  auto s = sessions_->Create(me->name, params);
  ASSERT_TRUE(s.ok()) << s.status();
  const auto text = [](const std::string& t) {
    return nlohmann::json::array({{{"type", "text"}, {"text", t}}}).dump();
  };
  ASSERT_TRUE(sessions_->AppendHistory(s->id, {"user", text("what is PA5")}).ok());
  ASSERT_TRUE(sessions_->AppendHistory(s->id, {"assistant", text("the LED pin")}).ok());
  auto before = sessions_->LoadHistory(s->id);
  ASSERT_TRUE(before.ok()) << before.status();

  for (const std::string turn_id : {"t-1", "t-2"}) {
    TurnRequest req;
    req.session_id = s->id;
    req.turn_id = turn_id;
    req.text = "blink it at " + turn_id;
    CancelToken cancel;
    RunTurn(t.deps, t.Hooks(checkpoint), cancel, req, [] { return Author{}; });
  }
  ASSERT_EQ(given.size(), 2u);
  // The first turn's checkpoint: the two entries before it, as stored.
  ASSERT_EQ(given[0].size(), 2u);
  EXPECT_EQ(HistoryPrefixSha(given[0], 2), HistoryPrefixSha(*before, 2));
  // The second's: those, the first turn's message and its answer.
  auto after = sessions_->LoadHistory(s->id);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), 6u);
  ASSERT_EQ(given[1].size(), 4u);
  EXPECT_EQ(HistoryPrefixSha(given[1], 4), HistoryPrefixSha(*after, 4));
  // The model was asked with the whole history and the second message last.
  std::vector<std::string> asked;
  for (const auto& m : model->last_messages) asked.push_back(m.role + ": " + m.content.dump());
  EXPECT_EQ(asked, (std::vector<std::string>{
                       "user: " + text("what is PA5"),
                       "assistant: " + text("the LED pin"),
                       "user: " + text("blink it at t-1"),
                       "assistant: " + text("done"),
                       "user: " + text("blink it at t-2"),
                   }));
}

// What happens in a turn whose model first calls a tool, in the order it
// happens (from any thread).
struct Happened {
  void Add(const std::string& what) {
    MutexLock lock(&mu);
    seen.push_back(what);
    changed.SignalAll();
  }
  // Waits (10 s at most, a hang's bound) until `what` happened.
  bool AwaitSeen(const std::string& what) {
    MutexLock lock(&mu);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::find(seen.begin(), seen.end(), what) == seen.end()) {
      if (changed.WaitWithDeadline(&mu, deadline)) break;
    }
    return std::find(seen.begin(), seen.end(), what) != seen.end();
  }
  std::vector<std::string> Seen() {
    MutexLock lock(&mu);
    return seen;
  }
  Mutex mu;
  CondVar changed;
  std::vector<std::string> seen ABSL_GUARDED_BY(mu);
};

// Asks for the tool `probe` first, then answers.
class ProbeFirstProvider : public Provider {
 public:
  explicit ProbeFirstProvider(Happened& happened) : happened_(happened) {
    config_.name = "probe-first";
    config_.kind = "anthropic";
    config_.model = "m";
  }
  absl::StatusOr<ChatResult> Stream(const ChatRequest&, StreamObserver& observer,
                                    CancelToken&) override {
    ChatResult r;
    if (++requests_ == 1) {
      happened_.Add("model asked");
      r.content = nlohmann::json::array({{{"type", "tool_use"},
                                          {"id", "call-1"},
                                          {"name", "probe"},
                                          {"input", nlohmann::json::object()}}});
      r.stop_reason = "tool_use";
      return r;
    }
    observer.OnText("done");
    r.content = nlohmann::json::array({{{"type", "text"}, {"text", "done"}}});
    r.stop_reason = "end_turn";
    return r;
  }
  const ProviderConfig& config() const override { return config_; }

 private:
  Happened& happened_;
  int requests_ = 0;
  ProviderConfig config_;
};

class ProbeTool : public Tool {
 public:
  explicit ProbeTool(Happened& happened) : happened_(happened) {}
  std::string name() const override { return "probe"; }
  std::string description() const override { return "records that it ran"; }
  nlohmann::json input_schema() const override { return {{"type", "object"}}; }
  bool read_only() const override { return true; }
  ToolResult Run(const nlohmann::json&, ToolContext&) override {
    happened_.Add("tool ran");
    return {"ran", false};
  }

 private:
  Happened& happened_;
};

// The checkpoint is taken beside the first model request, not before it:
// here it cannot end until the model was asked. The turn's first tool call
// runs only once the checkpoint is recorded.
TEST_F(TurnStartTest, TheModelIsAskedWhileTheCheckpointIsTakenAndToolsWaitForIt) {
  auto me = LookupAccount(getuid());
  ASSERT_TRUE(me.ok()) << me.status();
  Happened happened;
  OneLineTurns t(*sessions_);
  t.providers.providers["probe-first"] = std::make_unique<ProbeFirstProvider>(happened);
  t.providers.default_name = "probe-first";
  t.tools.Register(std::make_unique<ProbeTool>(happened));
  std::string checkpoint_thread;
  const TurnManager::CheckpointFn checkpoint = [&](const SessionInfo&, const LocalAccount*,
                                                   const std::string&,
                                                   const std::vector<HistoryEntry>&) {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    checkpoint_thread = name;
    happened.Add(happened.AwaitSeen("model asked") ? "checkpoint recorded"
                                                   : "checkpoint gave up waiting for the model");
  };
  const std::string id = ProjectSession(me->name, me->name);
  ASSERT_FALSE(id.empty());
  RunOne(t.deps, t.Hooks(checkpoint), id, "probe it");

  EXPECT_EQ(happened.Seen(),
            (std::vector<std::string>{"model asked", "checkpoint recorded", "tool ran"}));
  EXPECT_EQ(checkpoint_thread, "fwaid-checkpt");
  std::string finished;
  for (const auto& ev : Stored(id)) {
    if (ev.has_turn_finished()) finished = ev.turn_finished().stop_reason();
  }
  EXPECT_EQ(finished, "end_turn");
}

}  // namespace
}  // namespace fwai
