// fwai run SKILL, fwai skills, and the skill runs of the REPL (/build,
// /flash, /monitor, /test, and free text the intent resolver maps to a skill).
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai {

struct SkillRunOptions {
  std::string skill;
  bool ci = false;
  bool yes = false;
  std::string board;
  // Lease any board of the lab (or of this fwaid) with these tags for the run
  // (held while it runs, released after), waiting up to board_wait_s for one.
  std::vector<std::string> board_tags;
  int board_wait_s = 600;
  int timeout_s = 0;
  std::map<std::string, std::string> vars;
  // The exit code a failed run gets: by its failure class (10..21) or by its
  // verdict (30 firmware, 31 lab, 32 infra, 33 config, 34 unknown).
  std::string exit_by = "class";
};

// Runs a skill on the daemon and renders its events; returns the exit code
// (0, or one per failure class: see `fwai run --help`).
int RunSkill(const Globals& g, const SkillRunOptions& options);

// The REPL's view of free text: "run", "ask" or "chat", and the skill.
struct IntentDecision {
  std::string action = "chat";
  std::string skill;
  double confidence = 0;
  std::string tier;
};
IntentDecision ResolveIntent(const Globals& g, const std::string& text);
// Prints the project's skills (fwai skills ls, /skills).
int ListSkills(const Globals& g);

class SkillCommands {
 public:
  SkillCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int List();
  int Resolve();
  Globals& g_;
  CLI::App *run_ = nullptr, *list_ = nullptr, *resolve_ = nullptr;
  SkillRunOptions opts_;
  std::vector<std::string> vars_;
  std::string text_;
};

}  // namespace fwai
