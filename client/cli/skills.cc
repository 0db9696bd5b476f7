#include "client/cli/skills.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/hw.h"
#include "common/grpc_status.h"
#include "common/verdict.h"
#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/projects.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
using json = nlohmann::json;

namespace {

std::atomic<grpc::ClientContext*> g_running_ctx{nullptr};

struct Style {
  bool color;
  std::string dim() const { return color ? "\033[2m" : ""; }
  std::string bold() const { return color ? "\033[1m" : ""; }
  std::string red() const { return color ? "\033[31m" : ""; }
  std::string green() const { return color ? "\033[32m" : ""; }
  std::string yellow() const { return color ? "\033[33m" : ""; }
  std::string reset() const { return color ? "\033[0m" : ""; }
};

bool AskYesNo(const std::string& question) {
  if (!isatty(STDIN_FILENO)) return false;
  std::cerr << question << " [y/N] " << std::flush;
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  answer = absl::AsciiStrToLower(absl::StripAsciiWhitespace(answer));
  return answer == "y" || answer == "yes";
}

}  // namespace

namespace {

// The skill `name` of project `root` as fwaid lists it (its timeout,
// whether it flashes): 0, or the exit code after saying why.
int LookUpSkill(const Globals& g, pb::Skills::Stub& stub, const std::string& root,
                const std::string& name, pb::Skill* out) {
  pb::ListSkillsRequest lr;
  lr.set_project_root(root);
  pb::ListSkillsResponse skills;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto st = stub.List(&ctx, lr, &skills);
  if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
    return Fail(g, 11, st.error_message());  // config
  if (!st.ok()) return FailGrpc(g, st);
  std::vector<std::string> names;
  for (const auto& s : skills.skills()) {
    names.push_back(s.name());
    if (s.name() == name) {
      *out = s;
      return 0;
    }
  }
  return Fail(g, 11,
              absl::StrCat("no skill '", name, "' in ", root,
                           " (skills: ", absl::StrJoin(names, ", "), ")"));
}

// A board held by a Hold stream for the run; fwaid renews the lease while
// the stream is open and releases it the moment it ends (here, or when this
// process dies).
struct HeldBoard {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReader<pb::Lease>> reader;
  ~HeldBoard() {
    if (!reader) return;
    ctx->TryCancel();
    pb::Lease l;
    while (reader->Read(&l)) {
    }
    (void)reader->Finish();
  }
};

// --board-tag: a board with the tags held for the run, its id in `*board`:
// 0, or the exit code (18, hardware) after saying why.
int HoldBoardByTags(const Globals& g, const std::shared_ptr<grpc::Channel>& ch,
                    const SkillRunOptions& o, HeldBoard* held, std::string* board) {
  pb::AcquireRequest ar;
  AddBoardTags(o.board_tags, &ar);
  ar.set_ttl_s(60);
  ar.set_wait_s(o.board_wait_s);
  const std::string tags = absl::StrJoin(o.board_tags, ",");
  std::ostream& note = o.ci && !g.json ? std::cerr : std::cout;
  if (!g.json)
    note << "leasing a board with tags " << tags << " (waiting up to " << o.board_wait_s << " s)"
         << std::endl;
  auto hw = pb::Hardware::NewStub(ch);
  held->ctx = std::make_unique<grpc::ClientContext>();
  held->ctx->AddMetadata("fwai-client", "fwai run");
  held->reader = hw->Hold(held->ctx.get(), ar);
  pb::Lease lease;
  if (!held->reader->Read(&lease)) {
    grpc::Status hs = held->reader->Finish();
    held->reader.reset();
    const std::string verdict = VerdictOf(hs).empty() ? "unknown" : VerdictOf(hs);
    const int code = o.exit_by == "verdict" ? VerdictExitCode(verdict) : 18;
    const std::string msg =
        absl::StrCat("no board with tags ", tags, " for the run: ", hs.error_message());
    if (o.ci && !g.json) {
      std::cout << json({{"skill", o.skill},
                         {"ok", false},
                         {"failure_class", "hardware"},
                         {"verdict", verdict},
                         {"exit_code", code},
                         {"board_tags", o.board_tags},
                         {"error", msg}})
                       .dump()
                << std::endl;
    }
    return Fail(g, code, msg);
  }
  *board = lease.device_id();
  if (!g.json) {
    note << "leased " << *board
         << (lease.node().empty() ? "" : absl::StrCat(" on node ", lease.node())) << " (lease "
         << lease.lease_id() << ")" << std::endl;
  }
  return 0;
}

// The run's exit code: the summary's (by failure class), or by its verdict.
int ExitCodeOf(const SkillRunOptions& o, const json& summary) {
  const int by_class = summary.value("exit_code", 10);
  if (o.exit_by != "verdict" || summary.value("ok", false) || by_class == 130) return by_class;
  return VerdictExitCode(summary.value("verdict", std::string(kVerdictUnknown)));
}

// One event of the run for a person.
void PrintSkillEvent(std::ostream& out, const Style& st, const pb::SkillEvent& ev) {
  const std::string& k = ev.kind();
  if (k == "run_started") {
    out << st.bold() << "▶ " << ev.text() << st.reset() << std::endl;
  } else if (k == "step_started") {
    out << st.bold() << "== " << ev.text() << st.reset() << std::endl;
  } else if (k == "output") {
    out << st.dim() << "  " << ev.text() << st.reset() << '\n';
  } else if (k == "step_retry") {
    out << st.yellow() << "  ↻ " << ev.text() << st.reset() << std::endl;
  } else if (k == "step_skipped") {
    out << st.dim() << "-- " << ev.step() << ": " << ev.text() << st.reset() << std::endl;
  } else if (k == "step_finished") {
    out << (ev.ok() ? st.green() + "✓ " : st.red() + "✗ ") << ev.text() << st.reset() << std::endl;
  }
}

// The exit code of a run whose stream ended with `status` (not OK), said.
int RunStreamFailed(const Globals& g, const SkillRunOptions& o, const grpc::Status& status,
                    const std::string& run_id, int limit_s) {
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Fail(g, 17,
                absl::StrCat("the run did not finish within ", limit_s, " s (client watchdog)"));
  }
  if (status.error_code() == grpc::StatusCode::CANCELLED) return Fail(g, 130, "cancelled");
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !run_id.empty()) {
    // The run started and its stream broke: fwaid went away (or the
    // connection did, and fwaid cancels a run whose client left).
    const int kInterrupted = o.exit_by == "verdict" ? VerdictExitCode(kVerdictInfra) : 20;
    const std::string msg = absl::StrCat(
        "run ", run_id, " was interrupted: the connection to fwaid broke (", status.error_message(),
        "). If fwaid stopped or crashed, its next start records the run as "
        "interrupted (fwai evidence show ",
        run_id, ")");
    if (o.ci && !g.json) {
      std::cout << json({{"run_id", run_id},
                         {"skill", o.skill},
                         {"ok", false},
                         {"failure_class", "interrupted"},
                         {"verdict", "infra"},
                         {"exit_code", kInterrupted},
                         {"error", msg}})
                       .dump()
                << std::endl;
    }
    return Fail(g, kInterrupted, msg);
  }
  int rc = FailGrpc(g, status);
  return rc == kExitUnreachable ? rc : 11;
}

// The run's diagnostics (errors first, at most 10) and its outcome, for a
// person; in CI mode the summary also goes to stdout as JSON.
void PrintRunSummary(std::ostream& out, const Style& st, const SkillRunOptions& o,
                     const json& summary, const std::vector<json>& diagnostics) {
  int errors = 0, warnings = 0;
  for (const auto& d : diagnostics)
    (d.value("severity", "") == "error" ? errors : warnings) += d.value("severity", "") != "note";
  if (!diagnostics.empty()) {
    out << st.bold() << "diagnostics: " << errors << (errors == 1 ? " error, " : " errors, ")
        << warnings << (warnings == 1 ? " warning" : " warnings") << st.reset() << std::endl;
    int shown = 0;
    for (const auto& d : diagnostics) {
      if (d.value("severity", "") != "error" || ++shown > 10) continue;
      out << "  " << st.red() << d.value("kind", "") << st.reset() << " " << d.value("file", "")
          << (d.contains("line") ? absl::StrCat(":", d["line"].get<int>()) : "") << " "
          << d.value("message", "") << std::endl;
    }
  }
  if (summary.value("ok", false)) {
    out << st.green() << st.bold() << "ok" << st.reset() << "  " << summary.value("skill", "")
        << " in " << summary.value("duration_ms", 0) << " ms";
  } else {
    const std::string verdict = summary.value("verdict", "");
    out << st.red() << st.bold() << "FAILED (" << summary.value("failure_class", "")
        << (verdict.empty() ? "" : ", verdict " + verdict) << ")" << st.reset() << "  "
        << summary.value("error", "");
  }
  out << "\n  run " << summary.value("run_id", "") << ", logs " << summary.value("log_dir", "");
  if (summary.contains("evidence_index"))
    out << ", evidence record " << summary["evidence_index"].get<uint64_t>();
  out << std::endl;
  if (o.ci) std::cout << summary.dump() << std::endl;
}

}  // namespace

int RunSkill(const Globals& g, const SkillRunOptions& o) {
  auto ch = ConnectChannel(g);
  if (!ch.ok()) return Fail(g, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Skills::NewStub(*ch);
  const std::string root = ProjectRoot(g);
  // What the skill is: its timeout and whether it flashes (which needs approval).
  pb::Skill skill;
  if (int rc = LookUpSkill(g, *stub, root, o.skill, &skill); rc != 0) {
    if (o.exit_by != "verdict") return rc;
    // No such skill is the request's failure; fwaid not answering, infra's.
    return VerdictExitCode(rc == 11 ? kVerdictConfig : kVerdictInfra);
  }
  bool approved = o.yes;
  if (skill.flashes() && !approved && !o.ci) {
    approved = AskYesNo(absl::StrCat("The skill '", o.skill, "' flashes ",
                                     o.board.empty() ? "the board" : o.board, ". Proceed?"));
    if (!approved && isatty(STDIN_FILENO)) {
      std::cerr << "fwai: not approved; nothing was run" << std::endl;
      return 16;
    }
  }
  std::string board = o.board;
  HeldBoard held;
  if (!o.board_tags.empty() && !o.board.empty())
    return Fail(g, kExitUsage, "give --board or --board-tag, not both");
  if (!o.board_tags.empty()) {
    if (int rc = HoldBoardByTags(g, *ch, o, &held, &board); rc != 0) return rc;
  }
  pb::RunSkillRequest req;
  req.set_project_root(root);
  req.set_skill(o.skill);
  req.set_ci(o.ci);
  req.set_approved(approved);
  req.set_board(board);
  req.set_timeout_s(o.timeout_s);
  for (const auto& [k, v] : o.vars) (*req.mutable_vars())[k] = v;

  // Human progress goes to stdout, or to stderr in CI mode (stdout carries
  // the final JSON summary). --json: every event is a JSON line on stdout.
  std::ostream& out = o.ci && !g.json ? std::cerr : std::cout;
  const Style st{!g.json && isatty(o.ci ? STDERR_FILENO : STDOUT_FILENO)};
  grpc::ClientContext ctx;
  ctx.AddMetadata("fwai-client", "fwai run");
  // The watchdog: the run's own limit plus a margin; the daemon enforces the
  // limit itself, this catches a daemon or a connection that went quiet.
  const int limit_s = (o.timeout_s > 0 ? o.timeout_s : std::max(1, skill.timeout_s())) + 60;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(limit_s));
  g_running_ctx = &ctx;
  struct sigaction sa {
  }, old{};
  sa.sa_handler = [](int) {
    if (auto* c = g_running_ctx.load()) c->TryCancel();
  };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  sigaction(SIGTERM, &sa, nullptr);
  auto reader = stub->Run(&ctx, req);
  pb::SkillEvent ev;
  json summary;
  std::string run_id;
  std::vector<json> diagnostics;
  while (reader->Read(&ev)) {
    json data = ev.json().empty() ? json() : json::parse(ev.json(), nullptr, false);
    if (g.json) {
      std::cout << json({{"type", "skill_event"},
                         {"run_id", ev.run_id()},
                         {"kind", ev.kind()},
                         {"step", ev.step()},
                         {"text", ev.text()},
                         {"ok", ev.ok()},
                         {"data", data}})
                       .dump()
                << std::endl;
    }
    if (ev.kind() == "run_finished") summary = data;
    if (ev.kind() == "run_started") run_id = ev.run_id();
    if (g.json) continue;
    if (ev.kind() == "diagnostic") diagnostics.push_back(data);
    PrintSkillEvent(out, st, ev);
  }
  auto status = reader->Finish();
  sigaction(SIGINT, &old, nullptr);
  signal(SIGTERM, SIG_DFL);
  g_running_ctx = nullptr;
  if (!status.ok()) return RunStreamFailed(g, o, status, run_id, limit_s);
  if (!summary.is_object()) return Fail(g, kExitError, "the run ended without a summary");
  if (!g.json) PrintRunSummary(out, st, o, summary, diagnostics);
  return ExitCodeOf(o, summary);
}

namespace {

// Skills.Resolve for `text` in this project (the provider may be asked).
absl::StatusOr<pb::ResolveIntentResponse> CallResolve(const Globals& g, const std::string& text) {
  auto ch = ConnectChannel(g);
  if (!ch.ok()) return ch.status();
  auto stub = pb::Skills::NewStub(*ch);
  pb::ResolveIntentRequest req;
  req.set_project_root(ProjectRoot(g));
  req.set_text(text);
  req.set_use_provider(true);
  pb::ResolveIntentResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto st = stub->Resolve(&ctx, req, &resp);
  if (!st.ok())
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  return resp;
}

}  // namespace

IntentDecision ResolveIntent(const Globals& g, const std::string& text) {
  IntentDecision d;
  auto resp = CallResolve(g, text);
  if (!resp.ok()) return d;  // anything wrong: just chat
  d.action = resp->action();
  d.skill = resp->skill();
  d.confidence = resp->confidence();
  d.tier = resp->tier();
  return d;
}

SkillCommands::SkillCommands(CLI::App& app, Globals& g) : g_(g) {
  run_ = app.add_subcommand(
      "run",
      "Run a skill (build, flash, monitor, test, build-flash-verify, or .fwai/skills/*.yaml)");
  run_->footer(
      "Exit codes: 0 ok; 10 a step failed; 11 config (unknown skill, bad YAML, unknown variable); "
      "12 build; 13 flash; "
      "14 verify (the expected output was not seen); 15 test; 16 policy; 17 timeout; 18 hardware "
      "(no board, lease "
      "held); 19 provider; 20 interrupted; 21 registers; 130 cancelled; 3 fwaid unreachable. "
      "With --exit-by verdict, whose failure it was: 30 firmware, 31 lab, 32 infra, 33 config, "
      "34 unknown (docs/hil.md).");
  run_->add_option("skill", opts_.skill, "The skill's name")->required();
  run_->add_flag("--ci", opts_.ci, "No prompts; progress on stderr and a JSON summary on stdout");
  run_->add_flag("--yes,-y", opts_.yes, "Approve flashing");
  run_->add_option("--board", opts_.board,
                   "The board (default: the one you hold, else the only one)");
  run_->add_option("--board-tag", opts_.board_tags,
                   "Lease any free board with this tag (KEY or KEY:VALUE; repeatable: all of them) "
                   "for the run, "
                   "in the whole lab on a node of a lab; released when the run ends")
      ->allow_extra_args(false);
  run_->add_option("--board-wait", opts_.board_wait_s,
                   "Seconds to wait for a --board-tag board (default 600)")
      ->check(CLI::NonNegativeNumber);
  run_->add_option("--timeout", opts_.timeout_s, "Seconds for the whole run (default: the skill's)")
      ->check(CLI::PositiveNumber);
  run_->add_option("--var", vars_, "NAME=VALUE for ${NAME} in the skill; repeatable")
      ->allow_extra_args(false);
  run_->add_option("--exit-by", opts_.exit_by,
                   "A failed run's exit code: by its failure class (default) or by its verdict "
                   "(firmware, lab, infra, config, unknown)")
      ->check(CLI::IsMember({"class", "verdict"}));
  auto* skills = app.add_subcommand("skills", "The project's skills");
  list_ = skills->add_subcommand("ls", "List the skills (built-in and .fwai/skills/*.yaml)");
  resolve_ = skills->add_subcommand("resolve", "Which skill free text would run, and how sure");
  resolve_->add_option("text", text_, "What you would type")->required();
  skills->require_subcommand(1);
}

std::optional<int> SkillCommands::RunIfParsed() {
  if (run_->parsed()) {
    for (const auto& v : vars_) {
      auto eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        return Fail(g_, kExitUsage, absl::StrCat("--var ", v, ": expected NAME=VALUE"));
      opts_.vars[v.substr(0, eq)] = v.substr(eq + 1);
    }
    return RunSkill(g_, opts_);
  }
  if (list_->parsed()) return List();
  if (resolve_->parsed()) return Resolve();
  return std::nullopt;
}

int SkillCommands::List() { return ListSkills(g_); }

int ListSkills(const Globals& g) {
  const Globals& g_ = g;
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Skills::NewStub(*ch);
  pb::ListSkillsRequest req;
  req.set_project_root(ProjectRoot(g_));
  pb::ListSkillsResponse resp;
  grpc::ClientContext ctx;
  auto st = stub->List(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    json arr = json::array();
    for (const auto& s : resp.skills()) {
      arr.push_back({{"name", s.name()},
                     {"description", s.description()},
                     {"builtin", s.builtin()},
                     {"source", s.source()},
                     {"steps", std::vector<std::string>(s.steps().begin(), s.steps().end())},
                     {"flashes", s.flashes()}});
    }
    std::cout << arr.dump(2) << std::endl;
    return kExitOk;
  }
  for (const auto& s : resp.skills()) {
    std::cout << s.name() << (s.builtin() ? "  (built-in)" : absl::StrCat("  (", s.source(), ")"))
              << "\n    " << s.description() << "\n    steps: " << absl::StrJoin(s.steps(), ", ")
              << "\n";
    if (!s.vars().empty()) {
      std::vector<std::string> v;
      for (const auto& [k, val] : s.vars())
        v.push_back(absl::StrCat(k, "=", val.empty() ? "\"\"" : val));
      std::cout << "    vars: " << absl::StrJoin(v, ", ") << "\n";
    }
  }
  return kExitOk;
}

int SkillCommands::Resolve() {
  auto r = CallResolve(g_, text_);
  if (!r.ok()) {
    return Fail(g_,
                r.status().code() == absl::StatusCode::kUnavailable ? kExitUnreachable : kExitError,
                std::string(r.status().message()));
  }
  const pb::ResolveIntentResponse& resp = *r;
  if (g_.json) {
    std::cout << json({{"skill", resp.skill()},
                       {"confidence", resp.confidence()},
                       {"tier", resp.tier()},
                       {"action", resp.action()},
                       {"reason", resp.reason()}})
                     .dump()
              << std::endl;
  } else {
    std::cout << (resp.skill().empty() ? "(no skill)" : resp.skill()) << "  confidence "
              << resp.confidence() << " (" << resp.tier() << ") -> " << resp.action() << "\n  "
              << resp.reason() << std::endl;
  }
  return kExitOk;
}

}  // namespace fwai
