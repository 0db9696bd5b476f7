// SkillRunner: runs a skill's steps for one caller. Build, test and shell
// steps run through the command runner (sandboxed, streamed, typed
// diagnostics); flash and monitor go through the hardware broker (lease,
// guard, serial); llm_analyze asks the provider about a log; agentic runs an
// agent turn in a new session. Every step's output goes to
// .fwai/runs/<run_id>/<step>.log (secrets redacted); the run ends with one
// signed evidence record. A run is bounded by its timeout (a watchdog) and
// each step by its own.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "server/hardware/broker.h"
#include "server/skills/skill.h"

namespace fwai {

class Boards;
class BoardLeases;
class RunJournal;
class SvdCatalog;
class SessionManager;
class TurnManager;
class SecretScanner;
struct ProviderSet;

struct SkillDeps {
  HardwareBroker* hardware = nullptr;  // null: flash / monitor steps fail (hardware)
  // Every board, this node's and (in a lab) the other nodes' (null: as
  // `hardware` null). A board of another node is worked on under the
  // caller's lab lease; the run does not take or release it.
  Boards* boards = nullptr;
  BoardLeases* leases = nullptr;  // the leases a run takes on this node's boards
  const ProviderSet* providers = nullptr;
  SessionManager* sessions = nullptr;  // agentic steps need both
  TurnManager* turns = nullptr;
  // Appends a record to the evidence log; returns its index.
  std::function<absl::StatusOr<uint64_t>(const nlohmann::json&)> append_evidence;
  std::string policy_file;
  std::shared_ptr<const SecretScanner> secrets;  // null: the built-in patterns
  bool sandbox = true;            // build/test/shell in the sandbox when it is available
  RunJournal* journal = nullptr;  // null: a run cut by a crash leaves no record
  // The project's latest build record (a skill run with a memory report), for
  // the memory diff of a new build; null when there is none.
  std::function<nlohmann::json(const std::string& project_root)> previous_build;
  std::string dpkg_admindir;  // toolchain attestation: dpkg's database ("" : the system's)
  std::string version;        // fwai's, for the SBOM's tool
  // The installed plugins' skills (null: none).
  std::function<std::vector<PluginSkillSet>()> plugin_skills;
  // Records the project before a run made for a session (caller.session_id
  // set) changes it: session, project root, account, what runs (null: none).
  std::function<void(const Caller&, const std::string& project_root, const std::string& what)>
      checkpoint;
  // Where check_registers steps find SVDs by part (null: those steps fail).
  const SvdCatalog* svd_catalog = nullptr;
};

struct SkillRunRequest {
  std::string project_root;  // canonical
  std::string skill;
  std::string board;
  bool ci = false;
  bool approved = false;
  int timeout_s = 0;  // 0: the skill's
  std::map<std::string, std::string> vars;
  Caller caller;
};

struct SkillEventOut {
  std::string step;
  std::string kind;  // run_started | step_started | output | diagnostic | step_skipped | step_retry
                     // | step_finished | run_finished
  std::string text;
  bool ok = false;
  nlohmann::json data;  // null or an object
};

// Failure classes and the exit codes `fwai run` uses for them (above the
// CLI's own 1-4):
//   ok 0, failed 10 (a shell / other step), config 11, build 12, flash 13,
//   verify 14, test 15, policy 16, timeout 17, hardware 18, provider 19,
//   interrupted 20 (fwaid stopped during the run), cancelled 130
int ExitCodeFor(const std::string& failure_class);

struct SkillRunResult {
  std::string run_id;
  bool ok = false;
  std::string failure_class;  // "" when ok
  // Whose failure it was (common/verdict.h): firmware | lab | infra | config
  // | unknown; "" when ok or cancelled.
  std::string verdict;
  int exit_code = 0;
  nlohmann::json summary;  // what run_finished carries
};

class SkillRunner {
 public:
  explicit SkillRunner(SkillDeps deps);
  // Never throws; every failure is in the result (and the events).
  SkillRunResult Run(const SkillRunRequest& request,
                     const std::function<void(const SkillEventOut&)>& emit, CancelToken& cancel);

 private:
  struct RunState;
  struct RunDriver;
  SkillDeps deps_;
};

}  // namespace fwai
