// Skills: list a project's skills, run one (a stream of step events), and
// resolve free text to a skill. A run lives on its own thread; the client
// going away cancels it.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "common/thread_pool.h"
#include "fwai/v1/projects.grpc.pb.h"
#include "server/agent/turn_manager.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/api/queued_writer.h"
#include "server/plugins/plugin_store.h"
#include "server/skills/intent.h"
#include "server/skills/runner.h"
#include "server/skills/skill.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;
namespace fs = std::filesystem;

absl::StatusOr<std::string> Root(const std::string& r) { return CanonicalProjectRoot(r); }

// The skills of a project ("" : the built-ins only), read as `account`, and
// of the installed plugins (read as fwaid: they live in its data directory).
absl::StatusOr<std::vector<Skill>> SkillsOf(const std::string& project_root,
                                            const LocalAccount& account,
                                            const PluginStore* plugins) {
  auto plugin_sets = plugins ? plugins->SkillSets() : std::vector<PluginSkillSet>{};
  ScopedFsIdentity as(account);
  if (!as.status().ok()) return as.status();
  std::string root;
  if (!project_root.empty()) {
    auto r = Root(project_root);
    if (!r.ok()) return r.status();
    root = *r;
  }
  return LoadSkills(root, plugin_sets);
}

// Skill runs at once (each has its own thread and maybe a board).
constexpr int kMaxRuns = 32;

class SkillsService final : public pb::Skills::CallbackService {
 public:
  explicit SkillsService(ApiDeps deps) : deps_(std::move(deps)) {}
  ~SkillsService() override {
    // Runs end when their streams are cancelled at shutdown.
    for (int i = 0; i < 500 && running_ > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const pb::ListSkillsRequest* req,
                                 pb::ListSkillsResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Skills.List");
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, true, "", [this, req, resp, account = *who->account] {
      auto skills = SkillsOf(req->project_root(), account, deps_.plugins);
      if (!skills.ok()) return skills.status();
      for (const auto& s : *skills) {
        auto* o = resp->add_skills();
        o->set_name(s.name);
        o->set_description(s.description);
        o->set_builtin(s.builtin);
        o->set_source(s.source);
        o->set_flashes(s.flashes());
        o->set_timeout_s(s.timeout_s);
        for (const auto& st : s.steps)
          o->add_steps(absl::StrCat(st.name, " (", st.type == "tool" ? st.tool : st.type, ")"));
        for (const auto& k : s.keywords) o->add_keywords(k);
        for (const auto& [k, v] : s.vars) (*o->mutable_vars())[k] = v;
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* Resolve(grpc::CallbackServerContext* ctx,
                                    const pb::ResolveIntentRequest* req,
                                    pb::ResolveIntentResponse* resp) override {
    auto who = deps_.gate->Admit(ctx, "Skills.Resolve");
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, true, "", [this, req, resp, account = *who->account] {
      if (req->text().empty()) return absl::InvalidArgumentError("text: required");
      auto skills = SkillsOf(req->project_root(), account, deps_.plugins);
      if (!skills.ok()) return skills.status();
      Provider* p = req->use_provider() && deps_.providers ? deps_.providers->Find("") : nullptr;
      CancelToken cancel;
      IntentMatch m = ResolveIntent(req->text(), *skills, p, &cancel);
      resp->set_skill(m.skill);
      resp->set_confidence(m.confidence);
      resp->set_tier(m.tier);
      resp->set_reason(m.reason);
      resp->set_action(m.action);
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<pb::SkillEvent>* Run(grpc::CallbackServerContext* ctx,
                                                const pb::RunSkillRequest* req) override {
    auto* svc = this;
    using Stream = WorkStreamReactor<pb::SkillEvent>;
    return Stream::Serve(
        svc->deps_.skills != nullptr, "the skill runner is not available",
        [&](Stream& stream, const std::shared_ptr<Stream::State>& st) {
          auto who = svc->deps_.gate->Admit(ctx, "Skills.Run");
          if (!who.ok()) {
            st->writer.Close(ToGrpcStatus(who.status()));
            return;
          }
          absl::StatusOr<std::string> root = absl::UnknownError("");
          {
            ScopedFsIdentity as(*who->account);
            root = as.status().ok() ? Root(req->project_root())
                                    : absl::StatusOr<std::string>(as.status());
          }
          if (!root.ok()) {
            st->writer.Close(ToGrpcStatus(root.status()));
            return;
          }
          if (req->skill().empty()) {
            st->writer.Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "skill: required"));
            return;
          }
          if (svc->running_ >= kMaxRuns) {
            st->writer.Close(grpc::Status(
                grpc::StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat(kMaxRuns, " skill runs are under way; try again when one ends")));
            return;
          }
          const LimitsConfig limits = svc->deps_.gate->identities().LimitsOf(*who);
          if (!svc->TryAddRun(who->id, limits.running_runs)) {
            st->writer.Close(ToGrpcStatus(absl::ResourceExhaustedError(
                absl::StrCat("limit running_runs (", limits.running_runs,
                             ") reached: retry when one of your runs has ended"))));
            return;
          }
          SkillRunRequest r;
          r.project_root = *root;
          r.skill = req->skill();
          r.board = req->board();
          r.ci = req->ci();
          r.approved = req->approved();
          r.timeout_s = std::max(0, req->timeout_s());
          for (const auto& [k, v] : req->vars()) r.vars[k] = v;
          r.caller = CallerFor(*who, ctx);
          // A revoked or expired token cancels the run as the client's cancel
          // does, and ends the stream with the gate's status.
          stream.Track(*svc->deps_.gate, *who, ctx);
          svc->running_++;
          std::thread([svc, st, r = std::move(r), owner = who->id] {
            std::string run_id;
            svc->deps_.skills->Run(
                r,
                [&](const SkillEventOut& e) {
                  if (e.kind == "run_started" && e.data.is_object())
                    run_id = e.data.value("run_id", "");
                  if (e.kind == "run_finished" && e.data.is_object())
                    run_id = e.data.value("run_id", run_id);
                  pb::SkillEvent out;
                  out.set_run_id(run_id);
                  out.set_step(e.step);
                  out.set_kind(e.kind);
                  out.set_text(e.text);
                  out.set_ok(e.ok);
                  if (!e.data.is_null()) out.set_json(e.data.dump());
                  // A slow reader slows the run's output, never the daemon.
                  std::atomic<bool> stop{false};
                  st->writer.WaitBelow(1024, stop);
                  st->writer.Push(std::move(out));
                },
                st->cancel);
            // Counted out before the stream ends: a caller that starts its next
            // run the moment this one ends is not refused by its limit.
            svc->AddRun(owner, -1);
            svc->running_--;
            st->writer.Close(grpc::Status::OK);
          }).detach();
        });
  }

 private:
  // Counts a run of `owner` in if it has fewer than `limit` running: the
  // check and the count are one step, so runs started at once cannot all
  // slip under the limit.
  bool TryAddRun(const std::string& owner, int64_t limit) {
    MutexLock lock(&mu_);
    int64_t& n = runs_by_owner_[owner];
    if (n >= limit) {
      if (n == 0) runs_by_owner_.erase(owner);
      return false;
    }
    ++n;
    return true;
  }
  void AddRun(const std::string& owner, int delta) {
    MutexLock lock(&mu_);
    if ((runs_by_owner_[owner] += delta) <= 0) runs_by_owner_.erase(owner);
  }

  const ApiDeps deps_;
  std::atomic<int> running_{0};
  Mutex mu_;
  std::map<std::string, int64_t> runs_by_owner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<grpc::Service> MakeSkillsService(const ApiDeps& deps) {
  return std::make_unique<SkillsService>(deps);
}

}  // namespace fwai
