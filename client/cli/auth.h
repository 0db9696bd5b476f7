// fwai whoami | token create/ls/revoke | login | logout: who you are to a
// daemon, the tokens of a shared one, and a stored profile for it.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class AuthCommands {
 public:
  AuthCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int WhoAmI();
  int TokenCreate();
  int TokenList();
  int TokenRevoke();
  int Login();
  int Logout();

  Globals& g_;
  CLI::App *whoami_ = nullptr, *create_ = nullptr, *ls_ = nullptr, *revoke_ = nullptr,
           *login_ = nullptr, *logout_ = nullptr;
  std::string user_, role_ = "user", expires_, note_, id_, login_daemon_;
};

// "90d", "12h", "30m", "45s", "2w" or plain seconds; 0 for "never".
std::optional<int64_t> ParseDuration(const std::string& text);

}  // namespace fwai
