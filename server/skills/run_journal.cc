#include "server/skills/run_journal.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "common/verdict.h"
#include "server/skills/runner.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

constexpr char kPrefix[] = "open-run/";

std::string Key(const std::string& run_id) { return kPrefix + run_id; }

}  // namespace

void RunJournal::Begin(const std::string& run_id, const nlohmann::json& record) {
  nlohmann::json r = record;
  r["journal_started_us"] = NowMicros();
  r["journal_updated_us"] = r["journal_started_us"];
  // Synced: a run that started must be found after a power cut too.
  if (auto s = storage_.Put(Cf::kMeta, Key(run_id), r.dump(), /*sync=*/true); !s.ok()) {
    spdlog::warn("run {}: cannot note it as running: {}", run_id, s.ToString());
  }
}

void RunJournal::Update(const std::string& run_id, const nlohmann::json& record) {
  auto old = storage_.Get(Cf::kMeta, Key(run_id));
  nlohmann::json r = record;
  if (old.ok() && *old) {
    auto prev = nlohmann::json::parse(**old, nullptr, false);
    if (prev.is_object()) r["journal_started_us"] = prev.value("journal_started_us", int64_t{0});
  }
  r["journal_updated_us"] = NowMicros();
  if (auto s = storage_.Put(Cf::kMeta, Key(run_id), r.dump(), /*sync=*/false); !s.ok()) {
    spdlog::warn("run {}: cannot note its progress: {}", run_id, s.ToString());
  }
}

void RunJournal::End(const std::string& run_id) {
  if (auto s = storage_.Delete(Cf::kMeta, Key(run_id), /*sync=*/false); !s.ok()) {
    spdlog::warn("run {}: cannot clear its running note: {}", run_id, s.ToString());
  }
}

absl::StatusOr<int> RunJournal::FinishInterrupted(
    const std::function<absl::StatusOr<uint64_t>(const nlohmann::json&)>& append) {
  std::vector<std::pair<std::string, std::string>> open;
  std::string end = kPrefix;
  end.back() += 1;
  RETURN_IF_ERROR(
      storage_.Scan(Cf::kMeta, kPrefix, end, [&](std::string_view k, std::string_view v) {
        open.emplace_back(std::string(k), std::string(v));
        return true;
      }));
  int n = 0;
  for (const auto& [key, value] : open) {
    auto rec = nlohmann::json::parse(value, nullptr, false);
    if (!rec.is_object()) rec = nlohmann::json::object();
    const int64_t started = rec.value("journal_started_us", int64_t{0});
    const int64_t updated = rec.value("journal_updated_us", started);
    rec.erase("journal_started_us");
    rec.erase("journal_updated_us");
    rec["kind"] = "skill_run";
    rec["run_id"] = key.substr(sizeof(kPrefix) - 1);
    rec["ok"] = false;
    rec["failure_class"] = "interrupted";
    rec["verdict"] = VerdictOfClass("interrupted", "");
    rec["exit_code"] = ExitCodeFor("interrupted");
    rec["error"] =
        "fwaid stopped while the run was in progress (it was killed or crashed); the steps listed "
        "are those that "
        "had finished";
    rec["duration_ms"] = started > 0 ? (updated - started) / 1000 : 0;
    rec["interrupted_noted_us"] = NowMicros();
    const std::string dir = rec.value("log_dir", "");
    std::error_code ec;
    if (!dir.empty() && std::filesystem::is_directory(dir, ec)) {
      std::ofstream(std::filesystem::path(dir) / "summary.json") << rec.dump(2) << '\n';
    }
    if (append) {
      auto idx = append(rec);
      if (!idx.ok()) return idx.status();  // keep the note: the next start tries again
    }
    RETURN_IF_ERROR(storage_.Delete(Cf::kMeta, key, /*sync=*/true));
    ++n;
  }
  return n;
}

}  // namespace fwai
