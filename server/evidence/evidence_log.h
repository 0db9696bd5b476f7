// The evidence log: every run record is stored as the exact bytes that were
// hashed, chained to the one before, and a leaf of an RFC 6962 Merkle tree.
// Checkpoints (tree size, root, chain, time) are signed with the daemon's
// Ed25519 key. Writes are synced (records appended at once share one sync,
// outside the log's lock; an append returns once its record is durable); a
// failed write or sync stops the log (fail-stop). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/evidence/merkle.h"

namespace fwai {

class Storage;

struct EvidenceRecord {
  uint64_t index = 0;
  std::string run_id;
  std::string bytes;  // exactly what was hashed
  Hash leaf{};
};

struct EvidenceVerifyReport {
  bool ok = true;
  uint64_t records = 0;
  uint64_t checkpoints = 0;
  std::string first_bad;  // "record 12" / "checkpoint 100"
  std::string detail;
};

class EvidenceLog {
 public:
  // `key_path`: the Ed25519 private key (PEM), created with mode 0600 if missing.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EvidenceLog>> Open(
      Storage& storage, const std::string& key_path, int checkpoint_every);
  ~EvidenceLog();

  // Appends `record` (an object; index, run_id, time_us and prev are added).
  [[nodiscard]] absl::StatusOr<EvidenceRecord> Append(nlohmann::json record);
  // Signs a checkpoint of the current tree (no-op when nothing is new).
  [[nodiscard]] absl::Status Checkpoint();
  [[nodiscard]] absl::StatusOr<std::vector<EvidenceRecord>> List(size_t limit);
  [[nodiscard]] absl::StatusOr<EvidenceRecord> Get(const std::string& run_id);
  // The newest record whose bytes contain every string of `contains` and
  // that `match` accepts (parsed); null if none.
  [[nodiscard]] absl::StatusOr<nlohmann::json> FindLatest(
      const std::vector<std::string>& contains,
      const std::function<bool(const nlohmann::json&)>& match);
  EvidenceVerifyReport Verify();
  std::string public_key_hex() const;
  // The RFC 6962 tree head over every record (hex).
  std::string root_hex() const;
  // An Ed25519 signature (64 bytes) of `message` with the log's key.
  [[nodiscard]] absl::StatusOr<std::string> Sign(std::string_view message) const;
  uint64_t size() const;

  // For tests: makes the next writes fail as a full disk would.
  void FailWritesForTest(bool fail);

  struct Rep;

 private:
  explicit EvidenceLog(std::unique_ptr<Rep> rep);
  // Append's ordered part, under the log's lock: the record chained and
  // written (not yet synced); `ticket` is what Storage::SyncThrough waits
  // for.
  absl::StatusOr<EvidenceRecord> AppendUnsynced(nlohmann::json record, uint64_t* ticket);
  std::unique_ptr<Rep> rep_;
};

}  // namespace fwai
