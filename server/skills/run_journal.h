// RunJournal: the skill runs in progress, kept in the database while they
// run, so a run cut by a crash (kill -9, power loss) is not lost: on the next
// start it gets its summary.json and evidence record with failure class
// "interrupted" (exit code 20), with the steps it had finished.
// Thread-safe.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace fwai {

class Storage;

class RunJournal {
 public:
  explicit RunJournal(Storage& storage) : storage_(storage) {}
  RunJournal(const RunJournal&) = delete;
  RunJournal& operator=(const RunJournal&) = delete;

  // `record` is the run's summary as known so far (kind, run_id, skill,
  // project, by, log_dir, steps...). Begin and Update overwrite it; End
  // forgets the run. Failures are logged, never fatal to the run.
  void Begin(const std::string& run_id, const nlohmann::json& record);
  void Update(const std::string& run_id, const nlohmann::json& record);
  void End(const std::string& run_id);

  // Ends every run a previous process left behind: writes its summary.json
  // (when its log directory still exists) and appends its record through
  // `append`. Returns how many.
  [[nodiscard]] absl::StatusOr<int> FinishInterrupted(
      const std::function<absl::StatusOr<uint64_t>(const nlohmann::json&)>& append);

 private:
  Storage& storage_;
};

}  // namespace fwai
