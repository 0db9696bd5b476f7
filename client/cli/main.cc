// fwai: the command-line client and REPL.
//
// Exit codes: 0 ok, 1 error, 2 usage, 3 daemon unreachable, 4 turn failed
// (error or cancelled).
#include <editline/readline.h>
#include <grpc/support/log.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cli/auth.h"
#include "client/cli/cli.h"
#include "client/cli/evidence.h"
#include "client/cli/fault.h"
#include "client/cli/firmware.h"
#include "client/cli/hw.h"
#include "client/cli/kb.h"
#include "client/cli/ota.h"
#include "client/cli/plugin.h"
#include "client/cli/project.h"
#include "client/cli/render.h"
#include "client/cli/rewind.h"
#include "client/cli/share.h"
#include "client/cli/skills.h"
#include "client/cli/tools.h"
#include "client/cli/turn_notes.h"
#include "client/cli/watch.h"
#include "client/lib/client.h"
#include "common/grpc_status.h"
#include "common/ids.h"
#include "common/paths.h"
#include "fwai/v1/daemon.grpc.pb.h"
#include "fwai/v1/sessions.grpc.pb.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

// Ctrl-C handling: the handler only writes to a pipe; a watcher thread acts.
int g_sigpipe[2] = {-1, -1};
std::atomic<int> g_sigint_count{0};

void OnSigint(int) {
  int n = ++g_sigint_count;
  if (n >= 3) _exit(130);
  char c = 'c';
  (void)!write(g_sigpipe[1], &c, 1);
}

void InstallSigint() {
  if (g_sigpipe[0] < 0) (void)!pipe(g_sigpipe);
  struct sigaction sa {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

// Calls on_sigint on its own thread each time Ctrl-C arrives (after InstallSigint), until
// on_sigint returns false or the watcher is stopped. Stop() (or the destructor) joins it.
class SigintWatcher {
 public:
  explicit SigintWatcher(std::function<bool()> on_sigint)
      : thread_([this, on_sigint = std::move(on_sigint)] {
          while (!done_) {
            fd_set fds;
            FD_ZERO(&fds);
            FD_SET(g_sigpipe[0], &fds);
            timeval tv{0, 100000};
            if (select(g_sigpipe[0] + 1, &fds, nullptr, nullptr, &tv) <= 0) continue;
            char buf[16];
            (void)!read(g_sigpipe[0], buf, sizeof(buf));
            if (done_ || !on_sigint()) break;
          }
        }) {}
  SigintWatcher(const SigintWatcher&) = delete;
  SigintWatcher& operator=(const SigintWatcher&) = delete;
  ~SigintWatcher() { Stop(); }

  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

struct Conn {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Sessions::Stub> sessions;
  std::unique_ptr<pb::Daemon::Stub> daemon;
};

absl::StatusOr<Conn> Connect(const Globals& g, bool autostart = true) {
  auto ch = ConnectChannel(g, autostart);
  if (!ch.ok()) return ch.status();
  ReportNotedTurns(g, *ch);
  Conn c;
  c.channel = *ch;
  c.sessions = pb::Sessions::NewStub(c.channel);
  c.daemon = pb::Daemon::NewStub(c.channel);
  return c;
}

// Asks the person at the terminal about a submitted plan.
pb::ClientEvent DecidePlan(const pb::PlanSubmitted& plan) {
  pb::ClientEvent out;
  auto* d = out.mutable_plan_decision();
  d->set_plan_id(plan.plan_id());
  std::cerr << "\nApprove this plan? [y]es, [e]dit it first, or type what to change: "
            << std::flush;
  std::string answer;
  std::getline(std::cin, answer);
  answer = std::string(absl::StripAsciiWhitespace(answer));
  if (answer == "y" || answer == "yes" || answer == "Y") {
    d->set_approve(true);
  } else if (answer == "e" || answer == "edit") {
    const std::string tmp =
        std::filesystem::temp_directory_path() / ("fwai-plan-" + plan.plan_id() + ".md");
    std::ofstream(tmp) << plan.text();
    const char* editor = std::getenv("VISUAL") ? std::getenv("VISUAL") : std::getenv("EDITOR");
    std::string cmd = absl::StrCat(editor ? editor : "vi", " '", tmp, "'");
    if (std::system(cmd.c_str()) == 0) {
      std::ifstream in(tmp);
      std::stringstream ss;
      ss << in.rdbuf();
      d->set_approve(true);
      d->set_edited_plan(ss.str());
    } else {
      d->set_feedback("the user could not edit the plan; revise it");
    }
    std::filesystem::remove(tmp);
  } else {
    d->set_feedback(answer.empty() ? "not approved; revise the plan" : answer);
  }
  return out;
}

// Asks the person at the terminal the model's questions.
pb::ClientEvent AnswerQuestions(const pb::QuestionAsked& q) {
  pb::ClientEvent out;
  auto* a = out.mutable_answer();
  a->set_question_id(q.question_id());
  std::vector<std::string> texts;
  for (const auto& one : q.questions()) {
    std::cerr << "\n? " << one.text() << "\n";
    for (int i = 0; i < one.options_size(); ++i)
      std::cerr << "  " << i + 1 << ". " << one.options(i).label() << "\n";
    std::cerr << (one.options_size() ? (one.multiple() ? "choose (e.g. 1,3)" : "choose a number")
                                     : "answer")
              << (one.options_size() && one.allow_free_text() ? " or type an answer" : "") << ": "
              << std::flush;
    std::string line;
    std::getline(std::cin, line);
    line = std::string(absl::StripAsciiWhitespace(line));
    bool picked = false;
    // An option typed by its name ("accept") picks it.
    for (const auto& o : one.options()) {
      if (!line.empty() && absl::EqualsIgnoreCase(line, o.label())) {
        a->add_selected(o.label());
        picked = true;
      }
    }
    const bool by_name = picked;
    for (absl::string_view part : absl::StrSplit(line, ',', absl::SkipWhitespace())) {
      if (by_name) break;
      int n = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &n) && n >= 1 &&
          n <= one.options_size()) {
        a->add_selected(one.options(n - 1).label());
        picked = true;
      }
    }
    if (!picked && !line.empty())
      texts.push_back(q.questions_size() > 1 ? one.text() + ": " + line : line);
  }
  a->set_text(absl::StrJoin(texts, "\n"));
  return out;
}

// Runs one turn on an open connection and renders it. Returns the exit code.
// `mode` ("plan" | "act" | "") is set on the session before the message, and
// asking before edits turned on if `ask_edits`.
int RunTurn(const Globals& g, Conn& c, const std::string& session_id, const std::string& text,
            const std::string& provider, const std::string& model, EventRenderer& renderer,
            const std::string& mode = "", bool ask_edits = false) {
  grpc::ClientContext ctx;
  auto stream = c.sessions->Chat(&ctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(session_id);
  if (!mode.empty()) {
    stream->Write(open);
    open.Clear();
    open.mutable_set_mode()->set_mode(mode);
  }
  if (ask_edits) {
    stream->Write(open);
    open.Clear();
    open.mutable_set_edit_approval()->set_ask_before_edits(true);
  }
  const std::string turn_id = NewId("t-");
  pb::ClientEvent msg;
  if (text == "/compact") {
    msg.mutable_compact()->set_turn_id(turn_id);
  } else {
    msg.mutable_message()->set_text(text);
    msg.mutable_message()->set_provider(provider);
    msg.mutable_message()->set_model(model);
    msg.mutable_message()->set_turn_id(turn_id);
  }
  if (!stream->Write(open) || !stream->Write(msg)) {
    // The status says why (e.g. NOT_FOUND).
  }
  g_sigint_count = 0;
  InstallSigint();
  SigintWatcher watcher([&] {
    pb::ClientEvent cancel;
    cancel.mutable_cancel();
    if (!g.json) std::cerr << "\n(cancelling; Ctrl-C twice more to quit at once)" << std::endl;
    stream->Write(cancel);
    return true;
  });
  pb::ServerEvent ev;
  std::string stop_reason;
  bool finished = false;
  uint64_t last_seq = 0;
  while (stream->Read(&ev)) {
    last_seq = ev.seq();
    if (ev.turn_id() != turn_id) continue;  // another client's turn
    renderer.Render(ev);
    const bool interactive = !g.json && isatty(0) && isatty(2);
    if (ev.has_plan_submitted()) {
      if (interactive) {
        stream->Write(DecidePlan(ev.plan_submitted()));
      } else if (!g.json) {
        std::cerr << "(the plan waits for a decision: run fwai interactively, or start with "
                     "--auto-approve)"
                  << std::endl;
      }
    }
    if (ev.has_question_asked()) {
      if (interactive) {
        stream->Write(AnswerQuestions(ev.question_asked()));
      } else if (!g.json) {
        std::cerr << "(the question waits for an answer from an interactive fwai)" << std::endl;
      }
    }
    if (ev.has_turn_finished()) {
      stop_reason = ev.turn_finished().stop_reason();
      finished = true;
      break;
    }
  }
  // The stream follows the session: a turn queued after this one (another
  // user's) may already be streaming. Read to the end fwaid gives it once
  // this client is done sending, then the status.
  stream->WritesDone();
  while (stream->Read(&ev)) {
  }
  grpc::Status st = stream->Finish();
  watcher.Stop();
  signal(SIGINT, SIG_DFL);
  renderer.EndLine();
  if (!finished) {
    if (!st.ok() && st.error_code() != grpc::StatusCode::UNAVAILABLE) return FailGrpc(g, st);
    return ReportLostTurn(g, session_id, turn_id, last_seq,
                          st.ok() ? "the stream ended" : st.error_message());
  }
  if (stop_reason == "error" || stop_reason == "cancelled") return kExitTurnFailed;
  return kExitOk;
}

absl::StatusOr<pb::Session> CreateSession(Conn& c, const Globals& g, const std::string& title,
                                          const std::string& provider, const std::string& model,
                                          const std::string& mode = "", bool auto_approve = false,
                                          bool ask_edits = false) {
  grpc::ClientContext ctx;
  pb::CreateSessionRequest req;
  req.set_mode(mode);
  req.set_auto_approve_plan(auto_approve);
  req.set_ask_before_edits(ask_edits);
  req.set_title(title.substr(0, 80));
  req.set_project_root(ProjectRoot(g));
  req.set_provider(provider);
  req.set_model(model);
  pb::Session s;
  grpc::Status st = c.sessions->Create(&ctx, req, &s);
  if (!st.ok())
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  // The daemon gave the session no project (a token or certificate that
  // acts as no local account): say so before the model is asked anything.
  if (!s.no_project_reason().empty()) {
    std::cerr << "note: this session has no project and no file or command tools: "
              << s.no_project_reason() << std::endl;
  }
  return s;
}

std::string FormatTime(int64_t us) {
  time_t t = us / 1000000;
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M", std::localtime(&t));
  return buf;
}

// ---------------------------------------------------------------- commands

int CmdChat(const Globals& g, std::string session_id, const std::vector<std::string>& words,
            const std::string& provider, const std::string& model, bool cont, bool plan,
            bool auto_approve, bool ask_edits) {
  std::string text = absl::StrJoin(words, " ");
  if (text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  if (session_id.empty() && cont) {
    grpc::ClientContext ctx;
    pb::ListSessionsResponse list;
    if (c->sessions->List(&ctx, pb::ListSessionsRequest(), &list).ok()) {
      for (const auto& s : list.sessions()) {
        if (s.project_root() == ProjectRoot(g)) {
          session_id = s.id();
          break;
        }
      }
    }
  }
  std::string set_mode = plan ? "plan" : "";
  if (session_id.empty()) {
    auto s =
        CreateSession(*c, g, text, provider, model, plan ? "plan" : "act", auto_approve, ask_edits);
    if (!s.ok()) return Fail(g, kExitError, std::string(s.status().message()));
    session_id = s->id();
    set_mode.clear();
    ask_edits = false;  // the session was made so
    if (!g.json) std::cerr << "session " << session_id << (plan ? " (plan mode)" : "") << std::endl;
  }
  EventRenderer r(g.json, false);
  return RunTurn(g, *c, session_id, text, provider, model, r, set_mode, ask_edits);
}

int CmdAttach(const Globals& g, const std::string& session_id, uint64_t after, bool no_follow) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  // Events past this seq arrive live; an interrupted turn among them means
  // the turn being followed was cut by fwaid stopping, and following ends.
  uint64_t live_after = UINT64_MAX;
  if (!no_follow) {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(session_id);
    pb::Session s;
    auto st = c->sessions->Get(&ctx, req, &s);
    if (!st.ok()) return FailGrpc(g, st);
    live_after = s.last_seq();
  }
  g_sigint_count = 0;
  InstallSigint();
  EventRenderer r(g.json, true);
  uint64_t last = after;
  auto addr = ResolveDaemonAddress(g.daemon);
  while (true) {
    grpc::ClientContext ctx;
    pb::AttachRequest req;
    req.set_session_id(session_id);
    req.set_after_seq(last);
    req.set_no_follow(no_follow);
    auto reader = c->sessions->Attach(&ctx, req);
    SigintWatcher watcher([&] {
      ctx.TryCancel();
      return false;
    });
    pb::ServerEvent ev;
    std::string interrupted;
    while (reader->Read(&ev)) {
      r.Render(ev);
      last = ev.seq();
      if (ev.seq() > live_after && ev.has_turn_finished() &&
          ev.turn_finished().stop_reason() == "interrupted") {
        interrupted =
            absl::StrCat("turn ", ev.turn_id(), " was interrupted: ", ev.turn_finished().detail());
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status st = reader->Finish();
    watcher.Stop();
    r.EndLine();
    if (!interrupted.empty()) return Fail(g, kExitTurnFailed, interrupted);
    if (st.ok() || (st.error_code() == grpc::StatusCode::CANCELLED && g_sigint_count > 0))
      return kExitOk;
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      return Fail(
          g, kExitError,
          absl::StrCat(st.error_message(), " (fwai attach ", session_id, " --after ", last, ")"));
    }
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE || no_follow || !addr.ok())
      return FailGrpc(g, st);
    // fwaid went away: wait for it to come back and resume from the last event.
    if (!g.json) {
      std::cerr << "(fwaid went away: " << st.error_message()
                << "; waiting for it to come back, Ctrl-C to leave)" << std::endl;
    }
    while (g_sigint_count == 0) {
      auto ch = ConnectChannel(g, /*autostart=*/false, 250);
      if (ch.ok()) {
        c->channel = *ch;
        c->sessions = pb::Sessions::NewStub(c->channel);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    if (g_sigint_count > 0) return kExitOk;
    if (!g.json) std::cerr << "(fwaid is back; resuming after event " << last << ")" << std::endl;
  }
}

// What `fwai attach` answers or decides beside showing the session: from
// flags (scripts), or by asking the person at a terminal. A user the session
// is shared with needs the role for it (answer, approve); fwaid checks.
struct Respond {
  std::string answer;     // --answer: the pending (or next) question's answer
  bool approve = false;   // --approve: the pending (or next) plan approved
  std::string send_back;  // --send-back: the plan sent back, saying why
  bool prompt = false;    // at a terminal: ask for each question and plan
  bool once() const { return !answer.empty() || approve || !send_back.empty(); }
};

// An answer from --answer: an option named by it is selected, else it is text.
pb::ClientEvent AnswerFromFlag(const pb::QuestionAsked& q, const std::string& text) {
  pb::ClientEvent out;
  auto* a = out.mutable_answer();
  a->set_question_id(q.question_id());
  for (const auto& one : q.questions())
    for (const auto& o : one.options())
      if (absl::EqualsIgnoreCase(text, o.label())) a->add_selected(o.label());
  if (a->selected_size() == 0) a->set_text(text);
  return out;
}

// The reply to what waits (a question or a plan) once the stored events are
// read: nullopt when the flags or the person give none for it.
std::optional<pb::ClientEvent> ReplyTo(const pb::ServerEvent& waiting, const Respond& what) {
  if (waiting.has_question_asked()) {
    if (!what.answer.empty()) return AnswerFromFlag(waiting.question_asked(), what.answer);
    if (what.prompt) return AnswerQuestions(waiting.question_asked());
    return std::nullopt;
  }
  if (what.approve || !what.send_back.empty()) {
    pb::ClientEvent out;
    out.mutable_plan_decision()->set_plan_id(waiting.plan_submitted().plan_id());
    out.mutable_plan_decision()->set_approve(what.approve);
    out.mutable_plan_decision()->set_feedback(what.send_back);
    return out;
  }
  if (what.prompt) return DecidePlan(waiting.plan_submitted());
  return std::nullopt;
}

// The id a reply is about, and whether `ev` settles it (decided by anyone).
std::string ReplyId(const pb::ClientEvent& r) {
  return r.has_answer() ? r.answer().question_id() : r.plan_decision().plan_id();
}
bool Settles(const pb::ServerEvent& ev, const std::string& id) {
  return (ev.has_question_answered() && ev.question_answered().question_id() == id) ||
         (ev.has_plan_decided() && ev.plan_decided().plan_id() == id);
}

// `fwai attach` on a Chat stream, so it can answer and decide: the stored
// events, then the live tail; what waits once the stored events are read
// (and what comes later) gets its reply. With a flag it ends once its reply
// is settled — by it, or by someone first (said on stderr, exit 1).
int CmdAttachResponding(const Globals& g, const std::string& session_id, uint64_t after,
                        const Respond& what) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  grpc::ClientContext get_ctx;
  pb::GetSessionRequest get;
  get.set_session_id(session_id);
  pb::Session s;
  if (auto st = c->sessions->Get(&get_ctx, get, &s); !st.ok()) return FailGrpc(g, st);
  grpc::ClientContext ctx;
  auto stream = c->sessions->Chat(&ctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(session_id);
  open.mutable_open()->set_after_seq(after);
  open.mutable_open()->set_replay(true);
  stream->Write(open);
  g_sigint_count = 0;
  InstallSigint();
  SigintWatcher watcher([&] {
    ctx.TryCancel();
    return false;
  });
  EventRenderer r(g.json, true);
  std::optional<pb::ServerEvent> waiting;  // a question or plan nobody has settled
  std::string sent;                        // the id this client replied to
  int rc = kExitOk;
  bool caught_up = s.last_seq() <= after;
  pb::ServerEvent ev;
  auto reply_if_waiting = [&] {
    if (!caught_up || !waiting || !sent.empty()) return;
    auto reply = ReplyTo(*waiting, what);
    waiting.reset();
    if (!reply) return;
    sent = ReplyId(*reply);
    stream->Write(*reply);
  };
  reply_if_waiting();
  while (stream->Read(&ev)) {
    r.Render(ev);
    if (ev.has_question_asked() || ev.has_plan_submitted()) waiting = ev;
    if (waiting && ev.has_turn_finished() && ev.turn_id() == waiting->turn_id()) waiting.reset();
    if (waiting &&
        Settles(ev, waiting->has_question_asked() ? waiting->question_asked().question_id()
                                                  : waiting->plan_submitted().plan_id()))
      waiting.reset();
    if (ev.seq() == 0 && ev.has_error() && !sent.empty()) {
      // fwaid's word on this client's reply (shown above): someone else
      // settled it first.
      rc = kExitTurnFailed;
      if (what.once()) break;
      sent.clear();
    }
    if (!sent.empty() && Settles(ev, sent)) {
      if (what.once()) break;
      sent.clear();
    }
    caught_up = caught_up || ev.seq() >= s.last_seq();
    reply_if_waiting();
  }
  stream->WritesDone();
  while (stream->Read(&ev)) {
  }
  const grpc::Status st = stream->Finish();
  watcher.Stop();
  r.EndLine();
  if (!st.ok() && !(st.error_code() == grpc::StatusCode::CANCELLED && g_sigint_count > 0))
    return FailGrpc(g, st);
  return rc;
}

// `fwai attach`: its options, and which way it runs — read-only (Attach),
// or on a Chat stream when it is to answer or decide (flags, a terminal).
struct AttachCommand {
  explicit AttachCommand(CLI::App& app) {
    cmd = app.add_subcommand("attach", "Show a session's events, then follow it live");
    cmd->add_option("session", id, "Session id")->required();
    cmd->add_option("--after", after, "Only events after this seq");
    cmd->add_flag("--no-follow", no_follow, "Stop after the stored events");
    cmd->add_option("--answer", respond.answer,
                    "Answer the waiting (or next) question with this (an option's name picks it), "
                    "then stop");
    cmd->add_flag("--approve", respond.approve, "Approve the waiting (or next) plan, then stop");
    cmd->add_option("--send-back", respond.send_back,
                    "Send the waiting (or next) plan back, saying what to change, then stop");
  }
  int Run(const Globals& g) {
    // At a terminal, following: questions and plans are asked of the person.
    respond.prompt = !g.json && !no_follow && isatty(0) && isatty(2);
    if (respond.approve && !respond.send_back.empty())
      return Fail(g, kExitUsage, "attach: --approve or --send-back, not both");
    if (respond.once() || respond.prompt) return CmdAttachResponding(g, id, after, respond);
    return CmdAttach(g, id, after, no_follow);
  }
  CLI::App* cmd = nullptr;
  std::string id;
  uint64_t after = 0;
  bool no_follow = false;
  Respond respond;
};

int CmdSessionsLs(const Globals& g, bool all, bool shared_with_me) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  grpc::ClientContext ctx;
  pb::ListSessionsRequest req;
  req.set_all(all);
  req.set_shared_with_me(shared_with_me);
  pb::ListSessionsResponse resp;
  auto st = c->sessions->List(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g, st);
  if (g.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : resp.sessions()) arr.push_back(ProtoToJson(s));
    std::cout << arr.dump() << std::endl;
    return kExitOk;
  }
  if (resp.sessions().empty()) {
    std::cout << "no sessions (start one with: fwai chat \"...\")" << std::endl;
    return kExitOk;
  }
  std::printf("%-20s %-16s %6s  %-30s %s\n", "ID", "UPDATED", "EVENTS", "TITLE", "PROJECT");
  for (const auto& s : resp.sessions()) {
    std::string title = s.title().substr(0, 30);
    for (auto& ch : title)
      if (ch == '\n') ch = ' ';
    // A session shared with the caller says whose it is and what the caller may do.
    const std::string whose = s.my_role() == "owner" || s.my_role().empty()
                                  ? ""
                                  : absl::StrCat("  (", s.owner_user(), "'s, ", s.my_role(), ")");
    std::printf("%-20s %-16s %6llu  %-30s %s%s%s\n", s.id().c_str(),
                FormatTime(s.updated_us()).c_str(), static_cast<unsigned long long>(s.last_seq()),
                title.c_str(), s.project_root().c_str(), s.turn_running() ? "  (running)" : "",
                whose.c_str());
  }
  return kExitOk;
}

int CmdSessionsShow(const Globals& g, const std::string& id) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  pb::Session s;
  {
    grpc::ClientContext ctx;
    pb::GetSessionRequest req;
    req.set_session_id(id);
    auto st = c->sessions->Get(&ctx, req, &s);
    if (!st.ok()) return FailGrpc(g, st);
  }
  pb::HistoryResponse h;
  {
    grpc::ClientContext ctx;
    pb::HistoryRequest req;
    req.set_session_id(id);
    auto st = c->sessions->History(&ctx, req, &h);
    if (!st.ok()) return FailGrpc(g, st);
  }
  // Per turn, from the session's events: finished ones with how they ended,
  // and the one still running.
  nlohmann::json turns = nlohmann::json::array();
  {
    grpc::ClientContext ctx;
    pb::AttachRequest req;
    req.set_session_id(id);
    req.set_no_follow(true);
    auto reader = c->sessions->Attach(&ctx, req);
    pb::ServerEvent ev;
    std::map<std::string, size_t> index;  // turn id -> position of its latest turn in `turns`
    while (reader->Read(&ev)) {
      if (ev.turn_id().empty()) continue;
      // A turn starts with its user message (a client may reuse a turn id).
      auto it = index.find(ev.turn_id());
      if (it == index.end() || ev.has_user_message()) {
        index[ev.turn_id()] = turns.size();
        turns.push_back({{"turn_id", ev.turn_id()},
                         {"model_calls", 0},
                         {"stop_reason", "running"},
                         {"started_us", ev.time_us()}});
        it = index.find(ev.turn_id());
      }
      auto& t = turns[it->second];
      if (ev.has_message_done()) t["model_calls"] = t["model_calls"].get<int>() + 1;
      if (!ev.has_turn_finished()) continue;
      const auto& f = ev.turn_finished();
      t["stop_reason"] = f.stop_reason();
      if (!f.detail().empty()) t["detail"] = f.detail();
      t["input_tokens"] = f.usage().input_tokens();
      t["output_tokens"] = f.usage().output_tokens();
      t["cost_usd"] = f.usage().cost_usd();
      t["duration_ms"] = f.duration_ms();
    }
    auto st = reader->Finish();
    if (!st.ok()) return FailGrpc(g, st);
  }
  if (g.json) {
    nlohmann::json j = ProtoToJson(s);
    j["turns"] = turns;
    j["history"] = nlohmann::json::array();
    for (const auto& m : h.messages()) {
      j["history"].push_back(
          {{"role", m.role()},
           {"content", nlohmann::json::parse(m.content_json(), nullptr, false)}});
    }
    std::cout << j.dump() << std::endl;
    return kExitOk;
  }
  std::printf(
      "session  %s\ntitle    %s\nowner    %s\nproject  %s\ncreated  %s\nupdated  %s\nevents   "
      "%llu\n",
      s.id().c_str(), s.title().c_str(), s.owner().c_str(), s.project_root().c_str(),
      FormatTime(s.created_us()).c_str(), FormatTime(s.updated_us()).c_str(),
      static_cast<unsigned long long>(s.last_seq()));
  if (!s.provider().empty())
    std::printf("provider %s %s\n", s.provider().c_str(), s.model().c_str());
  std::printf("mode     %s%s%s\n", s.mode().c_str(),
              s.auto_approve_plan() ? " (plans auto-approved)" : "",
              s.ask_before_edits() ? " (asks before edits)" : "");
  std::printf("usage    %lld in · %lld out tokens · $%.4f\n",
              static_cast<long long>(s.usage().input_tokens()),
              static_cast<long long>(s.usage().output_tokens()), s.usage().cost_usd());
  if (!turns.empty()) std::printf("turns:\n");
  for (const auto& t : turns) {
    if (t["stop_reason"] == "running") {
      std::printf("  %-22s running since %s\n", t["turn_id"].get<std::string>().c_str(),
                  FormatTime(t["started_us"].get<int64_t>()).c_str());
      continue;
    }
    std::printf("  %-22s %7lld in %7lld out  $%.4f  %2d calls  %6.1f s  %s%s\n",
                t["turn_id"].get<std::string>().c_str(),
                static_cast<long long>(t["input_tokens"].get<int64_t>()),
                static_cast<long long>(t["output_tokens"].get<int64_t>()),
                t["cost_usd"].get<double>(), t["model_calls"].get<int>(),
                t["duration_ms"].get<int64_t>() / 1000.0,
                t["stop_reason"].get<std::string>().c_str(),
                t.contains("detail") ? (" — " + t["detail"].get<std::string>()).c_str() : "");
  }
  if (s.todos_size() > 0) {
    std::printf("todos:\n");
    for (const auto& t : s.todos())
      std::printf("  [%s] %s\n", t.status().c_str(), t.content().c_str());
  }
  std::printf("\n");
  for (const auto& m : h.messages()) {
    auto content = nlohmann::json::parse(m.content_json(), nullptr, false);
    if (!content.is_array()) continue;
    for (const auto& b : content) {
      const std::string type = b.value("type", "");
      if (type == "text") {
        std::printf("%s: %s\n\n", m.role().c_str(), b.value("text", "").c_str());
      } else if (type == "tool_use") {
        std::printf("%s: [tool %s %s]\n\n", m.role().c_str(), b.value("name", "").c_str(),
                    b.value("input", nlohmann::json::object()).dump().c_str());
      } else if (type == "tool_result") {
        std::string out = b.contains("content") && b["content"].is_string()
                              ? b["content"].get<std::string>()
                              : "";
        if (out.size() > 200) out = out.substr(0, 200) + "...";
        std::printf("  [result%s] %s\n\n", b.value("is_error", false) ? " (error)" : "",
                    out.c_str());
      }
    }
  }
  return kExitOk;
}

int CmdSessionsRm(const Globals& g, const std::vector<std::string>& ids) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  int rc = kExitOk;
  nlohmann::json deleted = nlohmann::json::array();
  for (const auto& id : ids) {
    grpc::ClientContext ctx;
    pb::DeleteSessionRequest req;
    req.set_session_id(id);
    pb::DeleteSessionResponse resp;
    auto st = c->sessions->Delete(&ctx, req, &resp);
    if (!st.ok()) {
      rc = FailGrpc(g, st);
      continue;
    }
    deleted.push_back(id);
    if (!g.json) std::cout << "deleted " << id << std::endl;
  }
  if (g.json) std::cout << nlohmann::json({{"deleted", deleted}}).dump() << std::endl;
  return rc;
}

int CmdDaemonStatus(const Globals& g) {
  auto c = Connect(g, /*autostart=*/false);
  if (!c.ok()) {
    if (g.json) {
      std::cout << nlohmann::json(
                       {{"running", false}, {"message", std::string(c.status().message())}})
                       .dump()
                << std::endl;
    } else {
      std::cout << "fwaid: not running (" << c.status().message() << ")" << std::endl;
    }
    return kExitUnreachable;
  }
  grpc::ClientContext ctx;
  pb::DaemonStatus s;
  auto st = c->daemon->Status(&ctx, pb::DaemonStatusRequest(), &s);
  if (!st.ok()) return FailGrpc(g, st);
  if (g.json) {
    auto j = ProtoToJson(s);
    j["running"] = true;
    std::cout << j.dump() << std::endl;
    return kExitOk;
  }
  std::printf("fwaid %s running (pid %lld) since %s\n", s.version().c_str(),
              static_cast<long long>(s.pid()), FormatTime(s.started_us()).c_str());
  std::printf("listen    %s\n", absl::StrJoin(s.listen(), ", ").c_str());
  std::printf("data dir  %s\n", s.data_dir().c_str());
  if (!s.config_file().empty()) std::printf("config    %s\n", s.config_file().c_str());
  std::printf("you are   %s\n", s.caller().c_str());
  std::printf("turns     %lld running\n", static_cast<long long>(s.running_turns()));
  if (s.providers().empty()) {
    std::printf(
        "providers none — set ANTHROPIC_API_KEY or OPENAI_API_KEY in fwaid's environment and "
        "restart it (fwai daemon stop), or add providers: to fwaid.yaml\n");
  }
  for (const auto& p : s.providers()) {
    std::printf("provider  %s%s (%s, model %s, %s, key %s)\n", p.name().c_str(),
                p.name() == s.default_provider() ? " [default]" : "", p.kind().c_str(),
                p.model().c_str(), p.base_url().c_str(),
                p.has_key() ? "set" : ("MISSING: set " + p.key_env()).c_str());
  }
  return kExitOk;
}

int CmdDaemonStart(const Globals& g) {
  auto addr = ResolveDaemonAddress(g.daemon);
  if (!addr.ok()) return Fail(g, kExitUsage, std::string(addr.status().message()));
  if (addr->unix_path.empty()) {
    return Fail(g, kExitUsage, "daemon start works for a local unix socket only");
  }
  DaemonAddress a = *addr;
  a.is_default = true;  // allow spawning at this path
  auto ch = ConnectToDaemon(a, /*autostart=*/true, 5000);
  if (!ch.ok()) return Fail(g, kExitUnreachable, std::string(ch.status().message()));
  return CmdDaemonStatus(g);
}

// True when `pid` has exited (gone, or a zombie its parent has not reaped).
bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  // "PID (comm) STATE ...": comm may hold spaces and parentheses.
  size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() &&
         (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

int CmdDaemonStop(const Globals& g) {
  auto c = Connect(g, /*autostart=*/false);
  if (!c.ok()) {
    if (!g.json) std::cout << "fwaid: not running" << std::endl;
    return kExitOk;
  }
  auto addr = ResolveDaemonAddress(g.daemon);
  // On a unix socket the daemon is on this machine: wait for its process to
  // end, which is when its data directory is free for the next one.
  pid_t pid = 0;
  if (addr.ok() && !addr->unix_path.empty()) {
    grpc::ClientContext sctx;
    sctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::DaemonStatus status;
    if (c->daemon->Status(&sctx, pb::DaemonStatusRequest(), &status).ok()) pid = status.pid();
  }
  grpc::ClientContext ctx;
  pb::ShutdownResponse resp;
  auto st = c->daemon->Shutdown(&ctx, pb::ShutdownRequest(), &resp);
  if (!st.ok()) return FailGrpc(g, st);
  auto stopped = [&] {
    if (g.json) {
      nlohmann::json j = {{"stopped", true}};
      if (pid > 0) j["pid"] = pid;
      std::cout << j.dump() << std::endl;
    } else {
      std::cout << "fwaid stopped" << (pid > 0 ? " (pid " + std::to_string(pid) + ")" : "")
                << std::endl;
    }
    return kExitOk;
  };
  constexpr int kStopTimeoutS = 60;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kStopTimeoutS);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pid > 0 ? ProcessGone(pid) : !ConnectToDaemon(*addr, false, 50).ok()) return stopped();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Fail(
      g, kExitError,
      pid > 0 ? absl::StrCat("fwaid (pid ", pid, ") is still shutting down after ", kStopTimeoutS,
                             " s; its data directory stays locked until it exits")
              : absl::StrCat("fwaid did not stop within ", kStopTimeoutS, " s"));
}

// ---------------------------------------------------------------- REPL

constexpr char kReplHelp[] =
    "/new       start a new session\n/session   show the current session id\n"
    "/sessions  list sessions\n/plan      plan mode (read-only; a plan to approve)\n"
    "/act       act mode (all tools)\n/mode      show the mode\n/todos     the todo list\n"
    "/compact   summarise older turns now\n"
    "/rewind [N] files and boards back to checkpoint N (the latest); asks first\n"
    "/build /flash /monitor /test   run the built-in skill\n"
    "/run SKILL [NAME=VALUE...]     run a skill (/skills lists them)\n"
    "/exit      leave (or Ctrl-D)\n"
    "Free text that names a skill runs it (or asks first when unsure).\n"
    "Ctrl-C during an answer cancels the turn.\n";

// The REPL between prompts: the session it talks to (made by its first
// message), the mode a session not yet made starts in, the last exit code.
class Repl {
 public:
  Repl(const Globals& g, Conn& c, std::string session_id, const std::string& provider,
       const std::string& model)
      : g_(g), c_(c), session_id_(std::move(session_id)), provider_(provider), model_(model) {}

  int last_rc() const { return last_rc_; }

  // One line the person typed (not empty). False: leave.
  bool Handle(const std::string& line) {
    if (line == "/exit" || line == "/quit") return false;
    if (line[0] == '/') {
      Command(line);
      return true;
    }
    if (RanNamedSkill(line)) return true;
    Send(line);
    return true;
  }

 private:
  void Command(const std::string& line) {
    if (line == "/help") {
      std::cout << kReplHelp;
    } else if (line == "/plan" || line == "/act") {
      SetMode(line.substr(1));
    } else if (line == "/mode" || line == "/todos") {
      Show(line);
    } else if (line == "/new") {
      session_id_.clear();
      std::cout << "(a new session starts with the next message)" << std::endl;
    } else if (line == "/session") {
      std::cout << (session_id_.empty() ? "(none yet)" : session_id_) << std::endl;
    } else if (line == "/sessions") {
      CmdSessionsLs(g_, false, true);
    } else if (line == "/compact") {
      if (session_id_.empty()) {
        std::cout << "(nothing to compact yet)" << std::endl;
      } else {
        last_rc_ = RunTurn(g_, c_, session_id_, line, provider_, model_, renderer_);
      }
    } else if (line == "/build" || line == "/flash" || line == "/monitor" || line == "/test" ||
               absl::StartsWith(line, "/run ")) {
      RunSkillCommand(line);
    } else if (line == "/skills") {
      (void)ListSkills(g_);
    } else if (line == "/rewind" || absl::StartsWith(line, "/rewind ")) {
      Rewind(std::string(absl::StripAsciiWhitespace(line.substr(7))));
    } else {
      std::cout << "unknown command " << line << " (/help)" << std::endl;
    }
  }

  // /rewind: the checkpoints, then (asked) back to the latest or to N.
  void Rewind(const std::string& to) {
    if (session_id_.empty()) {
      std::cout << "(nothing to rewind yet)" << std::endl;
      return;
    }
    if (to.empty()) (void)ListCheckpoints(g_, session_id_);
    RewindChoice c;
    c.session = session_id_;
    c.to = to;
    last_rc_ = RunRewind(g_, c);
  }

  void SetMode(const std::string& mode) {
    if (session_id_.empty()) {
      pending_mode_ = mode;
      std::cout << "(the next session starts in " << mode << " mode)" << std::endl;
      return;
    }
    grpc::ClientContext mctx;
    auto ms = c_.sessions->Chat(&mctx);
    pb::ClientEvent open, set;
    open.mutable_open()->set_session_id(session_id_);
    set.mutable_set_mode()->set_mode(mode);
    ms->Write(open);
    ms->Write(set);
    ms->WritesDone();
    pb::ServerEvent ignored;
    while (ms->Read(&ignored)) {
    }
    auto st = ms->Finish();
    if (!st.ok()) {
      FailGrpc(g_, st);
    } else {
      std::cout << "[mode: " << mode << "]" << std::endl;
    }
  }

  // /mode or /todos.
  void Show(const std::string& line) {
    if (session_id_.empty()) {
      std::cout << (line == "/mode" ? (pending_mode_.empty() ? "act" : pending_mode_)
                                    : "(no todos yet)")
                << std::endl;
      return;
    }
    grpc::ClientContext gctx;
    pb::GetSessionRequest gr;
    gr.set_session_id(session_id_);
    pb::Session s;
    auto st = c_.sessions->Get(&gctx, gr, &s);
    if (!st.ok()) {
      FailGrpc(g_, st);
    } else if (line == "/mode") {
      std::cout << s.mode() << (s.auto_approve_plan() ? " (plans auto-approved)" : "")
                << (s.ask_before_edits() ? " (asks before edits)" : "") << std::endl;
    } else if (s.todos_size() == 0) {
      std::cout << "(no todos)" << std::endl;
    } else {
      for (const auto& t : s.todos()) {
        const char* mark = t.status() == "completed"     ? "[x]"
                           : t.status() == "in_progress" ? "[>]"
                           : t.status() == "cancelled"   ? "[-]"
                                                         : "[ ]";
        std::cout << (t.parent_id().empty() ? "" : "    ") << mark << " " << t.content()
                  << std::endl;
      }
    }
  }

  // /build, /flash, /monitor, /test, /run SKILL [NAME=VALUE...].
  void RunSkillCommand(const std::string& line) {
    SkillRunOptions so;
    std::vector<std::string> words = absl::StrSplit(line.substr(1), ' ', absl::SkipEmpty());
    if (words[0] == "run") words.erase(words.begin());
    so.skill = words.empty() ? "" : words[0];
    for (size_t i = 1; i < words.size(); ++i) {
      auto eq = words[i].find('=');
      if (eq != std::string::npos && eq > 0)
        so.vars[words[i].substr(0, eq)] = words[i].substr(eq + 1);
    }
    if (!so.skill.empty()) last_rc_ = RunSkill(g_, so);
  }

  // Free text that names a skill runs it (>= 0.8) or asks first (>= 0.6):
  // whether a skill ran.
  bool RanNamedSkill(const std::string& line) {
    IntentDecision d = ResolveIntent(g_, line);
    if (d.action == "chat" || d.skill.empty()) return false;
    bool run = d.action == "run";
    if (!run) {
      std::cout << "Run the skill '" << d.skill << "'? (confidence " << d.confidence << ") [y/N] "
                << std::flush;
      char* ans = readline("");
      std::string a = ans ? absl::AsciiStrToLower(absl::StripAsciiWhitespace(ans)) : "";
      free(ans);
      run = a == "y" || a == "yes";
    } else {
      std::cout << "[skill " << d.skill << ", " << d.tier << ", confidence " << d.confidence << "]"
                << std::endl;
    }
    if (!run) return false;
    SkillRunOptions so;
    so.skill = d.skill;
    last_rc_ = RunSkill(g_, so);
    return true;
  }

  // A message to the agent: a turn in the session (made now if need be).
  void Send(const std::string& line) {
    if (session_id_.empty()) {
      auto s = CreateSession(c_, g_, line, provider_, model_, pending_mode_);
      if (!s.ok()) {
        Fail(g_, kExitError, std::string(s.status().message()));
        return;
      }
      session_id_ = s->id();
      std::cerr << "session " << session_id_ << std::endl;
    }
    last_rc_ = RunTurn(g_, c_, session_id_, line, provider_, model_, renderer_);
  }

  const Globals& g_;
  Conn& c_;
  std::string session_id_;
  const std::string provider_, model_;
  EventRenderer renderer_{false, false};
  int last_rc_ = kExitOk;
  std::string pending_mode_;
};

// A line from the prompt: nullopt at end of input (Ctrl-D). At the prompt
// Ctrl-C neither kills the REPL nor disturbs the line editor: the line is
// dropped and the prompt comes again; during a turn it cancels the turn
// (RunTurn).
std::optional<std::string> ReadReplLine() {
  while (true) {
    static volatile sig_atomic_t prompt_interrupted = 0;
    prompt_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = [](int) { prompt_interrupted = 1; };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    char* raw = readline("fwai> ");
    if (raw == nullptr && prompt_interrupted) {
      std::cout << "^C (Ctrl-D to exit)" << std::endl;
      continue;
    }
    if (raw == nullptr) return std::nullopt;
    std::string line(absl::StripAsciiWhitespace(raw));
    free(raw);
    return line;
  }
}

int RunRepl(const Globals& g, std::string session_id, const std::string& provider,
            const std::string& model) {
  auto c = Connect(g);
  if (!c.ok()) return Fail(g, kExitUnreachable, std::string(c.status().message()));
  const std::string history_file = DefaultDataDir() + "/repl_history";
  (void)MakeDirs(DefaultDataDir(), 0700);
  using_history();
  read_history(history_file.c_str());
  std::cout << "fwai — type a message, /help for commands, Ctrl-D to exit" << std::endl;
  if (!session_id.empty()) std::cout << "session " << session_id << std::endl;
  Repl repl(g, *c, std::move(session_id), provider, model);
  // libedit must not juggle signals itself: its SIGINT handling leaves the
  // terminal in cooked mode (arrow keys stop working).
  rl_catch_signals = 0;
  while (true) {
    std::optional<std::string> line = ReadReplLine();
    if (!line) {
      std::cout << std::endl;
      break;
    }
    if (line->empty()) continue;
    add_history(line->c_str());
    write_history(history_file.c_str());
    if (!repl.Handle(*line)) break;
  }
  return repl.last_rc() == kExitUnreachable ? repl.last_rc() : kExitOk;
}

}  // namespace

std::string ProjectRoot(const Globals& g) {
  std::error_code ec;
  auto p = std::filesystem::absolute(g.project.empty() ? "." : g.project, ec);
  return ec ? g.project : p.lexically_normal().string();
}

int Fail(const Globals& g, int code, const std::string& msg) {
  if (g.json) {
    std::cout << nlohmann::json({{"type", "error"}, {"message", msg}, {"exit_code", code}}).dump()
              << std::endl;
  }
  std::cerr << "fwai: " << msg << std::endl;
  return code;
}

int FailGrpc(const Globals& g, const grpc::Status& s) {
  // A board's port or bench being unavailable is not fwaid being so.
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE && VerdictOf(s).empty()) {
    return Fail(g, kExitUnreachable, absl::StrCat("fwaid unavailable: ", s.error_message()));
  }
  return Fail(g, kExitError, s.error_message());
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectChannel(const Globals& g, bool autostart,
                                                              int timeout_ms) {
  auto addr = ResolveDaemonAddress(g.daemon);
  if (!addr.ok()) return addr.status();
  auto creds = ResolveCredentials(*addr, g.credentials);
  if (!creds.ok()) return creds.status();
  return ConnectToDaemon(*addr, autostart, timeout_ms, *creds);
}

void DropGrpcLog(gpr_log_func_args*) {}

int Main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{"fwai — an AI assistant for firmware engineers"};
  app.set_version_flag("--version", std::string("fwai ") + FWAI_VERSION);
  // Global flags (--json, --daemon, --project) are accepted after subcommands too.
  app.fallthrough();
  Globals g;
  app.add_option("--ca-cert", g.credentials.ca_cert,
                 "CA certificate of a tls: daemon (or $FWAI_CA_CERT)");
  app.add_option("--client-cert", g.credentials.client_cert, "Client certificate for mTLS");
  app.add_option("--client-key", g.credentials.client_key, "Its private key");
  app.add_option("--token-file", g.credentials.token_file,
                 "File holding your token (or $FWAI_TOKEN)");
  app.add_option(
         "--daemon", g.daemon,
         "Daemon address: unix:PATH, tcp:HOST:PORT (loopback) or tls:HOST:PORT (or $FWAI_DAEMON)")
      ->envname("FWAI_DAEMON");
  app.add_flag("--json", g.json, "Machine-readable output (events as JSON lines)");
  app.add_flag("--verbose", g.verbose,
               "Also print gRPC's own log lines (connection and TLS details) on stderr");
  app.add_option("--project", g.project,
                 "Project root for new sessions (default: current directory)");
  app.footer(
      "Exit codes: 0 ok, 1 error, 2 usage, 3 daemon unreachable, 4 turn failed.\n"
      "With no command, fwai starts an interactive session (REPL).");

  std::string session_id, provider, model;
  std::vector<std::string> words;
  bool cont = false;
  auto* chat = app.add_subcommand("chat", "Send a message and stream the answer");
  chat->add_option("--session,-s", session_id, "Continue this session");
  chat->add_flag("--continue,-c", cont, "Continue the latest session of this project");
  chat->add_option("--provider", provider, "Provider for this turn");
  chat->add_option("--model", model, "Model for this turn");
  chat->add_option("message", words, "The message ('-' reads standard input)")->required();
  bool plan_mode = false, auto_approve = false;
  chat->add_flag("--plan", plan_mode,
                 "Plan mode: read-only tools and a plan to approve before anything changes");
  chat->add_flag("--auto-approve", auto_approve,
                 "New session: approve submitted plans without asking (CI)");
  bool ask_edits = false;
  chat->add_flag("--ask-before-edits", ask_edits,
                 "The agent's write_file / edit_file wait for your accept (kept by the session)");

  AttachCommand attach(app);

  auto* sessions = app.add_subcommand("sessions", "List, show, share and remove sessions");
  sessions->require_subcommand(1);
  bool all = false, shared_with_me = false;
  auto* ls = sessions->add_subcommand("ls", "List sessions");
  ls->add_flag("--all", all, "Every user's sessions (daemon owner only)");
  ls->add_flag("--shared-with-me", shared_with_me,
               "Also the sessions other users share with you (with their owner and your role)");
  std::string show_id;
  auto* show = sessions->add_subcommand("show", "Show a session and its history");
  show->add_option("session", show_id)->required();
  std::vector<std::string> rm_ids;
  auto* rm = sessions->add_subcommand("rm", "Delete sessions");
  rm->add_option("session", rm_ids)->required();
  ShareCommands share(*sessions, g);

  auto* daemon = app.add_subcommand("daemon", "Start, stop or inspect fwaid");
  daemon->require_subcommand(1);
  auto* dstart = daemon->add_subcommand("start", "Start fwaid on the local socket");
  auto* dstop = daemon->add_subcommand("stop", "Stop fwaid");
  auto* dstatus = daemon->add_subcommand("status", "Show fwaid's status");

  KbCommands kb(app, g);
  ToolsCommands tools(app, g);
  HwCommands hw(app, g);
  EvidenceCommands evidence(app, g);
  AuthCommands auth(app, g);
  FirmwareCommands firmware(app, g);
  OtaCommands ota(app, g);
  FaultCommands fault(app, g);
  WatchCommands watch(app, g);
  RewindCommands rewind(app, g);
  PluginCommands plugin(app, g);
  ProjectCommands project(app, g);
  SkillCommands skill_cmds(app, g);
  auto* repl_session = app.add_option("--session", session_id, "Session for the REPL");
  (void)repl_session;

  // The first word naming a command is the command. After `debug` the words
  // are gdb's (`fault`, `watch counter`), never fwai's other commands: CLI11
  // would take a word naming one as that command.
  for (int i = 1; i < argc; ++i) {
    CLI::App* sub = nullptr;
    try {
      sub = app.get_subcommand(argv[i]);
    } catch (const CLI::Error&) {
      continue;
    }
    if (std::string(argv[i]) == "debug") {
      for (CLI::App* other : app.get_subcommands([](CLI::App*) { return true; }))
        if (other != sub && !other->get_name().empty()) other->disabled();
    }
    break;
  }
  std::vector<char*> args_in(argv, argv + argc);
  try {
    app.parse(static_cast<int>(args_in.size()), args_in.data());
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  // fwai says what went wrong in its own words; gRPC's log lines (a failed
  // handshake, a dropped connection) only with --verbose or GRPC_VERBOSITY.
  if (!g.verbose && std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(DropGrpcLog);
  if (chat->parsed())
    return CmdChat(g, session_id, words, provider, model, cont, plan_mode, auto_approve, ask_edits);
  if (attach.cmd->parsed()) return attach.Run(g);
  if (ls->parsed()) return CmdSessionsLs(g, all, shared_with_me);
  if (auto rc = share.RunIfParsed()) return *rc;
  if (show->parsed()) return CmdSessionsShow(g, show_id);
  if (rm->parsed()) return CmdSessionsRm(g, rm_ids);
  if (dstart->parsed()) return CmdDaemonStart(g);
  if (dstop->parsed()) return CmdDaemonStop(g);
  if (dstatus->parsed()) return CmdDaemonStatus(g);
  if (auto rc = kb.RunIfParsed()) return *rc;
  if (auto rc = tools.RunIfParsed()) return *rc;
  if (auto rc = hw.RunIfParsed()) return *rc;
  if (auto rc = evidence.RunIfParsed()) return *rc;
  if (auto rc = auth.RunIfParsed()) return *rc;
  if (auto rc = firmware.RunIfParsed()) return *rc;
  if (auto rc = ota.RunIfParsed()) return *rc;
  if (auto rc = fault.RunIfParsed()) return *rc;
  if (auto rc = watch.RunIfParsed()) return *rc;
  if (auto rc = rewind.RunIfParsed()) return *rc;
  if (auto rc = plugin.RunIfParsed()) return *rc;
  if (auto rc = project.RunIfParsed()) return *rc;
  if (auto rc = skill_cmds.RunIfParsed()) return *rc;
  if (g.json) return Fail(g, kExitUsage, "--json needs a command (see fwai --help)");
  return RunRepl(g, session_id, provider, model);
}

}  // namespace fwai

int main(int argc, char** argv) {
  const int rc = fwai::Main(argc, argv);
  // gRPC's threads may still be at work when a command is done (a channel to
  // a daemon that is not there, reconnecting): the libraries' exit handlers
  // (OpenSSL's cleanup under a handshake) would crash under them. What was
  // written is flushed, then the process ends without those handlers.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(rc);
}
