// The register-truth benchmark's evaluation (docs/registers.md): correct
// register code for several peripherals of two vendors' parts
// (tests/bench/registers/PART/*.c), and each single-line error of the kinds
// below made one at a time in it. A mutant is found when the checker reports
// an error at the line changed; any other finding is false.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace fwai::testing {

struct RegisterEvalKind {
  int injected = 0;
  int found = 0;           // an error at the changed line
  int false_findings = 0;  // findings on lines not changed
};

struct RegisterEvalResult {
  std::map<std::string, RegisterEvalKind> kinds;  // by the kind of error made
  int clean_files = 0;
  int clean_lines = 0;
  int clean_findings = 0;           // findings on the correct files
  std::vector<std::string> misses;  // "file:line kind: the changed line"
};

// Evaluates every PART directory under `corpus` against SOURCE_DIR/data/svd.
RegisterEvalResult EvaluateRegisterChecks(const std::string& corpus, const std::string& svd_dir);

}  // namespace fwai::testing
