#include "server/agent/compaction.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/events.h"
#include "server/agent/history.h"
#include "server/agent/todos.h"
#include "server/session/session_manager.h"

namespace fwai {

using json = nlohmann::json;

namespace {

class NullObserver final : public StreamObserver {
 public:
  void OnText(std::string_view) override {}
};

}  // namespace

bool NearContextLimit(const Agent& a) {
  int64_t estimate = 0;
  for (const auto& m : a.messages) estimate += static_cast<int64_t>(m.content.dump().size()) / 4;
  return std::max(a.last_input_tokens, estimate) > a.context_window * 8 / 10;
}

absl::StatusOr<int> Compact(SessionManager& sessions, Agent& a, bool forced) {
  // Keep the last turns (2 normally, 1 when asked): a turn starts at a user
  // message with text (tool results are not turns).
  std::vector<size_t> starts;
  for (size_t i = 0; i < a.messages.size(); ++i) {
    if (a.messages[i].role != "user") continue;
    for (const auto& b : a.messages[i].content) {
      if (b.value("type", "") == "text") {
        starts.push_back(i);
        break;
      }
    }
  }
  const size_t keep = forced ? 1 : 2;
  if (starts.size() <= keep) return 0;
  const size_t cut = starts[starts.size() - keep];
  std::vector<LlmMessage> older(a.messages.begin(),
                                a.messages.begin() + static_cast<ptrdiff_t>(cut));
  std::vector<LlmMessage> kept(a.messages.begin() + static_cast<ptrdiff_t>(cut), a.messages.end());
  ChatRequest creq;
  creq.model = a.model;
  creq.system =
      "You summarise a conversation between a firmware engineer and an assistant so it can "
      "continue without the full text. Keep decisions, facts found (files, registers, values), "
      "what was changed, and what is still open. Be concise.";
  creq.messages.push_back(
      {"user", json::array({{{"type", "text"},
                             {"text", "Summarise this conversation:\n\n" + Transcript(older)}}})});
  creq.max_tokens = 2048;
  NullObserver quiet;
  auto result = a.provider->Stream(creq, quiet, *a.cancel);
  if (!result.ok()) return result.status();
  a.turn->AddUsage(result->input_tokens, result->output_tokens, 0);
  std::string summary;
  for (const auto& b : result->content) {
    if (b.value("type", "") == "text") summary += b.value("text", "");
  }
  if (summary.empty())
    return absl::UnavailableError("compaction: the provider returned no summary");
  // Open todos survive compaction word for word.
  std::string todos_text;
  auto fresh = sessions.Get(a.turn->session.id);
  if (fresh.ok()) todos_text = OpenTodos(fresh->todos_json);
  std::string head = absl::StrCat("Summary of the earlier conversation (compacted):\n", summary);
  if (!todos_text.empty()) absl::StrAppend(&head, "\n\nOpen todos:\n", todos_text);
  std::vector<LlmMessage> next;
  next.push_back({"user", json::array({{{"type", "text"}, {"text", head}}})});
  next.push_back(
      {"assistant",
       json::array({{{"type", "text"}, {"text", "Understood; continuing from the summary."}}})});
  for (auto& m : kept) next.push_back(std::move(m));
  if (a.persist) {
    std::vector<HistoryEntry> entries;
    for (const auto& m : next) entries.push_back({m.role, m.content.dump()});
    if (auto s = sessions.ReplaceHistory(a.turn->session.id, entries); !s.ok()) return s;
  }
  const int dropped = static_cast<int>(older.size());
  a.messages = std::move(next);
  a.last_input_tokens = 0;
  v1::ServerEvent ev;
  ev.mutable_compacted()->set_dropped_messages(dropped);
  ev.mutable_compacted()->set_summary(summary);
  a.turn->sink.Emit(std::move(ev));
  return dropped;
}

}  // namespace fwai
