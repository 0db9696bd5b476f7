// tools: the Tool interface, the registry, and the built-in tools.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "common/config.h"
#include "common/mutex.h"
#include "common/tool_spec.h"

namespace fwai {

struct LocalAccount;
class ProjectFs;

// What a tool wants to do, for the policy check.
struct PolicyQuery {
  std::string kind;    // write | command
  std::string target;  // the path (relative to the project root) or the command line
  std::string tool;
  int lines = 0;  // write: lines it changes (added + removed)
};

// Answers a policy query: OK, or PERMISSION_DENIED with the rule that refused.
using PolicyCheck = std::function<absl::Status(const PolicyQuery&)>;

// What a tool call may see and use. Valid for the duration of Run().
struct ToolContext {
  std::string session_id;
  std::string turn_id;  // the turn and the model's call this run serves
  std::string call_id;
  std::string project_root;  // canonical; file tools see nothing outside it
  std::string owner;         // the session owner's identity ("uid:N")
  // The local account the project is read, written and run as (null: none;
  // file and command tools then refuse).
  const LocalAccount* account = nullptr;
  const ToolsConfig* limits = nullptr;
  CancelToken* cancel = nullptr;
  // Streams partial output to clients (tool output delta events).
  std::function<void(std::string_view)> output;
  // Every write and command is checked here first (null: allowed).
  PolicyCheck policy;
  bool network_allowed = false;
};

struct ToolResult {
  std::string content;
  bool is_error = false;
};

class Tool {
 public:
  virtual ~Tool() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual nlohmann::json input_schema() const = 0;
  // name(), description() and input_schema() as one shared spec, made on the
  // first call and kept: they must not change over the tool's life.
  ToolSpecPtr spec() const {
    std::call_once(spec_once_,
                   [this] { spec_ = MakeToolSpec(name(), description(), input_schema()); });
    return spec_;
  }
  // False while whatever provides the tool no longer offers it (an MCP server
  // dropped it from its list); the registry then hides it.
  virtual bool available() const { return true; }
  // True if the tool never changes files, devices or anything outside fwaid.
  virtual bool read_only() const = 0;
  // True if the tool reads, writes or runs things in the session's project:
  // a session without a project (or without a local account) is not offered it.
  virtual bool needs_project() const { return false; }
  // Input errors are returned as a ToolResult with is_error (the model sees
  // them and can correct itself), not as a Status.
  virtual ToolResult Run(const nlohmann::json& input, ToolContext& ctx) = 0;

 private:
  mutable std::once_flag spec_once_;
  mutable ToolSpecPtr spec_;
};

// Holds tools by name; safe from any thread. Tools are never removed (an
// unavailable one is hidden), so the pointers it hands out stay valid.
class ToolRegistry {
 public:
  // At start-up: adds `tool`, replacing one of the same name.
  void Register(std::unique_ptr<Tool> tool);
  // While serving (an MCP server that came up late): adds `tool` unless one
  // of that name exists; false then.
  bool Add(std::unique_ptr<Tool> tool);
  Tool* Find(const std::string& name) const;
  std::vector<Tool*> All() const;

 private:
  mutable SharedMutex mu_;
  std::map<std::string, std::unique_ptr<Tool>> tools_ ABSL_GUARDED_BY(mu_);
};

// Runs `fn` with the project opened beneath its root as ctx.account (the
// thread's file identity for the length of the call); an error result when
// the session has no project or no account.
ToolResult InProject(ToolContext& ctx, const std::function<ToolResult(const ProjectFs&)>& fn);

// Registers read_file, list_dir, grep and glob.
void RegisterFileTools(ToolRegistry& registry);
// What runs after write_file or edit_file changed a file (outside the
// caller's file identity): `after_write` gets the file (relative to the
// project) and the 1-based lines of the new text the call wrote, and returns
// what to add to the tool's result ("" : nothing), so the model sees it.
struct WriteToolHooks {
  std::function<std::string(ToolContext& ctx, const std::string& rel_path,
                            const std::set<int>& lines)>
      after_write;
};
// Registers write_file, edit_file and bash (they change things).
void RegisterWriteTools(ToolRegistry& registry, WriteToolHooks hooks = {});

// Resolves `path` (relative to `root`, or absolute inside it) following
// symlinks; fails if the result lies outside `root`.
[[nodiscard]] absl::StatusOr<std::string> ResolveInRoot(const std::string& root,
                                                        const std::string& path);

}  // namespace fwai
