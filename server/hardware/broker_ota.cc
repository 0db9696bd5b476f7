// HardwareBroker: over-the-air updates through MCUboot slots (simulated
// boards) or the board's ota_* commands (physical ones).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/clock.h"
#include "common/paths.h"
#include "common/subprocess.h"
#include "common/verdict.h"
#include "server/hardware/broker.h"
#include "server/hardware/broker_internal.h"
#include "server/hardware/qemu.h"
#include "server/hardware/sim_mcuboot.h"
#include "server/storage/storage.h"

namespace fwai {

using broker_internal::BootRegex;
using broker_internal::kFlashPrefix;

absl::StatusOr<OtaBootResult> HardwareBroker::BootFromSlots(Board& b) {
  if (!b.slots)
    return absl::FailedPreconditionError(absl::StrCat("board ", b.cfg.id, " has no OTA slots"));
  auto boot = b.slots->Boot();
  if (!boot.ok()) return boot.status();
  OtaBootResult r;
  r.swap = boot->swap;
  r.detail = boot->detail;
  if (!boot->bootable) {
    // Nothing to run: the board stays off, as a real one would hang in its bootloader.
    b.restarting = true;
    b.hub->Close("the simulated board has no bootable image", false);
    b.StopQemu();
    b.restarting = false;
    b.SetHealth("bad", boot->error);
    // The bootloader refused the image: the firmware's failure, not the board's.
    return WithVerdict(
        absl::FailedPreconditionError(absl::StrCat("board ", b.cfg.id, ": ", boot->error)),
        kVerdictFirmware);
  }
  const std::string payload = absl::StrCat(run_dir_, "/", b.cfg.id, "-slot0.bin");
  if (auto s = WriteFileAtomic(payload, boot->payload); !s.ok()) return s;
  b.from_slots = true;
  if (auto s = BootSimulated(b, payload); !s.ok()) return s;
  r.version = boot->primary.version;
  r.hash = boot->primary.hash;
  {
    MutexLock lock(&b.state_mu);
    b.image = payload;
    b.image_sha256 = boot->primary.hash;
    b.ota_version = r.version;
  }
  nlohmann::json rec = {{"image", payload},
                        {"sha256", r.hash},
                        {"time_us", NowMicros()},
                        {"mcuboot", true},
                        {"version", r.version}};
  if (auto s = storage_.Put(Cf::kLeases, kFlashPrefix + b.cfg.id, rec.dump(), true); !s.ok())
    return s;
  return r;
}

void HardwareBroker::SetOtaOptions(std::string dir, std::vector<std::string> keys) {
  ota_dir_ = std::move(dir);
  ota_keys_ = std::move(keys);
}

absl::StatusOr<BoardConfig> HardwareBroker::BoardConfigOf(const std::string& board) const {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  return b->cfg;
}

absl::Status HardwareBroker::RunOtaCommand(Board& b, const std::string& what,
                                           const std::string& tmpl, const std::string& image) {
  if (tmpl.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("board ", b.cfg.id, " has no ", what,
                                                      " command (hardware.boards[].", what,
                                                      " in fwaid.yaml)"));
  }
  std::string cmd = absl::StrReplaceAll(tmpl, {{"{image}", ShellQuote(image)},
                                               {"{port}", ShellQuote(b.cfg.serial)},
                                               {"{probe}", ShellQuote(b.cfg.probe)}});
  ProcessOptions po;
  po.timeout_ms = 300000;
  auto r = RunProcess({"/bin/sh", "-c", cmd}, po);
  if (!r.ok()) return r.status();
  if (r->timed_out || r->exit_code != 0) {
    std::string out = r->out + r->err;
    return absl::InternalError(
        absl::StrCat(what, " on ", b.cfg.id, " failed (",
                     r->timed_out ? "timed out" : absl::StrCat("exit ", r->exit_code),
                     "): ", out.size() > 2000 ? out.substr(out.size() - 2000) : out));
  }
  return absl::OkStatus();
}

absl::Status HardwareBroker::OtaStage(const Caller& caller, const std::string& board,
                                      const std::string& image, bool permanent) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = CheckScope(caller, board, true); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("an update needs the lease: ", s.message()));
  }
  MutexLock op(&b->op_mu);
  leases_->Touch(board, caller.identity);
  if (b->simulated()) {
    if (!b->slots)
      return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no OTA slots"));
    return b->slots->Stage(image, permanent);
  }
  const std::string path = absl::StrCat(run_dir_, "/", board, "-ota.bin");
  if (auto s = WriteFileAtomic(path, image); !s.ok()) return s;
  return RunOtaCommand(*b, "ota_upload", b->cfg.ota_upload, path);
}

absl::StatusOr<OtaBootResult> HardwareBroker::OtaRestart(const Caller& caller,
                                                         const std::string& board,
                                                         int boot_timeout_ms) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("restarting for an update needs the lease: ", s.message()));
  }
  MutexLock op(&b->op_mu);
  leases_->Touch(board, caller.identity);
  uint64_t since = b->hub->next_seq();
  OtaBootResult r;
  if (b->simulated()) {
    auto boot = BootFromSlots(*b);
    if (!boot.ok()) return boot.status();
    r = *boot;
  } else {
    if (auto s = RunOtaCommand(*b, "ota_reset", b->cfg.ota_reset, ""); !s.ok()) return s;
  }
  r.booted = b->cfg.boot_pattern.empty();
  if (!b->cfg.boot_pattern.empty()) {
    auto re = BootRegex(b->cfg);
    if (!re.ok()) return re.status();
    auto line = b->hub->WaitFor(*re, since, boot_timeout_ms);
    if (line) r.boot_line = line->text;
    r.booted = line.has_value();
  }
  return r;
}

absl::Status HardwareBroker::OtaConfirm(const Caller& caller, const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("confirming an update needs the lease: ", s.message()));
  }
  MutexLock op(&b->op_mu);
  if (b->simulated()) {
    if (!b->slots)
      return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no OTA slots"));
    return b->slots->Confirm();
  }
  return RunOtaCommand(*b, "ota_confirm", b->cfg.ota_confirm, "");
}

absl::Status HardwareBroker::OtaRestorePrevious(const Caller& caller, const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("reverting an update needs the lease: ", s.message()));
  }
  MutexLock op(&b->op_mu);
  if (!b->simulated()) {
    return absl::UnimplementedError(
        absl::StrCat("board ", board,
                     ": going back from a confirmed update is done by "
                     "rolling out the previous image again on physical boards"));
  }
  if (!b->slots)
    return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no OTA slots"));
  return b->slots->RestorePrevious();
}

absl::StatusOr<OtaSlotsInfo> HardwareBroker::OtaSlots(const std::string& board) const {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  OtaSlotsInfo out;
  out.simulated = b->simulated();
  if (!b->slots) return out;
  MutexLock op(&b->op_mu);
  out.booted_from_slots = b->from_slots;
  for (int i : {0, 1}) {
    auto st = b->slots->State(i);
    if (!st.ok()) return st.status();
    auto& o = i == 0 ? out.primary : out.secondary;
    o.has_image = st->has_image;
    o.version = st->version;
    o.hash = st->hash;
    o.magic = st->magic;
    o.image_ok = st->image_ok;
    o.copy_done = st->copy_done;
  }
  return out;
}

}  // namespace fwai
