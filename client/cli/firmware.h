// fwai sbom and fwai mem: the SBOM and the memory report of a build run or an
// image; fwai check registers: the project's register code against its
// device's SVD (exit 0 clean, 1 an error found, 2 bad usage).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai {

class FirmwareCommands {
 public:
  FirmwareCommands(CLI::App& app, Globals& g);
  std::optional<int> RunIfParsed();

 private:
  int CheckRegisters();

  Globals& g_;
  CLI::App *sbom_ = nullptr, *mem_ = nullptr, *check_ = nullptr, *registers_ = nullptr;
  std::string which_, format_ = "cyclonedx", output_, image_, diff_;
  std::vector<std::string> paths_;
  std::string svd_, target_, sarif_;
};

}  // namespace fwai
