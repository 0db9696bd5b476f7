// mcp: a client for Model Context Protocol servers over stdio (JSON-RPC 2.0,
// one message per line): initialize handshake, tools/list, tools/call,
// notifications, cancellation. A server that exits, hangs or writes
// malformed JSON fails the affected calls with a clear error; the owner
// decides whether to restart it. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "common/local_account.h"

namespace fwai {

class HttpClient;

struct McpServerConfig {
  std::string name;
  std::vector<std::string> command;  // stdio: argv; the first is looked up on PATH
  std::map<std::string, std::string> env;
  int init_timeout_ms = 20000;
  std::string url;  // streamable HTTP instead of stdio, e.g. http://127.0.0.1:3001/mcp
  std::vector<std::string> headers;  // extra HTTP headers ("Authorization: Bearer ...")
  // stdio: the account the server runs as (none: fwaid's own). A project's
  // servers run as the project's account.
  std::optional<LocalAccount> run_as;
};

struct McpTool {
  std::string name;
  std::string description;
  nlohmann::json input_schema;
};

struct McpCallResult {
  std::string text;  // text content joined; other content kinds summarized
  bool is_error = false;
};

class McpClient {
 public:
  // Spawns the server (stdio) or connects to it (url set; `http` required),
  // and completes the initialize handshake.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<McpClient>> Start(McpServerConfig config,
                                                                        HttpClient* http = nullptr);
  ~McpClient();  // stops the server (SIGTERM, then SIGKILL)
  McpClient(const McpClient&) = delete;
  McpClient& operator=(const McpClient&) = delete;

  [[nodiscard]] absl::StatusOr<std::vector<McpTool>> ListTools(int timeout_ms = 20000);
  // CANCELLED if `cancel` fires (the server is told), DEADLINE_EXCEEDED after
  // `timeout_ms`, UNAVAILABLE if the server died or broke the protocol.
  [[nodiscard]] absl::StatusOr<McpCallResult> CallTool(const std::string& tool,
                                                       const nlohmann::json& arguments,
                                                       CancelToken* cancel, int timeout_ms = 60000);
  // True once after the server said its tool list changed
  // (notifications/tools/list_changed).
  bool TakeToolsChanged();
  bool alive() const;
  int pid() const;  // the server process, -1 once it is gone
  const std::string& name() const;
  std::string server_info() const;

  struct Impl;

 private:
  explicit McpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fwai
