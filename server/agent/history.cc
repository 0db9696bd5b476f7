#include "server/agent/history.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "server/session/session_manager.h"

namespace fwai {

using json = nlohmann::json;

std::vector<LlmMessage> RepairHistory(std::vector<LlmMessage> msgs) {
  std::vector<LlmMessage> out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    out.push_back(msgs[i]);
    if (msgs[i].role != "assistant") continue;
    std::vector<std::string> ids;
    for (const auto& b : msgs[i].content) {
      if (b.value("type", "") == "tool_use") ids.push_back(b.value("id", ""));
    }
    if (ids.empty()) continue;
    std::set<std::string> answered;
    if (i + 1 < msgs.size() && msgs[i + 1].role == "user") {
      for (const auto& b : msgs[i + 1].content) {
        if (b.value("type", "") == "tool_result") answered.insert(b.value("tool_use_id", ""));
      }
    }
    json missing = json::array();
    for (const auto& id : ids) {
      if (!answered.count(id)) {
        missing.push_back({{"type", "tool_result"},
                           {"tool_use_id", id},
                           {"content", "interrupted: the tool did not run to completion"},
                           {"is_error", true}});
      }
    }
    if (missing.empty()) continue;
    if (i + 1 < msgs.size() && msgs[i + 1].role == "user") {
      for (auto& m : missing) msgs[i + 1].content.insert(msgs[i + 1].content.begin(), m);
    } else {
      out.push_back({"user", missing});
    }
  }
  // Merge adjacent messages of the same role (providers require alternation).
  std::vector<LlmMessage> merged;
  for (auto& m : out) {
    if (!merged.empty() && merged.back().role == m.role) {
      for (auto& b : m.content) merged.back().content.push_back(b);
    } else {
      merged.push_back(std::move(m));
    }
  }
  return merged;
}

std::vector<LlmMessage> ConversationOf(const std::vector<HistoryEntry>& history,
                                       const HistoryEntry* then) {
  std::vector<LlmMessage> messages;
  messages.reserve(history.size() + 1);
  auto add = [&messages](const HistoryEntry& h) {
    messages.push_back({h.role, json::parse(h.content_json, nullptr, false)});
    if (messages.back().content.is_discarded()) messages.pop_back();
  };
  for (const auto& h : history) add(h);
  if (then != nullptr) add(*then);
  return RepairHistory(std::move(messages));
}

std::string Transcript(const std::vector<LlmMessage>& msgs) {
  std::string out;
  for (const auto& m : msgs) {
    for (const auto& b : m.content) {
      const std::string t = b.value("type", "");
      if (t == "text") {
        absl::StrAppend(&out, m.role, ": ", b.value("text", ""), "\n");
      } else if (t == "tool_use") {
        absl::StrAppend(&out, "assistant called ", b.value("name", ""), " ",
                        b.value("input", json::object()).dump(), "\n");
      } else if (t == "tool_result") {
        std::string c = b.contains("content") && b["content"].is_string()
                            ? b["content"].get<std::string>()
                            : b.dump();
        if (c.size() > 600) c = c.substr(0, 600) + " ...";
        absl::StrAppend(&out, "tool result: ", c, "\n");
      }
    }
  }
  return out;
}

}  // namespace fwai
