// fwai tools: add, ls, rm, search — the tool catalog from the CLI.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai {

class ToolsCommands {
 public:
  ToolsCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Add();
  int Ls();
  int Rm();
  int Search();

  Globals& g_;
  CLI::App* add_ = nullptr;
  CLI::App* ls_ = nullptr;
  CLI::App* rm_ = nullptr;
  CLI::App* search_ = nullptr;
  std::vector<std::string> files_;
  std::vector<std::string> names_;
  std::vector<std::string> query_words_;
  int top_k_ = 5;
  std::string mode_;
  std::string batch_;
};

}  // namespace fwai
