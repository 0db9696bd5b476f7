// ota: rollouts of an MCUboot image over a fleet of boards, in stages.
//
// Each board of a stage gets the image in its secondary slot marked for a
// test boot, is restarted through its bootloader, and runs the health skill:
// a pass confirms the image (image_ok), a fail restarts the board without
// confirming, so its bootloader reverts to the previous image. A stage whose
// failure rate passes the threshold stops the rollout and takes every board
// it updated back to its previous image; boards of later stages never see
// it. A downgrade is refused unless forced. Physical boards are refused
// until the same image (its SHA-256 TLV) has passed a whole rollout on
// simulated ones. Every state change is an evidence record; the rollout's
// state is kept in the database.
//
// Thread-safe; each Run() works on its own thread.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancel.h"
#include "common/config.h"
#include "server/boards/boards.h"
#include "server/boards/leases.h"

namespace fwai {

class Storage;
class SkillRunner;

struct RolloutRequest {
  std::string image_path;
  // Board ids select those boards; tags select the boards carrying all of them.
  std::vector<std::string> boards;
  std::vector<std::string> stages;  // cumulative: "1", "25%", "100%"
  std::string health_skill;         // "" : the boot line alone decides
  std::string project_root;         // where the health skill is found
  double max_failure_rate = -1;     // < 0: ota.max_failure_rate
  bool force = false;               // allow a downgrade
  Caller caller;
};

struct RolloutEvent {
  std::string kind;   // rollout_started | stage_started | board | stage_finished | rollout_finished
  std::string board;  // for board events
  std::string state;  // board: staging | testing | healthy | confirmed | reverting | reverted |
                      // failed | skipped | rolled_back
  std::string text;
  nlohmann::json data;  // the record written to the evidence log
};

struct RolloutResult {
  std::string rollout_id;
  std::string state;  // completed | stopped | refused | cancelled | failed
  std::string error;
  nlohmann::json summary;
};

class RolloutManager {
 public:
  using AppendEvidence = std::function<absl::StatusOr<uint64_t>(const nlohmann::json&)>;
  // Rollouts update this node's boards, through the board contract.
  RolloutManager(::fwai::Boards& boards, BoardLeases& leases, SkillRunner* skills, Storage& storage,
                 AppendEvidence append, OtaConfig config);

  // Marks rollouts a previous daemon left running as interrupted (their
  // boards revert on their own at the next power-on: nothing was confirmed).
  [[nodiscard]] absl::Status Start();

  // Never throws; every failure is in the result and the events.
  RolloutResult Run(const RolloutRequest& request,
                    const std::function<void(const RolloutEvent&)>& emit, CancelToken& cancel);

  // Recent rollouts, newest first.
  [[nodiscard]] absl::StatusOr<std::vector<nlohmann::json>> List(size_t limit) const;
  [[nodiscard]] absl::StatusOr<nlohmann::json> Get(const std::string& rollout_id) const;
  // Every board: what runs, what its slots hold, its last rollout.
  [[nodiscard]] absl::StatusOr<nlohmann::json> Boards() const;

 private:
  struct Run_;
  // This node's boards that can take an update (simulated ones and
  // declared boards).
  std::vector<DeviceInfo> Fleet() const;

  ::fwai::Boards& boards_;
  BoardLeases& leases_;
  SkillRunner* skills_;
  Storage& storage_;
  const AppendEvidence append_;
  const OtaConfig config_;
  std::vector<std::string> key_pems_;
};

// "1,25%,100%" over `total` boards -> cumulative counts (stages adding no
// board dropped). INVALID_ARGUMENT names the bad stage.
[[nodiscard]] absl::StatusOr<std::vector<size_t>> StageCounts(
    const std::vector<std::string>& stages, size_t total);

}  // namespace fwai
