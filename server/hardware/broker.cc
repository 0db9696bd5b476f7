#include "server/hardware/broker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/paths.h"
#include "common/subprocess.h"
#include "server/hardware/broker_internal.h"
#include "server/hardware/discovery.h"
#include "server/hardware/firmware_image.h"
#include "server/hardware/qemu.h"
#include "server/hardware/sim_mcuboot.h"
#include "server/storage/storage.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

namespace fs = std::filesystem;

using broker_internal::kFlashPrefix;

HardwareBroker::HardwareBroker(const HardwareConfig& config, Storage& storage, std::string run_dir)
    : config_(config),
      storage_(storage),
      run_dir_(std::move(run_dir)),
      supervisor_(std::make_unique<Supervisor>()) {
  std::vector<BoardConfig> boards = config.boards;
  if (boards.empty() && config.default_simulated_board) {
    BoardConfig b;
    b.id = "sim-stm32vl";
    b.kind = "simulated";
    b.machine = "stm32vldiscovery";
    b.tags = {"simulated", "stm32f1", "stm32vldiscovery"};
    b.boot_pattern = "booted";
    ApplyBoardDefaults(b);
    boards.push_back(b);
  }
  for (auto& c : boards) {
    auto b = std::make_unique<Board>();
    b->cfg = c;
    b->history_lines = static_cast<size_t>(config.history_lines);
    b->hub = std::make_unique<SerialHub>(c.id, b->history_lines);
    if (c.maintenance) b->SetHealth("maintenance", "marked maintenance in the config", true);
    boards_.push_back(std::move(b));
  }
  leases_ = std::make_unique<LeaseManager>(
      storage_,
      [this](const LeaseRecord& l, const std::string& reason) { OnLeaseEnded(l, reason); });
}

HardwareBroker::~HardwareBroker() { Shutdown(); }

absl::Status HardwareBroker::Start() {
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  if (auto s = leases_->Start(); !s.ok()) return s;
  for (auto& bp : boards_) {
    Board& b = *bp;
    Board* raw = &b;
    b.hub->SetOnFailure([this, raw](const std::string& reason) {
      if (raw->restarting) return;
      raw->SetHealth("bad", reason + (raw->simulated() ? " (the simulator stopped)" : ""));
      spdlog::warn("board {}: {}", raw->cfg.id, reason);
      supervisor_->cv.SignalAll();
    });
    // Booting it is work on the board: under its op_mu, as for any other.
    MutexLock op(&b.op_mu);
    if (auto rec = storage_.Get(Cf::kLeases, kFlashPrefix + b.cfg.id);
        rec.ok() && rec->has_value()) {
      auto j = nlohmann::json::parse(**rec, nullptr, false);
      if (!j.is_discarded()) {
        MutexLock lock(&b.state_mu);
        b.image = j.value("image", "");
        b.image_sha256 = j.value("sha256", "");
      }
    }
    bool from_slots = false;
    if (auto rec = storage_.Get(Cf::kLeases, kFlashPrefix + b.cfg.id);
        rec.ok() && rec->has_value()) {
      auto j = nlohmann::json::parse(**rec, nullptr, false);
      from_slots = !j.is_discarded() && j.value("mcuboot", false);
    }
    if (b.simulated() && !ota_dir_.empty()) {
      b.slots = std::make_unique<SimMcuboot>(absl::StrCat(ota_dir_, "/", b.cfg.id),
                                             static_cast<uint32_t>(b.cfg.ota_slot_size), ota_keys_);
      if (auto s = b.slots->Init(); !s.ok()) {
        spdlog::warn("board {}: OTA slots: {}", b.cfg.id, std::string(s.message()));
        b.slots.reset();
      }
    }
    if (b.simulated() && from_slots && b.slots && b.cfg.image.empty()) {
      if (auto r = BootFromSlots(b); !r.ok()) {
        b.SetHealth("bad", std::string(r.status().message()));
        spdlog::warn("board {}: {}", b.cfg.id, std::string(r.status().message()));
      }
    } else if (b.simulated()) {
      std::string image = !b.cfg.image.empty() ? b.cfg.image : b.image;
      if (!image.empty() && fs::exists(image, ec)) {
        if (auto s = BootSimulated(b, image); !s.ok()) {
          b.SetHealth("bad", std::string(s.message()));
          spdlog::warn("board {}: {}", b.cfg.id, std::string(s.message()));
        }
      }
    } else if (!b.cfg.serial.empty()) {
      if (auto s = b.hub->Open(b.cfg.serial, b.Settings()); !s.ok()) {
        b.SetHealth("bad", std::string(s.message()));
        spdlog::warn("board {}: {}", b.cfg.id, std::string(s.message()));
      }
    }
    LoadQuarantine(b);
  }
  supervisor_->thread = std::thread([this] { Supervise(); });
  return absl::OkStatus();
}

void HardwareBroker::Shutdown() {
  stopping_ = true;
  {
    MutexLock lock(&supervisor_->mu);
    supervisor_->stopping = true;
  }
  supervisor_->cv.SignalAll();
  if (supervisor_->thread.joinable()) supervisor_->thread.join();
  for (auto& b : boards_) {
    b->restarting = true;
    b->hub->Close("fwaid is shutting down", true);
    if (!b->simulated()) continue;  // no simulator to stop
    // The simulator is stopped under op_mu, never under a flash, debug
    // session or reset of the board. A debug session stops at its next
    // command; a board still busy after a while keeps its simulator, which
    // ends with fwaid (it dies with its parent).
    b->debug_cancel = true;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    bool stopped = false;
    while (true) {
      if (b->op_mu.TryLock()) {
        b->StopQemu();
        b->op_mu.Unlock();
        stopped = true;
        break;
      }
      if (std::chrono::steady_clock::now() >= give_up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!stopped) {
      spdlog::warn(
          "board {}: still busy (flash, debug or reset) after 3 s of shutting down; "
          "its simulator is not stopped cleanly and ends with fwaid",
          b->cfg.id);
    }
  }
}

// Reopens physical ports that went away (unplugged, not yet present).
void HardwareBroker::Supervise() {
  MutexLock lock(&supervisor_->mu);
  while (!supervisor_->stopping) {
    supervisor_->cv.WaitWithTimeout(&supervisor_->mu, std::chrono::seconds(2));
    if (supervisor_->stopping) break;
    lock.Unlock();
    for (auto& b : boards_) {
      if (b->simulated() || b->cfg.serial.empty() || b->hub->is_open() || b->restarting) continue;
      std::error_code ec;
      if (!fs::exists(b->cfg.serial, ec)) continue;
      if (auto st = b->hub->Open(b->cfg.serial, b->Settings()); st.ok()) {
        b->SetHealth("good", "");
        spdlog::info("board {}: serial port {} is back", b->cfg.id, b->cfg.serial);
      } else {
        b->SetHealth("bad", std::string(st.message()));
      }
    }
    lock.Lock();
  }
}

HardwareBroker::Board* HardwareBroker::FindBoard(const std::string& id) const {
  for (const auto& b : boards_) {
    if (b->cfg.id == id) return b.get();
  }
  return nullptr;
}

absl::StatusOr<std::string> HardwareBroker::ResolveBoard(const std::string& id,
                                                         const Caller& caller) const {
  if (!id.empty()) {
    if (FindBoard(id)) return id;
    std::vector<std::string> ids;
    for (const auto& b : boards_) ids.push_back(b->cfg.id);
    return absl::NotFoundError(absl::StrCat(
        "no board '", id, "' (boards: ", ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
  }
  std::vector<std::string> mine;
  for (const auto& l : leases_->All()) {
    if (FindBoard(l.device_id) &&
        (l.identity == caller.identity || (caller.identity.empty() && !caller.session_id.empty() &&
                                           l.session_id == caller.session_id))) {
      mine.push_back(l.device_id);
    }
  }
  if (mine.size() == 1) return mine[0];
  if (boards_.size() == 1) return boards_[0]->cfg.id;
  if (boards_.empty())
    return absl::NotFoundError("no boards are configured (hardware.boards in fwaid.yaml)");
  std::vector<std::string> ids;
  for (const auto& b : boards_) ids.push_back(b->cfg.id);
  return absl::InvalidArgumentError(
      absl::StrCat("several boards (", absl::StrJoin(ids, ", "), "); name one"));
}

std::vector<DeviceInfo> HardwareBroker::List() const {
  std::vector<DeviceInfo> out;
  std::map<std::string, LeaseRecord> held;
  for (const auto& l : leases_->All()) held[l.device_id] = l;
  auto fill_lease = [&](DeviceInfo& d) {
    auto it = held.find(d.id);
    if (it != held.end()) {
      d.holder = it->second.holder;
      d.held_since_us = it->second.acquired_us;
      d.lease_expires_us = it->second.expires_us;
    }
  };
  for (const auto& b : boards_) {
    DeviceInfo d;
    d.id = b->cfg.id;
    d.kind = b->simulated() ? "simulated" : "board";
    d.name = b->simulated() ? absl::StrCat("QEMU ", b->cfg.machine)
                            : (b->cfg.target.empty() ? b->cfg.id : b->cfg.target);
    std::tie(d.health, d.health_reason) = b->Health();
    d.tags = b->cfg.tags;
    d.target = b->cfg.target;
    d.path = b->simulated() ? b->hub->path() : b->cfg.serial;
    d.serial_number = b->cfg.probe;
    {
      // Under state_mu, not op_mu: a listing never waits for a flash.
      const Board::Listing l = b->Listed();
      d.image = l.image;
      d.image_sha256 = l.image_sha256;
      d.running = b->simulated() ? (l.up && !l.paused) : b->hub->is_open();
      d.state = d.running ? "running" : (l.up && l.paused) ? "paused" : "stopped";
      if (l.up) d.pid = l.pid;
      d.ota_version = l.ota_version;
    }
    d.streams = b->StreamsListed();
    fill_lease(d);
    out.push_back(std::move(d));
  }
  for (const auto& dd : DiscoverDevices(config_.sysfs_root, config_.dev_root)) {
    DeviceInfo d;
    d.id = dd.id;
    d.kind = dd.kind;
    d.name = dd.manufacturer.empty() ? dd.name : absl::StrCat(dd.manufacturer, " ", dd.name);
    d.health = "good";
    d.vid_pid = dd.vid_pid;
    d.serial_number = dd.serial_number;
    d.path = dd.stable_path.empty() ? dd.path : dd.stable_path;
    for (const auto& b : boards_) {
      if ((!b->cfg.serial.empty() &&
           (b->cfg.serial == dd.path || b->cfg.serial == dd.stable_path)) ||
          (!b->cfg.probe.empty() &&
           (b->cfg.probe == dd.serial_number || b->cfg.probe == dd.vid_pid))) {
        d.tags.push_back("board:" + b->cfg.id);
      }
    }
    fill_lease(d);
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<LeaseRecord> HardwareBroker::Acquire(
    const Caller& caller, const std::string& device_id, const std::vector<std::string>& tags,
    int ttl_s, int wait_s, const std::function<bool()>& cancelled, const std::string& lease_id) {
  if (ttl_s <= 0) ttl_s = config_.default_ttl_s;
  if (ttl_s > config_.max_ttl_s) {
    return absl::InvalidArgumentError(
        absl::StrCat("ttl ", ttl_s, " s is above the limit of ", config_.max_ttl_s, " s"));
  }
  if (wait_s < 0 || wait_s > 86400)
    return absl::InvalidArgumentError("wait must be 0..86400 seconds");
  std::vector<std::string> candidates;
  if (!device_id.empty()) {
    if (!FindBoard(device_id)) {
      bool found = false;
      for (const auto& d : DiscoverDevices(config_.sysfs_root, config_.dev_root))
        found |= d.id == device_id;
      if (!found) {
        std::vector<std::string> ids;
        for (const auto& b : boards_) ids.push_back(b->cfg.id);
        return absl::NotFoundError(absl::StrCat(
            "no board or device '", device_id,
            "' (boards: ", ids.empty() ? "none" : absl::StrJoin(ids, ", "), "; see fwai hw ls)"));
      }
    }
    candidates.push_back(device_id);
  } else {
    for (const auto& b : boards_) {
      bool all = true;
      for (const auto& t : tags)
        all &= std::find(b->cfg.tags.begin(), b->cfg.tags.end(), t) != b->cfg.tags.end();
      if (all) candidates.push_back(b->cfg.id);
    }
    if (candidates.empty()) {
      return absl::NotFoundError(absl::StrCat("no board has tags ", absl::StrJoin(tags, ", ")));
    }
  }
  if (caller.scope) {
    std::vector<std::string> allowed;
    absl::Status refused;
    for (const auto& id : candidates) {
      if (auto s = CheckScope(caller, id, false); s.ok()) {
        allowed.push_back(id);
      } else {
        refused = s;
      }
    }
    if (allowed.empty()) return refused;
    candidates = allowed;
  }
  LeaseRecord who;
  who.lease_id = lease_id;  // "": a new id
  who.holder = caller.display.empty() ? caller.identity : caller.display;
  who.identity = caller.identity;
  who.uid = caller.uid;
  who.session_id = caller.session_id;
  who.token_id = caller.token_id;
  auto available = [this](const std::string& id) -> absl::Status {
    Board* b = FindBoard(id);
    if (!b) return absl::OkStatus();
    auto [health, reason] = b->Health();
    if (health == "good") return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "board ", id, " is ", health, reason.empty() ? "" : ": " + reason, "; it is not handed out",
        health == "quarantined" || health == "maintenance"
            ? ""
            : absl::StrCat(" (fwai hw test ", id, " re-checks it)")));
  };
  const std::string wants =
      device_id.empty() ? absl::StrCat("tags ", absl::StrJoin(tags, ", ")) : device_id;
  auto lease = leases_->Acquire(candidates, who, ttl_s, wait_s * 1000, available, cancelled, wants);
  if (!lease.ok()) return lease;
  if (Board* b = FindBoard(lease->device_id); b && !transcript_dir_.empty() && !lease->renewed) {
    MutexLock lock(&transcripts_mu_);
    transcript_from_[lease->lease_id] = b->hub->next_seq();
  }
  if (Board* b = FindBoard(lease->device_id); b && b->simulated()) {
    MutexLock op(&b->op_mu);
    if (b->paused && b->qemu && b->qemu->running() && b->qemu->Continue().ok()) b->SetPaused(false);
  }
  // A board with a power switch is powered for its holder (and off again
  // when the lease ends).
  if (Board* b = FindBoard(lease->device_id); b && !b->cfg.power_on.empty() && !lease->renewed) {
    ProcessOptions po;
    po.timeout_ms = 30000;
    auto r = RunProcess({"/bin/sh", "-c", b->cfg.power_on}, po);
    if (!r.ok() || r->exit_code != 0) {
      std::string why = !r.ok() ? std::string(r.status().message())
                                : absl::StrCat("exit ", r->exit_code, ": ", r->err.substr(0, 500));
      b->SetHealth("bad", absl::StrCat("power_on failed: ", why));
      (void)leases_->Release(lease->lease_id, "", caller.identity, false, false);
      return absl::UnavailableError(absl::StrCat("board ", b->cfg.id, ": power_on failed: ", why));
    }
  }
  return lease;
}

absl::Status HardwareBroker::SetLeaseExpiry(const std::string& lease_id,
                                            std::optional<int64_t> expires_us,
                                            const std::string& reason) {
  return leases_->SetExpiry(lease_id, expires_us, reason);
}

absl::StatusOr<LeaseRecord> HardwareBroker::Renew(const Caller& caller,
                                                  const std::string& lease_id) {
  return leases_->Renew(lease_id, caller.identity, caller.admin);
}

absl::StatusOr<LeaseRecord> HardwareBroker::Release(const Caller& caller,
                                                    const std::string& lease_id,
                                                    const std::string& device_id, bool force) {
  return leases_->Release(lease_id, device_id, caller.identity, force, caller.admin);
}

void HardwareBroker::SessionEnded(const std::string& session_id) {
  leases_->ReleaseSession(session_id);
}

std::vector<LeaseRecord> HardwareBroker::TokenEnded(const std::string& token_id,
                                                    const std::string& reason) {
  return leases_->ReleaseTakenWith(token_id, reason);
}

std::vector<LeaseRecord> HardwareBroker::Leases() const { return leases_->All(); }

std::vector<LeaseWaiter> HardwareBroker::Waiters() const { return leases_->Waiters(); }

nlohmann::json HardwareBroker::TakeTranscript(const std::string& lease_id) {
  MutexLock lock(&transcripts_mu_);
  auto it = transcripts_.find(lease_id);
  if (it == transcripts_.end()) return nullptr;
  nlohmann::json t = std::move(it->second);
  transcripts_.erase(it);
  return t;
}

nlohmann::json HardwareBroker::KeepTranscript(const LeaseRecord& lease) {
  Board* b = FindBoard(lease.device_id);
  if (!b || transcript_dir_.empty()) return nullptr;
  uint64_t from = 1;  // a lease from before a restart: what this process saw
  {
    MutexLock lock(&transcripts_mu_);
    if (auto it = transcript_from_.find(lease.lease_id); it != transcript_from_.end()) {
      from = it->second;
      transcript_from_.erase(it);
    }
  }
  std::string text;
  uint64_t lines = 0, first = 0;
  for (const auto& l : b->hub->History(0)) {
    if (l.seq < from) continue;
    if (first == 0) first = l.seq;
    absl::StrAppend(&text, l.text, "\n");
    ++lines;
  }
  const uint64_t end = b->hub->next_seq();
  // Lines the history ring dropped before the lease ended are counted, not hidden.
  const uint64_t lost = first == 0 ? (end > from ? end - from : 0) : first - from;
  const std::string sha = BytesSha256Hex(text);
  const std::string path = absl::StrCat(transcript_dir_, "/", sha, ".log");
  nlohmann::json t = {{"sha256", sha},     {"bytes", text.size()}, {"lines", lines},
                      {"first_seq", from}, {"lost_lines", lost},   {"path", path}};
  if (auto s = MakeDirs(transcript_dir_, 0700); !s.ok()) {
    t["error"] = std::string(s.message());
  } else if (auto w = WriteFileAtomic(path, text, 0600); !w.ok()) {
    t["error"] = std::string(w.message());
  }
  return t;
}

void HardwareBroker::OnLeaseEnded(const LeaseRecord& lease, const std::string& reason) {
  spdlog::info("lease {} on {} ({}) ended: {}", lease.lease_id, lease.device_id, lease.holder,
               reason);
  if (lease.acquired_us > 0) {
    telemetry::RecordLease(lease.device_id,
                           static_cast<double>(NowMicros() - lease.acquired_us) / 1e6);
  }
  Board* b = FindBoard(lease.device_id);
  if (!b) return;
  if (nlohmann::json t = KeepTranscript(lease); !t.is_null()) {
    if (absl::StartsWith(reason, "released by") || absl::StartsWith(reason, "force-released")) {
      // The release's own record (lease_released / lease_kicked) takes it.
      MutexLock lock(&transcripts_mu_);
      if (transcripts_.size() > 1000) transcripts_.erase(transcripts_.begin());
      transcripts_[lease.lease_id] = std::move(t);
    } else if (auto recorder = [this] {
                 MutexLock lock(&hooks_mu_);
                 return recorder_;
               }()) {
      recorder({{"kind", "lease_ended"},
                {"lease_id", lease.lease_id},
                {"board", lease.device_id},
                {"holder", lease.identity},
                {"holder_name", lease.holder},
                {"reason", reason},
                {"serial_transcript", std::move(t)}});
    }
  }
  b->debug_cancel = true;
  // A simulated board nobody holds is paused: a firmware spinning in a fault
  // handler must not eat a core of a shared machine. It resumes when leased.
  if (b->simulated()) {
    MutexLock op(&b->op_mu);
    if (b->qemu && b->qemu->running() && b->qemu->Pause().ok()) b->SetPaused(true);
  }
  if (!b->cfg.power_off.empty()) {
    ProcessOptions po;
    po.timeout_ms = 30000;
    auto r = RunProcess({"/bin/sh", "-c", b->cfg.power_off}, po);
    if (!r.ok() || r->exit_code != 0) spdlog::warn("board {}: power_off failed", b->cfg.id);
  }
  const std::string why =
      absl::StrCat("lease ", lease.lease_id, " on ", lease.device_id, " ended: ", reason);
  const auto held = [&](const SerialReader& r) { return r.lease_id == lease.lease_id; };
  b->hub->EndReaders(held, why);
  for (SerialHub* h : b->Streams()) h->EndReaders(held, why);
}

absl::Status HardwareBroker::CheckHolder(const Caller& caller, const std::string& board) const {
  if (!FindBoard(board)) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  return leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id);
}

absl::Status HardwareBroker::SetHealth(const Caller& caller, const std::string& board,
                                       const std::string& health, const std::string& reason) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (!caller.admin)
    return absl::PermissionDeniedError("only root or the daemon's user may set a board's health");
  if (health != "good" && health != "bad" && health != "maintenance" && health != "quarantined") {
    return absl::InvalidArgumentError(
        absl::StrCat("health must be good, bad, maintenance or quarantined, not '", health, "'"));
  }
  const std::string was = b->Health().first;
  const std::string why = reason.empty() ? absl::StrCat("set by ", caller.display) : reason;
  b->SetHealth(health, why, /*admin=*/true);
  AdminHealthChanged(*b, was, health, why, caller);
  return absl::OkStatus();
}

absl::StatusOr<std::string> HardwareBroker::SelfTest(const Caller& caller,
                                                     const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto holder = leases_->Holder(board);
      holder &&
      !leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id).ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("self-test would disturb the holder: ", DescribeHeld(*holder)));
  }
  if (auto [health, reason] = b->Health(); health == "maintenance" || health == "quarantined") {
    return absl::FailedPreconditionError(
        absl::StrCat(board, health == "maintenance" ? " is in maintenance" : " is quarantined",
                     reason.empty() ? "" : ": " + reason, "; an admin sets it back to good"));
  }
  MutexLock op(&b->op_mu);
  std::string report;
  absl::Status verdict;
  if (!b->cfg.self_test.empty()) {
    ProcessOptions po;
    po.timeout_ms = 120000;
    auto r = RunProcess({"/bin/sh", "-c", b->cfg.self_test}, po);
    if (!r.ok()) {
      verdict = r.status();
    } else {
      report = r->out + r->err;
      if (r->exit_code != 0)
        verdict =
            absl::InternalError(absl::StrCat("self-test exited ", r->exit_code, ": ", report));
    }
  } else if (b->simulated()) {
    if (b->image.empty()) {
      verdict = absl::FailedPreconditionError("no firmware to boot; flash an image first");
    } else {
      uint64_t since = b->hub->next_seq();
      verdict = PowerOn(*b);
      if (verdict.ok() && !b->cfg.boot_pattern.empty()) {
        auto line = b->hub->WaitFor(std::regex(b->cfg.boot_pattern), since, 15000);
        if (!line)
          verdict = absl::DeadlineExceededError(
              "booted, but the boot pattern did not appear within 15 s");
        else
          report = "booted: " + line->text;
      }
    }
  } else {
    if (b->cfg.serial.empty() || b->hub->is_open() ||
        b->hub->Open(b->cfg.serial, b->Settings()).ok()) {
      report = "serial port open";
    } else {
      verdict =
          absl::UnavailableError(absl::StrCat("serial port ", b->cfg.serial, " cannot be opened"));
    }
  }
  if (!verdict.ok()) {
    b->SetHealth("bad", absl::StrCat("self-test failed: ", verdict.message()), true);
    return verdict;
  }
  {
    MutexLock lock(&b->state_mu);
    b->admin_health = false;
  }
  b->SetHealth("good", "");
  if (b->simulated() && !leases_->Holder(board) && b->qemu && b->qemu->Pause().ok()) {
    b->SetPaused(true);
  }
  return report.empty() ? std::string("ok") : report;
}

absl::Status HardwareBroker::PowerOn(Board& b) {
  if (b.from_slots && b.slots) return BootFromSlots(b).status();
  return BootSimulated(b, b.image);
}

absl::Status HardwareBroker::CheckScope(const Caller& caller, const std::string& board,
                                        bool flash) const {
  if (!caller.scope) return absl::OkStatus();
  const CapabilityScope& sc = *caller.scope;
  Board* b = FindBoard(board);
  std::vector<std::string> tags = b ? b->cfg.tags : std::vector<std::string>{};
  bool tagged = std::any_of(sc.boards.begin(), sc.boards.end(), [&](const std::string& t) {
    return std::find(tags.begin(), tags.end(), t) != tags.end();
  });
  if (!tagged) {
    return absl::PermissionDeniedError(absl::StrCat(
        "plugin ", sc.plugin, " did not declare board ", board,
        " (capabilities.boards: ", sc.boards.empty() ? "none" : absl::StrJoin(sc.boards, ", "),
        "; the board carries ", tags.empty() ? "no tags" : absl::StrJoin(tags, ", "), ")"));
  }
  if (flash && !sc.flash) {
    return absl::PermissionDeniedError(
        absl::StrCat("plugin ", sc.plugin, " did not declare the flash capability"));
  }
  return absl::OkStatus();
}

}  // namespace fwai
