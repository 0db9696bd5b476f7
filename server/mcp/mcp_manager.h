// Supervises the MCP servers fwaid was configured with: starts them, lists
// their tools, restarts a server that died (backoff 1 s doubling to 60 s),
// and routes calls. Tools are named mcp_<server>_<tool> (characters outside
// [A-Za-z0-9_-] become '_', at most 64 characters). Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/config.h"
#include "common/mutex.h"
#include "server/mcp/mcp_client.h"

namespace fwai {

class Tool;

struct McpToolInfo {
  std::string server;
  std::string tool;       // the server's own name
  std::string qualified;  // mcp_<server>_<tool>
  std::string description;
  nlohmann::json input_schema;
};

class McpManager {
 public:
  // `http` (may be null when every server is stdio) must outlive the manager.
  explicit McpManager(std::vector<McpServerConfig> servers, HttpClient* http = nullptr);
  ~McpManager();
  McpManager(const McpManager&) = delete;
  McpManager& operator=(const McpManager&) = delete;

  // Starts every server and lists its tools (failures are logged and the
  // server is retried by the supervisor). Returns the tools known now.
  std::vector<McpToolInfo> Start();
  // Called (from the supervisor thread, no lock held) with a server's tools
  // each time they are read again after Start: the server came back (after a
  // crash, or late after failing at Start) or said its tool list changed.
  // Set before Start.
  void OnTools(std::function<void(const std::string& server, const std::vector<McpToolInfo>&)> fn) {
    on_tools_ = std::move(fn);
  }
  // UNAVAILABLE names the server and why it is down (restarting, or its error).
  [[nodiscard]] absl::StatusOr<McpCallResult> Call(const std::string& server,
                                                   const std::string& tool,
                                                   const nlohmann::json& args, CancelToken* cancel);
  void Stop();
  // For tests and status: the server's process id (-1 if down) and restarts.
  int pid(const std::string& server);
  int restarts(const std::string& server);

  // True if the server's latest tool list (or its only one, while it is
  // down) has `tool`.
  bool Lists(const std::string& server, const std::string& tool);

  static std::string QualifiedName(const std::string& server, const std::string& tool);

 private:
  struct Server {
    McpServerConfig config;
    std::shared_ptr<McpClient> client;
    std::string last_error;
    int restarts = 0;
    int backoff_ms = 1000;
    std::chrono::steady_clock::time_point next_try;
    std::set<std::string> tools;  // its latest tool list
  };
  // A started server and its tools, or why it could not start.
  struct Connection {
    std::shared_ptr<McpClient> client;
    std::vector<McpToolInfo> tools;
    std::string error;
  };
  void Supervise() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the server and lists its tools; takes no lock (may take seconds).
  Connection Connect(const McpServerConfig& config) const;
  void Adopt(Server& s, const Connection& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Mutex mu_;
  CondVar cv_;
  std::map<std::string, Server> servers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread supervisor_;  // started by Start(), joined by Stop() (one caller at a time)
  // Set before Start(), read-only after.
  std::function<void(const std::string&, const std::vector<McpToolInfo>&)> on_tools_;
  HttpClient* const http_;
};

// The server configs of a config file's `mcp_servers:` entries.
std::vector<McpServerConfig> McpServerConfigs(const std::map<std::string, McpServerEntry>& entries);

// Agent tools that call MCP tools through the manager.
std::unique_ptr<Tool> MakeMcpTool(McpManager& manager, McpToolInfo info);

}  // namespace fwai
