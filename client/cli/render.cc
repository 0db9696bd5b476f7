#include "client/cli/render.h"

#include <unistd.h>

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
std::string Yellow(FILE* f, const std::string& s) {
  return Tty(f) ? "\033[33m" + s + "\033[0m" : s;
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
    std::fputc('\n', stdout);
    std::fflush(stdout);
    mid_line_ = false;
  }
}

void EventRenderer::Line(FILE* f, const std::string& text) {
  EndLine();
  std::fprintf(f, "%s\n", text.c_str());
  std::fflush(f);
}

void EventRenderer::Render(const fwai::v1::ServerEvent& ev) {
  using E = fwai::v1::ServerEvent;
  if (json_) {
    std::string line =
        EventToJson(ev).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.push_back('\n');
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
    return;
  }
  switch (ev.payload_case()) {
    case E::kTextDelta: {
      const auto& d = ev.text_delta();
      if (d.thinking()) return;
      int depth = Depth(d.origin().parent_call_id());
      if (depth == 0) {
        std::fwrite(d.text().data(), 1, d.text().size(), stdout);
        std::fflush(stdout);
        mid_line_ = !d.text().empty() && d.text().back() != '\n';
      }
      return;
    }
    case E::kUserMessage:
      if (show_user_) Line(stdout, absl::StrCat("> ", ev.user_message().text()));
      return;
    case E::kToolCallStarted: {
      const auto& s = ev.tool_call_started();
      int depth = Depth(s.parent_call_id());
      depth_[s.call_id()] = depth;
      Line(stdout, std::string(depth * 2, ' ') +
                       Dim(stdout, absl::StrCat("⏺ ", s.tool(), " ", Summarize(s.input_json()),
                                                s.agent() != "main" && !s.agent().empty()
                                                    ? absl::StrCat("  [", s.agent(), "]")
                                                    : "")));
      return;
    }
    case E::kToolCallOutputDelta:
      return;  // full output comes with the finished event
    case E::kToolCallFinished: {
      const auto& f = ev.tool_call_finished();
      int depth = depth_.count(f.call_id()) ? depth_[f.call_id()] : 0;
      std::string first = f.output().substr(0, f.output().find('\n'));
      if (first.size() > 100) first = first.substr(0, 97) + "...";
      size_t lines = std::count(f.output().begin(), f.output().end(), '\n');
      std::string summary = f.is_error()
                                ? Red(stdout, absl::StrCat("error: ", first))
                                : Dim(stdout, absl::StrCat(lines, " line", lines == 1 ? "" : "s"));
      Line(stdout, absl::StrCat(std::string(depth * 2 + 2, ' '), Dim(stdout, "⎿ "), summary,
                                Dim(stdout, absl::StrCat(" (", f.duration_ms(), " ms)"))));
      return;
    }
    case E::kTurnStarted:
      if (show_user_) {
        Line(stdout, Dim(stdout, absl::StrCat("[", ev.turn_started().provider(), " ",
                                              ev.turn_started().model(), "]")));
      }
      return;
    case E::kTurnFinished: {
      const auto& f = ev.turn_finished();
      char cost[32];
      std::snprintf(cost, sizeof(cost), "$%.4f", f.usage().cost_usd());
      EndLine();
      std::fprintf(
          stderr, "%s\n",
          Dim(stderr, absl::StrCat("[", f.usage().input_tokens(), " in · ",
                                   f.usage().output_tokens(), " out tokens · ", cost, " · ",
                                   f.duration_ms() / 1000.0, " s · ", f.stop_reason(), "]"))
              .c_str());
      std::fflush(stderr);
      return;
    }
    case E::kError:
      EndLine();
      std::fprintf(stderr, "%s\n",
                   Red(stderr, absl::StrCat("error: ", ev.error().message())).c_str());
      std::fflush(stderr);
      return;
    case E::kMessageDone:
      return;
    case E::kModeChanged:
      Line(stdout, Dim(stdout, absl::StrCat("[mode: ", ev.mode_changed().mode(), "]")));
      return;
    case E::kTodosUpdated: {
      std::string out = "todos:";
      for (const auto& t : ev.todos_updated().todos()) {
        absl::StrAppend(&out, "\n  [", t.status(), "] ", t.content());
      }
      Line(stdout, out);
      return;
    }
    case E::kPlanSubmitted:
      Line(stdout, absl::StrCat("plan:\n", ev.plan_submitted().text()));
      return;
    case E::kQuestionAsked:
      for (const auto& q : ev.question_asked().questions())
        Line(stdout, absl::StrCat("? ", q.text()));
      return;
    case E::kQuestionAnswered: {
      const auto& a = ev.question_answered();
      std::string what = absl::StrJoin(a.selected(), ", ");
      if (!a.text().empty()) absl::StrAppend(&what, what.empty() ? "" : "; ", a.text());
      Line(stdout, Dim(stdout, absl::StrCat("[answered by ", a.answered_by(), ": ", what, "]")));
      return;
    }
    case E::kPlanDecided: {
      const auto& p = ev.plan_decided();
      Line(stdout,
           Dim(stdout, absl::StrCat("[plan ",
                                    p.approved() ? (p.edited() ? "approved as edited" : "approved")
                                                 : "sent back",
                                    " by ", p.decided_by(), "]")));
      return;
    }
    case E::kToolsOffered:
      if (show_user_) {
        Line(stdout,
             Dim(stdout,
                 absl::StrCat("[tools: ", absl::StrJoin(ev.tools_offered().tools(), ", "), "]")));
      }
      return;
    case E::kBoardNotice: {
      const auto& n = ev.board_notice();
      Line(stdout, Yellow(stdout, absl::StrCat("[", n.board(), "] ", n.text())));
      return;
    }
    case E::kRewound: {
      const auto& r = ev.rewound();
      Line(stdout,
           Dim(stdout,
               absl::StrCat("[rewound to checkpoint ", r.checkpoint(), " (before turn ",
                            r.turn_id(), ") by ", r.by(), ": ", r.files(), " files",
                            r.boards().empty() ? "" : ", boards ", absl::StrJoin(r.boards(), ", "),
                            r.history_dropped() ? absl::StrCat(", ", r.history_dropped(),
                                                               " conversation entries cut")
                                                : "",
                            "]")));
      return;
    }
    case E::kCompacted:
      Line(stdout, Dim(stdout, absl::StrCat("[compacted ", ev.compacted().dropped_messages(),
                                            " messages]")));
      return;
    case E::PAYLOAD_NOT_SET:
      return;
  }
}

}  // namespace fwai
