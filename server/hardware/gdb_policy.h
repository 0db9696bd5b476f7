// What a caller may have GDB do on a board: read and write the target's
// memory and registers, set breakpoints and watchpoints, and run, step and
// reset it — never act on the host. GDB runs as fwaid (it reads fwaid's
// private copy of the flashed image), so anything that would read or write a
// host file, run a program or a script, define commands or change GDB's own
// settings is refused here, by name, before GDB sees it.
//
// The rule is an allowlist of commands (GDB's own abbreviations are not
// expanded: `pyth` is not `print`), with sub-allowlists for `info`, `set`
// and `monitor`; any control character (a second command smuggled after a
// newline) and GDB's convenience functions (`$_shell(...)` runs a shell) are
// refused in any argument. Thread-safe: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fwai {

// Why `command` (one GDB command line, trimmed) may not run, naming the rule;
// nullopt when it may.
std::optional<std::string> RefuseGdbCommand(std::string_view command);

}  // namespace fwai
