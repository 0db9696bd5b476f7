// fwai fault decode: a fault capture decoded offline (no board, no fwaid).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class FaultCommands {
 public:
  FaultCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int Decode();
  int ServeRsp();

  Globals& g_;
  CLI::App *decode_ = nullptr, *rsp_ = nullptr;
  std::string capture_, image_;
};

// Writes a capture (the `capture` of a debug command's result) to `path`,
// readable by its owner only; says where and how to decode it.
int SaveCapture(const Globals& g, const std::string& path, const std::string& capture_json);

}  // namespace fwai
