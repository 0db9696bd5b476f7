// HardwareBroker: the daemon's owner of boards and devices. Leases, health,
// serial fan-out, flashing behind a guard, GDB, and simulated boards.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "common/config.h"
#include "common/mutex.h"
#include "server/auth/caller.h"
#include "server/hardware/lease_manager.h"
#include "server/hardware/rtt.h"
#include "server/hardware/serial_hub.h"

namespace fwai {

class QemuInstance;
class QemuTargetMemory;
class RttPump;
class SimMcuboot;
class Storage;

struct DeviceInfo {
  std::string id, kind, name, health, health_reason;
  std::vector<std::string> tags;
  std::string vid_pid, serial_number, path, holder, target, image, image_sha256;
  int64_t held_since_us = 0;
  int64_t lease_expires_us = 0;
  bool running = false;
  std::string state;        // running | paused | stopped
  int pid = -1;             // the simulator's process (simulated boards)
  std::string ota_version;  // the MCUboot image it runs, if it boots through slots
  // Boards: (id, name) of what can be read: ("uart", ""), then ("rtt:N",
  // the firmware's name) for each RTT up-channel of the running firmware.
  std::vector<std::pair<std::string, std::string>> streams;
};

// The result of restarting a board through its bootloader.
struct OtaBootResult {
  std::string swap;  // none | test | perm | revert | fail (simulated boards); "" for physical ones
  std::string detail;
  std::string version;  // what runs now (simulated boards)
  std::string hash;     // its MCUboot SHA-256 TLV
  std::string boot_line;
  bool booted = false;  // the boot pattern was seen (or the board has none)
};

// The update slots of a board.
struct OtaSlotsInfo {
  bool simulated = false;
  bool booted_from_slots = false;
  struct Slot {
    bool has_image = false;
    std::string version, hash, magic, image_ok, copy_done;
  } primary, secondary;
};

struct FlashProgressUpdate {
  std::string stage;  // guard | loading | writing | booting | done
  double fraction = 0;
  std::string message;
};

struct FlashResult {
  std::string sha256;
  std::string boot_line;  // the line that matched the boot pattern, if any
  double seconds = 0;
  // What the flash's evidence record says of it (kind "flash"): written by
  // the caller (Boards), never by the broker.
  nlohmann::json record;
};

// The policy's rules for the flash guard beyond lease, image, fit and
// approval (which always apply).
struct FlashGuardPolicy {
  bool check_fresh = true;                  // no source newer than the image
  bool require_verified_toolchain = false;  // the image's build record says its toolchain verified
  double flash_max_pct = 0;                 // memory budgets (0: none)
  double ram_max_pct = 0;
  int64_t max_growth_bytes = 0;  // per region, against the previous build
  // The project's register code against its SVD: off | warn | block.
  std::string register_check = "off";
  // The image's build record when the caller has it (a run that has just
  // built the image and not yet recorded it); else it is looked up.
  nlohmann::json build;
  bool any_memory_budget() const {
    return flash_max_pct > 0 || ram_max_pct > 0 || max_growth_bytes > 0;
  }
};

// True when the build record `rec` lists an artifact file with this SHA-256.
bool BuildRecordMadeImage(const nlohmann::json& rec, const std::string& sha256);
// The guard's toolchain rule (policy flash.require_verified_toolchain): the
// image's build record says its toolchain's files verified. `image` names it.
[[nodiscard]] absl::Status CheckToolchainRecord(const nlohmann::json& build,
                                                const std::string& image,
                                                const std::string& sha256);

// The flash guard's register_check: the register report of the project's
// sources at `project_root` against its device's SVD ({findings, checked}),
// read as the caller; an error says why there is none.
using RegisterCheckHook = std::function<absl::StatusOr<nlohmann::json>(
    const Caller& caller, const std::string& project_root)>;
// The guard's register_check (`mode` warn or block) of the project at `root`
// by `check` (null: none): OK with what to say in the guard's summary
// (`said`), or the refusal. `warning` gets what a warn-mode flash goes on
// despite. Used where the sources are: the broker for its boards, a lab
// front for the benches' boards.
[[nodiscard]] absl::Status GuardRegisters(const RegisterCheckHook& check, const Caller& caller,
                                          const std::string& root, const std::string& mode,
                                          std::string* said, std::string* warning);

struct DebugResult {
  std::vector<std::string> outputs;  // one text per command
  nlohmann::json results = nlohmann::json::array();
};

class HardwareBroker {
 public:
  // `run_dir` holds sockets and derived images.
  HardwareBroker(const HardwareConfig& config, Storage& storage, std::string run_dir);
  ~HardwareBroker();

  // Loads leases, opens serial ports, boots simulated boards that have an image.
  [[nodiscard]] absl::Status Start();
  void Shutdown();
  // True once Shutdown began: streams ending now end because fwaid stops.
  bool stopping() const { return stopping_.load(); }
  // Receives the records of leases that end on their own (TTL, session)
  // and of quarantines; flash records are the caller's to write
  // (FlashResult::record).
  void SetRunRecorder(std::function<void(const nlohmann::json&)> recorder) {
    MutexLock lock(&hooks_mu_);
    recorder_ = std::move(recorder);
  }
  // The flash guard's register_check (see RegisterCheckHook).
  void SetRegisterCheck(RegisterCheckHook hook) {
    MutexLock lock(&hooks_mu_);
    register_check_ = std::move(hook);
  }
  // The register report of the project at `root` as the hook makes it;
  // UNIMPLEMENTED when this fwaid has none.
  absl::StatusOr<nlohmann::json> CheckRegistersOf(const Caller& caller,
                                                  const std::string& root) const;
  // With hardware.keep_serial_transcripts: where each lease's serial output
  // is kept, content-addressed (DIR/SHA256.log, mode 0600).
  void SetTranscriptDir(std::string dir) { transcript_dir_ = std::move(dir); }
  // The transcript of a lease its holder (or an admin) just released, for the
  // record of that release: {sha256, bytes, lines, path, first_seq, lost_lines};
  // null if none. Leases that end otherwise (TTL, session) get their own
  // lease_ended record with it.
  nlohmann::json TakeTranscript(const std::string& lease_id);
  // Finds the build record (a skill run) that produced the image with this
  // SHA-256, for the guard's toolchain and growth rules; null if none.
  void SetBuildRecordLookup(std::function<nlohmann::json(const std::string& sha256)> lookup) {
    MutexLock lock(&hooks_mu_);
    build_record_ = std::move(lookup);
  }
  nlohmann::json BuildRecordOf(const std::string& sha256) const {
    std::function<nlohmann::json(const std::string&)> lookup;
    {
      MutexLock lock(&hooks_mu_);
      lookup = build_record_;
    }
    return lookup ? lookup(sha256) : nlohmann::json();
  }
  // Each flash record carries the SBOM of what was flashed: `tool_version`
  // names fwaid in it; `dpkg_admindir` is where toolchains are attested.
  void SetSbomOptions(std::string tool_version, std::string dpkg_admindir) {
    MutexLock lock(&hooks_mu_);
    sbom_version_ = std::move(tool_version);
    dpkg_admindir_ = std::move(dpkg_admindir);
  }

  std::vector<DeviceInfo> List() const;
  // "" picks the caller's leased board, else the only board.
  [[nodiscard]] absl::StatusOr<std::string> ResolveBoard(const std::string& id,
                                                         const Caller& caller) const;

  [[nodiscard]] absl::StatusOr<LeaseRecord> Acquire(const Caller& caller,
                                                    const std::string& device_id,
                                                    const std::vector<std::string>& tags, int ttl_s,
                                                    int wait_s,
                                                    const std::function<bool()>& cancelled,
                                                    const std::string& lease_id = "");
  // A lease standing for one granted elsewhere (a lab lease): see
  // LeaseManager::SetExpiry. Use does not extend it.
  [[nodiscard]] absl::Status SetLeaseExpiry(const std::string& lease_id,
                                            std::optional<int64_t> expires_us,
                                            const std::string& reason);
  [[nodiscard]] absl::StatusOr<LeaseRecord> Renew(const Caller& caller,
                                                  const std::string& lease_id);
  [[nodiscard]] absl::StatusOr<LeaseRecord> Release(const Caller& caller,
                                                    const std::string& lease_id,
                                                    const std::string& device_id, bool force);
  void SessionEnded(const std::string& session_id);
  // Ends every lease taken with token `token_id` (it was revoked), saying
  // `reason`; the leases that ended.
  std::vector<LeaseRecord> TokenEnded(const std::string& token_id, const std::string& reason);
  std::vector<LeaseRecord> Leases() const;
  // OK when the caller (principal, session or lease id) holds `board`'s lease.
  [[nodiscard]] absl::Status CheckHolder(const Caller& caller, const std::string& board) const;
  // Who waits for a board (Acquire with a wait), earliest first.
  std::vector<LeaseWaiter> Waiters() const;

  [[nodiscard]] absl::StatusOr<FlashResult> Flash(
      const Caller& caller, const std::string& board, const std::string& image, bool approved,
      const std::string& project_root,
      const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
      const FlashGuardPolicy& guard = {});

  // Serial: reading needs no lease; writing does. `stream` picks the board's
  // UART ("" or "uart") or, on a simulated board whose firmware has RTT, an
  // RTT channel ("rtt:N": up-channel N read, down-channel N written).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<SerialReader>> OpenSerial(
      const Caller& caller, const std::string& board, bool from_history,
      const std::string& stream = "");
  void CloseSerial(const std::string& board, const std::shared_ptr<SerialReader>& reader,
                   const std::string& stream = "");
  [[nodiscard]] absl::Status SerialWrite(const Caller& caller, const std::string& board,
                                         std::string_view bytes, const std::string& stream = "");
  [[nodiscard]] absl::Status SerialSendLine(const Caller& caller, const std::string& board,
                                            std::string_view line, const std::string& stream = "");
  [[nodiscard]] absl::StatusOr<std::vector<SerialLine>> SerialHistory(
      const std::string& board, size_t max_lines, const std::string& stream = "");
  [[nodiscard]] absl::StatusOr<uint64_t> SerialNextSeq(const std::string& board,
                                                       const std::string& stream = "");
  [[nodiscard]] absl::StatusOr<std::optional<SerialLine>> SerialWaitFor(
      const std::string& board, const std::regex& pattern, uint64_t since, int timeout_ms,
      const CancelToken* cancel, const std::string& stream = "");

  // Over-the-air updates. Simulated boards keep their MCUboot slots under
  // `dir`; their bootloader trusts `keys` (PEM text; empty: hash only).
  // Call before Start().
  void SetOtaOptions(std::string dir, std::vector<std::string> keys);
  // The board's configuration (NOT_FOUND for an unknown id).
  [[nodiscard]] absl::StatusOr<BoardConfig> BoardConfigOf(const std::string& board) const;
  // Each of these needs the caller's lease. Stage writes an MCUboot image to
  // the secondary slot, pending for a test boot (or for good); Restart
  // power-cycles the board through its bootloader and waits for the boot
  // pattern; Confirm makes the running image permanent; RestorePrevious
  // marks the image a swap moved out to come back at the next restart.
  [[nodiscard]] absl::Status OtaStage(const Caller& caller, const std::string& board,
                                      const std::string& image, bool permanent);
  [[nodiscard]] absl::StatusOr<OtaBootResult> OtaRestart(const Caller& caller,
                                                         const std::string& board,
                                                         int boot_timeout_ms);
  [[nodiscard]] absl::Status OtaConfirm(const Caller& caller, const std::string& board);
  [[nodiscard]] absl::Status OtaRestorePrevious(const Caller& caller, const std::string& board);
  [[nodiscard]] absl::StatusOr<OtaSlotsInfo> OtaSlots(const std::string& board) const;

  // `cancel` (may be null) ends gdb at once: a command waiting on the target
  // returns, no further one runs.
  [[nodiscard]] absl::StatusOr<DebugResult> Debug(const Caller& caller, const std::string& board,
                                                  const std::vector<std::string>& commands,
                                                  int timeout_ms, CancelToken* cancel = nullptr);
  [[nodiscard]] absl::Status Reset(const Caller& caller, const std::string& board);
  // good | bad | maintenance | quarantined, by an admin; good returns a
  // quarantined board to the pool.
  [[nodiscard]] absl::Status SetHealth(const Caller& caller, const std::string& board,
                                       const std::string& health, const std::string& reason);
  // The outcome of work on `board` (`what`: "flash", "skill run NAME"):
  // flashes count their own; a skill run tells its others. A failure with
  // the verdict `lab` (common/verdict.h) counts against the board; success,
  // or a `firmware` failure (the board ran the firmware), resets the count;
  // other verdicts leave it. At hardware.quarantine_after `lab` failures in
  // a row the board is quarantined: health "quarantined" (kept across
  // restarts, not handed out, not cleared by a self-test or a good flash)
  // with a record {kind: board_quarantined, failures}, until an admin sets
  // it good.
  void CountOutcome(const std::string& board, const absl::Status& outcome, const std::string& what);
  // Runs the board's self-test; the board's health follows the result.
  [[nodiscard]] absl::StatusOr<std::string> SelfTest(const Caller& caller,
                                                     const std::string& board);

  // A configured board. Used by the broker's .cc files only; defined here
  // so that the broker's helpers can name the lock of the board they work on.
  struct Board {
    BoardConfig cfg;
    std::unique_ptr<SerialHub> hub;
    // Trace streams of a simulated board, "rtt:N": a fed hub per RTT
    // up-channel, made when first asked for or fed and never removed
    // (readers hold them, as they hold `hub`); the simulator's memory and
    // the pump that feeds them while it runs.
    size_t history_lines = 1000;  // each hub's
    mutable Mutex streams_mu ABSL_ACQUIRED_AFTER(state_mu);
    std::map<std::string, std::unique_ptr<SerialHub>> streams ABSL_GUARDED_BY(streams_mu);
    std::unique_ptr<QemuTargetMemory> target_memory ABSL_GUARDED_BY(streams_mu);
    std::shared_ptr<RttPump> rtt ABSL_GUARDED_BY(streams_mu);
    std::unique_ptr<SimMcuboot> slots;  // simulated boards with an OTA directory (set by Start)
    Mutex op_mu;                        // one flash / debug / reset at a time
    mutable Mutex state_mu ABSL_ACQUIRED_AFTER(op_mu);
    // The simulator, whether it is paused, and the image the board runs are
    // changed under op_mu and state_mu both, so they are read whole under
    // either: work on the board holds op_mu; List() takes only state_mu (it
    // must not wait for a flash) through Listed(). The analysis checks op_mu.
    std::unique_ptr<QemuInstance> qemu ABSL_GUARDED_BY(op_mu);  // simulated boards while running
    bool paused ABSL_GUARDED_BY(op_mu) = false;         // simulated: stopped while nobody holds it
    std::string image ABSL_GUARDED_BY(op_mu);           // last image loaded
    bool from_slots ABSL_GUARDED_BY(op_mu) = false;     // runs the primary slot's image ...
    std::string ota_version ABSL_GUARDED_BY(state_mu);  // ... of this version
    std::string image_sha256 ABSL_GUARDED_BY(state_mu);
    std::string health ABSL_GUARDED_BY(state_mu) =
        "good";  // good | bad | maintenance | quarantined
    std::string health_reason ABSL_GUARDED_BY(state_mu);
    bool admin_health ABSL_GUARDED_BY(state_mu) = false;  // set by an admin; not auto-recovered
    // The `lab` failures since the board last worked (CountOutcome).
    std::vector<nlohmann::json> lab_failures ABSL_GUARDED_BY(state_mu);
    std::atomic<bool> restarting{false};
    std::atomic<bool> debug_cancel{false};
    std::atomic<uint64_t> generation{0};  // bumps on each (re)start

    // Replaces the simulator (null: none); the old one is destroyed after
    // state_mu is let go (its exit callback may take state_mu).
    void SetQemu(std::unique_ptr<QemuInstance> q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu)
        ABSL_LOCKS_EXCLUDED(state_mu);
    // Takes the simulator out of the board under state_mu (a listing then
    // sees none, and never reads one being stopped) and stops it outside the
    // lock (its exit callback may take state_mu).
    void StopQemu() ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu) ABSL_LOCKS_EXCLUDED(state_mu);
    void SetPaused(bool p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu) ABSL_LOCKS_EXCLUDED(state_mu) {
      MutexLock lock(&state_mu);
      paused = p;
    }
    // What List() shows of the board, read under state_mu alone (not
    // checked: qemu, paused and image are guarded by op_mu for the
    // analysis, which cannot say "written under both, read under either").
    struct Listing {
      std::string image, image_sha256, ota_version;
      bool up = false;  // a simulator runs (or is paused)
      bool paused = false;
      int pid = -1;
    };
    Listing Listed() const ABSL_LOCKS_EXCLUDED(state_mu) ABSL_NO_THREAD_SAFETY_ANALYSIS;

    bool simulated() const { return cfg.kind == "simulated"; }
    void SetHealth(const std::string& h, const std::string& reason, bool admin = false)
        ABSL_LOCKS_EXCLUDED(state_mu) {
      MutexLock lock(&state_mu);
      if (admin_health && !admin) return;
      health = h;
      health_reason = reason;
      if (admin) admin_health = h != "good";
    }
    std::pair<std::string, std::string> Health() const ABSL_LOCKS_EXCLUDED(state_mu) {
      MutexLock lock(&state_mu);
      return {health, health_reason};
    }
    SerialSettings Settings() const;
    // The hub of stream `name` ("rtt:N"), made if new: fed by the pump,
    // writing to its down-channel N.
    SerialHub* Stream(const std::string& name) ABSL_LOCKS_EXCLUDED(streams_mu);
    // Every trace stream's hub.
    std::vector<SerialHub*> Streams() const ABSL_LOCKS_EXCLUDED(streams_mu);
    // What a listing says can be read: the UART, and the RTT up-channels
    // of the control block the pump last found (DeviceInfo::streams).
    std::vector<std::pair<std::string, std::string>> StreamsListed() const
        ABSL_LOCKS_EXCLUDED(streams_mu);
    // Starts feeding the trace streams from `memory` (the running
    // simulator's) as `where` says; StopRtt stops it (the pump's thread is
    // joined outside streams_mu, which its sink takes).
    void StartRtt(std::unique_ptr<QemuTargetMemory> memory, const RttSearch& where, int poll_ms)
        ABSL_LOCKS_EXCLUDED(streams_mu);
    void StopRtt() ABSL_LOCKS_EXCLUDED(streams_mu);
  };

 private:
  std::atomic<bool> stopping_{false};
  // `path` read as the caller's account into RUN/images/BOARD.ext (fwaid's own).
  absl::StatusOr<std::string> CopyImageAs(const Caller& caller, const std::string& board_id,
                                          const std::string& path);
  Board* FindBoard(const std::string& id) const;
  // The hub of `board`'s `stream` (see OpenSerial); errors name the board and
  // what streams it has.
  absl::StatusOr<SerialHub*> HubOf(const std::string& board, const std::string& stream) const;
  // The caller may write to `board`'s `stream`: in scope and holding its lease.
  absl::Status CheckWriter(const Caller& caller, const std::string& board,
                           const std::string& stream);
  // Flash(): FlashOnce, its verdict (a refusal by the guard is `config`)
  // counted against the board.
  absl::StatusOr<FlashResult> FlashGuarded(
      const Caller& caller, const std::string& board, const std::string& image, bool approved,
      const std::string& project_root,
      const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
      const FlashGuardPolicy& guard);
  // One flash: the guard, then (`*writing` set) the write and the boot wait.
  absl::StatusOr<FlashResult> FlashOnce(
      const Caller& caller, const std::string& board, const std::string& image, bool approved,
      const std::string& project_root,
      const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
      const FlashGuardPolicy& guard, bool* writing);
  // PERMISSION_DENIED when the caller acts for a plugin that did not declare
  // `board`'s tags (or, with `flash`, the flash capability).
  absl::Status CheckScope(const Caller& caller, const std::string& board, bool flash) const;
  absl::Status BootSimulated(Board& b, const std::string& image)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu);
  // Power-on of a simulated board through its MCUboot slots.
  absl::StatusOr<OtaBootResult> BootFromSlots(Board& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu);
  absl::Status RunOtaCommand(Board& b, const std::string& what, const std::string& tmpl,
                             const std::string& image);
  // Reboots a stopped simulated board the way it was last started.
  absl::Status PowerOn(Board& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu);
  // The flash guard's memory rules for `image_path` (fwaid's copy of
  // `requested_image`, whose map and sources are read as the caller).
  absl::Status GuardMemory(const Caller& caller, Board& b, const std::string& image_path,
                           const std::string& requested_image, const std::string& root,
                           const nlohmann::json& build, const FlashGuardPolicy& guard);
  // Writes `image_path` to `b`; `*flashed_file` is what was written.
  absl::Status WriteImage(Board& b, const std::string& image_path,
                          const std::function<void(const FlashProgressUpdate&)>& progress,
                          std::string* flashed_file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b.op_mu);
  absl::StatusOr<FlashResult> FlashMcuboot(
      const Caller& caller, Board& b, const std::string& image_path,
      const std::function<void(const FlashProgressUpdate&)>& progress, const CancelToken* cancel,
      int64_t start_us, bool* writing) ABSL_LOCKS_EXCLUDED(b.op_mu);
  void OnLeaseEnded(const LeaseRecord& lease, const std::string& reason);
  // The daemon's record hook (recorder_), copied out of hooks_mu_.
  std::function<void(const nlohmann::json&)> Recorder() const ABSL_LOCKS_EXCLUDED(hooks_mu_) {
    MutexLock lock(&hooks_mu_);
    return recorder_;
  }
  // The evidence record of a fault capture (kind fault_capture): the board,
  // the image's and the capture's SHA-256, the fault in words.
  void RecordCapture(const Caller& caller, const nlohmann::json& capture);
  // A quarantine kept from before fwaid's restart, applied to `b`.
  void LoadQuarantine(Board& b);
  // An admin's health for `b`: a quarantine lifted or set by hand is kept
  // (or dropped) in storage; the count of lab failures starts again.
  void AdminHealthChanged(Board& b, const std::string& was, const std::string& health,
                          const std::string& reason, const Caller& caller);
  void Supervise();

  const HardwareConfig config_;
  Storage& storage_;
  const std::string run_dir_;
  std::vector<std::unique_ptr<Board>> boards_;
  std::unique_ptr<LeaseManager> leases_;
  struct Supervisor;
  // Made by the constructor and never reset (the serial hubs' failure
  // callbacks read it from their threads); Shutdown stops its thread.
  const std::unique_ptr<Supervisor> supervisor_;
  // The daemon's hooks. It sets them after Start, while the lease sweeper
  // may already end a lease, so they are copied out under hooks_mu_ and
  // called without it.
  mutable Mutex hooks_mu_;
  std::function<void(const nlohmann::json&)> recorder_ ABSL_GUARDED_BY(hooks_mu_);
  std::function<nlohmann::json(const std::string&)> build_record_ ABSL_GUARDED_BY(hooks_mu_);
  RegisterCheckHook register_check_ ABSL_GUARDED_BY(hooks_mu_);
  std::string sbom_version_ ABSL_GUARDED_BY(hooks_mu_);
  std::string dpkg_admindir_ ABSL_GUARDED_BY(hooks_mu_);
  RegisterCheckHook RegisterCheck() const ABSL_LOCKS_EXCLUDED(hooks_mu_) {
    MutexLock lock(&hooks_mu_);
    return register_check_;
  }
  std::string SbomVersion() const ABSL_LOCKS_EXCLUDED(hooks_mu_) {
    MutexLock lock(&hooks_mu_);
    return sbom_version_;
  }
  std::string DpkgAdmindir() const ABSL_LOCKS_EXCLUDED(hooks_mu_) {
    MutexLock lock(&hooks_mu_);
    return dpkg_admindir_;
  }
  // Set before Start; read-only after.
  std::string transcript_dir_;
  Mutex transcripts_mu_;
  // lease id -> first serial seq
  std::map<std::string, uint64_t> transcript_from_ ABSL_GUARDED_BY(transcripts_mu_);
  // lease id -> transcript, until taken
  std::map<std::string, nlohmann::json> transcripts_ ABSL_GUARDED_BY(transcripts_mu_);
  nlohmann::json KeepTranscript(const LeaseRecord& lease) ABSL_LOCKS_EXCLUDED(transcripts_mu_);
  std::string ota_dir_;
  std::vector<std::string> ota_keys_;
};

}  // namespace fwai
