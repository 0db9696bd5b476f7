#include "server/hardware/gdb_mi.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/subprocess.h"

namespace fwai {

namespace {

struct MiParser {
  std::string_view s;
  size_t i = 0;

  absl::Status Fail(const char* what) const {
    return absl::InvalidArgumentError(absl::StrCat("MI parse error at ", i, ": ", what));
  }
  absl::StatusOr<std::string> CString() {
    if (i >= s.size() || s[i] != '"') return Fail("expected a string");
    ++i;
    std::string out;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\' && i < s.size()) {
        char e = s[i++];
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          default:
            if (e >= '0' && e <= '7') {
              int v = e - '0';
              for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k)
                v = v * 8 + (s[i++] - '0');
              out += static_cast<char>(v);
            } else {
              out += e;
            }
        }
      } else {
        out += c;
      }
    }
    if (i >= s.size()) return Fail("unterminated string");
    ++i;
    return out;
  }
  absl::StatusOr<nlohmann::json> Value() {
    if (i >= s.size()) return Fail("expected a value");
    if (s[i] == '"') {
      auto v = CString();
      if (!v.ok()) return v.status();
      return nlohmann::json(*v);
    }
    if (s[i] == '{') {
      ++i;
      nlohmann::json obj = nlohmann::json::object();
      if (i < s.size() && s[i] == '}') {
        ++i;
        return obj;
      }
      while (true) {
        auto r = Result(obj);
        if (!r.ok()) return r;
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') {
          ++i;
          return obj;
        }
        return Fail("expected , or }");
      }
    }
    if (s[i] == '[') {
      ++i;
      nlohmann::json arr = nlohmann::json::array();
      if (i < s.size() && s[i] == ']') {
        ++i;
        return arr;
      }
      while (true) {
        // A list holds values or name=value results.
        size_t save = i;
        while (i < s.size() &&
               (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '-' || s[i] == '_'))
          ++i;
        if (i < s.size() && s[i] == '=' && i > save) {
          i = save;
          nlohmann::json one = nlohmann::json::object();
          auto r = Result(one);
          if (!r.ok()) return r;
          // frame={...} entries in a list: keep the value itself.
          arr.push_back(one.size() == 1 ? one.begin().value() : one);
        } else {
          i = save;
          auto v = Value();
          if (!v.ok()) return v;
          arr.push_back(*v);
        }
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') {
          ++i;
          return arr;
        }
        return Fail("expected , or ]");
      }
    }
    return Fail("unexpected character");
  }
  absl::Status Result(nlohmann::json& into) {
    size_t start = i;
    while (i < s.size() && s[i] != '=') ++i;
    if (i >= s.size()) return Fail("expected name=value");
    std::string name(s.substr(start, i - start));
    ++i;
    auto v = Value();
    if (!v.ok()) return v.status();
    if (into.contains(name)) {
      if (!into[name].is_array()) into[name] = nlohmann::json::array({into[name]});
      into[name].push_back(*v);
    } else {
      into[name] = *v;
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseMiResults(std::string_view text) {
  MiParser p{text};
  nlohmann::json out = nlohmann::json::object();
  while (p.i < text.size()) {
    if (auto s = p.Result(out); !s.ok()) return s;
    if (p.i < text.size()) {
      if (text[p.i] != ',') return p.Fail("expected ,");
      ++p.i;
    }
  }
  return out;
}

std::string MiString(const nlohmann::json& tuple, const char* key, const std::string& fallback) {
  if (!tuple.is_object()) return fallback;
  auto it = tuple.find(key);
  return it != tuple.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::string FindGdb(const std::string& preferred) {
  std::vector<std::string> names;
  if (!preferred.empty()) names.push_back(preferred);
  names.push_back("gdb-multiarch");
  names.push_back("arm-none-eabi-gdb");
  for (const auto& n : names) {
    if (std::string found = FindProgram(n); !found.empty()) return found;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<GdbSession>> GdbSession::Start(const std::string& gdb,
                                                              const std::string& elf) {
  if (gdb.empty()) {
    return absl::FailedPreconditionError(
        "no GDB found: install gdb-multiarch (or arm-none-eabi-gdb)");
  }
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return absl::InternalError("pipe failed");
  }
  // No init files, and nothing the image could make GDB load (its
  // .debug_gdb_scripts) or read on the host (source files named in its DWARF).
  std::vector<std::string> args = {gdb,    "--interpreter=mi3", "-q",   "-nx",
                                   "-iex", "set auto-load off", "-iex", "set source open off"};
  if (!elf.empty()) args.push_back(elf);
  std::vector<char*> argv = ExecArgv(args);
  pid_t pid =
      ForkLongLived([&] { ExecChild(argv.data(), to_child[0], from_child[1], from_child[1]); });
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  close(to_child[0]);
  close(from_child[1]);
  std::unique_ptr<GdbSession> g = Attach(to_child[1], from_child[0]);
  g->pid_ = pid;
  // Wait for the first prompt.
  std::string line;
  while (true) {
    if (!g->ReadLine(line, 15000))
      return absl::UnavailableError(absl::StrCat(gdb, " did not start"));
    if (line.rfind("(gdb)", 0) == 0) break;
  }
  (void)g->Mi("-gdb-set confirm off");
  (void)g->Mi("-gdb-set pagination off");
  (void)g->Mi("-gdb-set print pretty off");
  // gdb waits 2 s for a remote's reply by default. A stub that is a process
  // gdb starts (`target remote | fwai fault rsp ...`) may take longer to
  // answer its first packet on a loaded machine; gdb then gives up on it and
  // reads its late reply as the answer to the next packet.
  (void)g->Mi("-gdb-set remotetimeout 20");
  return g;
}

std::unique_ptr<GdbSession> GdbSession::Attach(int to_gdb, int from_gdb) {
  std::unique_ptr<GdbSession> g(new GdbSession());
  g->in_fd_ = to_gdb;
  g->out_fd_ = from_gdb;
  return g;
}

GdbSession::~GdbSession() {
  if (pid_ > 0) {
    std::string quit = "-gdb-exit\n";
    (void)!write(in_fd_, quit.data(), quit.size());
    for (int i = 0; i < 50; ++i) {
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      waitpid(pid_, &st, 0);
    }
  }
  if (in_fd_ >= 0) close(in_fd_);
  if (out_fd_ >= 0) close(out_fd_);
}

bool GdbSession::ReadLine(std::string& line, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      line = buf_.substr(0, nl);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      buf_.erase(0, nl + 1);
      return true;
    }
    if (closed_) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{out_fd_, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char b[8192];
    ssize_t n = read(out_fd_, b, sizeof b);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    buf_.append(b, static_cast<size_t>(n));
  }
}

absl::StatusOr<MiResponse> GdbSession::Mi(const std::string& command, int timeout_ms) {
  const int token = token_++;
  std::string line = absl::StrCat(token, command, "\n");
  if (write(in_fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return absl::UnavailableError("gdb is gone");
  }
  MiResponse resp;
  const std::string prefix = absl::StrCat(token, "^");
  std::string l;
  while (true) {
    if (!ReadLine(l, timeout_ms)) {
      if (closed_)
        return absl::UnavailableError(
            absl::StrCat("gdb is gone (its output ended) during '", command, "'"));
      return absl::DeadlineExceededError(
          absl::StrCat("gdb did not answer '", command, "' within ", timeout_ms, " ms"));
    }
    if (l.rfind(prefix, 0) == 0) {
      std::string rest = l.substr(prefix.size());
      size_t comma = rest.find(',');
      resp.result_class = rest.substr(0, comma);
      if (comma != std::string::npos) {
        auto r = ParseMiResults(std::string_view(rest).substr(comma + 1));
        if (r.ok()) resp.results = *r;
      }
      if (resp.result_class == "error") resp.error = MiString(resp.results, "msg", "error");
      return resp;
    }
    if (!l.empty() && l[0] == '~') {
      MiParser p{std::string_view(l).substr(1)};
      auto s = p.CString();
      if (s.ok()) resp.console += *s;
    } else if (!l.empty() && l[0] == '*') {
      size_t comma = l.find(',');
      nlohmann::json ev = {
          {"class", l.substr(1, comma == std::string::npos ? std::string::npos : comma - 1)}};
      if (comma != std::string::npos) {
        auto r = ParseMiResults(std::string_view(l).substr(comma + 1));
        if (r.ok()) ev["results"] = *r;
      }
      pending_async_.push_back(ev);
    }
  }
}

absl::StatusOr<MiResponse> GdbSession::Console(const std::string& command, int timeout_ms) {
  std::string quoted = "\"";
  for (char c : command) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  quoted += '"';
  return Mi("-interpreter-exec console " + quoted, timeout_ms);
}

absl::StatusOr<nlohmann::json> GdbSession::WaitStopped(int timeout_ms) {
  auto take = [&]() -> std::optional<nlohmann::json> {
    for (auto it = pending_async_.begin(); it != pending_async_.end(); ++it) {
      if ((*it)["class"] == "stopped") {
        auto ev = *it;
        pending_async_.erase(it);
        return ev;
      }
    }
    return std::nullopt;
  };
  if (auto ev = take()) return *ev;
  std::string l;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool interrupted = false;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (interrupted)
        return absl::DeadlineExceededError("the target did not stop after an interrupt");
      std::string cmd = "-exec-interrupt\n";
      (void)!write(in_fd_, cmd.data(), cmd.size());
      interrupted = true;
      left = std::chrono::milliseconds(3000);
    }
    if (!ReadLine(l, static_cast<int>(left.count()))) {
      if (closed_)
        return absl::UnavailableError("gdb is gone (its output ended) while the target ran");
      continue;
    }
    if (l.rfind("*stopped", 0) == 0) {
      nlohmann::json ev = {{"class", "stopped"}, {"interrupted_after_timeout", interrupted}};
      size_t comma = l.find(',');
      if (comma != std::string::npos) {
        auto r = ParseMiResults(std::string_view(l).substr(comma + 1));
        if (r.ok()) ev["results"] = *r;
      }
      return ev;
    }
  }
}

absl::Status GdbSession::Connect(const std::string& host_port) {
  auto r = Mi("-target-select remote " + host_port, 15000);
  if (!r.ok()) return r.status();
  if (r->result_class == "error") {
    return absl::UnavailableError(
        absl::StrCat("gdb could not connect to ", host_port, ": ", r->error));
  }
  return absl::OkStatus();
}

void GdbSession::Detach() { (void)Mi("-target-detach", 5000); }

// ---- Cortex-M faults ----

std::vector<std::string> DecodeFaultBits(uint32_t cfsr, uint32_t hfsr, uint32_t mmfar,
                                         uint32_t bfar) {
  std::vector<std::string> out;
  auto bit = [](uint32_t v, int b) { return (v >> b) & 1u; };
  if (bit(hfsr, 30))
    out.push_back(
        "forced: a configurable fault escalated to HardFault (its handler is disabled or it "
        "faulted itself)");
  if (bit(hfsr, 1)) out.push_back("vector table read failed during exception processing");
  if (bit(hfsr, 31)) out.push_back("debug event");
  // MemManage
  if (bit(cfsr, 0))
    out.push_back("memory management: instruction fetch from a no-execute or protected region");
  if (bit(cfsr, 1)) out.push_back("memory management: data access violation");
  if (bit(cfsr, 3)) out.push_back("memory management: fault while unstacking on exception return");
  if (bit(cfsr, 4))
    out.push_back("memory management: fault while stacking on exception entry (stack overflow?)");
  if (bit(cfsr, 5))
    out.push_back("memory management: fault during floating-point lazy state preservation");
  if (bit(cfsr, 7))
    out.push_back(absl::StrFormat("memory management: faulting address 0x%08x", mmfar));
  // BusFault
  if (bit(cfsr, 8)) out.push_back("bus fault: instruction fetch from an invalid address");
  if (bit(cfsr, 9))
    out.push_back(
        "bus fault: precise data bus error (a load or store to an address that does not answer)");
  if (bit(cfsr, 10))
    out.push_back(
        "bus fault: imprecise data bus error (a buffered write failed; the stacked pc is after the "
        "culprit)");
  if (bit(cfsr, 11)) out.push_back("bus fault: fault while unstacking on exception return");
  if (bit(cfsr, 12))
    out.push_back("bus fault: fault while stacking on exception entry (stack overflow?)");
  if (bit(cfsr, 13))
    out.push_back("bus fault: fault during floating-point lazy state preservation");
  if (bit(cfsr, 15)) out.push_back(absl::StrFormat("bus fault: faulting address 0x%08x", bfar));
  // UsageFault
  if (bit(cfsr, 16)) out.push_back("usage fault: undefined instruction");
  if (bit(cfsr, 17))
    out.push_back(
        "usage fault: invalid state (a branch to an address without the Thumb bit, or a corrupt "
        "xPSR)");
  if (bit(cfsr, 18))
    out.push_back("usage fault: invalid exception return value (corrupt EXC_RETURN in lr)");
  if (bit(cfsr, 19)) out.push_back("usage fault: coprocessor access (FPU not enabled?)");
  if (bit(cfsr, 24)) out.push_back("usage fault: unaligned access");
  if (bit(cfsr, 25)) out.push_back("usage fault: divide by zero");
  return out;
}

nlohmann::json FaultReport::ToJson() const {
  return {{"in_fault", in_fault},
          {"exception", exception},
          {"cfsr", absl::StrFormat("0x%08x", cfsr)},
          {"hfsr", absl::StrFormat("0x%08x", hfsr)},
          {"mmfar", absl::StrFormat("0x%08x", mmfar)},
          {"bfar", absl::StrFormat("0x%08x", bfar)},
          {"frame", frame},
          {"location", location},
          {"causes", causes},
          {"summary", summary}};
}

namespace {

absl::StatusOr<uint64_t> EvalNumber(GdbSession& gdb, const std::string& expr) {
  auto r = gdb.Mi("-data-evaluate-expression \"" + expr + "\"");
  if (!r.ok()) return r.status();
  if (r->result_class == "error")
    return absl::InternalError(absl::StrCat("gdb: ", expr, ": ", r->error));
  std::string v = MiString(r->results, "value");
  size_t sp = v.find(' ');
  if (sp != std::string::npos) v = v.substr(0, sp);
  uint64_t out = 0;
  if (v.rfind("0x", 0) == 0) {
    if (!absl::SimpleHexAtoi(v.substr(2), &out))
      return absl::InternalError("gdb: not a number: " + v);
  } else {
    int64_t sv = 0;
    if (!absl::SimpleAtoi(v, &sv)) return absl::InternalError("gdb: not a number: " + v);
    out = static_cast<uint64_t>(sv) & 0xffffffffull;
  }
  return out;
}

}  // namespace

absl::StatusOr<FaultReport> DecodeFault(GdbSession& gdb) {
  FaultReport rep;
  auto xpsr = EvalNumber(gdb, "$xpsr");
  if (!xpsr.ok()) return xpsr.status();
  const uint32_t ipsr = static_cast<uint32_t>(*xpsr) & 0x1ff;
  static const char* kNames[] = {"", "", "NMI", "HardFault", "MemManage", "BusFault", "UsageFault"};
  if (ipsr < 3 || ipsr > 6) {
    rep.summary = ipsr == 0
                      ? "the core is not in a fault handler (thread mode)"
                      : absl::StrCat("the core is in exception ", ipsr, ", not a fault handler");
    return rep;
  }
  rep.in_fault = true;
  rep.exception = kNames[ipsr];
  auto read32 = [&](uint32_t addr) -> uint32_t {
    auto v = EvalNumber(gdb, absl::StrFormat("*(unsigned int*)0x%08x", addr));
    return v.ok() ? static_cast<uint32_t>(*v) : 0;
  };
  rep.cfsr = read32(0xE000ED28);
  rep.hfsr = read32(0xE000ED2C);
  rep.mmfar = read32(0xE000ED34);
  rep.bfar = read32(0xE000ED38);
  rep.causes = DecodeFaultBits(rep.cfsr, rep.hfsr, rep.mmfar, rep.bfar);
  // GDB unwinds through the exception entry ("<signal handler called>"); the
  // frame after it is where the fault happened, with the stacked registers.
  auto frames = gdb.Mi("-stack-list-frames 0 32");
  int fault_level = -1;
  nlohmann::json fault_frame;
  if (frames.ok() && frames->results.contains("stack") && frames->results["stack"].is_array()) {
    const auto& stack = frames->results["stack"];
    for (size_t i = 0; i + 1 < stack.size(); ++i) {
      if (MiString(stack[i], "func") == "<signal handler called>") {
        fault_frame = stack[i + 1];
        if (!absl::SimpleAtoi(MiString(fault_frame, "level"), &fault_level) || fault_level < 0)
          fault_level = -1;
        break;
      }
    }
  }
  if (fault_level >= 0) {
    rep.location = MiString(fault_frame, "func", "??");
    if (fault_frame.contains("file")) {
      absl::StrAppend(&rep.location, " at ", MiString(fault_frame, "file"), ":",
                      MiString(fault_frame, "line"));
    }
    (void)gdb.Mi(absl::StrCat("-stack-select-frame ", fault_level));
    for (const char* reg : {"r0", "r1", "r2", "r3", "r12", "lr", "pc", "xpsr"}) {
      auto v = EvalNumber(gdb, absl::StrCat("$", reg));
      if (v.ok()) rep.frame[reg] = absl::StrFormat("0x%08x", *v);
    }
    (void)gdb.Mi("-stack-select-frame 0");
  }
  std::string pc = rep.frame.value("pc", "");
  rep.summary =
      absl::StrCat(rep.exception, pc.empty() ? "" : " at pc=" + pc,
                   rep.location.empty() ? "" : " in " + rep.location,
                   rep.causes.empty() ? "" : ": ", rep.causes.empty() ? "" : rep.causes.back());
  for (const auto& c : rep.causes) {
    if (c.rfind("bus fault: precise", 0) == 0 || c.rfind("usage fault", 0) == 0 ||
        c.rfind("memory management: data", 0) == 0 ||
        c.rfind("memory management: instruction", 0) == 0 ||
        c.rfind("bus fault: instruction", 0) == 0 || c.rfind("bus fault: imprecise", 0) == 0) {
      rep.summary = absl::StrCat(rep.exception, pc.empty() ? "" : " at pc=" + pc,
                                 rep.location.empty() ? "" : " in " + rep.location, ": ", c);
      for (const auto& a : rep.causes) {
        if (a.find("faulting address") != std::string::npos)
          absl::StrAppend(&rep.summary, "; ", a.substr(a.find("faulting address")));
      }
      break;
    }
  }
  return rep;
}

}  // namespace fwai
