// fwai sessions share | unshare: another user watches, answers, approves or
// drives one of your sessions (docs/security.md "Sharing a session").
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class ShareCommands {
 public:
  // Adds `share` and `unshare` under `sessions`.
  ShareCommands(CLI::App& sessions, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Share();
  int Unshare();

  Globals& g_;
  CLI::App* share_ = nullptr;
  CLI::App* unshare_ = nullptr;
  std::string session_, user_, role_ = "watch", expires_;
};

}  // namespace fwai
