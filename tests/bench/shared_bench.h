// The shared daemon's figures (`fwai_bench --only shared`): streaming over
// TLS with a token beside the unix socket, many principals at once, and one
// user's chat while another floods requests or ingests a corpus.
#pragma once

#include <string>
#include <vector>

#include "tests/fakes/fake_llm_server.h"

namespace fwai::testing {

struct SharedBenchOptions {
  int runs = 3;        // runs of each figure; medians are reported
  bool quick = false;  // smaller inputs
  bool tiny = false;   // a few turns only: checks delivery and accounting, no figures
  std::string part;    // "transport", "principals", "noisy" or "noisy-ab": that figure
                       // only; empty: all but noisy-ab
  // noisy-ab: fwaid binaries run in turn, one a run (empty: the build's).
  std::vector<std::string> fwaid_binaries;
  int rounds = 3;  // noisy-ab: quiet and ingest rounds of each kind a run
};

// Returns 0 when every turn finished with every chunk its provider sent and
// each principal's turns add up to its share; 1 otherwise.
int RunSharedBench(FakeLlmServer& fake, const SharedBenchOptions& options);

}  // namespace fwai::testing
