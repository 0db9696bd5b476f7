// fwai kb: add, ls, rm, stats, search — the knowledge base from the CLI.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "client/cli/cli.h"

namespace fwai {

class KbCommands {
 public:
  KbCommands(CLI::App& app, Globals& g);
  // The exit code if a kb command was given on the command line.
  std::optional<int> RunIfParsed();

 private:
  int Add();
  int Ls();
  int Rm();
  int Stats();
  int Search();
  int Log();
  int Feedback();

  Globals& g_;
  CLI::App* add_ = nullptr;
  CLI::App* ls_ = nullptr;
  CLI::App* rm_ = nullptr;
  CLI::App* stats_ = nullptr;
  CLI::App* search_ = nullptr;
  CLI::App* log_ = nullptr;
  CLI::App* feedback_ = nullptr;
  int log_limit_ = 20;
  std::string log_before_;
  std::string search_id_, result_, note_;
  bool good_ = false, bad_ = false;
  std::vector<std::string> paths_;
  std::string collection_;
  std::vector<std::string> tags_;
  std::string kind_;
  std::vector<std::string> docs_;
  std::string query_;
  std::vector<std::string> query_words_;
  int max_results_ = 10;
  double threshold_ = 0;
  std::vector<std::string> types_;
  bool no_rerank_ = false;
  std::string mode_;
  std::string batch_;
  int passage_tokens_ = 0;  // 0: the daemon's default
  bool chunks_only_ = false;
};

}  // namespace fwai
