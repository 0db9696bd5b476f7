// checkpoints: a session's project files and boards' images as they were
// before each of its turns, so that the session can be rewound.
//
// Files: the project's tracked and untracked files less what .gitignore
// ignores (`git ls-files -co --exclude-standard`, run as the session's
// account; a project that is not a git work tree: every regular file, less
// .git), read as the session's account through ProjectFs: nothing outside
// the root is read or written. Symlinks, files larger than max_file_bytes,
// fault captures (.fwai/captures/), names that are not UTF-8 and what git
// ignored are not kept, and a rewind leaves them alone. Each file's bytes
// are an object named by its SHA-256 under DIR/objects (0600, written
// once): a checkpoint of an unchanged tree writes no object, and a file
// whose size, mtime and inode are as in the session's previous checkpoint
// (and older than it by two seconds) is not read again. A restored file
// gets its mode back; its time is the restore's, as with git checkout, so
// builds see it changed.
//
// Boards: each board the session flashed (NoteFlash), with the image's
// SHA-256; the image is an object while a checkpoint names it.
//
// Storage: Cf::kCheckpoints, "m/SESSION/SEQ" -> the checkpoint (JSON),
// "f/SESSION" -> {board: image sha256}. Limits: at most max_bytes of objects
// per project root; past it the project's oldest checkpoints go first (the
// newest is always kept), then every object no checkpoint names. What a
// project's checkpoints name is counted in memory from its last prune on,
// so a checkpoint reads the others' manifests only once that count is past
// the limit (and once per project after a start).
//
// Thread-safety: every method may be called from any thread. Checkpoints
// of different sessions are taken side by side; a prune or a drop runs
// alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace fwai {

class Storage;
struct LocalAccount;
struct HistoryEntry;

// The SHA-256 of a conversation's first `n` entries (roles and contents):
// what a checkpoint's history_sha is compared with.
std::string HistoryPrefixSha(const std::vector<HistoryEntry>& history, size_t n);

struct CheckpointFile {
  std::string sha256;
  uint32_t mode = 0644;  // permission bits
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t ino = 0;
};

struct Checkpoint {
  uint64_t seq = 0;  // 1, 2, ... within the session
  std::string session_id, turn_id, project_root;
  std::string reason;  // "turn", "skill build", ...
  int64_t time_us = 0;
  uint64_t history_len = 0;  // the conversation's entries before it
  std::map<std::string, CheckpointFile> files;
  std::vector<std::string> skipped;           // seen, not kept, with why (for people)
  std::vector<std::string> not_kept;          // the paths of those: a rewind leaves them alone
  bool git = false;                           // listed by git
  std::vector<std::string> ignored;           // what git ignored then ("dir/" for a directory)
  std::map<std::string, std::string> boards;  // board -> image sha256
  uint64_t bytes = 0;                         // the files' bytes
  std::string history_sha;                    // of the conversation's first history_len entries

  // `rel` was seen and not kept, or git ignored it: the checkpoint says
  // nothing of what it held.
  bool PassedOver(const std::string& rel) const;

  nlohmann::json ToJson() const;
  static absl::StatusOr<Checkpoint> FromJson(const nlohmann::json& j);
};

// One file a rewind changes.
struct FileChange {
  std::string path;
  std::string action;  // restore (changed since) | create (gone since) | delete (new since)
  std::string now_sha256, then_sha256;
};

struct CheckpointLimits {
  uint64_t max_bytes = uint64_t{2} << 30;  // of objects per project
  uint64_t max_file_bytes = 64 << 20;
};

class Checkpoints {
 public:
  Checkpoints(Storage& storage, std::string dir, CheckpointLimits limits);
  Checkpoints(const Checkpoints&) = delete;
  Checkpoints& operator=(const Checkpoints&) = delete;

  // Records the session's project (read as `account`, null: fwaid's own)
  // and the images of the boards it flashed.
  // `history_sha` identifies the conversation so far (a rewind cuts it back
  // only if it is still that). `prune` false: no checkpoint goes (one taken
  // in the middle of a rewind must not prune the one it goes back to).
  [[nodiscard]] absl::StatusOr<Checkpoint> Take(
      const std::string& session_id, const std::string& project_root, const LocalAccount* account,
      const std::string& turn_id, const std::string& reason, uint64_t history_len,
      const std::string& history_sha = "", bool prune = true) ABSL_LOCKS_EXCLUDED(gc_mu_);
  // The session flashed `image` (read as `account`; its bytes must still
  // hash to `sha256`) onto `board`: kept as an object, named by the
  // session's next checkpoints.
  [[nodiscard]] absl::Status NoteFlash(const std::string& session_id, const LocalAccount* account,
                                       const std::string& board, const std::string& image,
                                       const std::string& sha256) ABSL_LOCKS_EXCLUDED(gc_mu_);
  // The session's checkpoints, oldest first.
  [[nodiscard]] absl::StatusOr<std::vector<Checkpoint>> List(const std::string& session_id) const;
  // The checkpoint `to` names: its number, or a turn id (the checkpoint
  // before that turn), or "" (the latest). NOT_FOUND says which exist.
  [[nodiscard]] absl::StatusOr<Checkpoint> Find(const std::string& session_id,
                                                const std::string& to) const;
  // What restoring `c`'s files would change, by path.
  [[nodiscard]] absl::StatusOr<std::vector<FileChange>> Diff(const Checkpoint& c,
                                                             const LocalAccount* account) const;
  // Makes the project's files as `c` has them (`changes` from Diff), as
  // `account`: deletions first, deepest first, then writes. Every object,
  // and every directory on the way (none may now be a symlink), is checked
  // first: a refusal changes nothing.
  [[nodiscard]] absl::Status Restore(const Checkpoint& c, const std::vector<FileChange>& changes,
                                     const LocalAccount* account) const;
  // The bytes of object `sha256`, or NOT_FOUND.
  [[nodiscard]] absl::StatusOr<std::string> ReadObject(const std::string& sha256) const;
  // Forgets the session's checkpoints (and the objects only they named).
  [[nodiscard]] absl::Status DropSession(const std::string& session_id) ABSL_LOCKS_EXCLUDED(gc_mu_);

 private:
  // Take without the prune: lists and reads the files, writes the objects
  // and the manifest, holding the session's lock and gc_mu_ shared.
  absl::StatusOr<Checkpoint> Record(const std::string& session_id, const std::string& project_root,
                                    const LocalAccount* account, const std::string& turn_id,
                                    const std::string& reason, uint64_t history_len,
                                    const std::string& history_sha) ABSL_LOCKS_EXCLUDED(gc_mu_);
  std::string ObjectPath(const std::string& sha256) const;
  absl::Status PutObject(const std::string& sha256, const std::string& bytes) const;
  absl::Status PruneProject(const std::string& root) ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);
  absl::Status CollectGarbage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);

  Storage& storage_;
  const std::string dir_;
  const CheckpointLimits limits_;
  // The session's lock: one Take or NoteFlash of a session at a time (its
  // next seq, its flashed images). Made on first use, dropped with the session.
  std::shared_ptr<Mutex> SessionLock(const std::string& session_id) ABSL_LOCKS_EXCLUDED(map_mu_);
  // True when the project's objects, with `c`'s added, are within max_bytes
  // as far as known since its last prune (so no prune is needed); false when
  // past it or not yet known.
  bool WithinLimit(const Checkpoint& c) ABSL_LOCKS_EXCLUDED(usage_mu_);

  // Takes and NoteFlashes of different sessions run side by side holding it
  // shared; a prune or a drop holds it alone, so an object a Take has
  // written but no manifest names yet is never collected.
  SharedMutex gc_mu_;
  Mutex map_mu_;
  std::map<std::string, std::shared_ptr<Mutex>> session_mu_ ABSL_GUARDED_BY(map_mu_);
  // Per project root: the objects its checkpoints name, by SHA-256 with
  // their sizes, as of its last prune plus the checkpoints taken since (a
  // checkpoint dropped since leaves them counted: the next prune corrects it).
  struct Usage {
    std::map<std::string, uint64_t> objects;
    uint64_t bytes = 0;
    bool known = false;
  };
  Mutex usage_mu_;  // after gc_mu_
  std::map<std::string, Usage> usage_ ABSL_GUARDED_BY(usage_mu_);
};

}  // namespace fwai
