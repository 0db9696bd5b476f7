#include "server/skills/runner.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "common/verdict.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/turn_manager.h"
#include "server/boards/boards.h"
#include "server/boards/leases.h"
#include "server/firmware/artifacts.h"
#include "server/firmware/elf_file.h"
#include "server/firmware/memory.h"
#include "server/firmware/register_tools.h"
#include "server/firmware/sbom.h"
#include "server/firmware/toolchain.h"
#include "server/hardware/firmware_image.h"
#include "server/llm/provider.h"
#include "server/project/policy.h"
#include "server/project/project.h"
#include "server/project/secrets.h"
#include "server/session/session_manager.h"
#include "server/session/subscriber.h"
#include "server/skills/diagnostics.h"
#include "server/skills/run_journal.h"
#include "server/skills/skill.h"
#include "server/telemetry/telemetry.h"
#include "server/tools/process_runner.h"
#include "server/tools/project_fs.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

int ExitCodeFor(const std::string& c) {
  static const std::map<std::string, int> kCodes = {
      {"", 0},          {"failed", 10},      {"config", 11},    {"build", 12},     {"flash", 13},
      {"verify", 14},   {"test", 15},        {"policy", 16},    {"timeout", 17},   {"hardware", 18},
      {"provider", 19}, {"interrupted", 20}, {"registers", 21}, {"cancelled", 130}};
  auto it = kCodes.find(c);
  return it == kCodes.end() ? 10 : it->second;
}

namespace {

// What a run may read for its caller (docs/security.md).
constexpr char kReadRule[] = "rule: a run reads only files beneath its project, as its caller";

std::string ReadFileText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The newest ELF file under `root` (build trees, not .git / .fwai).
std::string NewestElf(const std::string& root) {
  std::error_code ec;
  fs::file_time_type best_time{};
  std::string best;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const auto& p = it->path();
    const std::string name = p.filename().string();
    if (it->is_directory(ec) &&
        (name == ".git" || name == ".fwai" || name == "node_modules" || it.depth() > 5)) {
      it.disable_recursion_pending();
      continue;
    }
    if (p.extension() != ".elf" || !it->is_regular_file(ec)) continue;
    auto t = fs::last_write_time(p, ec);
    if (!ec && (best.empty() || t > best_time)) {
      best = p.string();
      best_time = t;
    }
  }
  return best;
}

// git diff --numstat against HEAD: path -> added + removed lines.
std::map<std::string, int> NumStat(const std::string& root, const LocalAccount* account) {
  std::map<std::string, int> out;
  ProcessOptions po;
  po.timeout_ms = 20000;
  po.run_as = account;  // the project's git config and hooks are its owner's
  auto r = RunProcess({"git", "-C", root, "diff", "--numstat", "HEAD"}, po);
  if (!r.ok() || r->exit_code != 0) return out;
  for (absl::string_view line : absl::StrSplit(r->out, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    if (f.size() < 3) continue;
    int a = 0, d = 0;
    (void)absl::SimpleAtoi(f[0], &a);  // "-" for binary files
    (void)absl::SimpleAtoi(f[1], &d);
    out[std::string(f[2])] = a + d;
  }
  return out;
}

bool IsGitRepo(const std::string& root, const LocalAccount* account) {
  ProcessOptions po;
  po.timeout_ms = 10000;
  po.run_as = account;
  auto r = RunProcess({"git", "-C", root, "rev-parse", "--is-inside-work-tree"}, po);
  return r.ok() && r->exit_code == 0;
}

FlashGuardPolicy FlashGuardOf(const PolicyRules& rules, json build) {
  FlashGuardPolicy g = FlashGuardFromRules(rules);
  g.build = std::move(build);
  return g;
}

struct StepOutcome {
  bool ok = false;
  std::string failure_class;  // when !ok
  std::string verdict;        // the failing call's own (common/verdict.h); "": it set none
  std::string error;
  int exit_code = -1;
  std::string command;
  json extra = json::object();
};

// Marks `o` failed (keeping what it recorded so far) and returns it.
StepOutcome FailWith(StepOutcome& o, std::string klass, std::string error) {
  o.failure_class = std::move(klass);
  o.error = std::move(error);
  return o;
}

// The same, with the failing call's status: its words and its verdict.
StepOutcome FailWith(StepOutcome& o, std::string klass, const absl::Status& st) {
  o.verdict = VerdictOf(st);
  return FailWith(o, std::move(klass), std::string(st.message()));
}

StepOutcome Failed(std::string klass, std::string error) {
  StepOutcome o;
  o.failure_class = std::move(klass);
  o.error = std::move(error);
  return o;
}

StepOutcome Failed(std::string klass, const absl::Status& st) {
  StepOutcome o;
  return FailWith(o, std::move(klass), st);
}

}  // namespace

struct SkillRunner::RunState {
  RunState(SkillDeps& d, const SkillRunRequest& r,
           const std::function<void(const SkillEventOut&)>& e, std::shared_ptr<CancelToken> c,
           const SecretScanner& s)
      : deps(d), req(r), emit(e), cancel(std::move(c)), secrets(s) {}
  SkillDeps& deps;
  const SkillRunRequest& req;
  const std::function<void(const SkillEventOut&)>& emit;
  std::shared_ptr<CancelToken> cancel;  // the run's: parent cancel, or the watchdog
  const SecretScanner& secrets;
  std::string run_id, run_dir;
  const LocalAccount* account = nullptr;  // the caller's: the project is read and run as it
  Skill skill;
  ProjectSettings project;
  bool have_project = false;
  PolicyRules rules;
  std::map<std::string, std::string> vars;
  int64_t deadline_us = 0;
  std::atomic<bool> timed_out{false};
  // Written by the run's thread only; its lease_id under lease_mu (the
  // renewer copies it under lease_mu), so the run's own unlocked reads do
  // not race.
  Caller caller;
  std::string lease_board ABSL_GUARDED_BY(lease_mu);  // acquired by this run (released at its end)
  std::string lease_id ABSL_GUARDED_BY(lease_mu);
  // A lab's boards of other nodes (null outside a lab): the ones this run
  // resolved, and the serial stream of each opened just before its flash
  // (what a `since: run` monitor reads).
  std::map<std::string, BoardRef> resolved;  // boards this run resolved, by id
  // "board stream" (the UART's stream "") -> first seq of the run (or of the
  // board's last flash) on that stream
  std::map<std::string, uint64_t> since_seq;
  std::map<std::string, std::string> step_logs;  // step -> log file
  json images = json::array();
  json llm_calls = json::array();
  json refusals = json::array();
  json artifacts = json::array();
  json diagnostic_items = json::array();  // every diagnostic of the run (capped)
  json memory, toolchain, sbom;           // of the last build's image (null: no build made one)
  json boot = json::object();
  int errors = 0, warnings = 0;
  std::map<std::string, int> numstat_before;
  bool git = false;

  void Emit(const std::string& step, const std::string& kind, const std::string& text,
            bool ok = false, json data = nullptr) {
    emit(SkillEventOut{step, kind, text, ok, std::move(data)});
  }

  int RemainingMs() const {
    return static_cast<int>(std::max<int64_t>(0, (deadline_us - NowMicros()) / 1000));
  }
  int StepTimeoutMs(const SkillStep& s, int default_s) const {
    int64_t ms = static_cast<int64_t>(s.timeout_s > 0 ? s.timeout_s : default_s) * 1000;
    return static_cast<int>(std::min<int64_t>(ms, RemainingMs()));
  }

  absl::StatusOr<std::string> Var(const std::string& text) { return Interpolate(text, vars); }

  absl::StatusOr<std::string> ResolveBoard(const std::string& wanted) {
    if (!deps.hardware || !deps.boards || !deps.leases) {
      return absl::UnavailableError("the hardware broker is not running");
    }
    auto r = deps.boards->Resolve(caller, wanted);
    if (!r.ok()) return r.status();
    resolved[r->id] = *r;
    return r->id;
  }
  BoardRef RefOf(const std::string& board) const {
    auto it = resolved.find(board);
    return it != resolved.end() ? it->second : BoardRef{board, "", false, ""};
  }
  // The run's serial lines of `board` begin here (what a `since: run`
  // monitor reads).
  // Each stream a monitor step of the skill reads is marked too.
  void MarkSerial(const std::string& board) {
    std::set<std::string> streams = {""};
    for (const auto& st : skill.steps) {
      if (st.tool == "monitor") streams.insert(st.stream == "uart" ? "" : st.stream);
    }
    for (const auto& stream : streams) {
      auto seq = deps.boards->SerialNextSeq(caller, RefOf(board), stream);
      if (seq.ok() && *seq > 0) since_seq[absl::StrCat(board, " ", stream)] = *seq;
    }
  }

  // The run holds the board's lease while it needs it (an existing lease of
  // the caller is used as it is). The lease is short and renewed by the
  // watchdog, so a daemon that dies mid-run does not keep the board for long.
  static constexpr int kLeaseTtlS = 60;
  Mutex lease_mu;  // lease_id / lease_board / caller.lease_id, read by the renewer

  absl::Status EnsureLease(const std::string& board) ABSL_LOCKS_EXCLUDED(lease_mu) {
    {
      MutexLock lock(&lease_mu);
      if (lease_board == board) return absl::OkStatus();
    }
    auto l = deps.leases->LeaseFor(caller, RefOf(board), kLeaseTtlS,
                                   [this] { return cancel->cancelled(); });
    if (!l.ok()) return l.status();
    MutexLock lock(&lease_mu);
    caller.lease_id = l->lease_id;
    if (!l->renewed) {
      lease_board = board;
      lease_id = l->lease_id;
    }
    return absl::OkStatus();
  }

  void RenewLease() ABSL_LOCKS_EXCLUDED(lease_mu) {
    Caller c;
    std::string id;
    {
      MutexLock lock(&lease_mu);
      if (lease_id.empty() || !deps.leases) return;
      c = caller;
      id = lease_id;
    }
    (void)deps.leases->Renew(c, id);
  }

  void ReleaseLease() ABSL_LOCKS_EXCLUDED(lease_mu) {
    MutexLock lock(&lease_mu);
    if (lease_id.empty() || !deps.leases) return;
    (void)deps.leases->Release(caller, lease_id, lease_board, false);
    lease_id.clear();
    lease_board.clear();
  }

  // Runs a command step (build | test | shell) with streamed, logged, parsed output.
  StepOutcome Command(const SkillStep& s, const std::string& command, const std::string& klass,
                      std::ofstream& log) {
    StepOutcome o;
    o.command = command;
    if (skill.scope && !skill.scope->build) {
      const std::string rule = absl::StrCat("plugin ", skill.scope->plugin, ": capabilities.build");
      refusals.push_back(
          {{"kind", "command"}, {"target", command}, {"rule", rule}, {"step", s.name}});
      o.failure_class = "policy";
      o.error =
          absl::StrCat("refused (", rule, "): plugin ", skill.scope->plugin,
                       " did not declare the build capability, so its skills run no commands");
      return o;
    }
    PolicyDecision d = CheckPolicy(rules, "command", command);
    if (!d.allowed) {
      refusals.push_back(
          {{"kind", "command"}, {"target", command}, {"rule", d.rule}, {"step", s.name}});
      o.failure_class = "policy";
      o.error = absl::StrCat("refused by policy (", d.rule, "): ", d.reason);
      return o;
    }
    CommandOptions co;
    co.command = command;
    co.project_root = req.project_root;
    co.network = rules.network && (!skill.scope || skill.scope->network);
    co.sandbox = deps.sandbox;
    co.timeout_ms = StepTimeoutMs(s, klass == "test" ? 1200 : 600);
    co.cancel = cancel.get();
    co.max_output = 64 * 1024;
    std::string pending;
    int step_errors = 0, step_warnings = 0;
    json first_error;
    auto on_line = [&](std::string line) {
      line = secrets.Redact(line);
      log << line << '\n';
      Emit(s.name, "output", line);
      if (auto diag = ParseDiagnosticLine(line)) {
        if (diagnostic_items.size() < 500) {
          json item = diag->ToJson();
          item["step"] = s.name;
          diagnostic_items.push_back(std::move(item));
        }
        if (diag->severity == "error") {
          ++step_errors;
          if (first_error.is_null()) first_error = diag->ToJson();
        } else if (diag->severity == "warning") {
          ++step_warnings;
        }
        Emit(s.name, "diagnostic",
             absl::StrCat(diag->file.empty() ? "" : diag->file,
                          diag->line ? absl::StrCat(":", diag->line) : "",
                          diag->column ? absl::StrCat(":", diag->column) : "",
                          diag->file.empty() ? "" : ": ", diag->severity, ": ", diag->message),
             diag->severity != "error", diag->ToJson());
      }
    };
    co.output = [&](std::string_view chunk) {
      pending.append(chunk);
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, nl);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        pending.erase(0, nl + 1);
        on_line(std::move(line));
      }
    };
    co.run_as = account;
    auto r = RunCommand(co);
    if (!pending.empty()) on_line(std::move(pending));
    errors += step_errors;
    warnings += step_warnings;
    o.extra["errors"] = step_errors;
    o.extra["warnings"] = step_warnings;
    if (!first_error.is_null()) o.extra["first_error"] = first_error;
    if (!r.ok()) {
      o.failure_class = "failed";
      o.error = std::string(r.status().message());
      return o;
    }
    o.exit_code = r->exit_code;
    o.extra["sandboxed"] = r->sandboxed;
    if (r->cancelled || cancel->cancelled()) {
      o.failure_class = timed_out ? "timeout" : "cancelled";
      o.error = timed_out ? "the run's time ran out" : "cancelled";
      return o;
    }
    if (r->timed_out) {
      o.failure_class = "timeout";
      o.error = absl::StrCat("'", command, "' did not finish within ", co.timeout_ms / 1000, " s");
      return o;
    }
    if (r->exit_code != 0) {
      o.failure_class = klass;
      o.error = absl::StrCat("'", command, "' exited ", r->exit_code);
      if (step_errors > 0) {
        absl::StrAppend(
            &o.error, "; ", step_errors, step_errors == 1 ? " error" : " errors",
            ", first: ", first_error.value("file", ""),
            first_error.contains("line") ? absl::StrCat(":", first_error["line"].get<int>()) : "",
            first_error.contains("file") ? ": " : "", first_error.value("message", ""));
      }
      return o;
    }
    o.ok = true;
    return o;
  }

  // The project's register code against its SVD, as the caller: each finding
  // is a diagnostic (Problems in VS Code); an error fails the step.
  StepOutcome CheckRegisterStep(const SkillStep& s, std::ofstream& log) {
    if (!deps.svd_catalog) return Failed("config", "this fwaid has no register checker");
    RegisterCheckRequest r;
    r.project_root = req.project_root;
    r.paths = s.paths;
    r.target = s.target;
    r.svd = s.svd;
    auto report = CheckProjectRegisters(*deps.svd_catalog, account, std::move(r));
    if (!report.ok())
      return Failed("config", absl::StrCat("check_registers: ", report.status().message()));
    log << RegisterFindingsText(*report);
    int step_errors = 0;
    json first_error;
    for (const auto& f : (*report)["findings"]) {
      json d = {{"kind", "register"},
                {"severity", f["severity"]},
                {"file", f["file"]},
                {"line", f["line"]},
                {"column", f["column"]},
                {"symbol", f["symbol"]},
                {"message", absl::StrCat("[", f.value("kind", ""), "] ", f.value("code_says", ""),
                                         "; the SVD: ", f.value("svd_says", ""), " (",
                                         f.value("source", ""), "). Fix: ", f.value("fix", ""))}};
      const bool error = f.value("severity", "") == "error";
      (error ? errors : warnings)++;
      if (error && step_errors++ == 0) first_error = d;
      Emit(s.name, "diagnostic",
           absl::StrCat(f.value("file", ""), ":", f.value("line", 0), ":", f.value("column", 0),
                        ": ", f.value("severity", ""), ": ", d.value("message", "")),
           !error, d);
      if (diagnostic_items.size() < 500) {
        d["step"] = s.name;
        diagnostic_items.push_back(std::move(d));
      }
    }
    const auto& checked = (*report)["checked"];
    Emit(s.name, "output",
         absl::StrCat("checked ", checked.value("files", 0), " file(s), ",
                      checked.value("accesses", 0), " register accesses against ",
                      checked.value("svd", ""), ": ", checked.value("errors", 0), " error(s), ",
                      checked.value("warnings", 0), " warning(s)"),
         true);
    StepOutcome o;
    o.extra = {{"errors", step_errors},
               {"warnings", checked.value("warnings", 0)},
               {"svd", checked.value("svd", "")}};
    if (step_errors > 0) {
      o.failure_class = "registers";
      o.error =
          absl::StrCat(step_errors, " register error", step_errors == 1 ? "" : "s", " against ",
                       checked.value("svd", ""), ", first: ", first_error.value("file", ""), ":",
                       first_error.value("line", 0), ": ", first_error.value("message", ""));
      o.extra["first_error"] = first_error;
      return o;
    }
    o.ok = true;
    return o;
  }

  // Whose failure a serial stream of `board` ending is: this fwaid stopping
  // (infra), the board of this node gone bad meanwhile (lab: its simulator
  // or port went away), else not known.
  std::string EndedVerdict(const std::string& board) const {
    if (!deps.hardware) return std::string(kVerdictUnknown);
    if (deps.hardware->stopping()) return std::string(kVerdictInfra);
    for (const auto& d : deps.hardware->List()) {
      if (d.id == board && d.health == "bad") return std::string(kVerdictLab);
    }
    return std::string(kVerdictUnknown);
  }

  // The step's board (its own, else ${BOARD}, else the caller's or the only one).
  std::optional<std::string> StepBoard(const SkillStep& s, StepOutcome& o) {
    if (!deps.hardware) {
      o = Failed(
          "hardware",
          WithVerdict(absl::UnavailableError("the hardware broker is not running"), kVerdictInfra));
      return std::nullopt;
    }
    auto wanted = Var(s.board.empty() ? "${BOARD}" : s.board);
    if (!wanted.ok()) {
      o = Failed("config", std::string(wanted.status().message()));
      return std::nullopt;
    }
    auto board = ResolveBoard(*wanted);
    if (!board.ok()) {
      if (board.status().code() == absl::StatusCode::kPermissionDenied) {
        // Someone else's board (a lab lease of another user): refused by rule.
        refusals.push_back({{"kind", s.tool},
                            {"target", *wanted},
                            {"rule", "the board's lease holder"},
                            {"step", s.name}});
        o = Failed("policy", std::string(board.status().message()));
        return std::nullopt;
      }
      // No such board (or none to pick): what was asked names none.
      o = Failed("hardware", board.status().code() == absl::StatusCode::kNotFound
                                 ? WithVerdict(board.status(), kVerdictConfig)
                                 : board.status());
      return std::nullopt;
    }
    return *board;
  }

  StepOutcome Flash(const SkillStep& s, std::ofstream& log) {
    StepOutcome o;
    auto board = StepBoard(s, o);
    if (!board) return o;
    auto image = Var(s.image.empty() ? "${IMAGE}" : s.image);
    if (!image.ok()) return FailWith(o, "config", std::string(image.status().message()));
    std::string path = *image;
    if (path.empty()) path = NewestElf(req.project_root);
    if (path.empty()) {
      return FailWith(o, "config",
                      "no image to flash: set flash.image in .fwai/project.yaml (or IMAGE), or "
                      "build an ELF first");
    }
    if (fs::path(path).is_relative())
      path = (fs::path(req.project_root) / path).lexically_normal().string();
    vars["IMAGE"] = path;
    vars["BOARD"] = *board;
    o.command = absl::StrCat("flash ", path, " onto ", *board);
    PolicyDecision d = CheckFlashPolicy(rules, *board, req.approved);
    if (!d.allowed) {
      refusals.push_back(
          {{"kind", "flash"}, {"target", *board}, {"rule", d.rule}, {"step", s.name}});
      return FailWith(o, "policy", absl::StrCat("refused by policy (", d.rule, "): ", d.reason));
    }
    // The run holds a lease on the board while it needs it: its own on a
    // free board of this node, the caller's (renewed) on one they hold.
    if (auto st = EnsureLease(*board); !st.ok()) {
      if (st.code() == absl::StatusCode::kPermissionDenied) {
        refusals.push_back({{"kind", "flash"},
                            {"target", *board},
                            {"rule", "plugin capabilities"},
                            {"step", s.name}});
        return FailWith(o, "policy", std::string(st.message()));
      }
      return FailWith(o, "hardware", st);
    }
    MarkSerial(*board);
    auto r = deps.boards->Flash(
        caller, RefOf(*board), FlashOrderOf(path),
        [&](const FlashProgressUpdate& u) {
          std::string line = absl::StrCat("[", u.stage, "] ", u.message);
          log << line << '\n';
          Emit(s.name, "output", line, true, json{{"stage", u.stage}, {"fraction", u.fraction}});
        },
        cancel.get());
    if (!r.ok()) {
      if (cancel->cancelled())
        return FailWith(o, timed_out ? "timeout" : "cancelled", std::string(r.status().message()));
      if (r.status().code() == absl::StatusCode::kPermissionDenied) {
        refusals.push_back({{"kind", "flash"},
                            {"target", *board},
                            {"rule", RuleOf(r.status())},
                            {"step", s.name}});
        return FailWith(o, "policy", std::string(r.status().message()));
      }
      // The board's host says whose failure it was: the bench's or the
      // network's is a hardware failure, anything else the flash's.
      const std::string v = VerdictOf(r.status());
      return FailWith(o, v == kVerdictLab || v == kVerdictInfra ? "hardware" : "flash", r.status());
    }
    vars["IMAGE_SHA256"] = r->sha256;
    images.push_back({{"board", *board},
                      {"path", path},
                      {"sha256", r->sha256},
                      {"boot_line", r->boot_line},
                      {"seconds", r->seconds}});
    if (!r->boot_line.empty()) boot = {{"board", *board}, {"ok", true}, {"line", r->boot_line}};
    o.extra = {
        {"board", *board}, {"image", path}, {"sha256", r->sha256}, {"boot_line", r->boot_line}};
    o.ok = true;
    return o;
  }

  // A flash step's order: approved by running the skill; the guard's rules
  // are the run's (the project's policy, with the image's own build record).
  FlashOrder FlashOrderOf(const std::string& path) {
    FlashOrder order;
    order.image = path;
    order.project_root = req.project_root;
    order.approved = true;
    order.guard = FlashGuardOf(rules, OwnBuild());
    order.via = "skill run";
    return order;
  }

  // The rule a refusal names ("... (rule: R)"), for the record.
  static std::string RuleOf(const absl::Status& st) {
    const std::string m(st.message());
    const auto at = m.rfind("(rule: ");
    if (at == std::string::npos) return "plugin capabilities";
    const auto end = m.find(')', at);
    return m.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
  }

  StepOutcome Monitor(const SkillStep& s, std::ofstream& log) {
    StepOutcome o;
    auto board = StepBoard(s, o);
    if (!board) return o;
    auto expect = Var(s.expect);
    auto send = Var(s.send);
    if (!expect.ok()) return FailWith(o, "config", std::string(expect.status().message()));
    if (!send.ok()) return FailWith(o, "config", std::string(send.status().message()));
    std::regex re;
    if (!expect->empty()) {
      try {
        re = std::regex(*expect);
      } catch (const std::regex_error&) {
        return FailWith(o, "config",
                        absl::StrCat("step ", s.name, ": expect '", *expect,
                                     "' is not a valid regular expression"));
      }
    }
    const std::string stream = s.stream == "uart" ? "" : s.stream;
    o.command = absl::StrCat("monitor ", *board, stream.empty() ? "" : " " + stream,
                             expect->empty() ? "" : absl::StrCat(" until '", *expect, "'"));
    // Writing needs the lease; so does watching a simulated board that is
    // paused because nobody holds it (the lease resumes it).
    bool paused = false;
    for (const auto& d : deps.hardware->List()) paused |= d.id == *board && d.state == "paused";
    if (!send->empty() || paused) {
      if (auto st = EnsureLease(*board); !st.ok()) return FailWith(o, "hardware", st);
    }
    // `since: run`: the board's lines from the run's start (or its last
    // flash) on, from the history.
    const std::string key = absl::StrCat(*board, " ", stream);
    const bool from_run = s.since == "run" && since_seq.count(key);
    const uint64_t since = from_run ? since_seq[key] : 0;
    auto serial = deps.boards->OpenSerial(caller, RefOf(*board), from_run, stream);
    if (!serial.ok()) return FailWith(o, "hardware", serial.status());
    BoardSerial* r = serial->get();
    // A simulated board whose simulator died ends its readers when it does;
    // one that was already down before this reader came is told here.
    for (const auto& d : deps.hardware->List()) {
      if (d.id == *board && d.kind == "simulated" && d.health == "bad") {
        return FailWith(o, "hardware",
                        WithVerdict(absl::UnavailableError(absl::StrCat(
                                        "board ", *board, " is down: ", d.health_reason)),
                                    kVerdictLab));
      }
    }
    if (!send->empty()) {
      if (auto st = r->SendLine(*send); !st.ok()) return FailWith(o, "hardware", st);
      log << "> " << *send << '\n';
      Emit(s.name, "output", "> " + *send, true);
    }
    // A write refused after it left (a bench answers so) ends what the step
    // can expect.
    std::string refused;
    return WaitFor(
        s, *board, *expect, re, since,
        [r, &refused](SerialLine& l, int ms) {
          if (refused.empty()) refused = r->TakeRefusal();
          return refused.empty() ? r->Wait(l, ms) : SerialReader::Next::kEnded;
        },
        [r, &refused] {
          return refused.empty() ? r->end_reason() : absl::StrCat("write refused: ", refused);
        },
        log, o);
  }

  // Reads serial lines (from `since` on) until one matches `re` or the step's
  // time is up; every line is logged and streamed.
  StepOutcome WaitFor(const SkillStep& s, const std::string& board_id,
                      const std::string& expect_text, const std::regex& re, uint64_t since,
                      const std::function<SerialReader::Next(SerialLine&, int)>& next,
                      const std::function<std::string()>& end_reason, std::ofstream& log,
                      StepOutcome& o) {
    const std::string* board = &board_id;
    const std::string* expect = &expect_text;
    const int timeout_ms = StepTimeoutMs(s, 10);
    const int64_t until = NowMicros() + static_cast<int64_t>(timeout_ms) * 1000;
    telemetry::ActiveSpan wait("serial_wait", *board);
    wait->Set("fwai.board", *board);
    if (!expect->empty()) wait->Set("fwai.serial.pattern", *expect);
    wait->SetInt("fwai.serial.timeout_ms", timeout_ms);
    std::string last;
    int lines = 0;
    while (!cancel->cancelled()) {
      const int64_t left_ms = (until - NowMicros()) / 1000;
      if (left_ms <= 0) break;
      SerialLine line;
      auto n = next(line, static_cast<int>(std::min<int64_t>(left_ms, 200)));
      if (n == SerialReader::Next::kEnded) {
        return FailWith(o, "hardware",
                        WithVerdict(absl::UnavailableError(absl::StrCat("serial on ", *board,
                                                                        " ended: ", end_reason())),
                                    EndedVerdict(board_id)));
      }
      if (n != SerialReader::Next::kLine || line.notice || line.seq < since) continue;
      std::string text = secrets.Redact(line.text);
      log << text << '\n';
      Emit(s.name, "output", text, true, json{{"seq", line.seq}});
      last = text;
      ++lines;
      if (!expect->empty() && std::regex_search(line.text, re)) {
        boot = {{"board", *board}, {"ok", true}, {"line", text}, {"pattern", *expect}};
        o.extra = {{"board", *board}, {"matched", text}, {"lines", lines}};
        wait->SetBool("fwai.serial.matched", true);
        o.ok = true;
        return o;
      }
    }
    if (cancel->cancelled())
      return FailWith(o, timed_out ? "timeout" : "cancelled", "stopped while monitoring");
    o.extra = {{"board", *board}, {"lines", lines}};
    if (expect->empty()) {
      o.ok = true;
      return o;
    }
    boot = {{"board", *board}, {"ok", false}, {"pattern", *expect}};
    wait->SetBool("fwai.serial.matched", false);
    return FailWith(o, "verify",
                    absl::StrCat("'", *expect, "' not seen on ", *board, " within ",
                                 timeout_ms / 1000.0, " s (", lines, " lines",
                                 last.empty() ? "" : absl::StrCat("; last: ", last), ")"));
  }

  // `path` relative to the project, or PERMISSION_DENIED naming the rule
  // for an absolute path elsewhere (nothing is looked up).
  absl::StatusOr<std::string> InProject(const ProjectFs& pfs, const std::string& path) const {
    auto rel = pfs.Relative(path);
    if (rel.ok()) return rel;
    return absl::PermissionDeniedError(absl::StrCat("'", path, "' is outside the project ",
                                                    req.project_root, " (", kReadRule, ")"));
  }

  struct ProjectFileHash {
    std::string rel, sha256;
    int64_t bytes = 0;
  };
  // The files `pattern` names (a glob matches in its directory), opened as
  // the run's account beneath the project root (openat2 RESOLVE_BENEATH): an
  // absolute path elsewhere, or a link out of the project, is refused naming
  // the rule (PERMISSION_DENIED), as is a file the account cannot read; so a
  // run tells its caller nothing (not even a hash or a size) of a file the
  // caller could not read. Empty: nothing matches.
  absl::StatusOr<std::vector<ProjectFileHash>> HashProjectFiles(const std::string& pattern) {
    ScopedFsIdentity as(*account);
    if (!as.status().ok()) return as.status();
    auto pfs = ProjectFs::Open(req.project_root);
    if (!pfs.ok()) return pfs.status();
    auto rel = InProject(*pfs, pattern);
    if (!rel.ok()) return rel.status();
    std::vector<std::string> rels;
    if (rel->find_first_of("*?[") == std::string::npos) {
      rels.push_back(*rel);
    } else {
      const fs::path glob(*rel);
      const std::string dir = glob.has_parent_path() ? glob.parent_path().string() : ".";
      auto entries = pfs->List(dir);
      if (!entries.ok() && entries.status().code() != absl::StatusCode::kNotFound)
        return entries.status();
      for (const auto& e : entries.ok() ? *entries : std::vector<ProjectFs::Entry>{}) {
        if (!e.is_dir && fnmatch(glob.filename().c_str(), e.name.c_str(), 0) == 0) {
          rels.push_back(dir == "." ? e.name : absl::StrCat(dir, "/", e.name));
        }
      }
    }
    std::vector<ProjectFileHash> out;
    for (const auto& r : rels) {
      auto fd = pfs->OpenAt(r, O_RDONLY | O_NOCTTY | O_NONBLOCK);
      if (!fd.ok() && fd.status().code() == absl::StatusCode::kNotFound) continue;
      if (!fd.ok() && fd.status().code() == absl::StatusCode::kPermissionDenied) {
        return absl::PermissionDeniedError(
            absl::StrCat(fd.status().message(), " (", kReadRule, ", as ", account->name, ")"));
      }
      if (!fd.ok()) return fd.status();
      struct stat st {};
      if (fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      auto sha = FdSha256(fd->get());
      if (!sha.ok()) return absl::InternalError(absl::StrCat(r, ": ", sha.status().message()));
      out.push_back({r, sha->first, sha->second});
    }
    return out;
  }

  // The whole of file `path` (HashProjectFiles's rule), at most `max_bytes`.
  absl::StatusOr<std::string> ReadProjectFile(const std::string& path, size_t max_bytes) {
    ScopedFsIdentity as(*account);
    if (!as.status().ok()) return as.status();
    auto pfs = ProjectFs::Open(req.project_root);
    if (!pfs.ok()) return pfs.status();
    auto rel = InProject(*pfs, path);
    if (!rel.ok()) return rel.status();
    return pfs->ReadFile(*rel, max_bytes);
  }

  StepOutcome Evidence(const SkillStep& s) {
    StepOutcome o;
    json files = json::array();
    for (const auto& pattern : s.files) {
      auto p = Var(pattern);
      if (!p.ok()) {
        o.failure_class = "config";
        o.error = std::string(p.status().message());
        return o;
      }
      auto found = HashProjectFiles(*p);
      if (!found.ok()) {
        o.failure_class =
            found.status().code() == absl::StatusCode::kPermissionDenied ? "policy" : "failed";
        o.error = absl::StrCat("evidence: ", found.status().message());
        return o;
      }
      if (found->empty()) {
        o.failure_class = "failed";
        o.error = absl::StrCat("evidence: no file matches '", *p, "'");
        return o;
      }
      for (const auto& f : *found)
        files.push_back({{"path", f.rel}, {"sha256", f.sha256}, {"bytes", f.bytes}});
    }
    auto note = Var(s.note);
    json rec = {{"kind", "skill_evidence"},
                {"run_id", absl::StrCat(run_id, "/", s.name)},
                {"skill", skill.name},
                {"project", req.project_root},
                {"note", note.ok() ? *note : s.note},
                {"files", files}};
    o.command = absl::StrCat("record ", files.size(), " files");
    artifacts.push_back({{"step", s.name}, {"note", rec["note"]}, {"files", files}});
    if (deps.append_evidence) {
      auto idx = deps.append_evidence(rec);
      if (!idx.ok()) {
        o.failure_class = "failed";
        o.error = absl::StrCat("the evidence log refused the record: ", idx.status().message());
        return o;
      }
      o.extra["record"] = *idx;
    }
    for (const auto& f : files) {
      Emit(s.name, "output",
           absl::StrCat(f["path"].get<std::string>(), "  sha256 ", f["sha256"].get<std::string>()),
           true);
    }
    o.extra["files"] = files;
    o.ok = true;
    return o;
  }

  StepOutcome Analyze(const SkillStep& s, std::ofstream& log) {
    StepOutcome o;
    Provider* p = deps.providers ? deps.providers->Find("") : nullptr;
    if (!p)
      return FailWith(o, "provider",
                      "no provider is configured (export ANTHROPIC_API_KEY or OPENAI_API_KEY, then "
                      "fwai daemon stop)");
    std::string text;
    if (!s.log.empty()) {
      auto name = Var(s.log);
      if (!name.ok()) return FailWith(o, "config", std::string(name.status().message()));
      // A step's log, or a file of the project read as the run's account
      // beneath its root (HashProjectFiles's rule).
      std::string file = *name;
      if (auto it = step_logs.find(*name); it != step_logs.end()) file = it->second;
      auto read = ReadProjectFile(file, 64 << 20);
      if (!read.ok() && read.status().code() == absl::StatusCode::kPermissionDenied) {
        return FailWith(o, "policy", absl::StrCat("llm_analyze: ", read.status().message()));
      }
      if (!read.ok())
        return FailWith(
            o, "failed",
            absl::StrCat("llm_analyze: no log '", *name, "' (", read.status().message(), ")"));
      text = *std::move(read);
      constexpr size_t kTail = 48 * 1024;
      if (text.size() > kTail) text = "[...]\n" + text.substr(text.size() - kTail);
      text = secrets.Redact(text);
    }
    auto prompt = Var(s.prompt);
    if (!prompt.ok()) return FailWith(o, "config", std::string(prompt.status().message()));
    ChatRequest cr;
    cr.model = p->config().model;
    cr.system =
        "You analyse logs for a firmware engineer: build output, flash and boot logs, serial "
        "traces. Be specific: name "
        "files, lines, symbols and registers; say what to change. Be brief.";
    LlmMessage m;
    m.role = "user";
    m.content = json::array(
        {{{"type", "text"},
          {"text",
           text.empty() ? *prompt : absl::StrCat(*prompt, "\n\n<log>\n", text, "\n</log>")}}});
    cr.messages.push_back(std::move(m));
    cr.max_tokens = 2048;
    struct Obs final : StreamObserver {
      std::function<void(std::string_view)> fn;
      void OnText(std::string_view t) override { fn(t); }
    } obs;
    std::string pending, answer;
    obs.fn = [&](std::string_view t) {
      answer.append(t);
      pending.append(t);
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        Emit(s.name, "output", pending.substr(0, nl), true);
        pending.erase(0, nl + 1);
      }
    };
    o.command = absl::StrCat("ask ", p->config().kind, " (", cr.model, ")");
    auto r = p->Stream(cr, obs, *cancel);
    if (!pending.empty()) Emit(s.name, "output", pending, true);
    log << answer << '\n';
    if (!r.ok()) {
      if (cancel->cancelled())
        return FailWith(o, timed_out ? "timeout" : "cancelled", std::string(r.status().message()));
      return FailWith(o, "provider", std::string(r.status().message()));
    }
    double in = 0, out = 0;
    PriceFor(cr.model, &in, &out);
    llm_calls.push_back({{"step", s.name},
                         {"provider", p->config().kind},
                         {"model", cr.model},
                         {"input_tokens", r->input_tokens},
                         {"output_tokens", r->output_tokens},
                         {"cost_usd", (r->input_tokens * in + r->output_tokens * out) / 1e6}});
    o.extra = {{"answer", answer.substr(0, 4000)}};
    o.ok = true;
    return o;
  }

  StepOutcome Agentic(const SkillStep& s, std::ofstream& log) {
    StepOutcome o;
    if (!deps.sessions || !deps.turns)
      return FailWith(o, "failed", "agentic steps need the agent (not available here)");
    if (!deps.providers || !deps.providers->Find("")) {
      return FailWith(o, "provider",
                      "no provider is configured (export ANTHROPIC_API_KEY or OPENAI_API_KEY, then "
                      "fwai daemon stop)");
    }
    auto goal = Var(s.goal);
    if (!goal.ok()) return FailWith(o, "config", std::string(goal.status().message()));
    NewSession ns;
    ns.title = absl::StrCat("skill ", skill.name, ": ", s.name);
    ns.project_root = req.project_root;
    if (account) ns.account = account->name;  // the agent acts as the run's account
    auto session = deps.sessions->Create(caller.identity, ns);
    if (!session.ok()) return FailWith(o, "failed", std::string(session.status().message()));
    o.command = absl::StrCat("agent in session ", session->id);
    Emit(s.name, "output",
         absl::StrCat("agent session ", session->id, " (fwai sessions attach ", session->id, ")"),
         true, json{{"session_id", session->id}});
    // The agent's answer and tool calls stream as the step's output.
    auto sub = deps.sessions->Subscribe(session->id, 0, true, true, [] {});
    struct Unsub {
      SessionManager* sessions;
      std::string id;
      std::shared_ptr<Subscriber> sub;
      ~Unsub() {
        if (sub) sessions->Unsubscribe(id, sub.get());
      }
    } unsub{deps.sessions, session->id, sub.ok() ? *sub : nullptr};
    std::string pending;
    auto flush_text = [&](bool all) {
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        Emit(s.name, "output", secrets.Redact(pending.substr(0, nl)), true);
        pending.erase(0, nl + 1);
      }
      if (all && !pending.empty()) {
        Emit(s.name, "output", secrets.Redact(pending), true);
        pending.clear();
      }
    };
    auto drain = [&] {
      if (!unsub.sub) return;
      std::string bytes;
      absl::Status st;
      while (unsub.sub->Pull(&bytes, &st) == Subscriber::PullResult::kEvent) {
        v1::ServerEvent ev;
        if (!ev.ParseFromString(bytes)) continue;
        if (ev.has_text_delta() && !ev.text_delta().thinking() &&
            ev.text_delta().origin().parent_call_id().empty()) {
          pending += ev.text_delta().text();
          flush_text(false);
        } else if (ev.has_tool_call_started()) {
          flush_text(true);
          const auto& t = ev.tool_call_started();
          Emit(s.name, "output",
               absl::StrCat(t.agent() == "main" || t.agent().empty() ? "" : t.agent() + ": ", "→ ",
                            t.tool()),
               true, json{{"call_id", t.call_id()}, {"tool", t.tool()}});
        } else if (ev.has_tool_call_finished()) {
          const auto& t = ev.tool_call_finished();
          Emit(s.name, "output",
               absl::StrCat("← ", t.is_error() ? "error" : "ok", " (", t.duration_ms(), " ms)"),
               !t.is_error(), json{{"call_id", t.call_id()}});
        } else if (ev.has_error()) {
          flush_text(true);
          Emit(s.name, "output", absl::StrCat("error: ", ev.error().message()), false);
        }
      }
    };
    TurnRequest tr;
    tr.parent_span = telemetry::Current();  // the agent's turn hangs under this step
    tr.session_id = session->id;
    tr.text = *goal;
    tr.sender = caller.display;
    if (auto st = deps.turns->Start(tr); !st.ok())
      return FailWith(o, "failed", std::string(st.message()));
    const int timeout_ms = StepTimeoutMs(s, 900);
    const int64_t until = NowMicros() + static_cast<int64_t>(timeout_ms) * 1000;
    while (deps.turns->Running(session->id)) {
      drain();
      if (cancel->cancelled() || NowMicros() > until) {
        deps.turns->Cancel(session->id);
        for (int i = 0; i < 100 && deps.turns->Running(session->id); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (cancel->cancelled())
          return FailWith(o, timed_out ? "timeout" : "cancelled", "the agent was stopped");
        return FailWith(o, "timeout",
                        absl::StrCat("the agent did not finish within ", timeout_ms / 1000, " s"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    drain();
    flush_text(true);
    auto history = deps.sessions->LoadHistory(session->id);
    std::string final_text;
    if (history.ok() && !history->empty() && history->back().role == "assistant") {
      auto content = json::parse(history->back().content_json, nullptr, false);
      if (content.is_array()) {
        for (const auto& b : content) {
          if (b.value("type", "") == "text") final_text += b.value("text", "");
        }
      }
    }
    auto info = deps.sessions->Get(session->id);
    if (info.ok()) {
      llm_calls.push_back({{"step", s.name},
                           {"session_id", session->id},
                           {"provider", info->provider},
                           {"model", info->model},
                           {"input_tokens", info->input_tokens},
                           {"output_tokens", info->output_tokens},
                           {"cost_usd", info->cost_usd}});
    }
    final_text = secrets.Redact(final_text);
    log << final_text << '\n';
    if (!unsub.sub) {
      for (absl::string_view l : absl::StrSplit(final_text, '\n'))
        Emit(s.name, "output", std::string(l), true);
    }
    o.extra = {{"session_id", session->id}};
    if (final_text.empty())
      return FailWith(o, "provider",
                      absl::StrCat("the agent ended without an answer (see fwai sessions show ",
                                   session->id, ")"));
    o.ok = true;
    return o;
  }

  StepOutcome RunStep(const SkillStep& s, std::ofstream& log) {
    if (s.type == "evidence") return Evidence(s);
    if (s.type == "llm_analyze") return Analyze(s, log);
    if (s.type == "agentic") return Agentic(s, log);
    if (s.tool == "flash") return Flash(s, log);
    if (s.tool == "monitor") return Monitor(s, log);
    if (s.tool == "check_registers") return CheckRegisterStep(s, log);
    std::string command;
    std::string klass = s.tool == "shell" ? "failed" : s.tool;
    if (!s.command.empty()) {
      auto c = Var(s.command);
      if (!c.ok()) return Failed("config", std::string(c.status().message()));
      command = *c;
    } else if (s.tool == "build") {
      command = project.build_command;
      if (command.empty()) {
        return Failed(
            "config",
            "no build command: set build.command in .fwai/project.yaml (fwai init detects it)");
      }
    } else if (s.tool == "test") {
      command = project.test_command;
      if (command.empty())
        return Failed("config", "no test command: set test.command in .fwai/project.yaml");
    }
    const int64_t start_ns = NowMicros() * 1000;
    StepOutcome o = Command(s, command, klass, log);
    if (o.ok && s.tool == "build") RecordBuildOutputs(s, start_ns, o, log);
    return o;
  }

  // This run's build so far, as its record will have it (the flash guard
  // needs it before the record is written); null when nothing was built.
  json OwnBuild() const {
    if (artifacts.empty()) return nullptr;
    json b = {{"kind", "skill_run"}, {"run_id", run_id}, {"artifacts", artifacts}};
    if (!memory.is_null()) b["memory"] = memory;
    if (!toolchain.is_null()) b["toolchain"] = toolchain;
    if (!sbom.is_null()) b["sbom"] = sbom;
    return b;
  }

  // Build outputs are read as the run's account beneath the project root
  // (HashProjectFiles's rule): an image named outside it, or found through a
  // link out of it, is not read; a file the account cannot read is not seen.
  std::vector<BuildArtifact> FindOwnBuildArtifacts(const SkillStep& s, int64_t since_ns,
                                                   std::ofstream& log) {
    ScopedFsIdentity as(*account);
    auto pfs = as.status().ok() ? ProjectFs::Open(req.project_root)
                                : absl::StatusOr<ProjectFs>(as.status());
    auto say = [&](const std::string& line) {
      log << line << '\n';
      Emit(s.name, "output", line, false);
    };
    if (!pfs.ok()) {
      say(absl::StrCat("build outputs not read: ", pfs.status().message()));
      return {};
    }
    if (!project.image.empty() && !pfs->Relative(project.image).ok()) {
      say(absl::StrCat("flash.image ", project.image, " is outside the project: not read (",
                       kReadRule, ")"));
      return {};
    }
    std::vector<BuildArtifact> kept;
    for (auto& a : FindBuildArtifacts(req.project_root, project.image, since_ns)) {
      auto rel = pfs->Relative(a.abs_path);
      absl::Status ok =
          rel.ok() ? pfs->OpenAt(*rel, O_RDONLY | O_NOCTTY | O_NONBLOCK).status() : rel.status();
      if (ok.ok()) {
        kept.push_back(std::move(a));
      } else if (ok.code() == absl::StatusCode::kPermissionDenied) {
        say(absl::StrCat("artifact ", a.path, " not read: it leads outside the project (",
                         kReadRule, ")"));
      }
    }
    return kept;
  }

  // What a build made: its images with their hashes, the memory report of
  // the ELF (and the change since the project's previous build), the
  // toolchain that made it, and its SBOM.
  void RecordBuildOutputs(const SkillStep& s, int64_t since_ns, StepOutcome& o,
                          std::ofstream& log) {
    auto found = FindOwnBuildArtifacts(s, since_ns, log);
    json files = json::array();
    std::string elf;
    for (const auto& a : found) {
      files.push_back({{"path", a.path},
                       {"sha256", a.sha256},
                       {"bytes", a.bytes},
                       {"format", a.format},
                       {"fresh", a.fresh}});
      if (a.format == "elf" && elf.empty()) elf = a.abs_path;
      const std::string line =
          absl::StrCat("artifact ", a.path, " (", a.format, ", ", a.bytes, " bytes) sha256 ",
                       a.sha256, a.fresh ? "" : " (not rebuilt)");
      log << line << '\n';
      Emit(s.name, "output", line, true, json{{"artifact", files.back()}});
    }
    o.extra["artifacts"] = files;
    if (found.empty()) {
      const std::string line =
          "no image found: set flash.image in .fwai/project.yaml, or check that the build links an "
          "ELF";
      log << line << '\n';
      Emit(s.name, "output", line, false);
      return;
    }
    artifacts.push_back({{"step", s.name}, {"kind", "build"}, {"files", files}});
    if (elf.empty()) return;
    if (vars["IMAGE"].empty()) vars["IMAGE"] = elf;
    absl::StatusOr<ElfFile> info = absl::UnknownError("not read");
    absl::StatusOr<json> report = absl::UnknownError("not read");
    {
      // The ELF, its map, linker scripts and stack usage files: as the account.
      ScopedFsIdentity as(*account);
      info = as.status().ok() ? ReadElfFile(elf, true) : absl::StatusOr<ElfFile>(as.status());
      MemoryOptions mo;
      mo.project_root = req.project_root;
      report = as.status().ok() ? AnalyzeMemory(elf, mo) : absl::StatusOr<json>(as.status());
    }
    if (report.ok()) {
      json diff;
      const json prev = deps.previous_build ? deps.previous_build(req.project_root) : json();
      if (prev.is_object() && prev.contains("memory") && prev["memory"].contains("report")) {
        diff = DiffMemory(prev["memory"]["report"], *report);
        diff["against"] = {{"run_id", prev.value("run_id", "")},
                           {"image", prev["memory"].value("image", "")}};
      }
      memory = {{"image", (*report)["image"]}, {"report", *report}};
      if (!diff.is_null()) memory["diff"] = diff;
      const std::string text = MemorySummaryText(*report, diff, 5);
      log << text;
      for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty()))
        Emit(s.name, "output", std::string(line), true);
      json regions = json::array();
      std::map<std::string, int64_t> delta;
      if (diff.is_object()) {
        for (const auto& d : diff["regions"])
          delta[d.value("name", "")] = d.value("delta", int64_t{0});
      }
      for (const auto& r : (*report)["regions"]) {
        const std::string rn = r.value("name", "");
        json j = {
            {"name", rn}, {"used", r["used"]}, {"length", r["length"]}, {"percent", r["percent"]}};
        if (delta.count(rn)) j["delta"] = delta[rn];
        regions.push_back(j);
      }
      o.extra["memory"] = {{"totals", (*report)["totals"]}, {"regions", regions}};
      if (diff.is_object()) o.extra["memory"]["since"] = diff["against"];
    } else {
      memory = {{"error", std::string(report.status().message())}};
    }
    if (info.ok()) {
      ToolchainOptions to;
      to.dpkg_admindir = deps.dpkg_admindir;
      toolchain =
          AttestToolchain(info->machine, info->units.empty() ? "" : info->units.front().producer,
                          info->comments.empty() ? "" : info->comments.front(), to);
      const std::string line =
          toolchain.value("verified", false)
              ? absl::StrCat("toolchain verified (dpkg -V): ", toolchain["packages"].dump())
              : absl::StrCat("toolchain NOT verified: ", toolchain.value("error", ""),
                             toolchain.value("dpkg_verify", json::object())
                                 .value("problems", json::array())
                                 .dump());
      log << line << '\n';
      Emit(s.name, "output", line, toolchain.value("verified", false));
      o.extra["toolchain_verified"] = toolchain.value("verified", false);
    }
    SbomInput si;
    si.image = elf;
    si.project_root = req.project_root;
    si.project_name = project.name;
    si.target = project.target;
    si.run_id = run_id;
    si.skill = skill.name;
    si.toolchain = toolchain;
    si.tool_version = deps.version;
    si.steps = json::array({{{"name", s.name},
                             {"type", "build"},
                             {"command", secrets.Redact(o.command)},
                             {"exit_code", o.exit_code},
                             {"ok", true}}});
    absl::StatusOr<json> bom = absl::UnknownError("not read");
    {
      // Its inputs (the ELF, the map and what it names, sources) as the account.
      ScopedFsIdentity as(*account);
      bom = as.status().ok() ? MakeSbom(si) : absl::StatusOr<json>(as.status());
    }
    if (bom.ok()) {
      sbom = *bom;
      o.extra["sbom_components"] = sbom["components"].size();
    } else {
      sbom = {{"error", std::string(bom.status().message())}};
    }
  }
};

// A run from request to record, in the order Run calls its steps: Prepare
// (the account, the skill, the project and its policy, the variables, the
// run directory), StartWatchdog, Announce, RunSteps (each step with its
// retries and record, then the run's change budget), Finish (the summary,
// the evidence record, the last event). A failure before the steps is
// a Failure that Finish records.
struct SkillRunner::RunDriver {
  struct Failure {
    std::string klass, error;  // klass empty: the run succeeded
    std::string verdict;       // the failing step's call's own, if it set one
    std::string tool;          // the failing step's tool ("flash", "monitor" ...)
  };
  // A run that could not start: the skill, the project or the request is wrong.
  static Failure ConfigFailure(std::string error) {
    return Failure{"config", std::move(error), "", ""};
  }

  RunDriver(SkillDeps& d, const SkillRunRequest& r,
            const std::function<void(const SkillEventOut&)>& emit)
      : deps(d),
        req(r),
        span("run_skill", r.skill),
        secrets(d.secrets ? d.secrets : SecretScanner::Default()),
        run(d, r, emit, std::make_shared<CancelToken>(), *secrets) {
    // One span per run; its record's hash is noted on it when Finish appends it.
    span->Set("fwai.skill.name", req.skill);
    span->Set("fwai.principal", req.caller.identity);
    run.caller = req.caller;
    run.run_id = NewId("run-");
    result.run_id = run.run_id;
  }
  ~RunDriver() {
    done->Cancel();
    if (watchdog.joinable()) watchdog.join();
  }

  std::optional<Failure> Prepare() {
    // The project is read, built and run as its owner's local account.
    if (!req.caller.account) {
      return ConfigFailure(absl::StrCat(
          "a skill run reads and runs the project as a local account; ",
          req.caller.display.empty() ? req.caller.identity : req.caller.display, " has none"));
    }
    run.account = &*req.caller.account;
    if (auto f = LoadSkill()) return f;
    if (auto f = LoadProject()) return f;
    if (auto f = SetVars()) return f;
    return MakeRunDir();
  }

  // The skill (a broken file is a config failure).
  std::optional<Failure> LoadSkill() {
    auto plugin_sets = deps.plugin_skills ? deps.plugin_skills() : std::vector<PluginSkillSet>{};
    absl::StatusOr<std::vector<Skill>> skills = absl::UnknownError("");
    {
      ScopedFsIdentity as(*run.account);
      skills = as.status().ok() ? LoadSkills(req.project_root, plugin_sets)
                                : absl::StatusOr<std::vector<Skill>>(as.status());
    }
    if (!skills.ok()) return ConfigFailure(std::string(skills.status().message()));
    auto it = std::find_if(skills->begin(), skills->end(),
                           [&](const Skill& s) { return s.name == req.skill; });
    if (it == skills->end()) {
      std::vector<std::string> names;
      for (const auto& s : *skills) names.push_back(s.name);
      return ConfigFailure(
          absl::StrCat("no skill '", req.skill, "' (skills: ", absl::StrJoin(names, ", "), ")"));
    }
    run.skill = *it;
    // A plugin's skill acts within what its plugin declared: the broker
    // refuses boards (and flashing) outside it.
    if (run.skill.scope) {
      CapabilityScope sc;
      sc.plugin = run.skill.scope->plugin;
      sc.flash = run.skill.scope->flash;
      sc.boards = run.skill.scope->boards;
      run.caller.scope = sc;
    }
    return std::nullopt;
  }

  // The project and its policy (a broken file is a config failure).
  std::optional<Failure> LoadProject() {
    const fs::path project_yaml = fs::path(req.project_root) / ".fwai" / "project.yaml";
    std::error_code ec;
    absl::Status project_status;
    {
      ScopedFsIdentity as(*run.account);
      if (fs::exists(project_yaml, ec)) {
        auto p = ParseProjectYaml(ReadFileText(project_yaml), project_yaml.string());
        if (p.ok()) {
          run.project = *p;
          run.have_project = true;
        } else {
          project_status = p.status();
        }
      } else {
        run.project = DetectProject(req.project_root);
      }
    }
    if (!project_status.ok()) return ConfigFailure(std::string(project_status.message()));
    auto rules = LoadPolicy(req.project_root, deps.policy_file, run.account);
    if (!rules.ok()) return ConfigFailure(absl::StrCat("policy: ", rules.status().message()));
    run.rules = *rules;
    return std::nullopt;
  }

  // Variables: built-ins, the skill's defaults, then the request's; every
  // ${NAME} a step names must be known before anything runs.
  std::optional<Failure> SetVars() {
    auto& v = run.vars;
    v["PROJECT_ROOT"] = req.project_root;
    v["PROJECT_NAME"] = run.project.name;
    v["RUN_ID"] = run.run_id;
    v["BUILD_COMMAND"] = run.project.build_command;
    v["FLASH_COMMAND"] = run.project.flash_command;
    v["TEST_COMMAND"] = run.project.test_command;
    v["TARGET"] = run.project.target;
    v["BOARD"] = req.board;
    v["IMAGE"] = run.project.image;
    v["IMAGE_SHA256"] = "";
    v["BOOT_PATTERN"] = run.project.boot_pattern.empty() ? ".+" : run.project.boot_pattern;
    v["CI"] = req.ci ? "true" : "false";
    for (const auto& [k, val] : run.skill.vars) v[k] = val;
    for (const auto& [k, val] : req.vars) {
      if (k.empty() || k.find_first_of("${} ") != std::string::npos)
        return ConfigFailure(absl::StrCat("variable name '", k, "' is not valid"));
      v[k] = val;
    }
    for (const auto& s : run.skill.steps) {
      for (const auto& [field, text] : std::vector<std::pair<const char*, std::string>>{
               {"command", s.command},
               {"image", s.image},
               {"board", s.board},
               {"expect", s.expect},
               {"send", s.send},
               {"note", s.note},
               {"log", s.log},
               {"prompt", s.prompt},
               {"goal", s.goal},
               {"timeout", s.timeout_text},
               {"files", absl::StrJoin(s.files, " ")}}) {
        for (const auto& name : ReferencedVars(text)) {
          if (!v.count(name)) {
            return ConfigFailure(absl::StrCat(run.skill.source, ":", s.line, ": step '", s.name,
                                              "' ", field, ": unknown variable ${", name,
                                              "} (give it with --var ", name, "=...)"));
          }
        }
      }
    }
    return ResolveStepTimeouts();
  }

  // A step's timeout given by variables is fixed once they are known.
  std::optional<Failure> ResolveStepTimeouts() {
    for (auto& s : run.skill.steps) {
      if (s.timeout_text.empty()) continue;
      absl::StatusOr<std::string> text = Interpolate(s.timeout_text, run.vars);
      absl::StatusOr<int> t = text.ok() ? ParseDuration(*text) : text.status();
      if (!t.ok()) {
        return ConfigFailure(absl::StrCat(run.skill.source, ":", s.line, ": step '", s.name,
                                          "' timeout: ", s.timeout_text, ": ",
                                          t.status().message()));
      }
      s.timeout_s = *t;
    }
    return std::nullopt;
  }

  // The run's logs live in the project: made as its account.
  std::optional<Failure> MakeRunDir() {
    run.run_dir = (fs::path(req.project_root) / ".fwai" / "runs" / run.run_id).string();
    std::error_code ec;
    {
      ScopedFsIdentity as(*run.account);
      if (!as.status().ok()) return ConfigFailure(std::string(as.status().message()));
      PruneRunDirs((fs::path(req.project_root) / ".fwai" / "runs").string(), kKeptRunDirs - 1);
      fs::create_directories(run.run_dir, ec);
    }
    if (ec) {
      return ConfigFailure(absl::StrCat("cannot create ", run.run_dir, ": ", ec.message()));
    }
    run.vars["RUN_DIR"] = run.run_dir;
    run.git = IsGitRepo(req.project_root, run.account);
    if (run.git) run.numstat_before = NumStat(req.project_root, run.account);
    return std::nullopt;
  }

  // The watchdog: the run's own timeout, and the caller's cancel; it renews
  // the run's lease meanwhile.
  void StartWatchdog(CancelToken& parent) {
    timeout_s = req.timeout_s > 0 ? req.timeout_s : run.skill.timeout_s;
    run.deadline_us = start_us + static_cast<int64_t>(timeout_s) * 1000000;
    auto run_cancel = run.cancel;
    parent.OnCancel([run_cancel] { run_cancel->Cancel(); });
    watchdog = std::thread([this, done = done, run_cancel, timeout_s = timeout_s] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
      while (true) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          run.timed_out = true;
          run_cancel->Cancel();
          return;
        }
        if (done->WaitFor(
                std::min(left, std::chrono::milliseconds(RunState::kLeaseTtlS * 1000 / 3))))
          return;
        run.RenewLease();
      }
    });
  }

  void Announce() {
    auto& v = run.vars;
    if (req.board.empty() && deps.hardware) {
      // The board the run will use, for the record (flash/monitor resolve it again).
      if (auto b = run.ResolveBoard(""); b.ok()) v["BOARD"] = *b;
    }
    if (!v["BOARD"].empty() && deps.hardware && deps.boards) run.MarkSerial(v["BOARD"]);
    json planned = json::array();
    for (const auto& s : run.skill.steps)
      planned.push_back({{"name", s.name}, {"type", s.type == "tool" ? s.tool : s.type}});
    run.Emit("", "run_started",
             absl::StrCat("run ", run.run_id, ": ", run.skill.name, " (", run.skill.steps.size(),
                          " steps)"),
             true,
             {{"run_id", run.run_id},
              {"skill", run.skill.name},
              {"steps", planned},
              {"log_dir", run.run_dir},
              {"board", v["BOARD"]},
              {"timeout_s", timeout_s},
              {"ci", req.ci}});
  }

  // Noted as running until it ends, so a crash cannot lose it.
  json JournalRecord() {
    return json{{"kind", "skill_run"},         {"run_id", run.run_id},
                {"skill", req.skill},          {"skill_source", run.skill.source},
                {"project", req.project_root}, {"target", run.project.target},
                {"board", run.vars["BOARD"]},  {"ci", req.ci},
                {"by", req.caller.display},    {"principal", req.caller.identity},
                {"peer", req.caller.peer},     {"steps", steps_out},
                {"log_dir", run.run_dir}};
  }

  // Every step in turn (skipped as its `when` says); the run's failure,
  // if any.
  Failure RunSteps() {
    if (deps.journal) deps.journal->Begin(run.run_id, JournalRecord());
    Failure failure;
    for (const auto& s : run.skill.steps) {
      const bool failed = !failure.klass.empty();
      if ((s.when == "success" && failed) || (s.when == "failure" && !failed)) {
        run.Emit(s.name, "step_skipped",
                 failed ? "skipped: an earlier step failed" : "skipped: runs only after a failure",
                 true);
        steps_out.push_back({{"name", s.name}, {"skipped", true}});
        continue;
      }
      if (run.cancel->cancelled() && s.when != "failure" && s.when != "always") break;
      const StepOutcome o = RunStep(s);
      if (!o.ok && s.on_fail != "continue" && failure.klass.empty()) {
        failure.klass = o.failure_class.empty() ? "failed" : o.failure_class;
        failure.error = absl::StrCat("step ", s.name, ": ", o.error);
        failure.verdict = o.verdict;
        failure.tool = s.tool;
      }
      if (failure.klass.empty()) CheckChangeBudget(s, failure);
    }
    if (failure.klass.empty() && run.timed_out) {
      failure.klass = "timeout";
      failure.error = absl::StrCat("the run did not finish within ", timeout_s, " s");
    } else if (failure.klass.empty() && run.cancel->cancelled()) {
      failure.klass = "cancelled";
      failure.error = "cancelled";
    }
    if (failure.klass == "cancelled" && run.timed_out) failure.klass = "timeout";
    return failure;
  }

  // One step with its retries, its log, span, record and events.
  StepOutcome RunStep(const SkillStep& s) {
    const std::string log_path = (fs::path(run.run_dir) / (s.name + ".log")).string();
    run.step_logs[s.name] = log_path;
    std::ofstream log;
    {
      ScopedFsIdentity as(*run.account);
      if (as.status().ok()) log.open(log_path, std::ios::app);
    }
    const int attempts = s.on_fail == "retry" ? 1 + s.retries : 1;
    const std::string step_kind = s.type == "tool" ? s.tool : s.type;
    // A test step is its own kind of span; every other step is a skill_step.
    telemetry::ActiveSpan step_span(step_kind == "test" ? "test" : "skill_step", s.name);
    step_span->Set("fwai.skill.step.name", s.name);
    step_span->Set("fwai.skill.step.type", step_kind);
    StepOutcome o;
    int attempt = 0;
    const int64_t step_start = NowMicros();
    run.Emit(s.name, "step_started", absl::StrCat(s.name, " (", step_kind, ")"), true,
             {{"type", s.type}, {"tool", s.tool}, {"log", log_path}});
    for (attempt = 1; attempt <= attempts; ++attempt) {
      if (attempt > 1) {
        run.Emit(s.name, "step_retry",
                 absl::StrCat("attempt ", attempt, " of ", attempts, " (", o.error, ")"), false);
        log << "--- attempt " << attempt << " ---\n";
      }
      o = run.RunStep(s, log);
      if (o.ok || o.failure_class == "policy" || o.failure_class == "config" ||
          o.failure_class == "cancelled" || run.cancel->cancelled()) {
        break;  // retrying cannot change these
      }
    }
    attempt = std::min(attempt, attempts);
    log.close();
    const int64_t ms = (NowMicros() - step_start) / 1000;
    json rec = {{"name", s.name},
                {"type", step_kind},
                {"command", secrets->Redact(o.command)},
                {"exit_code", o.exit_code},
                {"duration_ms", ms},
                {"log_file", log_path},
                {"ok", o.ok},
                {"attempts", attempt}};
    if (!o.ok) {
      rec["failure_class"] = o.failure_class;
      rec["verdict"] = VerdictOfClass(o.failure_class, o.verdict);
      rec["error"] = secrets->Redact(o.error);
      rec["on_fail"] = s.on_fail;
    }
    for (auto& [k, val] : o.extra.items()) rec[k] = val;
    step_span->SetInt("fwai.skill.step.attempts", attempt);
    if (!o.ok) {
      step_span->Set("fwai.skill.step.failure_class", o.failure_class);
      step_span->Fail(o.failure_class.empty() ? "failed" : o.failure_class);
    }
    steps_out.push_back(rec);
    if (deps.journal) deps.journal->Update(run.run_id, JournalRecord());
    run.Emit(s.name, "step_finished",
             o.ok ? absl::StrCat(s.name, ": ok (", ms, " ms)")
                  : absl::StrCat(s.name, ": ", secrets->Redact(o.error)),
             o.ok, rec);
    return o;
  }

  // The change budget of the whole run, after step `s`: a policy failure
  // when the run changed more files or lines than the rules allow.
  void CheckChangeBudget(const SkillStep& s, Failure& failure) {
    if (!run.git || (run.rules.max_files_per_run <= 0 && run.rules.max_lines_per_run <= 0)) return;
    int files = 0, lines = 0;
    for (const auto& [path, n] : NumStat(req.project_root, run.account)) {
      auto b = run.numstat_before.find(path);
      if (b != run.numstat_before.end() && b->second == n) continue;
      ++files;
      lines += std::abs(n - (b == run.numstat_before.end() ? 0 : b->second));
    }
    std::string rule;
    if (run.rules.max_files_per_run > 0 && files > run.rules.max_files_per_run) {
      rule = absl::StrCat("change_budget: max_files_per_run ", run.rules.max_files_per_run,
                          " (the run changed ", files, " files)");
    } else if (run.rules.max_lines_per_run > 0 && lines > run.rules.max_lines_per_run) {
      rule = absl::StrCat("change_budget: max_lines_per_run ", run.rules.max_lines_per_run,
                          " (the run changed ", lines, " lines)");
    }
    if (rule.empty()) return;
    run.refusals.push_back({{"kind", "run"}, {"target", s.name}, {"rule", rule}});
    failure.klass = "policy";
    failure.error = absl::StrCat("after step ", s.name, ": ", rule);
  }

  // The files the run changed (a git project's numstat against its start).
  json FilesChanged() {
    json files_changed = json::array();
    if (!run.git) return files_changed;
    for (const auto& [path, lines] : NumStat(req.project_root, run.account)) {
      auto it = run.numstat_before.find(path);
      if (it == run.numstat_before.end() || it->second != lines)
        files_changed.push_back({{"path", path}, {"lines", lines}});
    }
    return files_changed;
  }

  json Summary(const Failure& f) {
    json files_changed = FilesChanged();  // before the duration is taken, which counts it
    json summary = {{"kind", "skill_run"},
                    {"run_id", run.run_id},
                    {"skill", req.skill},
                    {"skill_source", run.skill.source},
                    {"project", req.project_root},
                    {"target", run.project.target},
                    {"board", run.vars.count("BOARD") ? run.vars["BOARD"] : ""},
                    {"ci", req.ci},
                    {"by", req.caller.display},
                    {"principal", req.caller.identity},
                    {"peer", req.caller.peer},
                    {"ok", result.ok},
                    {"failure_class", f.klass},
                    {"verdict", result.verdict},
                    {"exit_code", result.exit_code},
                    {"error", secrets->Redact(f.error)},
                    {"duration_ms", (NowMicros() - start_us) / 1000},
                    {"steps", steps_out},
                    {"diagnostics", {{"errors", run.errors}, {"warnings", run.warnings}}},
                    {"diagnostic_items", run.diagnostic_items},
                    {"files_changed", files_changed},
                    {"images", run.images},
                    {"boot", run.boot},
                    {"llm_calls", run.llm_calls},
                    {"policy_refusals", run.refusals},
                    {"artifacts", run.artifacts},
                    {"log_dir", run.run_dir}};
    if (!run.memory.is_null()) summary["memory"] = run.memory;
    if (!run.toolchain.is_null()) summary["toolchain"] = run.toolchain;
    if (!run.sbom.is_null()) summary["sbom"] = run.sbom;
    secrets->RedactJson(summary);
    return summary;
  }

  // The run's record in the evidence log (a config failure leaves none). A
  // run that leaves no record has not succeeded.
  void AppendRecord(const Failure& f, json& summary) {
    if (!deps.append_evidence || f.klass == "config") return;
    auto idx = deps.append_evidence(summary);
    if (idx.ok()) {
      summary["evidence_index"] = *idx;
      return;
    }
    summary["evidence_error"] = std::string(idx.status().message());
    if (!result.ok) return;
    result.ok = false;
    result.failure_class = "failed";
    result.exit_code = ExitCodeFor("failed");
    summary["ok"] = false;
    summary["failure_class"] = "failed";
    summary["verdict"] = std::string(kVerdictInfra);
    result.verdict = std::string(kVerdictInfra);
    summary["exit_code"] = result.exit_code;
    summary["error"] =
        absl::StrCat("the evidence log refused the run record: ", idx.status().message());
  }

  // The run's outcome counted against its board of this node (a quarantine
  // follows `lab` failures in a row). A flash step's failure counted itself.
  void CountOutcome(const Failure& f) {
    const auto board = run.vars.find("BOARD");
    if (!deps.hardware || board == run.vars.end() || board->second.empty()) return;
    if (f.klass == "cancelled" || f.tool == "flash") return;
    absl::Status outcome;
    if (!f.klass.empty()) outcome = WithVerdict(absl::UnknownError(f.error), result.verdict);
    deps.hardware->CountOutcome(board->second, outcome, absl::StrCat("skill run ", req.skill));
  }

  SkillRunResult Finish(const Failure& f) {
    result.ok = f.klass.empty();
    result.failure_class = f.klass;
    result.verdict = VerdictOfClass(f.klass, f.verdict);
    result.exit_code = ExitCodeFor(f.klass);
    CountOutcome(f);
    run.ReleaseLease();
    const bool journaled = deps.journal && !run.run_dir.empty();
    json summary = Summary(f);
    if (!run.run_dir.empty() && run.account) {
      ScopedFsIdentity as(*run.account);
      if (as.status().ok())
        std::ofstream(fs::path(run.run_dir) / "summary.json") << summary.dump(2) << '\n';
    }
    AppendRecord(f, summary);
    if (journaled) deps.journal->End(run.run_id);
    result.summary = summary;
    span->Set("fwai.run.id", run.run_id);
    span->SetBool("fwai.run.ok", result.ok);
    if (!result.ok) {
      span->Set("fwai.run.failure_class", result.failure_class);
      span->Set("fwai.run.verdict", result.verdict);
      span->Fail(result.failure_class);
    }
    std::string text =
        result.ok
            ? absl::StrCat(req.skill, ": ok in ", (NowMicros() - start_us) / 1000, " ms")
            : absl::StrCat(req.skill, ": ", result.failure_class, ": ", summary.value("error", ""));
    run.Emit("", "run_finished", text, result.ok, summary);
    return result;
  }

  SkillDeps& deps;
  const SkillRunRequest& req;
  const int64_t start_us = NowMicros();
  telemetry::ActiveSpan span;
  std::shared_ptr<const SecretScanner> secrets;
  RunState run;
  SkillRunResult result;
  json steps_out = json::array();
  int timeout_s = 0;
  std::shared_ptr<CancelToken> done = std::make_shared<CancelToken>();
  std::thread watchdog;
};

SkillRunner::SkillRunner(SkillDeps deps) : deps_(std::move(deps)) {}

SkillRunResult SkillRunner::Run(const SkillRunRequest& req,
                                const std::function<void(const SkillEventOut&)>& emit,
                                CancelToken& parent) {
  if (deps_.checkpoint && !req.caller.session_id.empty() && !req.project_root.empty())
    deps_.checkpoint(req.caller, req.project_root, absl::StrCat("before skill ", req.skill));
  RunDriver d(deps_, req, emit);
  if (auto failed = d.Prepare()) return d.Finish(*failed);
  d.StartWatchdog(parent);
  d.Announce();
  return d.Finish(d.RunSteps());
}

}  // namespace fwai
