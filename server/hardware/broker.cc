#include "server/hardware/broker.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "common/paths.h"
#include "common/subprocess.h"
#include "server/firmware/memory.h"
#include "server/firmware/sbom.h"
#include "server/hardware/discovery.h"
#include "server/hardware/firmware_image.h"
#include "server/hardware/gdb_mi.h"
#include "server/hardware/qemu.h"
#include "server/hardware/sim_mcuboot.h"
#include "server/telemetry/telemetry.h"
#include "common/mcuboot.h"
#include "common/paths.h"
#include "server/storage/storage.h"

namespace fwai {

namespace fs = std::filesystem;

struct HardwareBroker::Board {
  BoardConfig cfg;
  std::unique_ptr<SerialHub> hub;
  std::unique_ptr<QemuInstance> qemu;  // simulated boards while running
  std::unique_ptr<SimMcuboot> slots;   // simulated boards with an OTA directory
  bool from_slots = false;             // runs the primary slot's image (op_mu)
  std::string ota_version;             // ... of this version (state_mu)
  std::mutex op_mu;                    // one flash / debug / reset at a time
  mutable std::mutex state_mu;
  std::string health = "good";  // good | bad | maintenance
  std::string health_reason;
  bool admin_health = false;    // set by an admin; not auto-recovered
  std::string image;            // last image loaded
  std::string image_sha256;
  std::atomic<bool> restarting{false};
  std::atomic<bool> debug_cancel{false};
  std::atomic<uint64_t> generation{0};  // bumps on each (re)start
  bool paused = false;                  // simulated: stopped while nobody holds it (op_mu)

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

namespace {

constexpr char kFlashPrefix[] = "flash/";

// openocd -f CFG... (and the probe's serial number when known).
std::vector<std::string> OpenOcdArgs(const BoardConfig& cfg) {
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

std::string ShellQuote(const std::string& s) {
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

absl::StatusOr<std::regex> BootRegex(const BoardConfig& cfg) {
  try {
    return std::regex(cfg.boot_pattern);
  } catch (const std::regex_error&) {
    return absl::InvalidArgumentError(absl::StrCat("board ", cfg.id, ": boot_pattern is not a valid regex"));
  }
}

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

}  // namespace

HardwareBroker::HardwareBroker(const HardwareConfig& config, Storage& storage, std::string run_dir)
    : config_(config), storage_(storage), run_dir_(std::move(run_dir)) {
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
    b->hub = std::make_unique<SerialHub>(c.id, static_cast<size_t>(config.history_lines));
    if (c.maintenance) {
      b->health = "maintenance";
      b->health_reason = "marked maintenance in the config";
      b->admin_health = true;
    }
    boards_.push_back(std::move(b));
  }
  leases_ = std::make_unique<LeaseManager>(
      storage_, [this](const LeaseRecord& l, const std::string& reason) { OnLeaseEnded(l, reason); });
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
      if (supervisor_) supervisor_->cv.notify_all();
    });
    if (auto rec = storage_.Get(Cf::kLeases, kFlashPrefix + b.cfg.id); rec.ok() && rec->has_value()) {
      auto j = nlohmann::json::parse(**rec, nullptr, false);
      if (!j.is_discarded()) {
        b.image = j.value("image", "");
        b.image_sha256 = j.value("sha256", "");
      }
    }
    bool from_slots = false;
    if (auto rec = storage_.Get(Cf::kLeases, kFlashPrefix + b.cfg.id); rec.ok() && rec->has_value()) {
      auto j = nlohmann::json::parse(**rec, nullptr, false);
      from_slots = !j.is_discarded() && j.value("mcuboot", false);
    }
    if (b.simulated() && !ota_dir_.empty()) {
      b.slots = std::make_unique<SimMcuboot>(absl::StrCat(ota_dir_, "/", b.cfg.id), static_cast<uint32_t>(b.cfg.ota_slot_size),
                                             ota_keys_);
      if (auto s = b.slots->Init(); !s.ok()) {
        spdlog::warn("board {}: OTA slots: {}", b.cfg.id, std::string(s.message()));
        b.slots.reset();
      }
    }
    if (b.simulated() && from_slots && b.slots && b.cfg.image.empty()) {
      std::lock_guard op(b.op_mu);
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
  }
  supervisor_ = std::make_unique<Supervisor>();
  supervisor_->thread = std::thread([this] { Supervise(); });
  return absl::OkStatus();
}

void HardwareBroker::Shutdown() {
  stopping_ = true;
  if (supervisor_) {
    {
      std::lock_guard lock(supervisor_->mu);
      supervisor_->stopping = true;
    }
    supervisor_->cv.notify_all();
    if (supervisor_->thread.joinable()) supervisor_->thread.join();
    supervisor_.reset();
  }
  for (auto& b : boards_) {
    b->restarting = true;
    b->hub->Close("fwaid is shutting down", true);
    if (b->qemu) b->qemu->Stop();
    b->qemu.reset();
  }
}

// Reopens physical ports that went away (unplugged, not yet present).
void HardwareBroker::Supervise() {
  std::unique_lock lock(supervisor_->mu);
  while (!supervisor_->stopping) {
    supervisor_->cv.wait_for(lock, std::chrono::seconds(2));
    if (supervisor_->stopping) break;
    lock.unlock();
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
    lock.lock();
  }
}

HardwareBroker::Board* HardwareBroker::FindBoard(const std::string& id) const {
  for (const auto& b : boards_) {
    if (b->cfg.id == id) return b.get();
  }
  return nullptr;
}

absl::StatusOr<std::string> HardwareBroker::ResolveBoard(const std::string& id, const Caller& caller) const {
  if (!id.empty()) {
    if (FindBoard(id)) return id;
    std::vector<std::string> ids;
    for (const auto& b : boards_) ids.push_back(b->cfg.id);
    return absl::NotFoundError(absl::StrCat("no board '", id, "' (boards: ", ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")"));
  }
  std::vector<std::string> mine;
  for (const auto& l : leases_->All()) {
    if (FindBoard(l.device_id) && (l.identity == caller.identity || (!caller.session_id.empty() && l.session_id == caller.session_id))) {
      mine.push_back(l.device_id);
    }
  }
  if (mine.size() == 1) return mine[0];
  if (boards_.size() == 1) return boards_[0]->cfg.id;
  if (boards_.empty()) return absl::NotFoundError("no boards are configured (hardware.boards in fwaid.yaml)");
  std::vector<std::string> ids;
  for (const auto& b : boards_) ids.push_back(b->cfg.id);
  return absl::InvalidArgumentError(absl::StrCat("several boards (", absl::StrJoin(ids, ", "), "); name one"));
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
    d.name = b->simulated() ? absl::StrCat("QEMU ", b->cfg.machine) : (b->cfg.target.empty() ? b->cfg.id : b->cfg.target);
    std::tie(d.health, d.health_reason) = b->Health();
    d.tags = b->cfg.tags;
    d.target = b->cfg.target;
    d.path = b->simulated() ? b->hub->path() : b->cfg.serial;
    d.serial_number = b->cfg.probe;
    d.image = b->image;
    d.image_sha256 = b->image_sha256;
    d.running = b->simulated() ? (b->qemu && b->qemu->running() && !b->paused) : b->hub->is_open();
    d.state = d.running ? "running" : (b->simulated() && b->paused && b->qemu && b->qemu->running()) ? "paused" : "stopped";
    if (b->simulated() && b->qemu && b->qemu->running()) d.pid = b->qemu->pid();
    {
      std::lock_guard lock(b->state_mu);
      d.ota_version = b->ota_version;
    }
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
      if ((!b->cfg.serial.empty() && (b->cfg.serial == dd.path || b->cfg.serial == dd.stable_path)) ||
          (!b->cfg.probe.empty() && (b->cfg.probe == dd.serial_number || b->cfg.probe == dd.vid_pid))) {
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
    return absl::InvalidArgumentError(absl::StrCat("ttl ", ttl_s, " s is above the limit of ", config_.max_ttl_s, " s"));
  }
  if (wait_s < 0 || wait_s > 86400) return absl::InvalidArgumentError("wait must be 0..86400 seconds");
  std::vector<std::string> candidates;
  if (!device_id.empty()) {
    if (!FindBoard(device_id)) {
      bool found = false;
      for (const auto& d : DiscoverDevices(config_.sysfs_root, config_.dev_root)) found |= d.id == device_id;
      if (!found) {
        std::vector<std::string> ids;
        for (const auto& b : boards_) ids.push_back(b->cfg.id);
        return absl::NotFoundError(absl::StrCat("no board or device '", device_id, "' (boards: ",
                                                ids.empty() ? "none" : absl::StrJoin(ids, ", "), "; see fwai hw ls)"));
      }
    }
    candidates.push_back(device_id);
  } else {
    for (const auto& b : boards_) {
      bool all = true;
      for (const auto& t : tags) all &= std::find(b->cfg.tags.begin(), b->cfg.tags.end(), t) != b->cfg.tags.end();
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
  auto available = [this](const std::string& id) -> absl::Status {
    Board* b = FindBoard(id);
    if (!b) return absl::OkStatus();
    auto [health, reason] = b->Health();
    if (health == "good") return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("board ", id, " is ", health, reason.empty() ? "" : ": " + reason,
                                                      "; it is not handed out (fwai hw test ", id, " re-checks it)"));
  };
  const std::string wants =
      device_id.empty() ? absl::StrCat("tags ", absl::StrJoin(tags, ", ")) : device_id;
  auto lease = leases_->Acquire(candidates, who, ttl_s, wait_s * 1000, available, cancelled, wants);
  if (!lease.ok()) return lease;
  if (Board* b = FindBoard(lease->device_id); b && !transcript_dir_.empty() && !lease->renewed) {
    std::lock_guard lock(transcripts_mu_);
    transcript_from_[lease->lease_id] = b->hub->next_seq();
  }
  if (Board* b = FindBoard(lease->device_id); b && b->simulated()) {
    std::lock_guard op(b->op_mu);
    if (b->paused && b->qemu && b->qemu->running() && b->qemu->Continue().ok()) b->paused = false;
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

absl::StatusOr<LeaseRecord> HardwareBroker::Renew(const Caller& caller, const std::string& lease_id) {
  return leases_->Renew(lease_id, caller.identity, caller.admin);
}

absl::StatusOr<LeaseRecord> HardwareBroker::Release(const Caller& caller, const std::string& lease_id,
                                                    const std::string& device_id, bool force) {
  return leases_->Release(lease_id, device_id, caller.identity, force, caller.admin);
}

void HardwareBroker::SessionEnded(const std::string& session_id) { leases_->ReleaseSession(session_id); }

std::vector<LeaseRecord> HardwareBroker::Leases() const { return leases_->All(); }

std::vector<LeaseWaiter> HardwareBroker::Waiters() const { return leases_->Waiters(); }

nlohmann::json HardwareBroker::TakeTranscript(const std::string& lease_id) {
  std::lock_guard lock(transcripts_mu_);
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
    std::lock_guard lock(transcripts_mu_);
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
  spdlog::info("lease {} on {} ({}) ended: {}", lease.lease_id, lease.device_id, lease.holder, reason);
  if (lease.acquired_us > 0) {
    telemetry::RecordLease(lease.device_id,
                           static_cast<double>(NowMicros() - lease.acquired_us) / 1e6);
  }
  Board* b = FindBoard(lease.device_id);
  if (!b) return;
  if (nlohmann::json t = KeepTranscript(lease); !t.is_null()) {
    if (absl::StartsWith(reason, "released by") || absl::StartsWith(reason, "force-released")) {
      // The release's own record (lease_released / lease_kicked) takes it.
      std::lock_guard lock(transcripts_mu_);
      if (transcripts_.size() > 1000) transcripts_.erase(transcripts_.begin());
      transcripts_[lease.lease_id] = std::move(t);
    } else if (recorder_) {
      recorder_({{"kind", "lease_ended"},
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
    std::lock_guard op(b->op_mu);
    if (b->qemu && b->qemu->running() && b->qemu->Pause().ok()) b->paused = true;
  }
  if (!b->cfg.power_off.empty()) {
    ProcessOptions po;
    po.timeout_ms = 30000;
    auto r = RunProcess({"/bin/sh", "-c", b->cfg.power_off}, po);
    if (!r.ok() || r->exit_code != 0) spdlog::warn("board {}: power_off failed", b->cfg.id);
  }
  const std::string why = absl::StrCat("lease ", lease.lease_id, " on ", lease.device_id, " ended: ", reason);
  b->hub->EndReaders([&](const SerialReader& r) { return r.lease_id == lease.lease_id; }, why);
}

absl::Status HardwareBroker::BootSimulated(Board& b, const std::string& image) {
  b.restarting = true;
  b.hub->Close("the simulated board is restarting", false);
  if (b.qemu) b.qemu->Stop();
  b.qemu.reset();
  QemuOptions o;
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
    return q.status();
  }
  b.qemu = *std::move(q);
  Board* raw = &b;
  b.qemu->SetOnExit([this, raw](const std::string& why) {
    if (raw->restarting) return;
    raw->SetHealth("bad", why);
    spdlog::warn("board {}: {}", raw->cfg.id, why);
  });
  if (auto s = b.hub->Open(b.qemu->pty(), b.Settings()); !s.ok()) {
    b.qemu->Stop();
    b.qemu.reset();
    b.restarting = false;
    return s;
  }
  b.generation++;
  b.paused = false;
  b.restarting = false;
  if (auto s = b.qemu->Continue(); !s.ok()) return s;
  if (!b.from_slots) {
    b.image = image;
    std::lock_guard lock(b.state_mu);
    b.ota_version.clear();
  }
  b.SetHealth("good", "");
  return absl::OkStatus();
}

absl::StatusOr<std::string> HardwareBroker::CopyImageAs(const Caller& caller, const std::string& board_id,
                                                         const std::string& path) {
  if (!caller.account) {
    return absl::PermissionDeniedError(absl::StrCat("flash guard (image): reading ", path, " needs a local account; ",
                                                    caller.display, " has none"));
  }
  std::string bytes;
  struct stat st {};
  {
    ScopedFsIdentity as(*caller.account);
    if (!as.status().ok()) return as.status();
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
      return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", path,
                                                        errno == ENOENT ? " does not exist"
                                                                        : absl::StrCat(": ", caller.account->name,
                                                                                       " cannot read it (",
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
    if (!regular) return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", path, " is not a regular file"));
    if (st.st_size > (64 << 20)) return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", path, " is over 64 MB"));
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
  if (rename(tmp.c_str(), out.c_str()) != 0) return absl::InternalError(absl::StrCat("cannot write ", out));
  return out;
}

absl::StatusOr<OtaBootResult> HardwareBroker::BootFromSlots(Board& b) {
  if (!b.slots) return absl::FailedPreconditionError(absl::StrCat("board ", b.cfg.id, " has no OTA slots"));
  auto boot = b.slots->Boot();
  if (!boot.ok()) return boot.status();
  OtaBootResult r;
  r.swap = boot->swap;
  r.detail = boot->detail;
  if (!boot->bootable) {
    // Nothing to run: the board stays off, as a real one would hang in its bootloader.
    b.restarting = true;
    b.hub->Close("the simulated board has no bootable image", false);
    if (b.qemu) b.qemu->Stop();
    b.qemu.reset();
    b.restarting = false;
    b.SetHealth("bad", boot->error);
    return absl::FailedPreconditionError(absl::StrCat("board ", b.cfg.id, ": ", boot->error));
  }
  const std::string payload = absl::StrCat(run_dir_, "/", b.cfg.id, "-slot0.bin");
  if (auto s = WriteFileAtomic(payload, boot->payload); !s.ok()) return s;
  b.from_slots = true;
  if (auto s = BootSimulated(b, payload); !s.ok()) return s;
  r.version = boot->primary.version;
  r.hash = boot->primary.hash;
  b.image = payload;
  b.image_sha256 = boot->primary.hash;
  {
    std::lock_guard lock(b.state_mu);
    b.ota_version = r.version;
  }
  nlohmann::json rec = {{"image", payload}, {"sha256", r.hash}, {"time_us", NowMicros()}, {"mcuboot", true},
                        {"version", r.version}};
  if (auto s = storage_.Put(Cf::kLeases, kFlashPrefix + b.cfg.id, rec.dump(), true); !s.ok()) return s;
  return r;
}

absl::StatusOr<FlashResult> HardwareBroker::Flash(
    const Caller& caller, const std::string& board_id, const std::string& requested_image, bool approved,
    const std::string& project_root,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
    const FlashGuardPolicy& guard) {
  // flash {board}: the flash record's hash is noted on it when it is appended.
  telemetry::ActiveSpan span("flash", board_id);
  if (span) {
    span->Set("fwai.board", board_id);
    span->Set("fwai.principal", caller.identity);
    if (!caller.session_id.empty()) span->Set("gen_ai.conversation.id", caller.session_id);
  }
  auto r = FlashGuarded(caller, board_id, requested_image, approved, project_root, progress, cancel,
                        guard);
  if (r.ok()) {
    span->Set("fwai.image.sha256", r->sha256);
    span->SetDouble("fwai.flash.seconds", r->seconds);
    span->SetBool("fwai.flash.booted", !r->boot_line.empty());
  } else {
    span->Fail(std::string(r.status().message()));
  }
  telemetry::RecordFlash(board_id, r.ok());
  return r;
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

absl::StatusOr<FlashResult> HardwareBroker::FlashGuarded(
    const Caller& caller, const std::string& board_id, const std::string& requested_image,
    bool approved, const std::string& project_root,
    const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
    const FlashGuardPolicy& guard) {
  const bool check_fresh = guard.check_fresh;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t start_us = NowMicros();
  Board* b = FindBoard(board_id);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board_id, "'"));
  // The guard: every rule is checked here, before anything is written.
  if (auto s = CheckScope(caller, board_id, true); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board_id, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("flash guard (lease): ", s.message()));
  }
  if (requested_image.empty()) return absl::InvalidArgumentError("flash guard (image): no image given");
  // The image is read as the caller, into a copy only fwaid can read: nobody
  // flashes (and so exposes) a file they could not read themselves.
  auto private_image = CopyImageAs(caller, board_id, requested_image);
  if (!private_image.ok()) return private_image.status();
  const std::string& image_path = *private_image;
  std::error_code ec;
  if (IsMcubootFile(image_path)) {
    if (!approved) {
      return absl::FailedPreconditionError(
          absl::StrCat("flash guard (approval): writing ", requested_image, " to ", board_id,
                       " needs a person's confirmation (answer the prompt, or pass --yes / an approved plan)"));
    }
    return FlashMcuboot(caller, *b, image_path, progress, cancel, start_us);
  }
  auto img = ReadFirmwareImage(image_path);
  if (!img.ok()) return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", img.status().message()));
  if (auto s = CheckImageTarget(*img, b->cfg); !s.ok()) return s;
  if (auto s = CheckImageFits(*img, b->cfg); !s.ok()) return s;
  std::string root = project_root.empty() ? FindProjectRoot(requested_image) : project_root;
  if (check_fresh) {
    if (auto s = CheckImageFresh(*img, root); !s.ok()) return s;
  }
  auto sha = FileSha256(image_path);
  if (!sha.ok()) return sha.status();
  // The rules that need the image's build record: its toolchain, its growth.
  nlohmann::json build = BuildRecordMadeImage(guard.build, *sha) ? guard.build : nlohmann::json();
  if (build.is_null() && build_record_) build = build_record_(*sha);
  if (guard.require_verified_toolchain) {
    if (auto s = CheckToolchainRecord(build, requested_image, *sha); !s.ok()) return s;
  }
  if (guard.any_memory_budget()) {
    MemoryOptions mo;
    mo.project_root = root;
    mo.board = board_id;
    mo.max_symbols = 0;
    if (b->cfg.flash_size > 0)
      mo.board_regions.push_back({"FLASH", b->cfg.flash_origin, b->cfg.flash_size, "rx", "flash"});
    if (b->cfg.ram_size > 0)
      mo.board_regions.push_back({"RAM", b->cfg.ram_origin, b->cfg.ram_size, "rwx", "ram"});
    auto report = AnalyzeMemory(image_path, mo);
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
  }
  if (!approved) {
    return absl::FailedPreconditionError(
        absl::StrCat("flash guard (approval): writing ", requested_image, " to ", board_id,
                     " needs a person's confirmation (answer the prompt, or pass --yes / an approved plan)"));
  }
  progress({"guard", 0.1,
            absl::StrCat(
                "guard passed: lease, image (", img->bytes, " bytes, sha256 ", sha->substr(0, 12),
                "), fits ", b->cfg.target, check_fresh ? ", fresh" : ", freshness waived by policy",
                guard.any_memory_budget() ? ", within the memory budget" : "",
                guard.require_verified_toolchain ? ", toolchain verified" : "", ", approved")});
  std::lock_guard op(b->op_mu);
  if (cancel && cancel->cancelled()) return absl::CancelledError("flash cancelled");
  leases_->Touch(board_id, caller.identity);
  FlashResult result;
  result.sha256 = *sha;
  std::string flashed_file =
      fs::absolute(image_path).string();  // what is written: the ELF, or a .bin/.hex made from it
  uint64_t since = b->hub->next_seq();
  if (b->simulated()) {
    b->from_slots = false;
    progress({"loading", 0.3, absl::StrCat("restarting QEMU ", b->cfg.machine, " with ", image_path)});
    if (auto s = BootSimulated(*b, fs::absolute(image_path).string()); !s.ok()) {
      b->SetHealth("bad", std::string(s.message()));
      return s;
    }
    progress({"writing", 0.8, absl::StrCat("loaded into the simulated ", b->cfg.target, "; serial on ", b->hub->path())});
  } else {
    std::vector<std::string> argv;
    if (!b->cfg.flash_command.empty()) {
      std::string cmd = b->cfg.flash_command;
      std::string elf = fs::absolute(image_path).string();
      auto derived = [&](const std::string& ext, const std::string& fmt) -> std::string {
        fs::path sibling = fs::path(elf).replace_extension(ext);
        if (fs::exists(sibling, ec) && fs::last_write_time(sibling, ec) >= fs::last_write_time(elf, ec)) return sibling;
        fs::path out = fs::path(run_dir_) / (board_id + ext);
        auto r = RunProcess({"arm-none-eabi-objcopy", "-O", fmt, elf, out.string()});
        return r.ok() && r->exit_code == 0 ? out.string() : sibling.string();
      };
      if (absl::StrContains(cmd, "{bin}")) {
        flashed_file = derived(".bin", "binary");
        absl::StrReplaceAll({{"{bin}", ShellQuote(flashed_file)}}, &cmd);
      }
      if (absl::StrContains(cmd, "{hex}")) {
        flashed_file = derived(".hex", "ihex");
        absl::StrReplaceAll({{"{hex}", ShellQuote(flashed_file)}}, &cmd);
      }
      absl::StrReplaceAll({{"{elf}", ShellQuote(elf)}, {"{port}", ShellQuote(b->cfg.serial)}, {"{probe}", ShellQuote(b->cfg.probe)}},
                          &cmd);
      argv = {"/bin/sh", "-c", cmd};
    } else if (!b->cfg.openocd_config.empty()) {
      argv = OpenOcdArgs(b->cfg);
      argv.push_back("-c");
      argv.push_back("program " + fs::absolute(image_path).string() + " verify reset exit");
    } else {
      return absl::FailedPreconditionError(absl::StrCat("board ", board_id, " has neither flash_command nor openocd_config"));
    }
    progress({"writing", 0.3, absl::StrJoin(argv, " ")});
    ProcessOptions po;
    po.timeout_ms = 300000;
    auto r = RunProcess(argv, po);
    if (!r.ok()) return r.status();
    std::string out = r->out + r->err;
    if (r->timed_out || r->exit_code != 0) {
      return absl::InternalError(absl::StrCat("flashing ", board_id, " failed (",
                                              r->timed_out ? "timed out" : absl::StrCat("exit ", r->exit_code), "): ",
                                              out.size() > 2000 ? out.substr(out.size() - 2000) : out));
    }
    progress({"writing", 0.8, "written and verified"});
    b->image = fs::absolute(image_path).string();
  }
  b->image_sha256 = *sha;
  nlohmann::json rec = {{"image", b->image}, {"sha256", *sha}, {"time_us", NowMicros()}, {"by", caller.display}};
  if (auto s = storage_.Put(Cf::kLeases, kFlashPrefix + board_id, rec.dump(), true); !s.ok()) return s;
  if (!b->cfg.boot_pattern.empty()) {
    progress({"booting", 0.9, absl::StrCat("waiting for '", b->cfg.boot_pattern, "' on the serial port")});
    std::regex re;
    try {
      re = std::regex(b->cfg.boot_pattern);
    } catch (const std::regex_error&) {
      return absl::InvalidArgumentError(absl::StrCat("board ", board_id, ": boot_pattern is not a valid regex"));
    }
    std::optional<SerialLine> line;
    {
      telemetry::ActiveSpan wait("serial_wait", board_id);
      wait->Set("fwai.board", board_id);
      wait->Set("fwai.serial.pattern", b->cfg.boot_pattern);
      wait->SetInt("fwai.serial.timeout_ms", 15000);
      line = b->hub->WaitFor(re, since, 15000, cancel);
      wait->SetBool("fwai.serial.matched", line.has_value());
      if (!line) wait->Fail("the boot pattern did not appear");
    }
    if (!line) {
      return absl::DeadlineExceededError(absl::StrCat("flashed ", board_id, ", but '", b->cfg.boot_pattern,
                                                      "' did not appear on the serial port within 15 s"));
    }
    result.boot_line = line->text;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (recorder_) {
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
    rec["sbom"] = FlashRecordSbom(rec, build, sbom_version_, dpkg_admindir_);
    recorder_(rec);
  }
  return result;
}

absl::StatusOr<std::shared_ptr<SerialReader>> HardwareBroker::OpenSerial(const Caller& caller, const std::string& board,
                                                                         bool from_history) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  auto reader = b->hub->Subscribe(from_history);
  if (auto l = leases_->Holder(board); l && leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id).ok()) {
    reader->lease_id = l->lease_id;
  }
  return reader;
}

void HardwareBroker::CloseSerial(const std::string& board, const std::shared_ptr<SerialReader>& reader) {
  if (Board* b = FindBoard(board)) b->hub->Unsubscribe(reader);
}

absl::Status HardwareBroker::SerialWrite(const Caller& caller, const std::string& board, std::string_view bytes) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("writing to the serial port needs the lease: ", s.message()));
  }
  leases_->Touch(board, caller.identity);
  return b->hub->Write(bytes);
}

absl::Status HardwareBroker::SerialSendLine(const Caller& caller, const std::string& board, std::string_view line) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("writing to the serial port needs the lease: ", s.message()));
  }
  leases_->Touch(board, caller.identity);
  return b->hub->SendLine(line);
}

absl::StatusOr<std::vector<SerialLine>> HardwareBroker::SerialHistory(const std::string& board, size_t max_lines) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  return b->hub->History(max_lines);
}

absl::StatusOr<uint64_t> HardwareBroker::SerialNextSeq(const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  return b->hub->next_seq();
}

absl::StatusOr<std::optional<SerialLine>> HardwareBroker::SerialWaitFor(const std::string& board,
                                                                        const std::regex& pattern, uint64_t since,
                                                                        int timeout_ms, const CancelToken* cancel) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  telemetry::ActiveSpan wait("serial_wait", board);
  wait->Set("fwai.board", board);
  wait->SetInt("fwai.serial.timeout_ms", timeout_ms);
  auto line = b->hub->WaitFor(pattern, since, timeout_ms, cancel);
  wait->SetBool("fwai.serial.matched", line.has_value());
  return line;
}

namespace {

std::string FormatFrames(const nlohmann::json& stack) {
  std::string out;
  if (!stack.is_array()) return out;
  for (const auto& f : stack) {
    absl::StrAppend(&out, "#", MiString(f, "level", "?"), "  ", MiString(f, "addr"), " in ", MiString(f, "func", "??"));
    if (f.contains("file")) absl::StrAppend(&out, " at ", MiString(f, "file"), ":", MiString(f, "line"));
    out += "\n";
  }
  return out;
}

}  // namespace

absl::StatusOr<DebugResult> HardwareBroker::Debug(const Caller& caller, const std::string& board,
                                                  const std::vector<std::string>& commands, int timeout_ms) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (commands.empty()) return absl::InvalidArgumentError("no debug commands given");
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("debugging needs the lease: ", s.message()));
  }
  if (timeout_ms <= 0) timeout_ms = 10000;
  std::lock_guard op(b->op_mu);
  leases_->Touch(board, caller.identity);
  b->debug_cancel = false;
  std::string target;
  pid_t ocd_pid = -1;
  if (b->simulated()) {
    if (!b->qemu || !b->qemu->running()) {
      return absl::FailedPreconditionError(absl::StrCat("board ", board, " is not running; flash an image first"));
    }
    target = absl::StrCat("127.0.0.1:", b->qemu->gdb_port());
  } else {
    if (b->cfg.openocd_config.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no openocd_config to start a GDB server"));
    }
    auto port = PickFreePort();
    if (!port.ok()) return port.status();
    std::vector<std::string> args = OpenOcdArgs(b->cfg);
    args.insert(args.end(), {"-c", absl::StrCat("gdb_port ", *port), "-c", "tcl_port disabled", "-c", "telnet_port disabled"});
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    ocd_pid = ForkLongLived([&] { ExecChild(args, -1, pipefd[1], pipefd[1]); });
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
      kill(ocd_pid, SIGKILL);
      waitpid(ocd_pid, nullptr, 0);
      return absl::UnavailableError(absl::StrCat("OpenOCD did not start a GDB server for ", board, ": ", out));
    }
    target = absl::StrCat("127.0.0.1:", *port);
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
    std::string cmd(absl::StripAsciiWhitespace(raw));
    nlohmann::json entry = {{"command", cmd}};
    std::string text;
    auto word_end = cmd.find(' ');
    std::string verb = cmd.substr(0, word_end);
    std::string arg = word_end == std::string::npos ? "" : std::string(absl::StripAsciiWhitespace(cmd.substr(word_end)));
    absl::StatusOr<MiResponse> r = absl::UnknownError("");
    if (verb == "fault" || cmd == "decode fault" || cmd == "info fault") {
      auto f = DecodeFault(**gdb);
      if (!f.ok()) {
        text = absl::StrCat("error: ", f.status().message());
        entry["error"] = text;
      } else {
        entry["fault"] = f->ToJson();
        text = f->summary;
        if (f->in_fault) {
          absl::StrAppendFormat(&text, "\n  CFSR=0x%08x HFSR=0x%08x MMFAR=0x%08x BFAR=0x%08x", f->cfsr, f->hfsr, f->mmfar,
                                f->bfar);
          for (const auto& c : f->causes) absl::StrAppend(&text, "\n  - ", c);
          if (!f->frame.empty()) {
            text += "\n  stacked:";
            for (const char* k : {"r0", "r1", "r2", "r3", "r12", "lr", "pc", "xpsr"}) {
              if (f->frame.contains(k)) absl::StrAppend(&text, " ", k, "=", f->frame[k].get<std::string>());
            }
          }
        }
      }
    } else if (verb == "reset") {
      if (b->simulated()) {
        auto s = b->qemu->Reset();
        text = s.ok() ? "reset (system reset of the simulated board)" : absl::StrCat("error: ", s.message());
      } else {
        r = (*gdb)->Console("monitor reset halt", timeout_ms);
        text = r.ok() ? (r->result_class == "error" ? "error: " + r->error : "reset (halted)") : std::string(r.status().message());
      }
    } else if ((verb == "print" || verb == "p") && !arg.empty()) {
      r = (*gdb)->Mi("-data-evaluate-expression \"" + absl::StrReplaceAll(arg, {{"\\", "\\\\"}, {"\"", "\\\""}}) + "\"", timeout_ms);
      if (r.ok() && r->result_class == "done") {
        text = absl::StrCat(arg, " = ", MiString(r->results, "value"));
        entry["value"] = MiString(r->results, "value");
      }
    } else if (cmd == "bt" || cmd == "backtrace" || cmd == "where") {
      r = (*gdb)->Mi("-stack-list-frames 0 64", timeout_ms);
      if (r.ok() && r->result_class == "done") {
        entry["frames"] = r->results.contains("stack") && r->results["stack"].is_array() ? r->results["stack"]
                                                                                       : nlohmann::json::array();
        text = FormatFrames(entry["frames"]);
      }
    } else if (verb == "continue" || verb == "c") {
      int wait = arg.empty() ? timeout_ms : std::max(1, std::atoi(arg.c_str())) * 1000;
      r = (*gdb)->Mi("-exec-continue", timeout_ms);
      if (r.ok() && r->result_class == "running") {
        auto st = (*gdb)->WaitStopped(wait);
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
          if ((*st).value("interrupted_after_timeout", false)) absl::StrAppend(&text, " (interrupted after ", wait / 1000, " s)");
        } else {
          text = absl::StrCat("error: ", st.status().message());
        }
      }
    } else if (verb == "break" || verb == "b") {
      r = (*gdb)->Mi("-break-insert " + arg, timeout_ms);
      if (r.ok() && r->result_class == "done") {
        entry["breakpoint"] = r->results.contains("bkpt") ? r->results["bkpt"] : nlohmann::json::object();
        const auto& bp = entry["breakpoint"];
        text = absl::StrCat("breakpoint ", MiString(bp, "number", "?"), " at ", MiString(bp, "addr"), " in ",
                            MiString(bp, "func", "??"),
                            bp.is_object() && bp.contains("file") ? " at " + MiString(bp, "file") + ":" + MiString(bp, "line")
                                                                  : "");
      }
    } else if (cmd == "quit" || cmd == "kill" || verb == "target" || verb == "detach" || verb == "shell" || verb == "!") {
      text = absl::StrCat("error: '", verb, "' is not allowed here (the broker owns the connection)");
      entry["error"] = text;
    } else {
      r = (*gdb)->Console(cmd, timeout_ms);
      if (r.ok() && r->result_class == "running") {
        auto st = (*gdb)->WaitStopped(timeout_ms);
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
    result.outputs.push_back(text);
    result.results.push_back(entry);
  }
  (*gdb)->Detach();
  gdb->reset();
  stop_ocd();
  return result;
}

absl::Status HardwareBroker::Reset(const Caller& caller, const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = CheckScope(caller, board, false); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("reset needs the lease: ", s.message()));
  }
  std::lock_guard op(b->op_mu);
  leases_->Touch(board, caller.identity);
  if (b->simulated()) {
    if (b->qemu && b->qemu->running()) return b->qemu->Reset();
    if (b->image.empty()) return absl::FailedPreconditionError(absl::StrCat(board, " has no firmware; flash an image first"));
    return PowerOn(*b);
  }
  if (b->cfg.openocd_config.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no openocd_config to reset it"));
  }
  std::vector<std::string> argv = OpenOcdArgs(b->cfg);
  argv.insert(argv.end(), {"-c", "init; reset run; shutdown"});
  auto r = RunProcess(argv);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return absl::InternalError(absl::StrCat("openocd reset failed: ", r->err));
  return absl::OkStatus();
}

absl::Status HardwareBroker::SetHealth(const Caller& caller, const std::string& board, const std::string& health,
                                       const std::string& reason) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (!caller.admin) return absl::PermissionDeniedError("only root or the daemon's user may set a board's health");
  if (health != "good" && health != "bad" && health != "maintenance") {
    return absl::InvalidArgumentError("health must be good, bad or maintenance");
  }
  b->SetHealth(health, reason.empty() ? absl::StrCat("set by ", caller.display) : reason, /*admin=*/true);
  return absl::OkStatus();
}

absl::StatusOr<std::string> HardwareBroker::SelfTest(const Caller& caller, const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto holder = leases_->Holder(board);
      holder && !leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id).ok()) {
    return absl::FailedPreconditionError(absl::StrCat("self-test would disturb the holder: ", DescribeHeld(*holder)));
  }
  if ((b->Health().first == "maintenance")) {
    return absl::FailedPreconditionError(absl::StrCat(board, " is in maintenance; an admin sets it back to good"));
  }
  std::lock_guard op(b->op_mu);
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
      if (r->exit_code != 0) verdict = absl::InternalError(absl::StrCat("self-test exited ", r->exit_code, ": ", report));
    }
  } else if (b->simulated()) {
    if (b->image.empty()) {
      verdict = absl::FailedPreconditionError("no firmware to boot; flash an image first");
    } else {
      uint64_t since = b->hub->next_seq();
      verdict = PowerOn(*b);
      if (verdict.ok() && !b->cfg.boot_pattern.empty()) {
        auto line = b->hub->WaitFor(std::regex(b->cfg.boot_pattern), since, 15000);
        if (!line) verdict = absl::DeadlineExceededError("booted, but the boot pattern did not appear within 15 s");
        else report = "booted: " + line->text;
      }
    }
  } else {
    if (b->cfg.serial.empty() || b->hub->is_open() || b->hub->Open(b->cfg.serial, b->Settings()).ok()) {
      report = "serial port open";
    } else {
      verdict = absl::UnavailableError(absl::StrCat("serial port ", b->cfg.serial, " cannot be opened"));
    }
  }
  if (!verdict.ok()) {
    b->SetHealth("bad", absl::StrCat("self-test failed: ", verdict.message()), true);
    return verdict;
  }
  {
    std::lock_guard lock(b->state_mu);
    b->admin_health = false;
  }
  b->SetHealth("good", "");
  if (b->simulated() && !leases_->Holder(board) && b->qemu && b->qemu->Pause().ok()) b->paused = true;
  return report.empty() ? std::string("ok") : report;
}

absl::Status HardwareBroker::PowerOn(Board& b) {
  if (b.from_slots && b.slots) return BootFromSlots(b).status();
  return BootSimulated(b, b.image);
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

absl::StatusOr<FlashResult> HardwareBroker::FlashMcuboot(const Caller& caller, Board& b, const std::string& image_path,
                                                         const std::function<void(const FlashProgressUpdate&)>& progress,
                                                         const CancelToken* cancel, int64_t start_us) {
  if (!b.simulated()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "flash guard (image): ", image_path, " is an MCUboot image; a physical board takes it through its bootloader "
        "(fwai ota rollout, with the board's ota_upload command) — flash the ELF to program it directly"));
  }
  if (!b.slots) return absl::FailedPreconditionError(absl::StrCat("flash guard (image): board ", b.cfg.id, " has no OTA slots"));
  auto bytes = ReadWhole(image_path);
  if (!bytes.ok()) return bytes.status();
  auto info = mcuboot::Parse(*bytes);
  if (!info.ok()) return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", info.status().message()));
  if (!info->hash_ok) {
    return absl::FailedPreconditionError(absl::StrCat("flash guard (image): ", image_path, ": its SHA-256 does not match its contents"));
  }
  auto sha = FileSha256(image_path);
  if (!sha.ok()) return sha.status();
  progress({"guard", 0.1, absl::StrCat("guard passed: lease, MCUboot image ", info->version.ToString(), " (", bytes->size(),
                                       " bytes, sha256 ", sha->substr(0, 12), "), approved")});
  std::lock_guard op(b.op_mu);
  if (cancel && cancel->cancelled()) return absl::CancelledError("flash cancelled");
  leases_->Touch(b.cfg.id, caller.identity);
  uint64_t since = b.hub->next_seq();
  progress({"writing", 0.3, absl::StrCat("programming the primary slot of ", b.cfg.id, " (confirmed)")});
  if (auto s = b.slots->Program(*bytes); !s.ok()) return s;
  progress({"loading", 0.6, "power-on through the simulated MCUboot"});
  auto boot = BootFromSlots(b);
  if (!boot.ok()) return boot.status();
  FlashResult result;
  result.sha256 = *sha;
  if (!b.cfg.boot_pattern.empty()) {
    progress({"booting", 0.9, absl::StrCat("waiting for '", b.cfg.boot_pattern, "' on the serial port")});
    auto re = BootRegex(b.cfg);
    if (!re.ok()) return re.status();
    auto line = b.hub->WaitFor(*re, since, 15000, cancel);
    if (!line) {
      return absl::DeadlineExceededError(absl::StrCat("flashed ", b.cfg.id, ", but '", b.cfg.boot_pattern,
                                                      "' did not appear on the serial port within 15 s"));
    }
    result.boot_line = line->text;
  }
  result.seconds = static_cast<double>(NowMicros() - start_us) / 1e6;
  if (recorder_) {
    recorder_({{"kind", "flash"}, {"board", b.cfg.id}, {"target", b.cfg.target}, {"image", image_path},
               {"image_sha256", *sha}, {"mcuboot", {{"version", info->version.ToString()}, {"hash", info->sha256_hex}}},
               {"bytes", bytes->size()}, {"by", caller.display}, {"session_id", caller.session_id}, {"approved", true},
               {"boot_line", result.boot_line}, {"booted", !result.boot_line.empty()}, {"seconds", result.seconds}});
  }
  return result;
}

absl::Status HardwareBroker::RunOtaCommand(Board& b, const std::string& what, const std::string& tmpl,
                                           const std::string& image) {
  if (tmpl.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("board ", b.cfg.id, " has no ", what,
                                                      " command (hardware.boards[].", what, " in fwaid.yaml)"));
  }
  std::string cmd = absl::StrReplaceAll(
      tmpl, {{"{image}", ShellQuote(image)}, {"{port}", ShellQuote(b.cfg.serial)}, {"{probe}", ShellQuote(b.cfg.probe)}});
  ProcessOptions po;
  po.timeout_ms = 300000;
  auto r = RunProcess({"/bin/sh", "-c", cmd}, po);
  if (!r.ok()) return r.status();
  if (r->timed_out || r->exit_code != 0) {
    std::string out = r->out + r->err;
    return absl::InternalError(absl::StrCat(what, " on ", b.cfg.id, " failed (",
                                            r->timed_out ? "timed out" : absl::StrCat("exit ", r->exit_code), "): ",
                                            out.size() > 2000 ? out.substr(out.size() - 2000) : out));
  }
  return absl::OkStatus();
}

absl::Status HardwareBroker::OtaStage(const Caller& caller, const std::string& board, const std::string& image,
                                      bool permanent) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = CheckScope(caller, board, true); !s.ok()) return s;
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("an update needs the lease: ", s.message()));
  }
  std::lock_guard op(b->op_mu);
  leases_->Touch(board, caller.identity);
  if (b->simulated()) {
    if (!b->slots) return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no OTA slots"));
    return b->slots->Stage(image, permanent);
  }
  const std::string path = absl::StrCat(run_dir_, "/", board, "-ota.bin");
  if (auto s = WriteFileAtomic(path, image); !s.ok()) return s;
  return RunOtaCommand(*b, "ota_upload", b->cfg.ota_upload, path);
}

absl::StatusOr<OtaBootResult> HardwareBroker::OtaRestart(const Caller& caller, const std::string& board,
                                                         int boot_timeout_ms) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("restarting for an update needs the lease: ", s.message()));
  }
  std::lock_guard op(b->op_mu);
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
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("confirming an update needs the lease: ", s.message()));
  }
  std::lock_guard op(b->op_mu);
  if (b->simulated()) {
    if (!b->slots) return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no OTA slots"));
    return b->slots->Confirm();
  }
  return RunOtaCommand(*b, "ota_confirm", b->cfg.ota_confirm, "");
}

absl::Status HardwareBroker::OtaRestorePrevious(const Caller& caller, const std::string& board) {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  if (auto s = leases_->CheckHeld(board, caller.identity, caller.lease_id, caller.session_id); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("reverting an update needs the lease: ", s.message()));
  }
  std::lock_guard op(b->op_mu);
  if (!b->simulated()) {
    return absl::UnimplementedError(absl::StrCat("board ", board, ": going back from a confirmed update is done by "
                                                 "rolling out the previous image again on physical boards"));
  }
  if (!b->slots) return absl::FailedPreconditionError(absl::StrCat("board ", board, " has no OTA slots"));
  return b->slots->RestorePrevious();
}

absl::StatusOr<OtaSlotsInfo> HardwareBroker::OtaSlots(const std::string& board) const {
  Board* b = FindBoard(board);
  if (!b) return absl::NotFoundError(absl::StrCat("no board '", board, "'"));
  OtaSlotsInfo out;
  out.simulated = b->simulated();
  if (!b->slots) return out;
  std::lock_guard op(b->op_mu);
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

absl::Status HardwareBroker::CheckScope(const Caller& caller, const std::string& board, bool flash) const {
  if (!caller.scope) return absl::OkStatus();
  const CapabilityScope& sc = *caller.scope;
  Board* b = FindBoard(board);
  std::vector<std::string> tags = b ? b->cfg.tags : std::vector<std::string>{};
  bool tagged = std::any_of(sc.boards.begin(), sc.boards.end(),
                            [&](const std::string& t) { return std::find(tags.begin(), tags.end(), t) != tags.end(); });
  if (!tagged) {
    return absl::PermissionDeniedError(absl::StrCat(
        "plugin ", sc.plugin, " did not declare board ", board, " (capabilities.boards: ",
        sc.boards.empty() ? "none" : absl::StrJoin(sc.boards, ", "), "; the board carries ",
        tags.empty() ? "no tags" : absl::StrJoin(tags, ", "), ")"));
  }
  if (flash && !sc.flash) {
    return absl::PermissionDeniedError(absl::StrCat("plugin ", sc.plugin, " did not declare the flash capability"));
  }
  return absl::OkStatus();
}

}  // namespace fwai
