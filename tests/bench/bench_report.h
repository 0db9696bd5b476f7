// The benchmarks' results file. A bench program calls Report().Init(name,
// argc, argv) first, Report().Add(...) for every figure it prints on a RESULT
// line, and Report().Write() when it ends well. With `--json FILE` among its
// arguments, Write() writes one JSON document to FILE:
//   {"bench", "commit" ($FWAI_COMMIT), "date" (UTC, ISO-8601), "machine" {cpu,
//    cores, memory_gb, os, kernel}, "quick", "args", "results": [...]}
// where each result is {"id" (a stable key), "measure", "input" (sizes and
// load), "value", "unit"} plus what the bench adds to it: "p50", "p99",
// "max"... (numbers, in the result's unit), "target" (text) and "baseline"
// ({"id", "name", "value"}: the figure of the same run it is compared with).
// Without --json nothing is written. scripts/bench-doc renders the files into
// docs/benchmarks.md.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace fwai::testing {

class BenchReport {
 public:
  using Json = nlohmann::ordered_json;

  // Remembers the bench's name and arguments; finds --json FILE and --quick.
  void Init(std::string bench, int argc, char** argv);
  // A run smaller than the bench's full one (set by --quick; a bench without
  // --quick may set it from its own sizes).
  void SetQuick(bool quick) { quick_ = quick; }
  bool quick() const { return quick_; }
  // Adds a result; the returned object stays valid, for p50/p99/target/baseline.
  Json& Add(const std::string& id, const std::string& measure, const std::string& input,
            double value, const std::string& unit);
  // The result added under `id`, or nullptr.
  const Json* Find(const std::string& id) const;
  // Marks `result` as compared with the result `baseline_id` of this run.
  void SetBaseline(Json& result, const std::string& baseline_id, const std::string& name);
  // Writes the document to the --json file (if any). False, with a message on
  // stderr, when it cannot be written.
  bool Write() const;

 private:
  std::string bench_, path_;
  bool quick_ = false;
  std::vector<std::string> args_;
  std::deque<Json> results_;
};

// The process's report.
BenchReport& Report();

// The machine as /proc and /etc/os-release describe it.
BenchReport::Json MachineJson();

}  // namespace fwai::testing
