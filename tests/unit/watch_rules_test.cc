// Watch rules: parsed from project.yaml with file:line errors; patterns in
// RE2, so none can take more than linear time, and one too big is refused.

#include "server/project/watch_rules.h"

#include <gtest/gtest.h>
#include <re2/re2.h>

#include <string>

#include "server/project/project.h"

namespace fwai {
namespace {

TEST(WatchRulesTest, ProjectYamlRulesAreReadWithTheirActions) {
  auto s = ParseProjectYaml(
      "name: blinky\nwatch:\n"
      "  - name: hardfault\n    pattern: 'FAULT|HardFault'\n    actions: [capture, notify]\n"
      "  - name: boot-loop\n    pattern: booted\n    count: 3\n    within: 10s\n"
      "    stream: rtt:0\n    actions: [{wake: s-123}]\n",
      ".fwai/project.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->watch.size(), 2u);
  EXPECT_EQ(s->watch[0].name, "hardfault");
  EXPECT_TRUE(s->watch[0].capture);
  EXPECT_TRUE(s->watch[0].notify);
  EXPECT_EQ(s->watch[0].source, ".fwai/project.yaml:3");
  EXPECT_EQ(s->watch[1].count, 3);
  EXPECT_EQ(s->watch[1].within_s, 10);
  EXPECT_EQ(s->watch[1].stream, "rtt:0");
  EXPECT_EQ(s->watch[1].wake_session, "s-123");
  EXPECT_FALSE(s->watch[1].notify);
}

TEST(WatchRulesTest, BadRulesAreRefusedNamingFileLineAndField) {
  auto bad = [](const std::string& rules) {
    auto s = ParseProjectYaml("watch:\n" + rules, "p.yaml");
    return s.ok() ? std::string("accepted") : std::string(s.status().message());
  };
  EXPECT_EQ(bad("  - name: x\n    pattern: 'a(b'\n"),
            "p.yaml:2: watch[0]: pattern: 'a(b' is not a pattern fwai runs: missing ): a(b");
  // A repetition that would blow up is refused by RE2 before it runs.
  EXPECT_NE(
      bad("  - name: x\n    pattern: '((a{100}){100}){100}'\n").find("invalid repetition size"),
      std::string::npos);
  EXPECT_NE(bad("  - name: x\n    pattern: '(a)\\1'\n").find("is not a pattern fwai runs"),
            std::string::npos);  // no backreferences: nothing that could backtrack
  EXPECT_NE(bad("  - name: x\n    pattern: a\n    count: 3\n").find("needs a window"),
            std::string::npos);
  EXPECT_NE(bad("  - name: x\n    pattern: a\n    stream: rtt:99\n").find("stream: 'rtt:99'"),
            std::string::npos);
  EXPECT_NE(bad("  - name: x\n    pattern: a\n    actions: [reboot]\n").find("p.yaml:4"),
            std::string::npos);
  EXPECT_NE(bad("  - name: x\n    pattern: a\n  - name: x\n    pattern: b\n").find("already"),
            std::string::npos);
  EXPECT_NE(bad("  - name: x\n    pattern: a\n    colour: red\n").find("unknown setting"),
            std::string::npos);
}

TEST(WatchRulesTest, APatternCatastrophicForABacktrackerRunsInLinearTime) {
  auto re = CompileWatchPattern("(a+)+$", "t");
  ASSERT_TRUE(re.ok()) << re.status();
  // Exponential for a backtracking engine (it would not return); RE2 scans it once.
  const std::string line = std::string(200000, 'a') + "b";
  EXPECT_FALSE(re2::RE2::PartialMatch(line, **re));
  EXPECT_TRUE(re2::RE2::PartialMatch(std::string(200000, 'a'), **re));
}

}  // namespace
}  // namespace fwai
