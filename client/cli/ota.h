// fwai ota package | verify | rollout | status | ls.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai {

class OtaCommands {
 public:
  OtaCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Package();
  int Verify();
  int Rollout();
  int Status();
  int List();

  Globals& g_;
  CLI::App *package_ = nullptr, *verify_ = nullptr, *rollout_ = nullptr, *status_ = nullptr,
           *ls_ = nullptr;
  std::string image_, version_, key_, output_, security_counter_, health_, rollout_id_;
  uint32_t header_size_ = 0x200;
  std::string slot_size_;
  bool confirm_ = false, force_ = false;
  std::vector<std::string> boards_, stages_;
  double max_failure_rate_ = -1;
  int limit_ = 20;
};

}  // namespace fwai
