// HardwareBroker: the serial port (reading, writing, waiting for a line),
// GDB sessions and resets.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "server/hardware/broker.h"
#include "server/hardware/broker_internal.h"
#include "server/hardware/fault_capture.h"
#include "server/hardware/firmware_image.h"
#include "server/hardware/gdb_mi.h"
#include "server/hardware/gdb_policy.h"
#include "server/hardware/qemu.h"
#include "server/hardware/rtt_pump.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

using broker_internal::OpenOcdArgs;

SerialHub* HardwareBroker::Board::Stream(const std::string& name) {
  MutexLock lock(&streams_mu);
  std::unique_ptr<SerialHub>& hub = streams[name];
  if (hub) return hub.get();
  hub = std::make_unique<SerialHub>(cfg.id, history_lines);
  // The semihosting console is a port: opened on the simulator's pty at each boot.
  if (name == "semihosting") return hub.get();
  SerialSettings s;
  s.encoding = cfg.encoding;
  s.line_ending = "\n";
  unsigned channel = 0;
  (void)absl::SimpleAtoi(name.substr(name.find(':') + 1), &channel);
  // Writes go to the pump of the moment (a restart makes a new one).
  auto writer = [this, channel](std::string_view bytes) -> absl::Status {
    std::shared_ptr<RttPump> pump;
    {
      MutexLock l(&streams_mu);
      pump = rtt;
    }
    if (!pump) {
      return absl::FailedPreconditionError(
          absl::StrCat("board ", cfg.id, " is not running: nothing reads RTT"));
    }
    return pump->Send(channel, bytes);
  };
  (void)hub->OpenFed(name, s, writer);
  return hub.get();
}

std::vector<SerialHub*> HardwareBroker::Board::Streams() const {
  MutexLock lock(&streams_mu);
  std::vector<SerialHub*> out;
  for (const auto& [name, hub] : streams) out.push_back(hub.get());
  return out;
}

std::vector<std::pair<std::string, std::string>> HardwareBroker::Board::StreamsListed() const {
  std::vector<std::pair<std::string, std::string>> out{{"uart", ""}};
  if (cfg.semihosting) out.emplace_back("semihosting", "");
  std::shared_ptr<RttPump> pump;
  {
    MutexLock lock(&streams_mu);
    pump = rtt;
  }
  const auto block = pump ? pump->block() : std::nullopt;
  for (size_t i = 0; block && i < block->up.size(); ++i) {
    if (block->up[i].size > 0) out.emplace_back(absl::StrCat("rtt:", i), block->up[i].name);
  }
  return out;
}

void HardwareBroker::Board::StartRtt(std::unique_ptr<QemuTargetMemory> memory,
                                     const RttSearch& where, int poll_ms) {
  StopRtt();
  RttPumpOptions o;
  o.poll_us = int64_t{poll_ms} * 1000;
  auto sink = [this](unsigned channel, std::string_view bytes, bool idle) {
    SerialHub* h = Stream(absl::StrCat("rtt:", channel));
    if (idle) {
      h->FlushFed();
    } else {
      h->Feed(bytes);
    }
  };
  auto pump = std::make_shared<RttPump>(*memory, where, o, SystemClock(), sink);
  MutexLock lock(&streams_mu);
  target_memory = std::move(memory);
  rtt = std::move(pump);
}

void HardwareBroker::Board::StopRtt() {
  std::shared_ptr<RttPump> pump;
  std::unique_ptr<QemuTargetMemory> memory;
  {
    MutexLock lock(&streams_mu);
    pump = std::move(rtt);
    memory = std::move(target_memory);
  }
  pump.reset();  // joins its thread before the memory it reads goes
  for (SerialHub* h : Streams()) h->FlushFed();
}

absl::StatusOr<SerialHub*> HardwareBroker::HubOf(const std::string& board,
                                                 const std::string& stream) const {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (stream.empty() || stream == "uart") return b->hub.get();
  if (stream == "semihosting") {
    if (!b->cfg.semihosting) {
      return absl::FailedPreconditionError(absl::StrCat(
          "board ", board, " has no semihosting console (semihosting: true in its configuration)"));
    }
    return b->Stream("semihosting");
  }
  unsigned channel = 0;
  if (!absl::StartsWith(stream, "rtt:") || !absl::SimpleAtoi(stream.substr(4), &channel) ||
      channel >= static_cast<unsigned>(kRttMaxBuffers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("board ", board, " has no stream '", stream,
                     "' (a board has uart, rtt:0 to rtt:15 when its firmware has RTT, and "
                     "semihosting when configured so)"));
  }
  if (!b->simulated()) {
    return absl::UnimplementedError(absl::StrCat("board ", board, ": RTT (", stream,
                                                 ") is read on simulated boards; this one is ",
                                                 b->cfg.kind));
  }
  if (b->cfg.rtt_poll_ms == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("board ", board, ": RTT is off (rtt: off in its configuration)"));
  }
  std::shared_ptr<RttPump> pump;
  {
    MutexLock lock(&b->streams_mu);
    pump = b->rtt;
  }
  if (auto block = pump ? pump->block() : std::nullopt; block && channel >= block->up.size()) {
    return absl::NotFoundError(absl::StrCat("board ", board,
                                            "'s firmware has RTT up-channels 0 to ",
                                            block->up.size() - 1, ", not ", stream));
  }
  return b->Stream(absl::StrCat("rtt:", channel));
}

absl::StatusOr<std::shared_ptr<SerialReader>> HardwareBroker::OpenSerial(
    const Caller& caller, const std::string& board, bool from_history, const std::string& stream) {
  ASSIGN_OR_RETURN(SerialHub * hub, HubOf(board, stream));
  auto reader = hub->Subscribe(from_history);
  if (auto l = leases_->Holder(board);
      l && leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id).ok()) {
    reader->lease_id = l->lease_id;
  }
  return reader;
}

void HardwareBroker::CloseSerial(const std::string& board,
                                 const std::shared_ptr<SerialReader>& reader,
                                 const std::string& stream) {
  if (auto hub = HubOf(board, stream); hub.ok()) (*hub)->Unsubscribe(reader);
}

absl::Status HardwareBroker::CheckWriter(const Caller& caller, const std::string& board,
                                         const std::string& stream) {
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("writing to ", stream.empty() || stream == "uart" ? "the serial port" : stream,
                     " needs the lease: ", s.message()));
  }
  leases_->Touch(board, caller.identity);
  return absl::OkStatus();
}

absl::Status HardwareBroker::SerialWrite(const Caller& caller, const std::string& board,
                                         std::string_view bytes, const std::string& stream) {
  ASSIGN_OR_RETURN(SerialHub * hub, HubOf(board, stream));
  RETURN_IF_ERROR(CheckWriter(caller, board, stream));
  return hub->Write(bytes);
}

absl::Status HardwareBroker::SerialSendLine(const Caller& caller, const std::string& board,
                                            std::string_view line, const std::string& stream) {
  ASSIGN_OR_RETURN(SerialHub * hub, HubOf(board, stream));
  RETURN_IF_ERROR(CheckWriter(caller, board, stream));
  return hub->SendLine(line);
}

absl::StatusOr<std::vector<SerialLine>> HardwareBroker::SerialHistory(const std::string& board,
                                                                      size_t max_lines,
                                                                      const std::string& stream) {
  ASSIGN_OR_RETURN(SerialHub * hub, HubOf(board, stream));
  return hub->History(max_lines);
}

absl::StatusOr<uint64_t> HardwareBroker::SerialNextSeq(const std::string& board,
                                                       const std::string& stream) {
  ASSIGN_OR_RETURN(SerialHub * hub, HubOf(board, stream));
  return hub->next_seq();
}

absl::StatusOr<std::optional<SerialLine>> HardwareBroker::SerialWaitFor(
    const std::string& board, const std::regex& pattern, uint64_t since, int timeout_ms,
    const CancelToken* cancel, const std::string& stream) {
  ASSIGN_OR_RETURN(SerialHub * hub, HubOf(board, stream));
  telemetry::ActiveSpan wait("serial_wait", board);
  wait->Set("fwai.board", board);
  wait->SetInt("fwai.serial.timeout_ms", timeout_ms);
  auto line = hub->WaitFor(pattern, since, timeout_ms, cancel);
  wait->SetBool("fwai.serial.matched", line.has_value());
  return line;
}

namespace {

std::string FormatFrames(const nlohmann::json& stack) {
  std::string out;
  if (!stack.is_array()) return out;
  for (const auto& f : stack) {
    absl::StrAppend(&out, "#", MiString(f, "level", "?"), "  ", MiString(f, "addr"), " in ",
                    MiString(f, "func", "??"));
    if (f.contains("file"))
      absl::StrAppend(&out, " at ", MiString(f, "file"), ":", MiString(f, "line"));
    out += "\n";
  }
  return out;
}

// OpenOCD serving GDB for a physical board, on a free port: its address
// ("127.0.0.1:PORT"), its pid in `*pid`.
absl::StatusOr<std::string> StartGdbServer(const BoardConfig& cfg, pid_t* pid) {
  const std::string& board = cfg.id;
  if (cfg.openocd_config.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("board ", board, " has no openocd_config to start a GDB server"));
  }
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  std::vector<std::string> args = OpenOcdArgs(cfg);
  args.insert(args.end(), {"-c", absl::StrCat("gdb_port ", *port), "-c", "tcl_port disabled", "-c",
                           "telnet_port disabled"});
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<char*> argv = ExecArgv(args);
  *pid = ForkLongLived([&] { ExecChild(argv.data(), -1, pipefd[1], pipefd[1]); });
  close(pipefd[1]);
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool ready = false;
  while (std::chrono::steady_clock::now() < deadline && !ready) {
    pollfd p{pipefd[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[1024];
    ssize_t n = read(pipefd[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    ready = absl::StrContains(out, "for gdb connections");
  }
  close(pipefd[0]);
  if (!ready) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    *pid = -1;
    return absl::UnavailableError(
        absl::StrCat("OpenOCD did not start a GDB server for ", board, ": ", out));
  }
  return absl::StrCat("127.0.0.1:", *port);
}

// What the broker knows of `b` for a capture: the image it runs (by the
// hash its flash record names) and the serial lines before now.
CaptureSource CaptureSourceOf(HardwareBroker::Board& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu) {
  CaptureSource s;
  s.board = b.cfg.id;
  s.target = b.cfg.target;
  s.machine = b.cfg.machine;
  s.image_path = b.image;
  {
    MutexLock lock(&b.state_mu);
    s.image_sha256 = b.image_sha256;
  }
  s.ram_origin = static_cast<uint32_t>(b.cfg.ram_origin);
  s.ram_size = static_cast<uint32_t>(b.cfg.ram_size);
  for (const auto& l : b.hub->History(100))
    s.serial_before.push_back({{"seq", l.seq}, {"text", l.text}});
  return s;
}

// One debug command on `gdb` (fwai's words: fault, capture, reset, print, bt,
// continue [S], break; anything else as a gdb console command): its entry
// (command, output, and what gdb said).
nlohmann::json RunDebugCommand(GdbSession& gdb, HardwareBroker::Board& b, const std::string& raw,
                               int timeout_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu) {
  std::string cmd(absl::StripAsciiWhitespace(raw));
  nlohmann::json entry = {{"command", cmd}};
  std::string text;
  auto word_end = cmd.find(' ');
  std::string verb = cmd.substr(0, word_end);
  std::string arg = word_end == std::string::npos
                        ? ""
                        : std::string(absl::StripAsciiWhitespace(cmd.substr(word_end)));
  absl::StatusOr<MiResponse> r = absl::UnknownError("");
  if (auto refused = RefuseGdbCommand(cmd)) {
    text = absl::StrCat("error: ", *refused);
    entry["error"] = text;
  } else if (verb == "fault" || cmd == "decode fault" || cmd == "info fault") {
    auto f = DecodeFault(gdb);
    if (!f.ok()) {
      text = absl::StrCat("error: ", f.status().message());
      entry["error"] = text;
    } else {
      entry["fault"] = f->ToJson();
      text = f->summary;
      if (f->in_fault) {
        absl::StrAppendFormat(&text, "\n  CFSR=0x%08x HFSR=0x%08x MMFAR=0x%08x BFAR=0x%08x",
                              f->cfsr, f->hfsr, f->mmfar, f->bfar);
        for (const auto& c : f->causes) absl::StrAppend(&text, "\n  - ", c);
        if (!f->frame.empty()) {
          text += "\n  stacked:";
          for (const char* k : {"r0", "r1", "r2", "r3", "r12", "lr", "pc", "xpsr"}) {
            if (f->frame.contains(k))
              absl::StrAppend(&text, " ", k, "=", f->frame[k].get<std::string>());
          }
        }
      }
    }
  } else if (verb == "capture") {
    auto c = CaptureFault(gdb, CaptureSourceOf(b));
    if (!c.ok()) {
      text = absl::StrCat("error: ", c.status().message());
      entry["error"] = text;
    } else {
      const nlohmann::json& fault = (*c)["fault"];
      text = absl::StrCat("captured ", b.cfg.id, " (", b.cfg.ram_size, " bytes of RAM, registers, ",
                          "fault status, ", (*c)["serial_before"].size(),
                          " serial lines): ", fault.value("summary", fault.value("error", "")));
      entry["capture"] = *std::move(c);
    }
  } else if (verb == "reset") {
    if (b.simulated()) {
      auto s = b.qemu->Reset();
      text = s.ok() ? "reset (system reset of the simulated board)"
                    : absl::StrCat("error: ", s.message());
    } else {
      r = gdb.Console("monitor reset halt", timeout_ms);
      text = r.ok() ? (r->result_class == "error" ? "error: " + r->error : "reset (halted)")
                    : std::string(r.status().message());
    }
  } else if ((verb == "print" || verb == "p") && !arg.empty()) {
    r = gdb.Mi("-data-evaluate-expression \"" +
                   absl::StrReplaceAll(arg, {{"\\", "\\\\"}, {"\"", "\\\""}}) + "\"",
               timeout_ms);
    if (r.ok() && r->result_class == "done") {
      text = absl::StrCat(arg, " = ", MiString(r->results, "value"));
      entry["value"] = MiString(r->results, "value");
    }
  } else if (cmd == "bt" || cmd == "backtrace" || cmd == "where") {
    r = gdb.Mi("-stack-list-frames 0 64", timeout_ms);
    if (r.ok() && r->result_class == "done") {
      entry["frames"] = r->results.contains("stack") && r->results["stack"].is_array()
                            ? r->results["stack"]
                            : nlohmann::json::array();
      text = FormatFrames(entry["frames"]);
    }
  } else if (verb == "continue" || verb == "c") {
    int wait = arg.empty() ? timeout_ms : std::max(1, std::atoi(arg.c_str())) * 1000;
    r = gdb.Mi("-exec-continue", timeout_ms);
    if (r.ok() && r->result_class == "running") {
      auto st = gdb.WaitStopped(wait);
      if (st.ok()) {
        entry["stopped"] = *st;
        const auto& res = (*st).value("results", nlohmann::json::object());
        text = absl::StrCat("stopped: ", MiString(res, "reason", "interrupted"));
        if (res.is_object() && res.contains("frame")) {
          const auto& frame = res["frame"];
          absl::StrAppend(&text, " in ", MiString(frame, "func", "??"));
          if (frame.is_object() && frame.contains("file")) {
            absl::StrAppend(&text, " at ", MiString(frame, "file"), ":", MiString(frame, "line"));
          }
        }
        if ((*st).value("interrupted_after_timeout", false))
          absl::StrAppend(&text, " (interrupted after ", wait / 1000, " s)");
      } else {
        text = absl::StrCat("error: ", st.status().message());
      }
    }
  } else if (verb == "break" || verb == "b") {
    r = gdb.Mi("-break-insert " + arg, timeout_ms);
    if (r.ok() && r->result_class == "done") {
      entry["breakpoint"] =
          r->results.contains("bkpt") ? r->results["bkpt"] : nlohmann::json::object();
      const auto& bp = entry["breakpoint"];
      text = absl::StrCat("breakpoint ", MiString(bp, "number", "?"), " at ", MiString(bp, "addr"),
                          " in ", MiString(bp, "func", "??"),
                          bp.is_object() && bp.contains("file")
                              ? " at " + MiString(bp, "file") + ":" + MiString(bp, "line")
                              : "");
    }
  } else {
    r = gdb.Console(cmd, timeout_ms);
    if (r.ok() && r->result_class == "running") {
      auto st = gdb.WaitStopped(timeout_ms);
      if (st.ok()) entry["stopped"] = *st;
    }
  }
  if (text.empty()) {
    if (!r.ok()) {
      text = absl::StrCat("error: ", r.status().message());
      entry["error"] = text;
    } else if (r->result_class == "error") {
      text = absl::StrCat("error: ", r->error);
      entry["error"] = r->error;
    } else {
      text = r->console;
      if (!r->results.empty()) entry["result"] = r->results;
    }
  }
  if (r.ok() && !r->console.empty()) entry["console"] = r->console;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  entry["output"] = text;
  return entry;
}

}  // namespace

absl::StatusOr<DebugResult> HardwareBroker::Debug(const Caller& caller, const std::string& board,
                                                  const std::vector<std::string>& commands,
                                                  int timeout_ms, CancelToken* cancel) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (commands.empty()) return absl::InvalidArgumentError("no debug commands given");
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("debugging needs the lease: ", s.message()));
  }
  if (timeout_ms <= 0) timeout_ms = 10000;
  MutexLock op(&b->op_mu);
  leases_->Touch(board, caller.identity);
  b->debug_cancel = false;
  std::string target;
  pid_t ocd_pid = -1;
  if (b->simulated()) {
    if (!b->qemu || !b->qemu->running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("board ", board, " is not running; flash an image first"));
    }
    target = b->qemu->gdb_target();
  } else {
    auto started = StartGdbServer(b->cfg, &ocd_pid);
    if (!started.ok()) return started.status();
    target = *started;
  }
  auto stop_ocd = [&] {
    if (ocd_pid > 0) {
      kill(ocd_pid, SIGTERM);
      waitpid(ocd_pid, nullptr, 0);
      ocd_pid = -1;
    }
  };
  auto gdb = GdbSession::Start(FindGdb(b->cfg.gdb), b->image);
  if (!gdb.ok()) {
    stop_ocd();
    return gdb.status();
  }
  // A cancel kills gdb: a command waiting on the target returns at once. The
  // pid is forgotten before the session reaps it (a reused pid is never hit).
  struct Abort {
    explicit Abort(pid_t p) : pid(p) {}
    Mutex mu;
    pid_t pid ABSL_GUARDED_BY(mu);
  };
  auto abort = std::make_shared<Abort>((*gdb)->pid());
  struct Disarm {
    std::shared_ptr<Abort> a;
    ~Disarm() {
      MutexLock lock(&a->mu);
      a->pid = -1;
    }
  } disarm{abort};
  if (cancel) {
    cancel->OnCancel([abort] {
      MutexLock lock(&abort->mu);
      if (abort->pid > 0) kill(abort->pid, SIGKILL);
    });
  }
  if (auto s = (*gdb)->Connect(target); !s.ok()) {
    stop_ocd();
    return s;
  }
  DebugResult result;
  for (const auto& raw : commands) {
    if (b->debug_cancel) {
      result.outputs.push_back("(stopped: the lease ended)");
      break;
    }
    if (cancel && cancel->cancelled()) {
      result.outputs.push_back("(stopped: cancelled)");
      break;
    }
    nlohmann::json entry = RunDebugCommand(**gdb, *b, raw, timeout_ms);
    if (entry.contains("capture")) RecordCapture(caller, entry["capture"]);
    result.outputs.push_back(entry["output"].get<std::string>());
    result.results.push_back(std::move(entry));
  }
  (*gdb)->Detach();
  gdb->reset();
  stop_ocd();
  return result;
}

void HardwareBroker::RecordCapture(const Caller& caller, const nlohmann::json& capture) {
  auto recorder = Recorder();
  if (!recorder) return;
  const std::string text = capture.dump();
  const nlohmann::json& image = capture["image"];
  recorder({{"kind", "fault_capture"},
            {"board", capture.value("board", "")},
            {"image_sha256", image.value("sha256", "")},
            {"capture_sha256", BytesSha256Hex(text)},
            {"bytes", text.size()},
            {"fault", capture["fault"].value("summary", "")},
            {"by", caller.display},
            {"session_id", caller.session_id}});
}

absl::Status HardwareBroker::Reset(const Caller& caller, const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("reset needs the lease: ", s.message()));
  }
  MutexLock op(&b->op_mu);
  leases_->Touch(board, caller.identity);
  if (b->simulated()) {
    if (b->qemu && b->qemu->running()) return b->qemu->Reset();
    if (b->image.empty())
      return absl::FailedPreconditionError(
          absl::StrCat(board, " has no firmware; flash an image first"));
    return PowerOn(*b);
  }
  if (b->cfg.openocd_config.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("board ", board, " has no openocd_config to reset it"));
  }
  std::vector<std::string> argv = OpenOcdArgs(b->cfg);
  argv.insert(argv.end(), {"-c", "init; reset run; shutdown"});
  auto r = RunProcess(argv);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return absl::InternalError(absl::StrCat("openocd reset failed: ", r->err));
  return absl::OkStatus();
}

}  // namespace fwai
