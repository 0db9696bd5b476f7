// fwai plugin install | ls | rm | verify | search | sign | keygen.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class PluginCommands {
 public:
  PluginCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Sign();
  int Keygen();

  Globals& g_;
  CLI::App *install_ = nullptr, *ls_ = nullptr, *rm_ = nullptr, *verify_ = nullptr,
           *search_ = nullptr, *sign_ = nullptr, *keygen_ = nullptr;
  std::string source_, name_, query_, marketplace_, dir_, key_, comment_, out_;
  bool replace_ = false;
};

}  // namespace fwai
