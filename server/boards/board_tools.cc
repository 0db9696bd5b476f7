#include "server/boards/board_tools.h"

#include <chrono>
#include <functional>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/local_account.h"
#include "server/boards/boards.h"
#include "server/tools/project_fs.h"

namespace fwai {

namespace {

using nlohmann::json;

Caller ToolCaller(const ToolContext& ctx) {
  Caller c;
  c.identity = ctx.owner;
  c.session_id = ctx.session_id;
  c.display = absl::StrCat(ctx.owner, " session ", ctx.session_id);
  return c;
}

json BoardProperty() {
  return {
      {"type", "string"},
      {"description", "Board id from `fwai hw ls`; omit for the session's leased (or only) board"}};
}

json StreamProperty() {
  return {{"type", "string"},
          {"description",
           "Which output: \"uart\" (the default), \"rtt:N\" (the firmware's SEGGER RTT "
           "channel N, read while the core runs: no halt, unlike gdb) or \"semihosting\" "
           "(its semihosting console); `fwai hw ls` lists a board's"}};
}

// The stream named in `input` ("" for the UART), or why it is not a name.
absl::StatusOr<std::string> StreamOf(const json& input) {
  if (!input.contains("stream") || input["stream"].is_null()) return std::string();
  if (!input["stream"].is_string())
    return absl::InvalidArgumentError("stream: expected a string such as \"uart\" or \"rtt:0\"");
  return input["stream"].get<std::string>();
}

// " rtt:N" for a trace stream, "" for the UART: said after a board's name.
std::string StreamSuffix(const std::string& stream) {
  return stream.empty() || stream == "uart" ? "" : " " + stream;
}

std::string FormatLines(const std::vector<SerialLine>& lines) {
  std::string out;
  for (const auto& l : lines) absl::StrAppend(&out, l.text, "\n");
  return out;
}

absl::StatusOr<std::regex> CompilePattern(const json& input, const char* key) {
  std::string p = input.value(key, "");
  if (p.empty()) return std::regex();
  try {
    return std::regex(p);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": not a valid regular expression: ", e.what()));
  }
}

// The line Collect ends with when a write was refused (after it was sent).
constexpr char kRefused[] = "write refused: ";

// Reads lines from `reader` until `pattern` matches or `timeout_ms` passes;
// with `idle_ms` > 0 it also stops that long after the last line. Each line
// is also streamed to `output` when there is one.
std::pair<std::vector<SerialLine>, bool> Collect(
    BoardSerial& reader, const std::regex* pattern, int timeout_ms, int idle_ms,
    CancelToken* cancel, const std::function<void(std::string_view)>& output = nullptr) {
  std::vector<SerialLine> lines;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0 || (cancel && cancel->cancelled())) return {lines, false};
    int wait = static_cast<int>(std::min<int64_t>(left, 100));
    if (idle_ms > 0 && !lines.empty()) wait = std::min(wait, idle_ms);
    SerialLine l;
    auto n = reader.Wait(l, wait);
    if (std::string refused = reader.TakeRefusal(); !refused.empty()) {
      lines.push_back({0, 0, absl::StrCat(kRefused, refused)});
      return {lines, false};
    }
    if (n == SerialReader::Next::kEnded) {
      lines.push_back({0, 0, absl::StrCat("(serial stream ended: ", reader.end_reason(), ")")});
      return {lines, false};
    }
    if (n == SerialReader::Next::kTimeout) {
      if (idle_ms > 0 && !lines.empty() && wait == idle_ms) return {lines, false};
      continue;
    }
    if (l.notice) l.text = absl::StrCat("[fwai] ", l.text);  // fwaid's, not the board's
    if (output) output(absl::StrCat(l.text, "\n"));
    lines.push_back(l);
    if (pattern && !l.notice && std::regex_search(l.text, *pattern)) return {lines, true};
  }
}

class SerialMonitorTool final : public Tool {
 public:
  explicit SerialMonitorTool(Boards& b) : boards_(b) {}
  std::string name() const override { return "serialMonitor"; }
  std::string description() const override {
    return "Read a board's serial output live for some seconds, or until a regular expression "
           "matches (e.g. a boot "
           "banner or an error). Returns the lines read.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"board", BoardProperty()},
          {"seconds",
           {{"type", "number"}, {"description", "How long to read (default 5, max 120)"}}},
          {"until", {{"type", "string"}, {"description", "Stop when a line matches this regex"}}},
          {"stream", StreamProperty()}}}};
  }
  bool read_only() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    Caller c = ToolCaller(ctx);
    auto board = boards_.Resolve(c, input.value("board", ""));
    if (!board.ok()) return {std::string(board.status().message()), true};
    auto re = CompilePattern(input, "until");
    if (!re.ok()) return {std::string(re.status().message()), true};
    double seconds = input.contains("seconds") && input["seconds"].is_number()
                         ? input["seconds"].get<double>()
                         : 5.0;
    seconds = std::clamp(seconds, 0.1, 120.0);
    auto stream = StreamOf(input);
    if (!stream.ok()) return {std::string(stream.status().message()), true};
    auto reader = boards_.OpenSerial(c, *board, false, *stream);
    if (!reader.ok()) return {std::string(reader.status().message()), true};
    const bool has_pattern = !input.value("until", "").empty();
    // Whoever watches the session sees the lines as they come.
    if (ctx.output) {
      ctx.output(absl::StrCat("(watching ", board->id, StreamSuffix(*stream),
                              board->remote ? " on " + board->node : "", " for ", seconds,
                              " s)\n"));
    }
    auto [lines, matched] = Collect(**reader, has_pattern ? &*re : nullptr,
                                    static_cast<int>(seconds * 1000), 0, ctx.cancel, ctx.output);
    reader->reset();
    // A stream that ended (the board's simulator died, its bench went
    // away) is an error whatever was read before it.
    const bool ended = !matched && !lines.empty() && lines.back().seq == 0 && !lines.back().notice;
    std::string head = has_pattern
                           ? (matched ? "pattern matched"
                                      : absl::StrCat("pattern not seen within ", seconds, " s"))
                           : absl::StrCat(lines.size(), " lines in ", seconds, " s");
    if (ended) head = absl::StrCat("the serial stream ended after ", lines.size() - 1, " lines");
    return {absl::StrCat(head, "\n", FormatLines(lines)), ended || (has_pattern && !matched)};
  }

 private:
  Boards& boards_;
};

class SerialHistoryTool final : public Tool {
 public:
  explicit SerialHistoryTool(Boards& b) : boards_(b) {}
  std::string name() const override { return "serialReadHistory"; }
  std::string description() const override {
    return "Read the recent serial output of a board from the daemon's history buffer (what was "
           "printed before you "
           "looked), optionally only lines matching a regex.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"board", BoardProperty()},
          {"lines",
           {{"type", "integer"}, {"description", "How many recent lines (default 50, max 2000)"}}},
          {"filter", {{"type", "string"}, {"description", "Only lines matching this regex"}}},
          {"stream", StreamProperty()}}}};
  }
  bool read_only() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    Caller c = ToolCaller(ctx);
    auto board = boards_.Resolve(c, input.value("board", ""));
    if (!board.ok()) return {std::string(board.status().message()), true};
    auto re = CompilePattern(input, "filter");
    if (!re.ok()) return {std::string(re.status().message()), true};
    int n = input.contains("lines") && input["lines"].is_number_integer()
                ? input["lines"].get<int>()
                : 50;
    n = std::clamp(n, 1, 2000);
    const bool filter = !input.value("filter", "").empty();
    auto stream = StreamOf(input);
    if (!stream.ok()) return {std::string(stream.status().message()), true};
    auto all = boards_.SerialHistory(c, *board, filter ? 0 : static_cast<size_t>(n), *stream);
    if (!all.ok()) return {std::string(all.status().message()), true};
    std::vector<SerialLine> lines;
    for (const auto& l : *all) {
      if (!filter || std::regex_search(l.text, *re)) lines.push_back(l);
    }
    if (lines.size() > static_cast<size_t>(n)) lines.erase(lines.begin(), lines.end() - n);
    if (lines.empty()) {
      return {stream->empty() || *stream == "uart"
                  ? "(no serial output in the history)"
                  : absl::StrCat("(no output on ", *stream, " in the history)"),
              false};
    }
    return {FormatLines(lines), false};
  }

 private:
  Boards& boards_;
};

class SerialSendTool final : public Tool {
 public:
  explicit SerialSendTool(Boards& b) : boards_(b) {}
  std::string name() const override { return "serialSendCommand"; }
  std::string description() const override {
    return "Send a command line to a board's serial console (or, with stream rtt:N, to the "
           "firmware's RTT down-channel N) and return the reply lines (until a "
           "regex matches, or "
           "the output goes quiet). Needs this session's lease on the board.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"board", BoardProperty()},
          {"command",
           {{"type", "string"}, {"description", "The line to send (the line ending is added)"}}},
          {"wait_for", {{"type", "string"}, {"description", "Regex that ends the reply"}}},
          {"timeout",
           {{"type", "number"},
            {"description", "Seconds to wait for the reply (default 3, max 60)"}}},
          {"stream", StreamProperty()}}},
        {"required", {"command"}}};
  }
  bool read_only() const override { return false; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    Caller c = ToolCaller(ctx);
    auto board = boards_.Resolve(c, input.value("board", ""));
    if (!board.ok()) return {std::string(board.status().message()), true};
    if (!input.contains("command") || !input["command"].is_string())
      return {"command: expected a string", true};
    auto re = CompilePattern(input, "wait_for");
    if (!re.ok()) return {std::string(re.status().message()), true};
    double timeout = input.contains("timeout") && input["timeout"].is_number()
                         ? input["timeout"].get<double>()
                         : 3.0;
    timeout = std::clamp(timeout, 0.1, 60.0);
    auto stream = StreamOf(input);
    if (!stream.ok()) return {std::string(stream.status().message()), true};
    auto reader = boards_.OpenSerial(c, *board, false, *stream);
    if (!reader.ok()) return {std::string(reader.status().message()), true};
    if (auto s = (*reader)->SendLine(input["command"].get<std::string>()); !s.ok()) {
      return {std::string(s.message()), true};
    }
    const bool has_pattern = !input.value("wait_for", "").empty();
    auto [lines, matched] =
        Collect(**reader, has_pattern ? &*re : nullptr, static_cast<int>(timeout * 1000),
                has_pattern ? 0 : 500, ctx.cancel);
    reader->reset();
    // A bench answers a refused write on the stream, after the send.
    if (!lines.empty() && lines.back().seq == 0 && absl::StartsWith(lines.back().text, kRefused)) {
      return {lines.back().text.substr(sizeof(kRefused) - 1), true};
    }
    if (lines.empty()) return {absl::StrCat("sent; no reply within ", timeout, " s"), false};
    const bool ended_early = !matched && lines.back().seq == 0 && !lines.back().notice;
    return {FormatLines(lines) +
                (has_pattern && !matched && !ended_early ? "(wait_for pattern not seen)\n" : ""),
            ended_early || (has_pattern && !matched)};
  }

 private:
  Boards& boards_;
};

class GdbTool final : public Tool {
 public:
  explicit GdbTool(Boards& b) : boards_(b) {}
  std::string name() const override { return "gdb"; }
  std::string description() const override {
    return "Run GDB commands on a board through its GDB server: print variables, info registers, "
           "x/ memory, "
           "bt, break LOCATION, continue [seconds], reset, and `fault` to decode a Cortex-M fault "
           "(CFSR/HFSR/BFAR and "
           "the stacked frame) in plain words. The target halts while attached. Needs this "
           "session's lease. Only commands on the target run (also step, next, finish, set var, "
           "watch, monitor reset); commands on the host (python, shell, source, dump, set "
           "logging, ...) are refused.";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"board", BoardProperty()},
              {"commands",
               {{"type", "array"},
                {"items", {{"type", "string"}}},
                {"description", "GDB commands in order"}}}}},
            {"required", {"commands"}}};
  }
  bool read_only() const override { return false; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    Caller c = ToolCaller(ctx);
    auto board = boards_.Resolve(c, input.value("board", ""));
    if (!board.ok()) return {std::string(board.status().message()), true};
    std::vector<std::string> cmds;
    if (input.contains("commands") && input["commands"].is_array()) {
      for (const auto& x : input["commands"]) {
        if (x.is_string()) cmds.push_back(x.get<std::string>());
      }
    }
    if (cmds.empty()) return {"commands: expected a non-empty list of GDB commands", true};
    // The turn's cancel (the user's stop, a revoked token) ends gdb too.
    auto r = boards_.Debug(c, *board, cmds, 10000, ctx.cancel);
    if (!r.ok()) return {std::string(r.status().message()), true};
    std::string out;
    for (size_t i = 0; i < r->outputs.size(); ++i)
      absl::StrAppend(&out, "(gdb) ", cmds[i], "\n", r->outputs[i], "\n");
    return {out, false};
  }

 private:
  Boards& boards_;
};

class FaultCaptureTool final : public Tool {
 public:
  explicit FaultCaptureTool(Boards& b) : boards_(b) {}
  std::string name() const override { return "faultCapture"; }
  std::string description() const override {
    return "Capture a faulted (or any stopped) board for later: halts it and saves the core "
           "registers, the fault status registers, RAM and the serial lines before into "
           ".fwai/captures/ in the project, tied to the image by its sha256. Returns the fault in "
           "plain words and the backtrace; `fwai fault decode FILE` decodes the file again later, "
           "on any machine. Needs this session's lease.";
  }
  json input_schema() const override {
    return {{"type", "object"}, {"properties", {{"board", BoardProperty()}}}};
  }
  bool read_only() const override { return false; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    Caller c = ToolCaller(ctx);
    auto board = boards_.Resolve(c, input.value("board", ""));
    if (!board.ok()) return {std::string(board.status().message()), true};
    auto r = boards_.Debug(c, *board, {"capture", "bt"}, 30000, ctx.cancel);
    if (!r.ok()) return {std::string(r.status().message()), true};
    if (r->results.empty() || !r->results[0].contains("capture"))
      return {r->outputs.empty() ? "no capture was taken" : r->outputs[0], true};
    const json& capture = r->results[0]["capture"];
    const json& fault = capture["fault"];
    std::string out = absl::StrCat(fault.value("summary", fault.value("error", "")), "\n");
    for (const auto& cause : fault.value("causes", json::array()))
      absl::StrAppend(&out, "  - ", cause.get<std::string>(), "\n");
    if (r->outputs.size() > 1) absl::StrAppend(&out, "backtrace:\n", r->outputs[1], "\n");
    auto saved = SaveCaptureInProject(ctx.project_root, ctx.account, board->id, capture);
    absl::StrAppend(
        &out,
        saved.ok() ? absl::StrCat("capture saved to ", *saved, " (fwai fault decode ", *saved, ")")
                   : absl::StrCat("the capture was not saved: ", saved.status().message()),
        "; image sha256 ", capture["image"].value("sha256", ""), "\n");
    return {out, false};
  }

 private:
  Boards& boards_;
};

}  // namespace

absl::StatusOr<std::string> SaveCaptureInProject(const std::string& project_root,
                                                 const LocalAccount* account,
                                                 const std::string& board, const json& capture) {
  if (project_root.empty() || !account)
    return absl::FailedPreconditionError(
        "there is no project or local account to keep the capture in");
  ScopedFsIdentity as(*account);
  if (!as.status().ok()) return as.status();
  auto pfs = ProjectFs::Open(project_root);
  if (!pfs.ok()) return pfs.status();
  const std::string rel =
      absl::StrCat(".fwai/captures/", board, "-",
                   absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()), ".fwcap");
  if (auto s = pfs->WriteFile(rel, capture.dump()); !s.ok()) return s;
  return rel;
}

void RegisterHardwareTools(ToolRegistry& registry, Boards& boards) {
  registry.Register(std::make_unique<FaultCaptureTool>(boards));
  registry.Register(std::make_unique<SerialMonitorTool>(boards));
  registry.Register(std::make_unique<SerialHistoryTool>(boards));
  registry.Register(std::make_unique<SerialSendTool>(boards));
  registry.Register(std::make_unique<GdbTool>(boards));
}

}  // namespace fwai
