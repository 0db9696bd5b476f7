#include <gtest/gtest.h>

#include "server/llm/sse_parser.h"

namespace fwai {
namespace {

std::vector<SseEvent> FeedBytewise(const std::string& s) {
  SseParser p;
  std::vector<SseEvent> out;
  for (char c : s) p.Feed(std::string_view(&c, 1), [&](const SseEvent& e) { out.push_back(e); });
  return out;
}

TEST(SseParserTest, EventsSplitAnywhere) {
  auto ev = FeedBytewise("event: message_start\ndata: {\"a\":1}\n\n: keep-alive\n\ndata: x\n\n");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].event, "message_start");
  EXPECT_EQ(ev[0].data, "{\"a\":1}");
  EXPECT_EQ(ev[1].event, "");
  EXPECT_EQ(ev[1].data, "x");
}

TEST(SseParserTest, CrLfAndMultilineData) {
  auto ev = FeedBytewise("event: e\r\ndata: one\r\ndata:two\r\n\r\n");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].data, "one\ntwo");
}

TEST(SseParserTest, IncompleteEventIsHeldBack) {
  SseParser p;
  int n = 0;
  p.Feed("data: partial", [&](const SseEvent&) { ++n; });
  EXPECT_EQ(n, 0);
  EXPECT_TRUE(p.HasPartial());
  p.Feed("\n\n", [&](const SseEvent& e) {
    ++n;
    EXPECT_EQ(e.data, "partial");
  });
  EXPECT_EQ(n, 1);
}

}  // namespace
}  // namespace fwai
