// MCP servers declared by a project (`mcp_servers:` in .fwai/project.yaml, the
// daemon config's format): started on the first turn in that project,
// supervised by their own manager (restarts with backoff), replaced when the
// section changes, stopped with fwaid. Tools are mcp_<server>_<tool>.
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace fwai {

class HttpClient;
class McpManager;
class Tool;
struct LocalAccount;

class ProjectMcpServers {
 public:
  // `max_projects`: how many projects' servers run at once (the least
  // recently used are stopped past it).
  explicit ProjectMcpServers(HttpClient* http, size_t max_projects = 8);
  ~ProjectMcpServers();

  // The tools of the project's servers, starting them when needed. Empty when
  // the project declares none; an error names file:line for a bad section.
  // `owner` keeps the tools (and their servers' manager) alive while used.
  struct ToolSet {
    std::shared_ptr<const void> owner;
    std::vector<Tool*> tools;
  };
  // The servers run as `account` and the project's file is read as it; each
  // account has its own servers in a project.
  [[nodiscard]] absl::StatusOr<ToolSet> ToolsFor(const std::string& project_root,
                                                 const LocalAccount& account)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the project declares servers (without starting them), read as `account`.
  [[nodiscard]] static absl::StatusOr<bool> Declares(const std::string& project_root,
                                                     const LocalAccount& account);
  // How many projects have servers running (for status and tests).
  size_t running() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry;
  // Stops the servers of the least recently used projects past
  // max_projects_, other than `keep`'s.
  void EvictPastLimit(const Entry* keep) ABSL_LOCKS_EXCLUDED(mu_);

  HttpClient* const http_;
  const size_t max_projects_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> by_root_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fwai
