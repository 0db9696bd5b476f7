// fwai evidence ls | show | verify | export.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class EvidenceCommands {
 public:
  EvidenceCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  Globals& g_;
  CLI::App *ls_ = nullptr, *show_ = nullptr, *verify_ = nullptr, *export_ = nullptr;
  int limit_ = 20;
  std::string run_id_;
  std::string format_ = "json";
  std::string output_;
};

}  // namespace fwai
