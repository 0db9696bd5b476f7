// storage: the RocksDB handle and its column families. The record of truth for
// sessions, events, history and (later) documents, tools, evidence and leases.
// Thread-safe: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rocksdb {
class Env;
}

namespace fwai {

enum class Cf : int {
  kMeta = 0,
  kSessions,
  kEvents,
  kHistory,
  kDocuments,
  kChunks,
  kTools,
  kEvidence,
  kLeases,
  kOta,
  kRetrieval,    // the knowledge base's search log and its feedback
  kCheckpoints,  // sessions' checkpoints (server/session/checkpoints.h)
  kCount,
};

// A set of writes applied atomically by Storage::Write.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(const WriteBatch&) = delete;
  WriteBatch& operator=(const WriteBatch&) = delete;
  void Put(Cf cf, std::string_view key, std::string_view value);
  void Delete(Cf cf, std::string_view key);
  // Deletes keys in [begin, end).
  void DeleteRange(Cf cf, std::string_view begin, std::string_view end);

 private:
  friend class Storage;
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

struct StorageOptions {
  // The environment (file system) RocksDB uses; null for the default. Tests
  // pass one whose log syncs they can hold.
  rocksdb::Env* env = nullptr;
};

class Storage {
 public:
  // Opens (creating if needed) the database under `dir`. Fails with a clear
  // message if another process holds it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Storage>> Open(const std::string& dir);
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Storage>> Open(const std::string& dir,
                                                                     const StorageOptions& options);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // `sync` makes the write durable against power loss before returning. The
  // disk is waited for outside RocksDB's write queue: the write goes to the
  // log unsynced, then the log is synced (DB::SyncWAL, which does not hold
  // the queue), so the unsynced writers queued meanwhile (the sessions' event
  // appends) never wait for an fsync, neither their own writer group's nor
  // one a synced writer would wait for at the head of the queue. Synced
  // writers that overlap share one log sync (group commit). Unlike RocksDB's
  // own synced write, readers may see the write a moment before it is
  // durable; the caller is answered only once it is.
  [[nodiscard]] absl::Status Put(Cf cf, std::string_view key, std::string_view value, bool sync);
  [[nodiscard]] absl::Status Delete(Cf cf, std::string_view key, bool sync);
  [[nodiscard]] absl::Status Write(WriteBatch& batch, bool sync);
  // Write(batch, true).
  [[nodiscard]] absl::Status WriteThenSync(WriteBatch& batch);
  // Write(batch, true) in two steps, for a caller that orders its writes
  // under a lock of its own and waits for the disk outside it: the write
  // (unsynced), which returns a ticket, then SyncThrough(ticket), which
  // returns once the write is durable (overlapping callers share one sync).
  // Once a sync has failed, every sync asked for a later write fails with
  // that error: a later fsync cannot vouch for what the failed one dropped.
  [[nodiscard]] absl::StatusOr<uint64_t> WriteForSync(WriteBatch& batch);
  [[nodiscard]] absl::Status SyncThrough(uint64_t ticket);
  // NotFound is reported as an empty optional, not an error.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> Get(Cf cf, std::string_view key);
  // Get() of many keys of one column family in one batched read (RocksDB
  // MultiGet: the blocks they share are read once); results in the order of
  // `keys`, absent keys as empty optionals.
  [[nodiscard]] absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      Cf cf, const std::vector<std::string>& keys);

  // Calls `fn` for keys in [begin, end) in order (end empty = no upper bound)
  // until it returns false.
  [[nodiscard]] absl::Status Scan(
      Cf cf, std::string_view begin, std::string_view end,
      const std::function<bool(std::string_view key, std::string_view value)>& fn);
  // Last key in [begin, end), if any.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> LastKey(Cf cf, std::string_view begin,
                                                                   std::string_view end);

  // Syncs the write-ahead log: everything written so far survives a power cut.
  [[nodiscard]] absl::Status SyncWal();
  const std::string& dir() const { return dir_; }

 private:
  struct Rep;
  Storage(std::string dir, std::unique_ptr<Rep> rep);
  // The number of the write that just reached the log, for SyncThrough: the
  // log is synced unless a sync that began after it has completed.
  uint64_t Ticket();
  const std::string dir_;
  std::unique_ptr<Rep> rep_;
};

// Key encoding helpers: fixed-width big-endian integers sort numerically.
std::string EncodeU64(uint64_t v);
uint64_t DecodeU64(std::string_view s);
// `prefix` + '\0' + big-endian `n`: per-owner sequences (events, history).
std::string SeqKey(std::string_view prefix, uint64_t n);
// The smallest key after every SeqKey(prefix, *).
std::string SeqKeyEnd(std::string_view prefix);

}  // namespace fwai
