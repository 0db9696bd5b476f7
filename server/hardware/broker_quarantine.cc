// HardwareBroker: counting a board's `lab` failures, and its quarantine.

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/verdict.h"
#include "server/hardware/broker.h"
#include "server/hardware/broker_internal.h"
#include "server/storage/storage.h"

namespace fwai {

using broker_internal::kQuarantinePrefix;

namespace {

constexpr char kQuarantined[] = "quarantined";

std::string QuarantineReason(const std::string& board, size_t failures,
                             const nlohmann::json& last) {
  return absl::StrCat(failures, " lab failure", failures == 1 ? "" : "s",
                      " in a row, the last: ", last.value("what", ""), ": ",
                      last.value("error", ""), " (an admin returns it: fwai hw health ", board,
                      " good)");
}

}  // namespace

void HardwareBroker::CountOutcome(const std::string& board, const absl::Status& outcome,
                                  const std::string& what) {
  Board* b = FindBoard(board);
  if (!b) return;
  const std::string verdict = VerdictOf(outcome);
  nlohmann::json rec;
  {
    MutexLock lock(&b->state_mu);
    if (outcome.ok() || verdict == kVerdictFirmware) {
      b->lab_failures.clear();
      return;
    }
    if (verdict != kVerdictLab) return;
    b->lab_failures.push_back({{"what", what},
                               {"error", std::string(outcome.message()).substr(0, 500)},
                               {"time_us", NowMicros()}});
    const int after = config_.quarantine_after;
    if (after <= 0 || b->lab_failures.size() < static_cast<size_t>(after) ||
        b->health == kQuarantined) {
      return;
    }
    rec = {{"kind", "board_quarantined"},
           {"board", board},
           {"after", after},
           {"failures", b->lab_failures},
           {"reason", QuarantineReason(board, b->lab_failures.size(), b->lab_failures.back())}};
    b->health = kQuarantined;
    b->health_reason = rec["reason"];
    b->admin_health = true;
    b->lab_failures.clear();
  }
  spdlog::warn("board {} is quarantined: {}", board, rec.value("reason", ""));
  if (auto s = storage_.Put(Cf::kLeases, kQuarantinePrefix + board, rec.dump(), true); !s.ok())
    spdlog::error("board {}: the quarantine is not kept: {}", board, s.ToString());
  if (auto recorder = Recorder()) recorder(rec);
}

void HardwareBroker::LoadQuarantine(Board& b) {
  auto kept = storage_.Get(Cf::kLeases, kQuarantinePrefix + b.cfg.id);
  if (!kept.ok() || !kept->has_value()) return;
  auto j = nlohmann::json::parse(**kept, nullptr, false);
  const std::string reason = j.is_object() ? j.value("reason", "") : "quarantined before a restart";
  b.SetHealth(kQuarantined, reason, /*admin=*/true);
}

void HardwareBroker::AdminHealthChanged(Board& b, const std::string& was, const std::string& health,
                                        const std::string& reason, const Caller& caller) {
  {
    MutexLock lock(&b.state_mu);
    b.lab_failures.clear();
  }
  // (The change itself is recorded by whoever asked for it: the API's audit.)
  absl::Status kept;
  if (health == kQuarantined) {
    const nlohmann::json rec = {{"board", b.cfg.id}, {"reason", reason}, {"by", caller.display}};
    kept = storage_.Put(Cf::kLeases, kQuarantinePrefix + b.cfg.id, rec.dump(), true);
  } else if (was == kQuarantined) {
    kept = storage_.Delete(Cf::kLeases, kQuarantinePrefix + b.cfg.id, true);
  }
  if (!kept.ok()) spdlog::error("board {}: {}", b.cfg.id, kept.ToString());
}

}  // namespace fwai
