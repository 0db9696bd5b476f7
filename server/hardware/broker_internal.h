// Internal to HardwareBroker's .cc files (broker.cc, broker_flash.cc,
// broker_serial_debug.cc, broker_ota.cc): the definitions of its private
// nested types and the helpers more than one of those files uses. Nothing
// else includes it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "server/hardware/broker.h"
#include "server/hardware/qemu.h"
#include "server/hardware/serial_hub.h"
#include "server/hardware/sim_mcuboot.h"

namespace fwai {

struct HardwareBroker::Board {
  BoardConfig cfg;
  std::unique_ptr<SerialHub> hub;
  // The simulator, whether it is paused, and the image the board runs are
  // changed under op_mu and state_mu both, so they are read whole under
  // either: work on the board holds op_mu; List() takes only state_mu (it
  // must not wait for a flash).
  std::unique_ptr<QemuInstance> qemu;  // simulated boards while running
  std::unique_ptr<SimMcuboot> slots;   // simulated boards with an OTA directory
  bool from_slots = false;             // runs the primary slot's image (op_mu)
  std::string ota_version;             // ... of this version (state_mu)
  std::mutex op_mu;                    // one flash / debug / reset at a time
  mutable std::mutex state_mu;
  std::string health = "good";  // good | bad | maintenance
  std::string health_reason;
  bool admin_health = false;  // set by an admin; not auto-recovered
  std::string image;          // last image loaded
  std::string image_sha256;
  std::atomic<bool> restarting{false};
  std::atomic<bool> debug_cancel{false};
  std::atomic<uint64_t> generation{0};  // bumps on each (re)start
  bool paused = false;                  // simulated: stopped while nobody holds it

  // Replaces the simulator (null: none); the old one is destroyed after
  // state_mu is let go (its exit callback may take state_mu). Caller holds op_mu.
  void SetQemu(std::unique_ptr<QemuInstance> q) {
    std::unique_ptr<QemuInstance> old;
    {
      std::lock_guard lock(state_mu);
      old = std::move(qemu);
      qemu = std::move(q);
    }
  }
  // Takes the simulator out of the board under state_mu (a listing then sees
  // none, and never reads one being stopped) and stops it outside the lock
  // (its exit callback may take state_mu). Caller holds op_mu.
  void StopQemu() {
    std::unique_ptr<QemuInstance> old;
    {
      std::lock_guard lock(state_mu);
      old = std::move(qemu);
    }
    if (old) old->Stop();
  }
  // Caller holds op_mu.
  void SetPaused(bool p) {
    std::lock_guard lock(state_mu);
    paused = p;
  }

  bool simulated() const { return cfg.kind == "simulated"; }
  void SetHealth(const std::string& h, const std::string& reason, bool admin = false) {
    std::lock_guard lock(state_mu);
    if (admin_health && !admin) return;
    health = h;
    health_reason = reason;
    if (admin) admin_health = h != "good";
  }
  std::pair<std::string, std::string> Health() const {
    std::lock_guard lock(state_mu);
    return {health, health_reason};
  }
  SerialSettings Settings() const {
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
};

struct HardwareBroker::Supervisor {
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;
};

namespace broker_internal {

inline constexpr char kFlashPrefix[] = "flash/";

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

inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
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
