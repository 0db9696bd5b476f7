// fwai sbom and fwai mem: the SBOM and the memory report of a build run or an
// image.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "client/cli/cli.h"

namespace fwai {

class FirmwareCommands {
 public:
  FirmwareCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  Globals& g_;
  CLI::App *sbom_ = nullptr, *mem_ = nullptr;
  std::string which_, format_ = "cyclonedx", output_, image_, diff_;
};

}  // namespace fwai
