// Line splitter for NDJSON (Ollama) and JSON-RPC over stdio (MCP): any bytes,
// split anywhere, give the same lines as when they arrive at once; no line
// holds a newline, none is blank.
#include <string>
#include <vector>

#include "server/llm/line_splitter.h"
#include "tests/fuzz/fuzz_support.h"

namespace fwai::fuzz {
namespace {

std::vector<std::string> Split(std::string_view body, Rng* rng) {
  LineSplitter s;
  std::vector<std::string> out;
  auto collect = [&](std::string_view line) { out.emplace_back(line); };
  if (rng == nullptr) {
    s.Feed(body, collect);
  } else {
    FeedInPieces(body, *rng, 64, [&](std::string_view piece) { s.Feed(piece, collect); });
  }
  return out;
}

}  // namespace
}  // namespace fwai::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai::fuzz;
  const std::string_view body = AsText(data, size);
  const auto whole = Split(body, nullptr);
  Rng rng(body);
  const auto pieces = Split(body, &rng);
  FUZZ_CHECK(whole == pieces);
  for (const auto& line : whole) {
    FUZZ_CHECK(line.find('\n') == std::string::npos);
    FUZZ_CHECK(line.find_first_not_of(" \t\r") != std::string::npos);
  }
  return 0;
}
