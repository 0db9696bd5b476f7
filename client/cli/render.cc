#include "client/cli/render.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/lib/client.h"
#include "fwai/v1/events.pb.h"

namespace fwai {

namespace {
bool Tty(FILE* f) { return isatty(fileno(f)); }
std::string Dim(FILE* f, const std::string& s) { return Tty(f) ? "\033[2m" + s + "\033[0m" : s; }
std::string Red(FILE* f, const std::string& s) { return Tty(f) ? "\033[31m" + s + "\033[0m" : s; }
std::string Green(FILE* f, const std::string& s) { return Tty(f) ? "\033[32m" + s + "\033[0m" : s; }
std::string Yellow(FILE* f, const std::string& s) {
  return Tty(f) ? "\033[33m" + s + "\033[0m" : s;
}

// "alice, 10:42" (local time): who decided, as people name them, and when.
std::string ByWhen(const std::string& user, const std::string& full, int64_t time_us) {
  std::string who = user.empty() ? full : user;
  if (time_us <= 0) return who;
  time_t t = static_cast<time_t>(time_us / 1000000);
  struct tm tm {};
  localtime_r(&t, &tm);
  char hhmm[8];
  std::strftime(hhmm, sizeof(hhmm), "%H:%M", &tm);
  return absl::StrCat(who, ", ", hhmm);
}

std::string Summarize(const std::string& json_input) {
  std::string s = json_input;
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}
}  // namespace

int EventRenderer::Depth(const std::string& parent) const {
  if (parent.empty()) return 0;
  auto it = depth_.find(parent);
  return it == depth_.end() ? 1 : it->second + 1;
}

void EventRenderer::EndLine() {
  if (mid_line_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    mid_line_ = false;
  }
}

void EventRenderer::Line(FILE* f, const std::string& text) {
  EndLine();
  std::fprintf(f, "%s\n", text.c_str());
  std::fflush(f);
}

void EventRenderer::SubText(const std::string& parent_call_id, bool all) {
  auto it = sub_.find(parent_call_id);
  if (it == sub_.end()) return;
  std::string& text = it->second;
  std::string indent(Depth(parent_call_id) * 2, ' ');
  size_t cut = text.size();
  if (!all) {
    size_t nl = text.rfind('\n');
    if (nl == std::string::npos) return;
    cut = nl + 1;
  }
  std::string shown = text.substr(0, cut);
  if (all) {
    sub_.erase(it);
  } else {
    text.erase(0, cut);
  }
  while (!shown.empty() && shown.back() == '\n') shown.pop_back();
  if (shown.empty()) return;
  for (absl::string_view line : absl::StrSplit(shown, '\n')) {
    Line(out_, absl::StrCat(indent, line));
  }
}

void EventRenderer::ToolFinished(const fwai::v1::ServerEvent& ev) {
  const auto& f = ev.tool_call_finished();
  SubText(f.call_id(), true);
  int depth = depth_.count(f.call_id()) ? depth_[f.call_id()] : 0;
  std::string first = f.output().substr(0, f.output().find('\n'));
  if (first.size() > 100) first = first.substr(0, 97) + "...";
  // Lines as people count them: a last line without its newline counts too.
  size_t lines = std::count(f.output().begin(), f.output().end(), '\n') +
                 (!f.output().empty() && f.output().back() != '\n' ? 1 : 0);
  std::string summary = f.is_error()
                            ? Red(out_, absl::StrCat("error: ", first))
                            : Dim(out_, absl::StrCat(lines, " line", lines == 1 ? "" : "s"));
  Line(out_, absl::StrCat(std::string(depth * 2 + 2, ' '), Dim(out_, "⎿ "), summary,
                          Dim(out_, absl::StrCat(" (", f.duration_ms(), " ms)"))));
}

void EventRenderer::EditPreview(const std::string& preview) {
  for (absl::string_view line : absl::StrSplit(preview, '\n', absl::SkipEmpty())) {
    std::string l(line);
    Line(out_, absl::StrCat("  ", l[0] == '-'   ? Red(out_, l)
                                  : l[0] == '+' ? Green(out_, l)
                                                : Dim(out_, l)));
  }
}

void EventRenderer::ToolsOffered(const fwai::v1::ToolsOffered& offered) {
  std::vector<std::string> shown;
  for (const auto& t : offered.offered()) {
    const bool plain = t.why().empty() || t.why() == "built in" || t.why() == "the agent's own";
    shown.push_back(plain ? t.name() : absl::StrCat(t.name(), " (", t.why(), ")"));
  }
  // From an older daemon: names only.
  if (shown.empty()) shown.assign(offered.tools().begin(), offered.tools().end());
  const std::string why = offered.reason().empty() ? "" : absl::StrCat(" (", offered.reason(), ")");
  Line(out_, Dim(out_, absl::StrCat("[tools", why, ": ", absl::StrJoin(shown, ", "), "]")));
}

// "[answered by alice, 10:42: USART2]", "[plan approved as edited by alice, 10:42]".
void EventRenderer::Decision(const fwai::v1::ServerEvent& ev) {
  if (ev.has_question_answered()) {
    const auto& a = ev.question_answered();
    std::string what = absl::StrJoin(a.selected(), ", ");
    if (!a.text().empty()) absl::StrAppend(&what, what.empty() ? "" : "; ", a.text());
    Line(out_, Dim(out_, absl::StrCat("[answered by ",
                                      ByWhen(a.answered_by_user(), a.answered_by(), ev.time_us()),
                                      ": ", what, "]")));
    return;
  }
  const auto& p = ev.plan_decided();
  Line(out_,
       Dim(out_, absl::StrCat(
                     "[plan ",
                     p.approved() ? (p.edited() ? "approved as edited" : "approved") : "sent back",
                     " by ", ByWhen(p.decided_by_user(), p.decided_by(), ev.time_us()), "]")));
}

void EventRenderer::Render(const fwai::v1::ServerEvent& ev) {
  using E = fwai::v1::ServerEvent;
  if (json_) {
    std::string line =
        EventToJson(ev).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fflush(out_);
    return;
  }
  switch (ev.payload_case()) {
    case E::kTextDelta: {
      const auto& d = ev.text_delta();
      if (d.thinking()) return;
      int depth = Depth(d.origin().parent_call_id());
      if (depth == 0) {
        std::fwrite(d.text().data(), 1, d.text().size(), out_);
        std::fflush(out_);
        mid_line_ = !d.text().empty() && d.text().back() != '\n';
      } else {
        sub_[d.origin().parent_call_id()] += d.text();
        SubText(d.origin().parent_call_id(), false);
      }
      return;
    }
    case E::kUserMessage: {
      // In a shared session (once someone other than the owner has written)
      // each message says whose it is ("bob> ...").
      const auto& a = ev.user_message().author();
      const bool guest = !a.principal().empty() && !a.owner();
      shared_ = shared_ || guest;
      if (show_user_ || guest)
        Line(out_, absl::StrCat(shared_ ? a.user() : "", "> ", ev.user_message().text()));
      return;
    }
    case E::kToolCallStarted: {
      const auto& s = ev.tool_call_started();
      if (!s.parent_call_id().empty()) SubText(s.parent_call_id(), true);
      int depth = Depth(s.parent_call_id());
      depth_[s.call_id()] = depth;
      Line(out_, std::string(depth * 2, ' ') +
                     Dim(out_, absl::StrCat("⏺ ", s.tool(), " ", Summarize(s.input_json()),
                                            s.agent() != "main" && !s.agent().empty()
                                                ? absl::StrCat("  [", s.agent(), "]")
                                                : "")));
      return;
    }
    case E::kToolCallOutputDelta:
      return;  // full output comes with the finished event
    case E::kToolCallFinished:
      ToolFinished(ev);
      return;
    case E::kTurnStarted:
      if (show_user_) {
        Line(out_, Dim(out_, absl::StrCat("[", ev.turn_started().provider(), " ",
                                          ev.turn_started().model(), "]")));
      }
      return;
    case E::kTurnFinished: {
      const auto& f = ev.turn_finished();
      char cost[32];
      std::snprintf(cost, sizeof(cost), "$%.4f", f.usage().cost_usd());
      EndLine();
      std::fprintf(
          err_, "%s\n",
          Dim(err_,
              absl::StrCat(
                  "[", f.usage().input_tokens(), " in · ", f.usage().output_tokens(),
                  " out tokens · ", cost, " · ", f.duration_ms() / 1000.0, " s · ", f.stop_reason(),
                  f.cancelled_by().user().empty() ? "" : " by " + f.cancelled_by().user(), "]"))
              .c_str());
      std::fflush(err_);
      return;
    }
    case E::kError:
      EndLine();
      std::fprintf(err_, "%s\n", Red(err_, absl::StrCat("error: ", ev.error().message())).c_str());
      std::fflush(err_);
      return;
    case E::kMessageDone:
      if (!ev.message_done().origin().parent_call_id().empty()) {
        SubText(ev.message_done().origin().parent_call_id(), true);
      }
      return;
    case E::kModeChanged: {
      const auto& a = ev.mode_changed().author();
      Line(out_, Dim(out_, absl::StrCat("[mode: ", ev.mode_changed().mode(),
                                        a.user().empty() ? "" : ", by " + a.user(), "]")));
      return;
    }
    case E::kTodosUpdated: {
      std::string out = "todos:";
      for (const auto& t : ev.todos_updated().todos()) {
        absl::StrAppend(&out, "\n  [", t.status(), "] ", t.content());
      }
      Line(out_, out);
      return;
    }
    case E::kPlanSubmitted:
      Line(out_, absl::StrCat("plan:\n", ev.plan_submitted().text()));
      return;
    case E::kQuestionAsked:
      for (const auto& q : ev.question_asked().questions())
        Line(out_, absl::StrCat("? ", q.text()));
      if (ev.question_asked().has_edit()) EditPreview(ev.question_asked().edit().preview());
      return;
    case E::kEditApprovalChanged:
      Line(out_,
           Dim(out_, absl::StrCat("[asks before edits: ",
                                  ev.edit_approval_changed().ask_before_edits() ? "on" : "off",
                                  ", set by ", ev.edit_approval_changed().by(), "]")));
      return;
    case E::kQuestionAnswered:
    case E::kPlanDecided:
      Decision(ev);
      return;
    case E::kToolsOffered:
      if (show_user_) ToolsOffered(ev.tools_offered());
      return;
    case E::kBoardNotice: {
      const auto& n = ev.board_notice();
      Line(out_, Yellow(out_, absl::StrCat("[", n.board(), "] ", n.text())));
      return;
    }
    case E::kRewound: {
      const auto& r = ev.rewound();
      Line(out_,
           Dim(out_, absl::StrCat(
                         "[rewound to checkpoint ", r.checkpoint(), " (before turn ", r.turn_id(),
                         ") by ", r.by(), ": ", r.files(), " files",
                         r.boards().empty() ? "" : ", boards ", absl::StrJoin(r.boards(), ", "),
                         r.history_dropped()
                             ? absl::StrCat(", ", r.history_dropped(), " conversation entries cut")
                             : "",
                         "]")));
      return;
    }
    case E::kCompacted:
      Line(out_,
           Dim(out_, absl::StrCat("[compacted ", ev.compacted().dropped_messages(), " messages]")));
      return;
    case E::PAYLOAD_NOT_SET:
      return;
  }
}

}  // namespace fwai
