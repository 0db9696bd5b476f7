// Internal to HardwareBroker's .cc files (broker.cc, broker_flash.cc,
// broker_serial_debug.cc, broker_ota.cc): the definitions of its private
// nested types (Board's is in broker.h) and the helpers more than one of
// those files uses. Nothing else includes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/mutex.h"
#include "common/strings.h"
#include "server/hardware/broker.h"
#include "server/hardware/qemu.h"
#include "server/hardware/rtt_pump.h"
#include "server/hardware/serial_hub.h"
#include "server/hardware/sim_mcuboot.h"

namespace fwai {

inline void HardwareBroker::Board::SetQemu(std::unique_ptr<QemuInstance> q) {
  std::unique_ptr<QemuInstance> old;
  {
    MutexLock lock(&state_mu);
    old = std::move(qemu);
    qemu = std::move(q);
  }
}

inline void HardwareBroker::Board::StopQemu() {
  StopRtt();  // it reads the simulator's memory
  std::unique_ptr<QemuInstance> old;
  {
    MutexLock lock(&state_mu);
    old = std::move(qemu);
  }
  if (old) old->Stop();
}

// Every write of qemu, paused and image holds state_mu too (besides op_mu),
// so state_mu alone suffices to read them here.
inline HardwareBroker::Board::Listing HardwareBroker::Board::Listed() const {
  MutexLock lock(&state_mu);
  Listing l;
  l.image = image;
  l.image_sha256 = image_sha256;
  l.ota_version = ota_version;
  l.up = simulated() && qemu && qemu->running();
  l.paused = paused;
  if (l.up) l.pid = qemu->pid();
  return l;
}

inline SerialSettings HardwareBroker::Board::Settings() const {
  SerialSettings s;
  s.baud = cfg.baud;
  s.data_bits = cfg.data_bits;
  s.parity = cfg.parity;
  s.stop_bits = cfg.stop_bits;
  s.flow_control = cfg.flow_control;
  s.encoding = cfg.encoding;
  s.line_ending = cfg.line_ending;
  s.startup_commands = cfg.startup_commands;
  s.log_file = cfg.log_file;
  return s;
}

struct HardwareBroker::Supervisor {
  Mutex mu;
  CondVar cv;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread thread;  // started by Start, joined by Shutdown
};

namespace broker_internal {

inline constexpr char kFlashPrefix[] = "flash/";
// A board's quarantine, kept across restarts (CountOutcome).
inline constexpr char kQuarantinePrefix[] = "quarantine/";

// openocd -f CFG... (and the probe's serial number when known).
inline std::vector<std::string> OpenOcdArgs(const BoardConfig& cfg) {
  std::vector<std::string> args = {"openocd"};
  for (const auto& f : cfg.openocd_config) {
    args.push_back("-f");
    args.push_back(f);
  }
  if (!cfg.probe.empty() && cfg.probe.find(':') == std::string::npos) {
    args.push_back("-c");
    args.push_back("adapter serial " + cfg.probe);
  }
  return args;
}

inline absl::StatusOr<std::regex> BootRegex(const BoardConfig& cfg) {
  try {
    return std::regex(cfg.boot_pattern);
  } catch (const std::regex_error&) {
    return absl::InvalidArgumentError(
        absl::StrCat("board ", cfg.id, ": boot_pattern is not a valid regex"));
  }
}

}  // namespace broker_internal

}  // namespace fwai
