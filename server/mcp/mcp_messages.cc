#include "server/mcp/mcp_messages.h"

#include "absl/strings/str_cat.h"

namespace fwai {

using json = nlohmann::json;

namespace {

// A member of an object when it is a string, else "".
std::string StringField(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

absl::StatusOr<JsonRpcMessage> ParseJsonRpcMessage(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  JsonRpcMessage m;
  const auto method = j.find("method");
  const auto id = j.find("id");
  if (method == j.end()) {
    const auto result = j.find("result");
    const auto error = j.find("error");
    if (id == j.end() || (result == j.end() && error == j.end())) {
      return absl::InvalidArgumentError("neither a request, a response nor a notification");
    }
    m.kind = JsonRpcMessage::Kind::kResponse;
    m.id = *id;
    if (error != j.end()) {
      m.is_error = true;
      if (error->is_object()) {
        const auto code = error->find("code");
        if (code != error->end() && code->is_number_integer()) m.error_code = code->get<int64_t>();
        m.error_message = StringField(*error, "message");
      } else if (error->is_string()) {
        m.error_message = error->get<std::string>();
      }
      if (m.error_message.empty()) m.error_message = error->dump().substr(0, 200);
    } else {
      m.result = *result;
    }
    return m;
  }
  if (!method->is_string()) return absl::InvalidArgumentError("method is not a string");
  m.method = method->get<std::string>();
  if (id != j.end()) {
    m.kind = JsonRpcMessage::Kind::kRequest;
    m.id = *id;
  }
  return m;
}

json ServerInfoFromInitialize(const json& result) {
  if (result.is_object()) {
    auto it = result.find("serverInfo");
    if (it != result.end() && it->is_object()) return *it;
  }
  return json::object();
}

absl::StatusOr<std::vector<McpTool>> ToolsFromListResult(const std::string& server,
                                                         const json& result, json* next_cursor) {
  *next_cursor = nullptr;
  const json* tools = nullptr;
  if (result.is_object()) {
    auto it = result.find("tools");
    if (it != result.end() && it->is_array()) tools = &*it;
  }
  if (tools == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("mcp server ", server, ": tools/list answer has no tools"));
  }
  std::vector<McpTool> out;
  for (const auto& t : *tools) {
    if (!t.is_object()) continue;
    std::string name = StringField(t, "name");
    if (name.empty()) continue;
    auto schema = t.find("inputSchema");
    out.push_back({std::move(name), StringField(t, "description"),
                   schema != t.end() && schema->is_object() ? *schema : json::object()});
  }
  auto cursor = result.find("nextCursor");
  if (cursor != result.end()) *next_cursor = *cursor;
  return out;
}

absl::StatusOr<McpCallResult> CallResultFromJson(const std::string& server, const json& result) {
  if (!result.is_object()) {
    return absl::UnavailableError(
        absl::StrCat("mcp server ", server, ": tools/call answer is not an object"));
  }
  McpCallResult out;
  auto is_error = result.find("isError");
  out.is_error = is_error != result.end() && is_error->is_boolean() && is_error->get<bool>();
  auto content = result.find("content");
  if (content != result.end() && content->is_array()) {
    for (const auto& c : *content) {
      if (!out.text.empty()) out.text += "\n";
      const std::string type = StringField(c, "type");
      if (type == "text") {
        out.text += StringField(c, "text");
      } else if (type == "resource" && c.contains("resource")) {
        const json& r = c["resource"];
        if (r.is_object() && r.contains("text") && r["text"].is_string()) {
          out.text += r["text"].get<std::string>();
        } else {
          absl::StrAppend(&out.text, "[resource ", StringField(r, "uri"), "]");
        }
      } else {
        absl::StrAppend(&out.text, "[", type, " content]");
      }
    }
  } else if (auto sc = result.find("structuredContent"); sc != result.end()) {
    out.text = sc->dump();
  }
  return out;
}

}  // namespace fwai
