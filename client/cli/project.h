// fwai init and fwai doctor.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai {

class ProjectCommands {
 public:
  ProjectCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Init();
  int Doctor();
  int PolicyCheck();
  Globals& g_;
  CLI::App *init_ = nullptr, *doctor_ = nullptr, *policy_check_ = nullptr;
  std::string kind_, target_;
  std::string dir_, template_;
  bool yes_ = false, force_ = false, embedder_md_ = false;
  std::vector<std::string> set_;
};

}  // namespace fwai
