#include "server/hardware/gdb_policy.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fwai {
namespace {

constexpr char kRule[] = "rule: debug commands act on the target only";

// Commands on the target: data, breakpoints, execution, the stack.
const std::set<std::string, std::less<>>& TargetCommands() {
  static const auto* kCommands = new std::set<std::string, std::less<>>{
      "print", "p", "output", "call", "x", "ptype", "whatis", "display", "undisplay", "disassemble",
      "bt", "backtrace", "where", "frame", "f", "up", "down", "break", "b", "br", "tbreak",
      "hbreak", "thbreak", "delete", "d", "clear", "disable", "enable", "condition", "ignore",
      "watch", "rwatch", "awatch", "continue", "c", "step", "s", "next", "n", "stepi", "si",
      "nexti", "ni", "finish", "fin", "until", "u", "advance", "jump",
      // fwaid's own: a fault decoded or captured, a reset of the board.
      "fault", "reset", "decode", "capture"};
  return *kCommands;
}

// `info` about the target and the loaded image.
const std::set<std::string, std::less<>>& InfoTopics() {
  static const auto* kTopics = new std::set<std::string, std::less<>>{
      "registers", "all-registers", "r",         "reg",    "frame",       "f",       "locals",
      "args",      "breakpoints",   "break",     "b",      "watchpoints", "threads", "symbol",
      "address",   "line",          "display",   "mem",    "stack",       "s",       "scope",
      "types",     "variables",     "functions", "vector", "float",       "program", "fault"};
  return *kTopics;
}

std::string Refused(const std::string& what, const std::string& why) {
  return absl::StrCat("'", what, "' is not allowed here: ", why, " (", kRule, ")");
}

}  // namespace

std::optional<std::string> RefuseGdbCommand(std::string_view command) {
  for (char c : command) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return absl::StrCat("a debug command is one line without control characters (", kRule, ")");
    }
  }
  const std::string cmd(absl::StripAsciiWhitespace(std::string(command)));
  if (cmd.find("$_") != std::string::npos) {
    // $_shell(...) runs a program; no convenience variable or function of
    // GDB's is needed to read the target.
    return Refused("$_", "GDB's convenience functions and variables act on the host");
  }
  // The verb ends at a space or a /FMT (print/x, x/4xw).
  const size_t end = cmd.find_first_of(" /");
  const std::string verb = cmd.substr(0, end);
  const std::string rest(
      absl::StripAsciiWhitespace(end == std::string::npos ? "" : cmd.substr(end)));
  if (verb == "quit" || verb == "q" || verb == "kill" || verb == "target" || verb == "detach" ||
      verb == "disconnect") {
    return Refused(verb, "the broker owns the connection to the board");
  }
  if (verb == "info" || verb == "i") {
    const std::string topic = rest.substr(0, rest.find(' '));
    if (InfoTopics().count(topic)) return std::nullopt;
    return Refused(absl::StrCat("info ", topic), "it is not about the target");
  }
  if (verb == "set") {
    // Only a variable of the target (`set var x = 1`, `set variable`).
    const std::string what = rest.substr(0, rest.find(' '));
    if (what == "var" || what == "variable") return std::nullopt;
    return Refused(absl::StrCat("set ", what),
                   "only `set var` changes the target; GDB's own "
                   "settings stay as fwaid set them");
  }
  if (verb == "monitor" || verb == "mon") {
    // The probe's reset and halt; a monitor can otherwise write files.
    static const std::set<std::string, std::less<>> kMonitor = {
        "reset", "reset halt", "reset init", "reset run", "halt", "resume"};
    if (kMonitor.count(rest)) return std::nullopt;
    return Refused(absl::StrCat("monitor ", rest), "only monitor reset, halt and resume");
  }
  if (TargetCommands().count(verb)) return std::nullopt;
  return Refused(verb, "GDB runs on the host; only commands on the target are");
}

}  // namespace fwai
