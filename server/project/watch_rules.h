// watch_rules: rules that watch a board's output and act when it says
// something (a HardFault banner, an ASSERT, a watchdog reset, a boot loop).
//
// A rule matches an RE2 pattern on one stream of a board (its UART, an RTT
// channel, semihosting): linear time in the line's length whatever the
// pattern, and a pattern too big for RE2's memory budget is refused when the
// rule is made, with RE2's words. It fires when the pattern matched `count`
// lines within `within_s` seconds (count 1: every match), at most once per
// `min_interval_s` (the firings it held back are counted and said with the
// next). Its actions: capture the core (a fault capture), notify (a notice
// on the stream, an evidence record), wake a named session with the
// capture as the start of a turn.
//
// Rules come from `watch:` in .fwai/project.yaml (errors name file:line and
// field) or from `fwai watch add` (errors name the flag).
//
// Thread-safety: values; CompileWatchPattern's result may be shared.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}
namespace YAML {
class Node;
}

namespace fwai {

struct WatchRule {
  std::string name;
  std::string board;   // "" : the board the caller holds
  std::string stream;  // "" (the UART) | rtt:N | semihosting
  std::string pattern;
  int count = 1;
  int within_s = 0;  // 0: no window
  bool capture = false;
  bool notify = true;
  std::string wake_session;
  int min_interval_s = 60;
  std::string source;  // where it was written: "FILE:LINE" or "fwai watch add"
};

// The pattern compiled, or why not (`where` names it: "FILE:LINE: watch[0].pattern").
absl::StatusOr<std::shared_ptr<const re2::RE2>> CompileWatchPattern(const std::string& pattern,
                                                                    const std::string& where);

// Checks a rule made by hand: its name, stream, pattern, counts and actions.
absl::Status CheckWatchRule(const WatchRule& rule, const std::string& where);

// The rules of a `watch:` list (`node`) of `source` (the file's name).
absl::StatusOr<std::vector<WatchRule>> ParseWatchRules(const YAML::Node& node,
                                                       const std::string& source);

}  // namespace fwai
