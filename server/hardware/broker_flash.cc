// HardwareBroker: flashing behind the guard (ELF images and MCUboot images),
// and (re)booting simulated boards.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "common/mcuboot.h"
#include "common/paths.h"
#include "common/subprocess.h"
#include "common/verdict.h"
#include "server/firmware/elf_file.h"
#include "server/firmware/memory.h"
#include "server/firmware/sbom.h"
#include "server/hardware/broker.h"
#include "server/hardware/broker_internal.h"
#include "server/hardware/firmware_image.h"
#include "server/hardware/qemu.h"
#include "server/hardware/rtt_pump.h"
#include "server/hardware/sim_mcuboot.h"
#include "server/storage/storage.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

namespace fs = std::filesystem;

using broker_internal::BootRegex;
using broker_internal::kFlashPrefix;
using broker_internal::OpenOcdArgs;

namespace {

bool IsMcubootFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char m[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(m), 4);
  uint32_t v = m[0] | (m[1] << 8) | (m[2] << 16) | (static_cast<uint32_t>(m[3]) << 24);
  return in.gcount() == 4 && v == mcuboot::kImageMagic;
}

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The board's boot pattern on its serial port after `since`, within its
// boot_timeout_s: the line that matched. A pattern that never came is the
// firmware's failure; a port that closed meanwhile (the simulator died, the
// adapter was pulled) the lab's.
absl::StatusOr<std::string> WaitForBoot(
    HardwareBroker::Board& b, uint64_t since,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel) {
  progress(
      {"booting", 0.9, absl::StrCat("waiting for '", b.cfg.boot_pattern, "' on the serial port")});
  auto re = BootRegex(b.cfg);
  if (!re.ok()) return WithVerdict(re.status(), kVerdictConfig);
  // The port gone before or while it waits: the lab's failure.
  auto port_gone = [&b] {
    auto [health, why] = b.Health();
    return WithVerdict(
        absl::UnavailableError(absl::StrCat(
            "flashed ", b.cfg.id, ", but its serial port closed before '", b.cfg.boot_pattern,
            "' appeared", why.empty() ? "" : absl::StrCat(": ", why))),
        kVerdictLab);
  };
  if (!b.hub->is_open()) return port_gone();
  const int timeout_ms = b.cfg.boot_timeout_s * 1000;
  const auto start = std::chrono::steady_clock::now();
  std::optional<SerialLine> line;
  {
    telemetry::ActiveSpan wait("serial_wait", b.cfg.id);
    wait->Set("fwai.board", b.cfg.id);
    wait->Set("fwai.serial.pattern", b.cfg.boot_pattern);
    wait->SetInt("fwai.serial.timeout_ms", timeout_ms);
    line = b.hub->WaitFor(*re, since, timeout_ms, cancel);
    wait->SetBool("fwai.serial.matched", line.has_value());
    if (!line) wait->Fail("the boot pattern did not appear");
  }
  if (line) return line->text;
  if (cancel && cancel->cancelled()) return absl::CancelledError("flash cancelled");
  // WaitFor ends before its time only when the port closes.
  if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(timeout_ms))
    return port_gone();
  return WithVerdict(
      absl::DeadlineExceededError(absl::StrCat("flashed ", b.cfg.id, ", but '", b.cfg.boot_pattern,
                                               "' did not appear on the serial port within ",
                                               b.cfg.boot_timeout_s, " s")),
      kVerdictFirmware);
}

// Starts reading the running simulator's RTT channels: at the image's
// _SEGGER_RTT when it is an ELF that has the symbol, else by a scan of RAM.
// Reading needs the simulator's memory; where fwai may not read it, the
// board keeps its UART and the reason is logged.
void StartTraceStreams(HardwareBroker::Board& b, const std::string& image, bool raw)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu) {
  RttSearch where{std::nullopt, static_cast<uint32_t>(b.cfg.ram_origin),
                  static_cast<uint32_t>(b.cfg.ram_size)};
  if (!raw) {
    if (auto elf = ReadElfFile(image, /*dwarf=*/false); elf.ok()) {
      for (const auto& sym : elf->symbols) {
        if (sym.name == kRttSymbol) where.symbol = static_cast<uint32_t>(sym.address);
      }
    }
  }
  const QemuTargetMemory::Region ram{where.ram_origin, where.ram_size};
  const QemuTargetMemory::Region flash{static_cast<uint32_t>(b.cfg.flash_origin),
                                       static_cast<uint32_t>(b.cfg.flash_size)};
  // Flash too (the channels' names are there), if the simulator maps it whole.
  auto mem = QemuTargetMemory::Open(*b.qemu, {ram, flash});
  if (!mem.ok()) mem = QemuTargetMemory::Open(*b.qemu, {ram});
  if (!mem.ok()) {
    spdlog::warn("board {}: RTT is not read: {}", b.cfg.id, mem.status().ToString());
    return;
  }
  b.StartRtt(*std::move(mem), where, b.cfg.rtt_poll_ms);
}

}  // namespace

absl::Status HardwareBroker::BootSimulated(Board& b, const std::string& image) {
  b.restarting = true;
  b.hub->Close("the simulated board is restarting", false);
  if (b.cfg.semihosting) b.Stream("semihosting")->Close("the simulated board is restarting", false);
  b.StopQemu();
  QemuOptions o;
  o.semihosting = b.cfg.semihosting;
  o.binary = b.cfg.qemu;
  o.machine = b.cfg.machine;
  o.image = image;
  o.run_dir = run_dir_;
  // The primary slot's payload runs where the slot executes: the flash.
  o.raw = b.from_slots;
  o.raw_load_addr = b.cfg.flash_origin;
  auto q = QemuInstance::Start(o);
  if (!q.ok()) {
    b.restarting = false;
    return WithVerdict(q.status(), kVerdictLab);
  }
  b.SetQemu(*std::move(q));
  Board* raw = &b;
  b.qemu->SetOnExit([this, raw](const std::string& why) {
    if (raw->restarting) return;
    raw->SetHealth("bad", why);
    spdlog::warn("board {}: {}", raw->cfg.id, why);
  });
  absl::Status opened = b.hub->Open(b.qemu->pty(), b.Settings());
  if (opened.ok() && b.cfg.semihosting) {
    opened = b.Stream("semihosting")->Open(b.qemu->semihosting_pty(), b.Settings());
  }
  if (!opened.ok()) {
    b.StopQemu();
    b.restarting = false;
    return WithVerdict(opened, kVerdictLab);
  }
  b.generation++;
  b.SetPaused(false);
  b.restarting = false;
  if (auto s = b.qemu->Continue(); !s.ok()) return WithVerdict(s, kVerdictLab);
  if (b.cfg.ram_size > 0 && b.cfg.rtt_poll_ms > 0) StartTraceStreams(b, image, b.from_slots);
  if (!b.from_slots) {
    MutexLock lock(&b.state_mu);
    b.image = image;
    b.ota_version.clear();
  }
  b.SetHealth("good", "");
  // A simulator that died while it started (its port's failure already
  // marked the board) is not made good by this start.
  if (!b.hub->is_open())
    b.SetHealth("bad", "the simulator stopped as it started (its serial port closed)");
  return absl::OkStatus();
}

absl::StatusOr<std::string> HardwareBroker::CopyImageAs(const Caller& caller,
                                                        const std::string& board_id,
                                                        const std::string& path) {
  if (!caller.account) {
    return absl::PermissionDeniedError(absl::StrCat("flash guard (image): reading ", path,
                                                    " needs a local account; ", caller.display,
                                                    " has none"));
  }
  std::string bytes;
  struct stat st {};
  {
    ScopedFsIdentity as(*caller.account);
    if (!as.status().ok()) return as.status();
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "flash guard (image): ", path,
          errno == ENOENT ? " does not exist"
                          : absl::StrCat(": ", caller.account->name, " cannot read it (",
                                         std::strerror(errno), ")")));
    }
    const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (regular && st.st_size <= (64 << 20)) {
      bytes.resize(static_cast<size_t>(st.st_size));
      size_t got = 0;
      while (got < bytes.size()) {
        ssize_t n = read(fd, bytes.data() + got, bytes.size() - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      bytes.resize(got);
    }
    close(fd);
    if (!regular)
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (image): ", path, " is not a regular file"));
    if (st.st_size > (64 << 20))
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (image): ", path, " is over 64 MB"));
  }
  const std::string dir = run_dir_ + "/images";
  if (auto s = MakeDirs(dir, 0700); !s.ok()) return s;
  const std::string out = absl::StrCat(dir, "/", board_id, fs::path(path).extension().string());
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  // Its modification time stays: the freshness rule compares it with the sources.
  timespec times[2] = {st.st_atim, st.st_mtim};
  utimensat(AT_FDCWD, tmp.c_str(), times, 0);
  if (rename(tmp.c_str(), out.c_str()) != 0)
    return absl::InternalError(absl::StrCat("cannot write ", out));
  return out;
}

absl::StatusOr<FlashResult> HardwareBroker::Flash(
    const Caller& caller, const std::string& board_id, const std::string& requested_image,
    bool approved, const std::string& project_root,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
    const FlashGuardPolicy& guard) {
  // Its span, metric and record are the caller's (Boards::Flash).
  return FlashGuarded(caller, board_id, requested_image, approved, project_root, progress, cancel,
                      guard);
}

bool BuildRecordMadeImage(const nlohmann::json& rec, const std::string& sha256) {
  if (!rec.is_object()) return false;
  for (const auto& a : rec.value("artifacts", nlohmann::json::array())) {
    for (const auto& f : a.value("files", nlohmann::json::array())) {
      if (f.value("sha256", "") == sha256) return true;
    }
  }
  return false;
}

absl::Status CheckToolchainRecord(const nlohmann::json& build, const std::string& requested_image,
                                  const std::string& sha256) {
  if (!build.is_object()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "flash guard (toolchain): no build record attests the toolchain of ", requested_image,
        " (sha256 ", sha256.substr(0, 12),
        "); build it with `fwai run build` (policy flash.require_verified_toolchain)"));
  }
  const nlohmann::json tc = build.value("toolchain", nlohmann::json::object());
  if (!tc.value("verified", false)) {
    std::string why = tc.value("error", "");
    for (const auto& p : tc.value("dpkg_verify", nlohmann::json::object())
                             .value("problems", nlohmann::json::array())) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", p.get<std::string>());
      if (why.size() > 400) break;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "flash guard (toolchain): ", requested_image, " was built (", build.value("run_id", ""),
        ") by a toolchain whose files do not verify: ", why.empty() ? "dpkg -V failed" : why,
        " (policy flash.require_verified_toolchain)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> HardwareBroker::CheckRegistersOf(const Caller& caller,
                                                                const std::string& root) const {
  const RegisterCheckHook check = RegisterCheck();
  if (!check) return absl::UnimplementedError("this fwaid has no register checker");
  return check(caller, root);
}

absl::Status GuardRegisters(const RegisterCheckHook& check, const Caller& caller,
                            const std::string& root, const std::string& mode, std::string* said,
                            std::string* warning) {
  if (mode != "warn" && mode != "block") return absl::OkStatus();
  const bool block = mode == "block";
  auto report =
      check ? check(caller, root) : absl::UnimplementedError("this fwaid has no register checker");
  if (!report.ok()) {
    if (block) {
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (register_check): the sources could not be checked: ",
                       report.status().message()));
    }
    *warning =
        absl::StrCat("register_check: the sources were not checked: ", report.status().message());
    return absl::OkStatus();
  }
  const auto& checked = (*report)["checked"];
  const int errors = checked.value("errors", 0);
  const std::string svd = checked.value("svd", "");
  if (errors == 0) {
    *said =
        absl::StrCat(", registers match ", svd, " (", checked.value("accesses", 0), " accesses)");
    return absl::OkStatus();
  }
  std::string list;
  int shown = 0;
  for (const auto& f : (*report)["findings"]) {
    if (f.value("severity", "") != "error" || ++shown > 5) continue;
    absl::StrAppend(&list, shown > 1 ? "; " : "", f.value("file", ""), ":", f.value("line", 0),
                    ": ", f.value("symbol", ""), " ", f.value("code_says", ""), ", but ",
                    f.value("svd_says", ""));
  }
  const std::string what =
      absl::StrCat(errors, " register error", errors == 1 ? "" : "s", " in the sources against ",
                   svd, ": ", list, errors > 5 ? "; …" : "", " (fwai check registers)");
  if (block)
    return absl::FailedPreconditionError(absl::StrCat("flash guard (register_check): ", what));
  *warning = absl::StrCat("register_check: ", what);
  return absl::OkStatus();
}

// The flash guard's memory rules (policy memory budgets and growth): the
// image's use of the board's flash and RAM, and its growth since the
// previous build as its build record says.
absl::Status HardwareBroker::GuardMemory(const Caller& caller, Board& b,
                                         const std::string& image_path,
                                         const std::string& requested_image,
                                         const std::string& root, const nlohmann::json& build,
                                         const FlashGuardPolicy& guard) {
  MemoryOptions mo;
  mo.project_root = root;
  mo.board = b.cfg.id;
  mo.max_symbols = 0;
  if (b.cfg.flash_size > 0)
    mo.board_regions.push_back({"FLASH", b.cfg.flash_origin, b.cfg.flash_size, "rx", "flash"});
  if (b.cfg.ram_size > 0)
    mo.board_regions.push_back({"RAM", b.cfg.ram_origin, b.cfg.ram_size, "rwx", "ram"});
  // The image is fwaid's private copy (read as fwaid); the project's linker
  // map, scripts and .su files beside the caller's image are the caller's.
  auto elf = ReadElfFile(image_path, true);
  if (!elf.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (memory): ", elf.status().message()));
  absl::StatusOr<nlohmann::json> report = absl::UnknownError("");
  {
    std::optional<ScopedFsIdentity> as;
    if (caller.account) as.emplace(*caller.account);
    if (as && !as->status().ok()) return as->status();
    report = AnalyzeMemory(*elf, requested_image, mo);
  }
  if (!report.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (memory): ", report.status().message()));
  nlohmann::json diff;
  if (guard.max_growth_bytes > 0) {
    if (!build.is_object() || !build.contains("memory") || !build["memory"].contains("diff")) {
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (memory): no build record of ", requested_image,
                       " says how much it grew since the previous build; "
                       "build it with `fwai run build` (policy memory.max_growth_bytes)"));
    }
    diff = build["memory"]["diff"];
  }
  MemoryBudget budget{guard.flash_max_pct, guard.ram_max_pct, guard.max_growth_bytes};
  if (auto st = CheckMemoryBudget(*report, diff, budget); !st.ok()) return st;
  return absl::OkStatus();
}

// The image written: a simulated board's QEMU restarted with it, a
// physical one's flash command (with {elf}, {bin}, {hex}, {port}, {probe})
// or OpenOCD program-and-verify. `*flashed_file`: the file written.
absl::Status HardwareBroker::WriteImage(
    Board& b, const std::string& image_path,
    const std::function<void(const FlashProgressUpdate&)>& progress, std::string* flashed_file) {
  std::error_code ec;
  if (b.simulated()) {
    b.from_slots = false;
    progress(
        {"loading", 0.3, absl::StrCat("restarting QEMU ", b.cfg.machine, " with ", image_path)});
    if (auto s = BootSimulated(b, fs::absolute(image_path).string()); !s.ok()) {
      b.SetHealth("bad", std::string(s.message()));
      return s;
    }
    progress(
        {"writing", 0.8,
         absl::StrCat("loaded into the simulated ", b.cfg.target, "; serial on ", b.hub->path())});
  } else {
    std::vector<std::string> argv;
    if (!b.cfg.flash_command.empty()) {
      std::string cmd = b.cfg.flash_command;
      std::string elf = fs::absolute(image_path).string();
      auto derived = [&](const std::string& ext, const std::string& fmt) -> std::string {
        fs::path sibling = fs::path(elf).replace_extension(ext);
        if (fs::exists(sibling, ec) &&
            fs::last_write_time(sibling, ec) >= fs::last_write_time(elf, ec))
          return sibling;
        fs::path out = fs::path(run_dir_) / (b.cfg.id + ext);
        auto r = RunProcess({"arm-none-eabi-objcopy", "-O", fmt, elf, out.string()});
        return r.ok() && r->exit_code == 0 ? out.string() : sibling.string();
      };
      if (absl::StrContains(cmd, "{bin}")) {
        *flashed_file = derived(".bin", "binary");
        absl::StrReplaceAll({{"{bin}", ShellQuote(*flashed_file)}}, &cmd);
      }
      if (absl::StrContains(cmd, "{hex}")) {
        *flashed_file = derived(".hex", "ihex");
        absl::StrReplaceAll({{"{hex}", ShellQuote(*flashed_file)}}, &cmd);
      }
      absl::StrReplaceAll({{"{elf}", ShellQuote(elf)},
                           {"{port}", ShellQuote(b.cfg.serial)},
                           {"{probe}", ShellQuote(b.cfg.probe)}},
                          &cmd);
      argv = {"/bin/sh", "-c", cmd};
    } else if (!b.cfg.openocd_config.empty()) {
      argv = OpenOcdArgs(b.cfg);
      argv.push_back("-c");
      argv.push_back("program " + fs::absolute(image_path).string() + " verify reset exit");
    } else {
      return WithVerdict(absl::FailedPreconditionError(absl::StrCat(
                             "board ", b.cfg.id, " has neither flash_command nor openocd_config")),
                         kVerdictConfig);
    }
    progress({"writing", 0.3, absl::StrJoin(argv, " ")});
    ProcessOptions po;
    po.timeout_ms = 300000;
    // The probe or the port failing to take the image is the lab's failure.
    auto r = RunProcess(argv, po);
    if (!r.ok()) return WithVerdict(r.status(), kVerdictLab);
    std::string out = r->out + r->err;
    if (r->timed_out || r->exit_code != 0) {
      return WithVerdict(absl::InternalError(absl::StrCat(
                             "flashing ", b.cfg.id, " failed (",
                             r->timed_out ? "timed out" : absl::StrCat("exit ", r->exit_code),
                             "): ", out.size() > 2000 ? out.substr(out.size() - 2000) : out)),
                         kVerdictLab);
    }
    progress({"writing", 0.8, "written and verified"});
    MutexLock lock(&b.state_mu);
    b.image = fs::absolute(image_path).string();
  }
  return absl::OkStatus();
}

absl::StatusOr<FlashResult> HardwareBroker::FlashGuarded(
    const Caller& caller, const std::string& board_id, const std::string& requested_image,
    bool approved, const std::string& project_root,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
    const FlashGuardPolicy& guard) {
  bool writing = false;
  auto r = FlashOnce(caller, board_id, requested_image, approved, project_root, progress, cancel,
                     guard, &writing);
  if (r.ok() || writing) {
    CountOutcome(board_id, r.status(), absl::StrCat("flash of ", requested_image));
    return r;
  }
  // Refused before anything was written: the request did not pass the guard
  // (or named no board here), which says nothing of the board.
  if (VerdictOf(r.status()).empty() && r.status().code() != absl::StatusCode::kCancelled)
    return WithVerdict(r.status(), kVerdictConfig);
  return r;
}

absl::StatusOr<FlashResult> HardwareBroker::FlashOnce(
    const Caller& caller, const std::string& board_id, const std::string& requested_image,
    bool approved, const std::string& project_root,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
    const FlashGuardPolicy& guard, bool* writing) {
  const bool check_fresh = guard.check_fresh;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t start_us = NowMicros();
  Board* b = FindBoard(board_id);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board_id, "'"));
  // The guard: every rule is checked here, before anything is written.
  if (auto s = CheckScope(caller, board_id, true); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board_id, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("flash guard (lease): ", s.message()));
  }
  if (requested_image.empty())
    return absl::InvalidArgumentError("flash guard (image): no image given");
  // The image is read as the caller, into a copy only fwaid can read: nobody
  // flashes (and so exposes) a file they could not read themselves.
  auto private_image = CopyImageAs(caller, board_id, requested_image);
  if (!private_image.ok()) return private_image.status();
  const std::string& image_path = *private_image;
  if (IsMcubootFile(image_path)) {
    if (!approved) {
      return absl::FailedPreconditionError(absl::StrCat(
          "flash guard (approval): writing ", requested_image, " to ", board_id,
          " needs a person's confirmation (answer the prompt, or pass --yes / an approved plan)"));
    }
    return FlashMcuboot(caller, *b, image_path, progress, cancel, start_us, writing);
  }
  auto img = ReadFirmwareImage(image_path);
  if (!img.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", img.status().message()));
  if (auto s = CheckImageTarget(*img, b->cfg); !s.ok()) return s;
  if (auto s = CheckImageFits(*img, b->cfg); !s.ok()) return s;
  std::string root;
  {
    // The project's tree is the caller's: walked as the caller, so a freshness
    // refusal never names a file the caller could not see.
    std::optional<ScopedFsIdentity> as;
    if (caller.account) as.emplace(*caller.account);
    if (as && !as->status().ok()) return as->status();
    root = project_root.empty() ? FindProjectRoot(requested_image) : project_root;
    if (check_fresh) {
      if (auto s = CheckImageFresh(*img, root); !s.ok()) return s;
    }
  }
  auto sha = FileSha256(image_path);
  if (!sha.ok()) return sha.status();
  // The rules that need the image's build record: its toolchain, its growth.
  nlohmann::json build = BuildRecordMadeImage(guard.build, *sha) ? guard.build : nlohmann::json();
  if (build.is_null()) build = BuildRecordOf(*sha);
  if (guard.require_verified_toolchain) {
    if (auto s = CheckToolchainRecord(build, requested_image, *sha); !s.ok()) return s;
  }
  if (guard.any_memory_budget()) {
    if (auto s = GuardMemory(caller, *b, image_path, requested_image, root, build, guard); !s.ok())
      return s;
  }
  std::string registers_said, registers_warning;
  if (auto s = GuardRegisters(RegisterCheck(), caller, root, guard.register_check, &registers_said,
                              &registers_warning);
      !s.ok()) {
    return s;
  }
  if (!approved) {
    return absl::FailedPreconditionError(absl::StrCat(
        "flash guard (approval): writing ", requested_image, " to ", board_id,
        " needs a person's confirmation (answer the prompt, or pass --yes / an approved plan)"));
  }
  if (!registers_warning.empty())
    progress({"guard", 0.1, absl::StrCat("warning: ", registers_warning)});
  progress({"guard", 0.1,
            absl::StrCat("guard passed: lease, image (", img->bytes, " bytes, sha256 ",
                         sha->substr(0, 12), "), fits ", b->cfg.target,
                         check_fresh ? ", fresh" : ", freshness waived by policy",
                         guard.any_memory_budget() ? ", within the memory budget" : "",
                         guard.require_verified_toolchain ? ", toolchain verified" : "",
                         registers_said, ", approved")});
  MutexLock op(&b->op_mu);
  if (cancel && cancel->cancelled()) return absl::CancelledError("flash cancelled");
  *writing = true;
  leases_->Touch(board_id, caller.identity);
  FlashResult result;
  result.sha256 = *sha;
  std::string flashed_file =
      fs::absolute(image_path).string();  // what is written: the ELF, or a .bin/.hex made from it
  uint64_t since = b->hub->next_seq();
  if (auto s = WriteImage(*b, image_path, progress, &flashed_file); !s.ok()) return s;
  {
    MutexLock lock(&b->state_mu);
    b->image_sha256 = *sha;
  }
  nlohmann::json rec = {
      {"image", b->image}, {"sha256", *sha}, {"time_us", NowMicros()}, {"by", caller.display}};
  if (auto s = storage_.Put(Cf::kLeases, kFlashPrefix + board_id, rec.dump(), true); !s.ok())
    return WithVerdict(s, kVerdictInfra);
  if (!b->cfg.boot_pattern.empty()) {
    auto line = WaitForBoot(*b, since, progress, cancel);
    if (!line.ok()) return line.status();
    result.boot_line = *line;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    // What the flash record says of it (Boards writes the record).
    auto flashed = FileSha256(flashed_file);
    nlohmann::json rec = {{"kind", "flash"},
                          {"board", board_id},
                          {"target", b->cfg.target},
                          {"image", requested_image},
                          {"image_copy", b->image},
                          {"principal", caller.identity},
                          {"peer", caller.peer},
                          {"image_sha256", *sha},
                          {"flashed_file", flashed_file},
                          {"flashed_sha256", flashed.ok() ? *flashed : ""},
                          {"project", root},
                          {"bytes", img->bytes},
                          {"by", caller.display},
                          {"session_id", caller.session_id},
                          {"approved", approved},
                          {"boot_line", result.boot_line},
                          {"booted", !result.boot_line.empty()},
                          {"seconds", result.seconds}};
    if (build.is_object()) rec["build_run_id"] = build.value("run_id", "");
    // The SBOM of what was flashed: the build's, with the bytes written.
    {
      // Its inputs (the image the caller named, its map, sources) as the caller.
      std::optional<ScopedFsIdentity> as;
      if (caller.account) as.emplace(*caller.account);
      rec["sbom"] = as && !as->status().ok()
                        ? nlohmann::json{{"error", std::string(as->status().message())}}
                        : FlashRecordSbom(rec, build, SbomVersion(), DpkgAdmindir());
    }
    result.record = std::move(rec);
  }
  return result;
}

absl::StatusOr<FlashResult> HardwareBroker::FlashMcuboot(
    const Caller& caller, Board& b, const std::string& image_path,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
    int64_t start_us, bool* writing) {
  if (!b.simulated()) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", image_path,
                     " is an MCUboot image; a physical board takes it through its bootloader "
                     "(fwai ota rollout, with the board's ota_upload command) — flash the ELF to "
                     "program it directly"));
  }
  if (!b.slots)
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): board ", b.cfg.id, " has no OTA slots"));
  auto bytes = ReadWhole(image_path);
  if (!bytes.ok()) return bytes.status();
  auto info = mcuboot::Parse(*bytes);
  if (!info.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (image): ", info.status().message()));
  if (!info->hash_ok) {
    return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", image_path,
                                                      ": its SHA-256 does not match its contents"));
  }
  auto sha = FileSha256(image_path);
  if (!sha.ok()) return sha.status();
  progress({"guard", 0.1,
            absl::StrCat("guard passed: lease, MCUboot image ", info->version.ToString(), " (",
                         bytes->size(), " bytes, sha256 ", sha->substr(0, 12), "), approved")});
  MutexLock op(&b.op_mu);
  if (cancel && cancel->cancelled()) return absl::CancelledError("flash cancelled");
  *writing = true;
  leases_->Touch(b.cfg.id, caller.identity);
  uint64_t since = b.hub->next_seq();
  progress(
      {"writing", 0.3, absl::StrCat("programming the primary slot of ", b.cfg.id, " (confirmed)")});
  if (auto s = b.slots->Program(*bytes); !s.ok()) return WithVerdict(s, kVerdictLab);
  progress({"loading", 0.6, "power-on through the simulated MCUboot"});
  auto boot = BootFromSlots(b);
  if (!boot.ok()) return boot.status();
  FlashResult result;
  result.sha256 = *sha;
  if (!b.cfg.boot_pattern.empty()) {
    auto line = WaitForBoot(b, since, progress, cancel);
    if (!line.ok()) return line.status();
    result.boot_line = *line;
  }
  result.seconds = static_cast<double>(NowMicros() - start_us) / 1e6;
  result.record = {{"kind", "flash"},
                   {"board", b.cfg.id},
                   {"target", b.cfg.target},
                   {"image", image_path},
                   {"image_sha256", *sha},
                   {"mcuboot", {{"version", info->version.ToString()}, {"hash", info->sha256_hex}}},
                   {"bytes", bytes->size()},
                   {"by", caller.display},
                   {"session_id", caller.session_id},
                   {"approved", true},
                   {"boot_line", result.boot_line},
                   {"booted", !result.boot_line.empty()},
                   {"seconds", result.seconds}};
  return result;
}

}  // namespace fwai
