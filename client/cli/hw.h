// fwai hw (ls, lease, release, who, test, health, reset), monitor, flash and
// debug: the hardware broker from the CLI.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai::v1 {
class AcquireRequest;
}

namespace fwai {

// Adds `--tag` values (KEY or KEY:VALUE; a board must carry all of them) to a
// lease request.
void AddBoardTags(const std::vector<std::string>& tags, v1::AcquireRequest* req);

class HwCommands {
 public:
  HwCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Ls();
  int Lease();
  int Release();
  int Who();
  int Test();
  int Health();
  int Reset();
  int Monitor();
  int Flash();
  int Debug();

  Globals& g_;
  CLI::App *ls_ = nullptr, *lease_ = nullptr, *release_ = nullptr, *who_ = nullptr,
           *test_ = nullptr, *health_ = nullptr, *reset_ = nullptr, *monitor_ = nullptr,
           *flash_ = nullptr, *debug_ = nullptr;
  std::string board_;
  std::vector<std::string> tags_;
  int ttl_ = 0;
  int wait_ = 0;
  bool hold_ = false;
  bool verbose_ = false;  // hw ls: each etcd member's answer when the lab cannot be read
  bool force_ = false;
  std::string session_;
  std::string state_, reason_;
  std::string until_;
  double timeout_ = 0;
  std::vector<std::string> send_;
  bool history_ = false;
  std::vector<unsigned> rtt_;  // monitor --rtt [N]: empty with the option means 0
  CLI::Option* rtt_opt_ = nullptr;
  bool semihosting_ = false;  // monitor --semihosting
  std::vector<std::string> positional_;
  bool yes_ = false;
  std::string project_root_;
  int debug_timeout_ = 10;
  std::string save_;  // fwai debug --save FILE
};

}  // namespace fwai
