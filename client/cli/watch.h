// fwai watch add | load | ls | rm: rules on a held board's output (docs/hil.md).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class WatchCommands {
 public:
  WatchCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Add();
  int Load();
  int List();
  int Remove();

  Globals& g_;
  CLI::App *add_ = nullptr, *load_ = nullptr, *ls_ = nullptr, *rm_ = nullptr;
  std::string board_, name_, pattern_, stream_, wake_, within_ = "0", interval_ = "60";
  int count_ = 1;
  bool capture_ = false, no_notify_ = false;
};

}  // namespace fwai
