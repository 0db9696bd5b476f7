// fwai rewind SESSION: a session's project files, boards and conversation
// back to a checkpoint taken before one of its turns (docs/sessions.md).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

struct RewindChoice {
  std::string session, to;
  bool files = true, boards = true, conversation = false;
  bool dry_run = false, yes = false;
};
// Shows the plan, asks (unless `yes`; without a terminal it needs `yes`),
// rewinds. Used by `fwai rewind` and the REPL's /rewind.
int RunRewind(const Globals& g, const RewindChoice& c);
// The session's checkpoints, one a line.
int ListCheckpoints(const Globals& g, const std::string& session);

class RewindCommands {
 public:
  RewindCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  Globals& g_;
  CLI::App* cmd_ = nullptr;
  std::string session_, to_;
  bool files_ = false, board_ = false, all_ = false, conversation_ = false;
  bool dry_run_ = false, list_ = false, yes_ = false;
};

}  // namespace fwai
