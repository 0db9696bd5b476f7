// Typed diagnostics from build output: gcc/clang `file:line:col: error|warning|note: msg`,
// linker errors (undefined references, missing libraries, ld's own errors) and
// memory region overflows. Parsed line by line so they can be streamed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fwai {

struct Diagnostic {
  std::string kind;      // compiler | linker | region_overflow
  std::string severity;  // error | warning | note
  std::string file;
  int line = 0;
  int column = 0;
  std::string message;
  std::string region;  // region_overflow: FLASH, RAM, ...
  int64_t bytes = 0;   // region_overflow: by how much
  std::string symbol;  // linker: the undefined symbol

  nlohmann::json ToJson() const;
};

// One line of build output; nullopt when it is not a diagnostic.
std::optional<Diagnostic> ParseDiagnosticLine(std::string_view line);
// Every diagnostic in `output`, in order.
std::vector<Diagnostic> ParseDiagnostics(std::string_view output);

}  // namespace fwai
