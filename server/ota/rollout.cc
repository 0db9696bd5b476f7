#include "server/ota/rollout.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/local_account.h"
#include "common/mcuboot.h"
#include "common/status_macros.h"
#include "server/skills/runner.h"
#include "server/storage/storage.h"

namespace fwai {

using json = nlohmann::json;

namespace {

constexpr char kRolloutPrefix[] = "rollout/";
constexpr char kPassedPrefix[] = "passed/";
constexpr char kBoardPrefix[] = "board/";
constexpr int kLeaseTtlS = 900;

// A rollout's lease on one of its boards: waits up to 30 s for it.
LeaseRequest LeaseOn(const std::string& board) {
  LeaseRequest r;
  r.board = board;
  r.ttl_s = kLeaseTtlS;
  r.wait_s = 30;
  return r;
}
constexpr int kBootTimeoutMs = 15000;

// Rollout keys sort by start time: "rollout/<20-digit time>-<id>".
std::string RolloutKey(int64_t started_us, const std::string& id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020lld", static_cast<long long>(started_us));
  return absl::StrCat(kRolloutPrefix, buf, "-", id);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::vector<size_t>> StageCounts(const std::vector<std::string>& stages,
                                                size_t total) {
  if (stages.empty()) return std::vector<size_t>{total};
  std::vector<size_t> out;
  size_t prev = 0;
  for (const auto& raw : stages) {
    std::string s = raw;
    size_t n = 0;
    if (!s.empty() && s.back() == '%') {
      double pct = 0;
      if (!absl::SimpleAtod(s.substr(0, s.size() - 1), &pct) || pct <= 0 || pct > 100) {
        return absl::InvalidArgumentError(
            absl::StrCat("stages: '", raw, "': a percentage must be in (0, 100]"));
      }
      n = static_cast<size_t>(std::ceil(pct * static_cast<double>(total) / 100.0 - 1e-9));
    } else {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(s, &v) || v == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stages: '", raw, "': expected a board count (1, 2, …) or a percentage (25%)"));
      }
      n = static_cast<size_t>(v);
    }
    n = std::min(n, total);
    if (n < prev) {
      return absl::InvalidArgumentError(absl::StrCat("stages: '", raw, "' covers ", n,
                                                     " boards, fewer than the stage before (", prev,
                                                     "); stages are cumulative"));
    }
    if (n > prev) out.push_back(n);
    prev = n;
  }
  return out;
}

// One rollout's state, written to the database at every change, and its
// steps in the order Run takes them: Prepare (the image read as the caller,
// the boards, promotion, versions), Begin, one RunStage per stage (each
// board: lease, stage, restart, health, confirm or revert), TakeBack when a
// stage failed too often, Finish.
struct RolloutManager::Run_ {
  Run_(RolloutManager* manager, const RolloutRequest& request,
       const std::function<void(const RolloutEvent&)>& emit_to, CancelToken& cancel_with,
       std::string record_key, std::string rollout_id)
      : m(manager),
        req(request),
        emit(emit_to),
        cancel(cancel_with),
        key(std::move(record_key)),
        id(std::move(rollout_id)) {}

  RolloutManager* m;
  const RolloutRequest& req;
  const std::function<void(const RolloutEvent&)>& emit;
  CancelToken& cancel;
  json doc = json::object();  // the stored record
  std::string key;
  std::string id;
  // What Prepare found.
  std::string bytes;  // the image
  mcuboot::ImageInfo info;
  std::string version, hash;
  std::vector<DeviceInfo> fleet;
  std::vector<size_t> counts;                  // cumulative boards per stage
  std::vector<std::string> physical;           // boards that are not simulated
  std::map<std::string, std::string> current;  // board -> version it runs
  std::set<std::string> already;               // boards that run this image
  std::vector<std::string> downgrades;
  double max_rate = 0;
  // How it went.
  std::vector<std::string> confirmed;  // boards this rollout updated for good
  std::string final_state = "completed";
  std::string final_error;

  void Save() {
    if (auto s = m->storage_.Put(Cf::kOta, key, doc.dump(), true); !s.ok()) {
      spdlog::error("ota: saving rollout {}: {}", id, s.ToString());
    }
  }

  // An evidence record, the stored state and an event, for one change.
  void Record(RolloutEvent e) {
    json rec = {{"kind", "ota"},
                {"event", e.kind},
                {"rollout_id", id},
                {"by", req.caller.display},
                {"image_hash", doc.value("image_hash", "")},
                {"version", doc.value("version", "")}};
    if (!e.board.empty()) rec["board"] = e.board;
    if (!e.state.empty()) rec["state"] = e.state;
    if (!e.text.empty()) rec["text"] = e.text;
    if (e.data.is_object()) {
      for (auto& [k, v] : e.data.items()) rec[k] = v;
    }
    if (m->append_) {
      auto idx = m->append_(rec);
      if (idx.ok()) {
        rec["evidence_index"] = *idx;
      } else {
        spdlog::error("ota: evidence: {}", idx.status().ToString());
      }
    }
    doc["events"].push_back(rec);
    if (!e.board.empty() && !e.state.empty()) doc["boards"][e.board]["state"] = e.state;
    Save();
    e.data = rec;
    emit(e);
  }

  void BoardEvent(const std::string& board, const std::string& state, const std::string& text,
                  json extra = json::object()) {
    Record({"board", board, state, text, std::move(extra)});
  }

  // The refusal of a rollout that did not start: its record and event.
  RolloutResult Refuse(const absl::Status& s) {
    RolloutResult result;
    result.rollout_id = id;
    result.state = "refused";
    result.error = std::string(s.message());
    result.summary = {{"rollout_id", id},
                      {"state", "refused"},
                      {"error", result.error},
                      {"code", static_cast<int>(s.code())}};
    if (m->append_) {
      (void)m->append_({{"kind", "ota"},
                        {"event", "rollout_refused"},
                        {"rollout_id", id},
                        {"image", req.image_path},
                        {"by", req.caller.display},
                        {"reason", result.error}});
    }
    emit({"rollout_finished", "", "refused", result.error, result.summary});
    return result;
  }

  absl::Status Prepare() {
    RETURN_IF_ERROR(ReadImage());
    RETURN_IF_ERROR(ChooseBoards());
    ASSIGN_OR_RETURN(counts, StageCounts(req.stages, fleet.size()));
    RETURN_IF_ERROR(CheckPromotion());
    RETURN_IF_ERROR(CheckVersions());
    if (!req.health_skill.empty() && !m->skills_)
      return absl::UnavailableError("the skill runner is not available");
    max_rate = req.max_failure_rate >= 0 ? req.max_failure_rate : m->config_.max_failure_rate;
    return absl::OkStatus();
  }

  // The image: a valid MCUboot image, signed by a trusted key when keys are
  // configured. Read as the caller's account: nobody rolls out (and so
  // exposes) a file they could not read themselves.
  absl::Status ReadImage() {
    if (!req.caller.account) {
      return absl::PermissionDeniedError(absl::StrCat(
          "reading ", req.image_path, " needs a local account; ", req.caller.display, " has none"));
    }
    {
      ScopedFsIdentity as(*req.caller.account);
      RETURN_IF_ERROR(as.status());
      ASSIGN_OR_RETURN(bytes, ReadFile(req.image_path));
    }
    auto parsed = mcuboot::Parse(bytes);
    if (!parsed.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(req.image_path, ": ", parsed.status().message()));
    info = *std::move(parsed);
    if (!info.hash_ok)
      return absl::DataLossError(
          absl::StrCat(req.image_path, ": its SHA-256 does not match its contents"));
    if (!m->key_pems_.empty()) {
      absl::Status last;
      for (const auto& k : m->key_pems_) {
        last = mcuboot::VerifySignature(bytes, info, k);
        if (last.ok()) break;
      }
      if (!last.ok()) {
        return absl::PermissionDeniedError(absl::StrCat(
            req.image_path, ": not signed by a key in ota.keys (", last.message(), ")"));
      }
    }
    version = info.version.ToString();
    hash = info.sha256_hex;
    return absl::OkStatus();
  }

  // The boards: ids, and tags every chosen board carries; sorted by id.
  absl::Status ChooseBoards() {
    std::set<std::string> ids;
    std::vector<std::string> tags;
    std::set<std::string> known;
    auto all = m->Fleet();
    for (const auto& d : all) known.insert(d.id);
    for (const auto& b : req.boards) {
      if (known.count(b)) {
        ids.insert(b);
      } else {
        tags.push_back(b);
      }
    }
    for (const auto& d : all) {
      if (!known.count(d.id)) continue;
      bool pick = ids.count(d.id) > 0;
      if (!pick && !tags.empty()) {
        pick = std::all_of(tags.begin(), tags.end(), [&](const std::string& t) {
          return std::find(d.tags.begin(), d.tags.end(), t) != d.tags.end();
        });
      }
      if (pick) fleet.push_back(d);
    }
    std::sort(fleet.begin(), fleet.end(),
              [](const DeviceInfo& a, const DeviceInfo& b) { return a.id < b.id; });
    if (fleet.empty()) {
      return absl::NotFoundError(absl::StrCat("no board matches --boards ",
                                              absl::StrJoin(req.boards, ","),
                                              " (board ids, or tags every chosen board carries)"));
    }
    return absl::OkStatus();
  }

  // Promotion: physical boards only get an image that passed on simulated ones.
  absl::Status CheckPromotion() {
    for (const auto& d : fleet) {
      if (d.kind != "simulated") physical.push_back(d.id);
    }
    if (physical.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(auto passed, m->storage_.Get(Cf::kOta, kPassedPrefix + hash));
    if (passed.has_value()) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("promotion refused: image ", version, " (sha256 ", hash.substr(0, 16),
                     "…) has not passed a rollout on "
                     "simulated boards; physical boards ",
                     absl::StrJoin(physical, ", "),
                     " get it after it has (fwai ota rollout IMAGE --boards simulated)"));
  }

  // What a board runs: a simulated one's primary slot, a physical one's
  // last confirmed rollout. (version, hash), empty if not known.
  std::pair<std::string, std::string> Running(const DeviceInfo& d) {
    if (d.kind == "simulated") {
      auto slots = m->boards_.OtaSlots(BoardRef{d.id, "", false, ""});
      if (slots.ok() && slots->booted_from_slots && slots->primary.has_image)
        return {slots->primary.version, slots->primary.hash};
    } else if (auto rec = m->storage_.Get(Cf::kOta, kBoardPrefix + d.id);
               rec.ok() && rec->has_value()) {
      auto j = json::parse(**rec, nullptr, false);
      if (!j.is_discarded()) return {j.value("version", ""), j.value("hash", "")};
    }
    return {};
  }

  // Downgrades (refused without --force), and boards that already run this image.
  absl::Status CheckVersions() {
    for (const auto& d : fleet) {
      const auto [cur_version, cur_hash] = Running(d);
      current[d.id] = cur_version;
      if (cur_version.empty()) continue;
      if (cur_hash == hash) {
        already.insert(d.id);
        continue;
      }
      auto cv = mcuboot::Version::Parse(cur_version);
      if (cv.ok() && info.version.Compare(*cv) < 0)
        downgrades.push_back(absl::StrCat(d.id, " runs ", cur_version));
    }
    if (!downgrades.empty() && !req.force) {
      return absl::FailedPreconditionError(
          absl::StrCat("downgrade refused: ", version, " is older than what ",
                       absl::StrJoin(downgrades, ", "), " (--force rolls it out anyway)"));
    }
    return absl::OkStatus();
  }

  void Begin(int64_t started) {
    json boards = json::object();
    json ids = json::array();
    for (const auto& d : fleet) {
      boards[d.id] = {{"state", "waiting"}, {"kind", d.kind}, {"from", current[d.id]}};
      ids.push_back(d.id);
    }
    doc = {{"id", id},
           {"state", "running"},
           {"image", req.image_path},
           {"image_hash", hash},
           {"version", version},
           {"signed", info.has_signature},
           {"stages", counts},
           {"health", req.health_skill},
           {"max_failure_rate", max_rate},
           {"forced", req.force && !downgrades.empty()},
           {"by", req.caller.display},
           {"started_us", started},
           {"boards", boards},
           {"events", json::array()}};
    Record({"rollout_started",
            "",
            "running",
            absl::StrCat("rolling out ", version, " to ", fleet.size(), " board(s) in ",
                         counts.size(), " stage(s)"),
            {{"boards", ids}, {"stages", counts}}});
  }

  // Stage `stage` (from 0): its boards, from the `done` before it; the
  // rollout stops when more than max_rate of them failed.
  void RunStage(size_t stage, size_t& done) {
    std::vector<DeviceInfo> members(fleet.begin() + static_cast<std::ptrdiff_t>(done),
                                    fleet.begin() + static_cast<std::ptrdiff_t>(counts[stage]));
    done = counts[stage];
    std::vector<std::string> ids;
    for (const auto& d : members) ids.push_back(d.id);
    Record({"stage_started",
            "",
            "",
            absl::StrCat("stage ", stage + 1, ": ", absl::StrJoin(ids, ", ")),
            {{"stage", stage + 1}, {"boards", ids}}});
    size_t attempted = 0, failed = 0;
    for (const auto& d : members) {
      if (cancel.cancelled()) {
        final_state = "cancelled";
        break;
      }
      if (already.count(d.id)) {
        BoardEvent(d.id, "skipped", absl::StrCat(d.id, " already runs ", version));
        continue;
      }
      attempted++;
      if (!UpdateBoard(d)) failed++;
    }
    double rate =
        attempted == 0 ? 0.0 : static_cast<double>(failed) / static_cast<double>(attempted);
    Record({"stage_finished",
            "",
            "",
            absl::StrCat("stage ", stage + 1, ": ", failed, " of ", attempted, " failed"),
            {{"stage", stage + 1},
             {"attempted", attempted},
             {"failed", failed},
             {"failure_rate", rate}}});
    if (final_state == "completed" && rate > max_rate) {
      final_state = "stopped";
      final_error =
          absl::StrCat("stage ", stage + 1, " failed on ", failed, " of ", attempted, " board(s) (",
                       static_cast<int>(rate * 100), "% > ", static_cast<int>(max_rate * 100),
                       "%): the rollout stops and is taken back");
    }
  }

  // One board, under a lease of its own (or the caller's): the image staged
  // in test state, booted, checked by the health skill, then confirmed or
  // reverted. Whether it is confirmed.
  bool UpdateBoard(const DeviceInfo& d) {
    const std::string& board = d.id;
    auto lease = m->leases_.Acquire(req.caller, LeaseOn(board), [&] { return cancel.cancelled(); });
    if (!lease.ok()) {
      BoardEvent(board, "failed",
                 absl::StrCat("cannot lease ", board, ": ", lease.status().message()));
      return false;
    }
    Caller bc = req.caller;
    bc.lease_id = lease->lease_id;
    bool ok = UpdateLeased(bc, d);
    if (!lease->renewed) (void)m->leases_.Release(bc, lease->lease_id, board, false);
    return ok;
  }

  bool UpdateLeased(const Caller& bc, const DeviceInfo& d) {
    const std::string& board = d.id;
    BoardEvent(board, "staging",
               absl::StrCat("writing ", version, " to the secondary slot of ", board, " (test)"));
    if (auto s = m->boards_.OtaStage(bc, BoardRef{board, "", false, ""}, bytes, false); !s.ok()) {
      BoardEvent(board, "failed", absl::StrCat("upload failed: ", s.message()));
      return false;
    }
    auto boot = m->boards_.OtaRestart(bc, BoardRef{board, "", false, ""}, kBootTimeoutMs);
    std::string why;
    if (!boot.ok()) {
      why = absl::StrCat("restart failed: ", boot.status().message());
    } else if (d.kind == "simulated" && boot->hash != hash) {
      why = absl::StrCat("the bootloader did not run the new image (swap ", boot->swap,
                         boot->detail.empty() ? "" : ": " + boot->detail, ")");
    } else if (!boot->booted) {
      why = "no boot line within 15 s";
    }
    json boot_data =
        boot.ok()
            ? json{{"swap", boot->swap}, {"running", boot->version}, {"boot_line", boot->boot_line}}
            : json::object();
    if (why.empty()) {
      BoardEvent(board, "testing",
                 absl::StrCat(board, " booted ", version, " in test state: ", boot->boot_line),
                 boot_data);
      if (!req.health_skill.empty()) why = CheckHealth(bc, board, boot_data);
    }
    if (why.empty()) why = Confirm(bc, d, boot_data);
    if (why.empty()) return true;
    // Not confirmed: the bootloader swaps the previous image back at this restart.
    const bool new_image_ran = !boot.ok() || d.kind != "simulated" || boot->hash == hash;
    Revert(bc, board, why, boot_data, new_image_ran);
    return false;
  }

  // The health skill on the board: why it failed, empty if it passed.
  std::string CheckHealth(const Caller& bc, const std::string& board, json& boot_data) {
    SkillRunRequest sr;
    sr.project_root = req.project_root;
    sr.skill = req.health_skill;
    sr.board = board;
    sr.ci = true;
    sr.timeout_s = m->config_.health_timeout_s;
    sr.vars = {{"OTA_VERSION", version}, {"OTA_IMAGE_HASH", hash}, {"ROLLOUT_ID", id}};
    sr.caller = bc;
    std::string last_error;
    auto r = m->skills_->Run(
        sr,
        [&](const SkillEventOut& e) {
          if (e.kind == "step_finished" && !e.ok) last_error = absl::StrCat(e.step, ": ", e.text);
        },
        cancel);
    boot_data["health_run"] = r.run_id;
    if (r.ok) return "";
    return absl::StrCat("health skill '", req.health_skill, "' failed (", r.failure_class, ")",
                        last_error.empty() ? "" : ": " + last_error);
  }

  // The image confirmed (and, for a physical board, what it runs kept):
  // why not, empty if it was.
  std::string Confirm(const Caller& bc, const DeviceInfo& d, const json& boot_data) {
    const std::string& board = d.id;
    if (auto s = m->boards_.OtaConfirm(bc, BoardRef{board, "", false, ""}); !s.ok())
      return absl::StrCat("confirm failed: ", s.message());
    confirmed.push_back(board);
    if (d.kind != "simulated") {
      (void)m->storage_.Put(Cf::kOta, kBoardPrefix + board,
                            json({{"version", version}, {"hash", hash}, {"rollout_id", id}}).dump(),
                            true);
    }
    BoardEvent(board, "confirmed", absl::StrCat(board, " runs ", version, " (confirmed)"),
               boot_data);
    return "";
  }

  void Revert(const Caller& bc, const std::string& board, const std::string& why,
              const json& boot_data, bool new_image_ran) {
    BoardEvent(board, "reverting", absl::StrCat(why, "; restarting without confirming"), boot_data);
    if (!new_image_ran) {
      BoardEvent(board, "reverted", absl::StrCat(board, " kept ", current[board], ": ", why),
                 {{"reason", why}});
      return;
    }
    auto back = m->boards_.OtaRestart(bc, BoardRef{board, "", false, ""}, kBootTimeoutMs);
    if (!back.ok()) {
      BoardEvent(board, "failed", absl::StrCat("revert failed: ", back.status().message()));
      return;
    }
    BoardEvent(
        board, "reverted",
        absl::StrCat(board, " is back on ", back->version.empty() ? current[board] : back->version,
                     back->booted ? (back->boot_line.empty() ? "" : ": " + back->boot_line)
                                  : " (no boot line)"),
        {{"swap", back->swap},
         {"running", back->version},
         {"boot_line", back->boot_line},
         {"reason", why}});
  }

  // Boards updated for good in earlier stages go back to their previous image.
  void TakeBack() {
    for (const auto& board : confirmed) {
      auto lease = m->leases_.Acquire(req.caller, LeaseOn(board), [] { return false; });
      if (!lease.ok()) {
        BoardEvent(board, "failed",
                   absl::StrCat("cannot lease ", board,
                                " to take the update back: ", lease.status().message()));
        continue;
      }
      Caller bc = req.caller;
      bc.lease_id = lease->lease_id;
      absl::Status s = m->boards_.OtaRestorePrevious(bc, BoardRef{board, "", false, ""});
      absl::StatusOr<OtaBootResult> back =
          s.ok() ? m->boards_.OtaRestart(bc, BoardRef{board, "", false, ""}, kBootTimeoutMs)
                 : absl::StatusOr<OtaBootResult>(s);
      if (!back.ok()) {
        BoardEvent(board, "failed",
                   absl::StrCat("taking the update back failed: ", back.status().message()));
      } else {
        BoardEvent(
            board, "rolled_back", absl::StrCat(board, " is back on ", back->version),
            {{"swap", back->swap}, {"running", back->version}, {"boot_line", back->boot_line}});
      }
      if (!lease->renewed) (void)m->leases_.Release(bc, lease->lease_id, board, false);
    }
  }

  RolloutResult Finish() {
    doc["state"] = final_state;
    doc["finished_us"] = NowMicros();
    if (!final_error.empty()) doc["error"] = final_error;
    // A whole rollout over simulated boards that passed lets the image go to physical ones.
    if (final_state == "completed" && physical.empty()) {
      json passed = {{"rollout_id", id},
                     {"version", version},
                     {"time_us", NowMicros()},
                     {"boards", doc["boards"]}};
      (void)m->storage_.Put(Cf::kOta, kPassedPrefix + hash, passed.dump(), true);
    }
    json summary = {{"rollout_id", id},
                    {"state", final_state},
                    {"version", version},
                    {"image_hash", hash},
                    {"boards", doc["boards"]}};
    if (!final_error.empty()) summary["error"] = final_error;
    Record({"rollout_finished", "", final_state,
            final_error.empty() ? absl::StrCat("rollout ", final_state) : final_error, summary});
    RolloutResult result;
    result.rollout_id = id;
    result.state = final_state;
    result.error = final_error;
    result.summary = summary;
    return result;
  }
};

RolloutManager::RolloutManager(::fwai::Boards& boards, BoardLeases& leases, SkillRunner* skills,
                               Storage& storage, AppendEvidence append, OtaConfig config)
    : boards_(boards),
      leases_(leases),
      skills_(skills),
      storage_(storage),
      append_(std::move(append)),
      config_(std::move(config)) {}

std::vector<DeviceInfo> RolloutManager::Fleet() const {
  std::vector<DeviceInfo> out;
  for (auto& b : leases_.List().boards) {
    if (b.device.state == "remote") continue;  // another node's: its bench rolls it out
    if (b.device.kind == "simulated" || b.device.kind == "board")
      out.push_back(std::move(b.device));
  }
  return out;
}

absl::Status RolloutManager::Start() {
  for (const auto& path : config_.keys) {
    auto pem = ReadFile(path);
    if (!pem.ok())
      return absl::InvalidArgumentError(absl::StrCat("ota.keys: ", pem.status().message()));
    if (auto h = mcuboot::KeyHashHex(*pem); !h.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ota.keys: ", path, ": ", h.status().message()));
    }
    key_pems_.push_back(*pem);
  }
  std::vector<std::pair<std::string, json>> stale;
  auto s = storage_.Scan(Cf::kOta, kRolloutPrefix, "rollout0",
                         [&](std::string_view k, std::string_view v) {
                           auto j = json::parse(v, nullptr, false);
                           if (!j.is_discarded() && j.value("state", "") == "running")
                             stale.emplace_back(std::string(k), j);
                           return true;
                         });
  if (!s.ok()) return s;
  for (auto& [k, j] : stale) {
    j["state"] = "interrupted";
    j["finished_us"] = NowMicros();
    j["error"] =
        "fwaid stopped during the rollout; boards left unconfirmed revert at their next power-on";
    if (append_) {
      (void)append_({{"kind", "ota"},
                     {"event", "rollout_finished"},
                     {"rollout_id", j.value("id", "")},
                     {"state", "interrupted"},
                     {"text", j["error"]}});
    }
    if (auto st = storage_.Put(Cf::kOta, k, j.dump(), true); !st.ok()) return st;
  }
  return absl::OkStatus();
}

RolloutResult RolloutManager::Run(const RolloutRequest& req,
                                  const std::function<void(const RolloutEvent&)>& emit,
                                  CancelToken& cancel) {
  const int64_t started = NowMicros();
  const std::string rollout_id = NewId("ota-");
  Run_ run(this, req, emit, cancel, RolloutKey(started, rollout_id), rollout_id);
  if (auto s = run.Prepare(); !s.ok()) return run.Refuse(s);
  run.Begin(started);
  size_t done = 0;
  for (size_t stage = 0; stage < run.counts.size() && run.final_state == "completed"; ++stage)
    run.RunStage(stage, done);
  if (run.final_state == "stopped") run.TakeBack();
  return run.Finish();
}

absl::StatusOr<std::vector<json>> RolloutManager::List(size_t limit) const {
  std::vector<json> all;
  auto s = storage_.Scan(Cf::kOta, kRolloutPrefix, "rollout0",
                         [&](std::string_view, std::string_view v) {
                           auto j = json::parse(v, nullptr, false);
                           if (!j.is_discarded()) {
                             j.erase("events");
                             all.push_back(std::move(j));
                           }
                           return true;
                         });
  if (!s.ok()) return s;
  std::reverse(all.begin(), all.end());
  if (all.size() > limit) all.resize(limit);
  return all;
}

absl::StatusOr<json> RolloutManager::Get(const std::string& rollout_id) const {
  std::optional<json> found;
  auto s = storage_.Scan(
      Cf::kOta, kRolloutPrefix, "rollout0", [&](std::string_view k, std::string_view v) {
        if (k.size() > rollout_id.size() && k.substr(k.size() - rollout_id.size()) == rollout_id &&
            k[k.size() - rollout_id.size() - 1] == '-') {
          found = json::parse(v, nullptr, false);
          return false;
        }
        return true;
      });
  if (!s.ok()) return s;
  if (!found || found->is_discarded())
    return absl::NotFoundError(absl::StrCat("no rollout '", rollout_id, "'"));
  return *found;
}

absl::StatusOr<json> RolloutManager::Boards() const {
  json out = json::array();
  auto recent = List(50);
  for (const auto& d : Fleet()) {
    json b = {{"board", d.id}, {"kind", d.kind}, {"health", d.health}, {"tags", d.tags}};
    if (d.kind == "simulated") {
      auto slots = boards_.OtaSlots(BoardRef{d.id, "", false, ""});
      if (slots.ok()) {
        auto slot = [](const OtaSlotsInfo::Slot& s) {
          return json{{"has_image", s.has_image}, {"version", s.version},
                      {"hash", s.hash},           {"magic", s.magic},
                      {"image_ok", s.image_ok},   {"copy_done", s.copy_done}};
        };
        b["booted_from_slots"] = slots->booted_from_slots;
        b["primary"] = slot(slots->primary);
        b["secondary"] = slot(slots->secondary);
        if (slots->booted_from_slots) b["running"] = slots->primary.version;
      }
    } else if (auto rec = storage_.Get(Cf::kOta, kBoardPrefix + d.id);
               rec.ok() && rec->has_value()) {
      auto j = json::parse(**rec, nullptr, false);
      if (!j.is_discarded()) b["running"] = j.value("version", "");
    }
    if (recent.ok()) {
      for (const auto& r : *recent) {
        if (r.contains("boards") && r["boards"].contains(d.id)) {
          b["last_rollout"] = {{"id", r.value("id", "")},
                               {"version", r.value("version", "")},
                               {"state", r["boards"][d.id].value("state", "")},
                               {"rollout_state", r.value("state", "")}};
          break;
        }
      }
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace fwai
