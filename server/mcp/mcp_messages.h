// What MCP servers send, read the same way over stdio and streamable HTTP:
// JSON-RPC 2.0 messages (one per line over stdio, a JSON body or SSE events
// over HTTP) and what the answers to initialize, tools/list and tools/call
// mean. Nothing a server sends can make these throw or crash; a message that
// breaks the protocol is an error that says what is wrong.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/mcp/mcp_client.h"

namespace fwai {

struct JsonRpcMessage {
  enum class Kind { kResponse, kRequest, kNotification };
  Kind kind = Kind::kNotification;
  nlohmann::json id;      // kResponse and kRequest, as sent
  std::string method;     // kRequest and kNotification
  nlohmann::json result;  // kResponse without an error
  bool is_error = false;  // kResponse: the server answered with an error
  int64_t error_code = 0;
  std::string error_message;
};

// One message. INVALID_ARGUMENT when `text` is not a JSON object, or is
// neither a response (an id with a result or an error), a request (a string
// method with an id) nor a notification (a string method).
[[nodiscard]] absl::StatusOr<JsonRpcMessage> ParseJsonRpcMessage(std::string_view text);

// The initialize result's serverInfo (an empty object when it has none).
nlohmann::json ServerInfoFromInitialize(const nlohmann::json& result);

// A tools/list result: its tools (entries without a string name are left
// out; a description or schema of the wrong type is dropped) and the cursor
// of the next page (null on the last). UNAVAILABLE when there is no tools
// array.
[[nodiscard]] absl::StatusOr<std::vector<McpTool>> ToolsFromListResult(const std::string& server,
                                                                       const nlohmann::json& result,
                                                                       nlohmann::json* next_cursor);

// A tools/call result: text content joined by lines, other content kinds
// summarized, or the structured content. UNAVAILABLE when it is not an object.
[[nodiscard]] absl::StatusOr<McpCallResult> CallResultFromJson(const std::string& server,
                                                               const nlohmann::json& result);

}  // namespace fwai
