// SSE (text/event-stream) parser: any bytes, split anywhere, give the same
// events as when they arrive at once.
#include <string>
#include <vector>

#include "server/llm/sse_parser.h"
#include "tests/fuzz/fuzz_support.h"

namespace fwai::fuzz {
namespace {

std::vector<SseEvent> Parse(std::string_view body, Rng* rng) {
  SseParser p;
  std::vector<SseEvent> out;
  auto collect = [&](const SseEvent& e) { out.push_back(e); };
  if (rng == nullptr) {
    p.Feed(body, collect);
  } else {
    FeedInPieces(body, *rng, 64, [&](std::string_view piece) { p.Feed(piece, collect); });
  }
  return out;
}

}  // namespace
}  // namespace fwai::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai::fuzz;
  const std::string_view body = AsText(data, size);
  const auto whole = Parse(body, nullptr);
  Rng rng(body);
  const auto pieces = Parse(body, &rng);
  FUZZ_CHECK(whole.size() == pieces.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    FUZZ_CHECK(whole[i].event == pieces[i].event);
    FUZZ_CHECK(whole[i].data == pieces[i].data);
  }
  return 0;
}
