#include "server/session/checkpoints.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "server/hardware/firmware_image.h"
#include "server/session/session_manager.h"
#include "server/storage/storage.h"
#include "server/tools/project_fs.h"

namespace fwai {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ManifestPrefix(const std::string& session) { return absl::StrCat("m/", session, "/"); }
std::string ManifestKey(const std::string& session, uint64_t seq) {
  return absl::StrFormat("m/%s/%016d", session, seq);
}
std::string FlashedKey(const std::string& session) { return absl::StrCat("f/", session); }
// The first key after every key that starts with `prefix`.
std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

// Never kept, never touched by a rewind: git's own, and fwai's records of
// what happened (fault captures, the runs' tool logs), which a rewind must
// not erase.
bool Excluded(const std::string& rel) {
  return rel == ".git" || absl::StartsWith(rel, ".git/") ||
         absl::StartsWith(rel, ".fwai/captures/") || absl::StartsWith(rel, ".fwai/runs/");
}

// True when `s` is well-formed UTF-8 (JSON and protobuf strings must be).
bool IsUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c == 0xe0) lo = 0xa0;  // no overlong forms
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (i + n >= s.size() && n > 0) return false;  // cut short
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (d < lo || d > hi) : (d & 0xc0) != 0x80) return false;
    }
    i += n + 1;
  }
  return true;
}

// The account's file identity while alive (none for a null account).
class AsAccount {
 public:
  explicit AsAccount(const LocalAccount* account) {
    if (account) as_.emplace(*account);
  }
  absl::Status status() const { return as_ ? as_->status() : absl::OkStatus(); }

 private:
  std::optional<ScopedFsIdentity> as_;
};

// The project's files by relative path, as the account sees them: git's
// tracked and untracked files less the ignored ones (and what git ignores,
// directories collapsed), or, outside a git work tree, every regular file.
// Names that are not UTF-8 are set apart: they are never kept or touched.
struct Listing {
  bool git = false;
  std::vector<std::string> names;
  std::vector<std::string> ignored;  // "build/" for a directory
  std::vector<std::string> odd;      // names that are not UTF-8, C-escaped
};

std::vector<std::string> SplitNul(const std::string& out) {
  std::vector<std::string> v;
  for (absl::string_view n : absl::StrSplit(out, '\0', absl::SkipEmpty())) v.emplace_back(n);
  return v;
}

// False only when git cannot call `root` a work tree: no `.git` in it or
// any directory above it, and no GIT_DIR or GIT_WORK_TREE pointing
// elsewhere. Spares starting git for each checkpoint of such a project.
bool MayBeInGit(const std::string& root) {
  if (std::getenv("GIT_DIR") || std::getenv("GIT_WORK_TREE")) return true;
  std::error_code ec;
  for (fs::path p = root;; p = p.parent_path()) {
    // not_found comes with ec set: only another type, or another error, counts.
    const fs::file_status st = fs::symlink_status(p / ".git", ec);
    if (st.type() != fs::file_type::not_found) return true;  // there, or cannot tell
    if (p == p.parent_path()) return false;
  }
}

absl::StatusOr<Listing> ProjectFiles(const std::string& root, const LocalAccount* account) {
  ProcessOptions o;
  o.cwd = root;
  o.timeout_ms = 60000;
  if (account && account->uid != getuid()) o.run_as = account;
  Listing l;
  if (MayBeInGit(root)) {
    auto inside = RunProcess({"git", "rev-parse", "--is-inside-work-tree"}, o);
    l.git = inside.ok() && inside->exit_code == 0 && absl::StartsWith(inside->out, "true");
  }
  if (l.git) {
    auto git = RunProcess(
        {"git", "-c", "core.quotePath=off", "ls-files", "-co", "--exclude-standard", "-z"}, o);
    auto ign = RunProcess({"git", "-c", "core.quotePath=off", "ls-files", "-oi",
                           "--exclude-standard", "--directory", "-z"},
                          o);
    if (!git.ok() || git->exit_code != 0 || !ign.ok() || ign->exit_code != 0) {
      return absl::UnavailableError(absl::StrCat(
          "git ls-files in ", root, " failed: ",
          git.ok() ? (ign.ok() ? ign->err : std::string(ign.status().message())) + git->err
                   : std::string(git.status().message())));
    }
    l.names = SplitNul(git->out);
    l.ignored = SplitNul(ign->out);
  } else {
    AsAccount as(account);
    RETURN_IF_ERROR(as.status());
    ASSIGN_OR_RETURN(auto pfs, ProjectFs::Open(root));
    pfs.Walk(
        ".", nullptr, [](const std::string& dir) { return dir == ".git"; },
        [&](const std::string& rel) {
          l.names.push_back(rel);
          return true;
        });
  }
  std::vector<std::string> kept;
  for (auto& n : l.names) {
    if (Excluded(n)) continue;
    if (!IsUtf8(n)) {
      l.odd.push_back(absl::CHexEscape(n));
      continue;
    }
    kept.push_back(std::move(n));
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  l.names = std::move(kept);
  return l;
}

// True when `rel` was ignored (or under an ignored directory) by git then.
bool UnderIgnored(const std::string& rel, const std::vector<std::string>& ignored) {
  for (const auto& i : ignored) {
    if (rel == i || (!i.empty() && i.back() == '/' && absl::StartsWith(rel, i))) return true;
  }
  return false;
}

// One file as it is now: its stat, and its bytes unless `before` shows it
// unchanged (then only its hash, from `before`).
struct Seen {
  CheckpointFile file;
  std::string bytes;
  bool read = false;
};

absl::StatusOr<Seen> SeeFile(const ProjectFs& pfs, const std::string& rel,
                             const CheckpointFile* before, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(UniqueFd fd, pfs.OpenAt(rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return absl::InternalError(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError("not a regular file");
  Seen s;
  s.file.mode = st.st_mode & 07777;
  s.file.size = static_cast<uint64_t>(st.st_size);
  s.file.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  s.file.ino = st.st_ino;
  if (before && before->size == s.file.size && before->mtime_ns == s.file.mtime_ns &&
      before->ino == s.file.ino) {
    s.file.sha256 = before->sha256;
    return s;
  }
  if (s.file.size > max_bytes)
    return absl::FailedPreconditionError(absl::StrCat("larger than ", max_bytes, " bytes"));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(std::strerror(errno));
    if (n == 0) break;
    s.bytes.append(buf, static_cast<size_t>(n));
    if (s.bytes.size() > max_bytes)
      return absl::FailedPreconditionError(absl::StrCat("larger than ", max_bytes, " bytes"));
  }
  s.file.sha256 = BytesSha256Hex(s.bytes);
  s.read = true;
  return s;
}

// The whole file at `path` (any path), as the account.
absl::StatusOr<std::string> ReadAs(const std::string& path, const LocalAccount* account,
                                   uint64_t max_bytes) {
  UniqueFd fd;
  {
    AsAccount as(account);
    RETURN_IF_ERROR(as.status());
    fd = UniqueFd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  }
  if (fd.get() < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat(path, ": ", std::strerror(errno)));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes)
      return absl::FailedPreconditionError(absl::StrCat(path, " is larger than ", max_bytes));
  }
  return out;
}

}  // namespace

std::string HistoryPrefixSha(const std::vector<HistoryEntry>& history, size_t n) {
  std::string all;
  for (size_t i = 0; i < n && i < history.size(); ++i) {
    absl::StrAppend(&all, history[i].role.size(), ":", history[i].role,
                    history[i].content_json.size(), ":", history[i].content_json);
  }
  return BytesSha256Hex(all);
}

json Checkpoint::ToJson() const {
  json f = json::object();
  for (const auto& [path, e] : files) {
    f[path] = {{"sha256", e.sha256},
               {"mode", e.mode},
               {"size", e.size},
               {"mtime_ns", e.mtime_ns},
               {"ino", e.ino}};
  }
  return {{"seq", seq},
          {"session_id", session_id},
          {"turn_id", turn_id},
          {"reason", reason},
          {"project_root", project_root},
          {"time_us", time_us},
          {"history_len", history_len},
          {"files", f},
          {"skipped", skipped},
          {"not_kept", not_kept},
          {"git", git},
          {"ignored", ignored},
          {"boards", boards},
          {"bytes", bytes},
          {"history_sha", history_sha}};
}

absl::StatusOr<Checkpoint> Checkpoint::FromJson(const json& j) {
  if (!j.is_object()) return absl::DataLossError("a checkpoint that is not a JSON object");
  Checkpoint c;
  try {
    c.seq = j.value("seq", uint64_t{0});
    c.session_id = j.value("session_id", "");
    c.turn_id = j.value("turn_id", "");
    c.reason = j.value("reason", "");
    c.project_root = j.value("project_root", "");
    c.time_us = j.value("time_us", int64_t{0});
    c.history_len = j.value("history_len", uint64_t{0});
    c.bytes = j.value("bytes", uint64_t{0});
    const json files = j.value("files", json::object());
    for (const auto& [path, e] : files.items()) {
      c.files[path] = {e.value("sha256", ""), e.value("mode", 0644u), e.value("size", uint64_t{0}),
                       e.value("mtime_ns", int64_t{0}), e.value("ino", uint64_t{0})};
    }
    c.skipped = j.value("skipped", std::vector<std::string>{});
    c.not_kept = j.value("not_kept", std::vector<std::string>{});
    c.git = j.value("git", false);
    c.ignored = j.value("ignored", std::vector<std::string>{});
    c.history_sha = j.value("history_sha", "");
    c.boards = j.value("boards", std::map<std::string, std::string>{});
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("a checkpoint's record: ", e.what()));
  }
  return c;
}

Checkpoints::Checkpoints(Storage& storage, std::string dir, CheckpointLimits limits)
    : storage_(storage), dir_(std::move(dir)), limits_(limits) {}

std::string Checkpoints::ObjectPath(const std::string& sha256) const {
  return absl::StrCat(dir_, "/objects/", sha256.substr(0, 2), "/", sha256);
}

absl::Status Checkpoints::PutObject(const std::string& sha256, const std::string& bytes) const {
  const std::string path = ObjectPath(sha256);
  std::error_code ec;
  if (fs::exists(path, ec)) return absl::OkStatus();  // content-addressed: already there
  RETURN_IF_ERROR(MakeDirs(fs::path(path).parent_path().string(), 0700));
  return WriteFileAtomic(path, bytes, 0600);
}

absl::StatusOr<std::string> Checkpoints::ReadObject(const std::string& sha256) const {
  if (sha256.size() != 64) return absl::NotFoundError(absl::StrCat("no object '", sha256, "'"));
  auto bytes = ReadAs(ObjectPath(sha256), nullptr, uint64_t{1} << 34);
  if (!bytes.ok()) return absl::NotFoundError(absl::StrCat("object ", sha256, " is gone"));
  if (BytesSha256Hex(*bytes) != sha256)
    return absl::DataLossError(absl::StrCat("object ", sha256, " does not hash to its name"));
  return bytes;
}

absl::StatusOr<Checkpoint> Checkpoints::Take(const std::string& session_id,
                                             const std::string& project_root,
                                             const LocalAccount* account,
                                             const std::string& turn_id, const std::string& reason,
                                             uint64_t history_len, const std::string& history_sha,
                                             bool prune) {
  ASSIGN_OR_RETURN(Checkpoint c, Record(session_id, project_root, account, turn_id, reason,
                                        history_len, history_sha));
  const bool within = WithinLimit(c);  // counts c's objects, pruning or not
  if (prune && !within) {
    WriterMutexLock alone(&gc_mu_);
    RETURN_IF_ERROR(PruneProject(project_root));
  }
  return c;
}

bool Checkpoints::WithinLimit(const Checkpoint& c) {
  MutexLock lock(&usage_mu_);
  Usage& u = usage_[c.project_root];
  if (!u.known) return false;
  std::error_code ec;
  auto add = [&](const std::string& sha, uint64_t size) {
    if (u.objects.emplace(sha, size).second) u.bytes += size;
  };
  for (const auto& [path, f] : c.files) add(f.sha256, f.size);
  for (const auto& [board, sha] : c.boards) {
    const auto n = fs::file_size(ObjectPath(sha), ec);
    add(sha, ec ? 0 : n);
  }
  return u.bytes <= limits_.max_bytes;
}

std::shared_ptr<Mutex> Checkpoints::SessionLock(const std::string& session_id) {
  MutexLock lock(&map_mu_);
  auto& slot = session_mu_[session_id];
  if (!slot) slot = std::make_shared<Mutex>();
  return slot;
}

absl::StatusOr<Checkpoint> Checkpoints::Record(const std::string& session_id,
                                               const std::string& project_root,
                                               const LocalAccount* account,
                                               const std::string& turn_id,
                                               const std::string& reason, uint64_t history_len,
                                               const std::string& history_sha) {
  const std::shared_ptr<Mutex> session_mu = SessionLock(session_id);
  MutexLock one(session_mu.get());
  ReaderMutexLock shared(&gc_mu_);
  ASSIGN_OR_RETURN(auto before, List(session_id));
  Checkpoint c;
  c.seq = before.empty() ? 1 : before.back().seq + 1;
  c.session_id = session_id;
  c.turn_id = turn_id;
  c.reason = reason;
  c.project_root = project_root;
  c.time_us = NowMicros();
  c.history_len = history_len;
  c.history_sha = history_sha;
  const Checkpoint* prev = before.empty() ? nullptr : &before.back();
  // A file changed within two seconds before the previous checkpoint may
  // have changed again within the same mtime tick: read it again.
  const int64_t trusted_before_ns = prev ? (prev->time_us - 2000000) * 1000 : 0;
  ASSIGN_OR_RETURN(Listing listing, ProjectFiles(project_root, account));
  c.git = listing.git;
  c.ignored = std::move(listing.ignored);
  for (const auto& odd : listing.odd)
    c.skipped.push_back(absl::StrCat(odd, ": a name that is not UTF-8"));
  std::optional<ProjectFs> pfs;
  {
    AsAccount as(account);
    RETURN_IF_ERROR(as.status());
    ASSIGN_OR_RETURN(auto opened, ProjectFs::Open(project_root));
    pfs.emplace(std::move(opened));
  }
  std::error_code ec;
  for (const std::string& rel : listing.names) {
    const CheckpointFile* was = nullptr;
    if (prev) {
      auto it = prev->files.find(rel);
      if (it != prev->files.end() && it->second.mtime_ns < trusted_before_ns &&
          fs::exists(ObjectPath(it->second.sha256), ec))
        was = &it->second;
    }
    absl::StatusOr<Seen> seen;
    {
      AsAccount as(account);
      RETURN_IF_ERROR(as.status());
      seen = SeeFile(*pfs, rel, was, limits_.max_file_bytes);
    }
    if (!seen.ok()) {
      if (!absl::IsNotFound(seen.status())) {  // a tracked file deleted is simply not there
        c.skipped.push_back(absl::StrCat(rel, ": ", seen.status().message()));
        c.not_kept.push_back(rel);
      }
      continue;
    }
    if (seen->read) RETURN_IF_ERROR(PutObject(seen->file.sha256, seen->bytes));
    c.bytes += seen->file.size;
    c.files[rel] = seen->file;
  }
  ASSIGN_OR_RETURN(auto flashed, storage_.Get(Cf::kCheckpoints, FlashedKey(session_id)));
  if (flashed) {
    const json j = json::parse(*flashed, nullptr, false);
    if (j.is_object())
      for (const auto& [board, sha] : j.items()) c.boards[board] = sha.get<std::string>();
  }
  std::string record;
  try {
    record = c.ToJson().dump();
  } catch (const json::exception& e) {  // every name was checked; this is a bug, not a crash
    return absl::InternalError(absl::StrCat("a checkpoint's record: ", e.what()));
  }
  // Written as the session's events are, without waiting for the disk: it
  // outlives a killed fwaid; a power cut may lose the last ones (the objects
  // are synced, and collected once nothing names them).
  RETURN_IF_ERROR(storage_.Put(Cf::kCheckpoints, ManifestKey(session_id, c.seq), record,
                               /*sync=*/false));
  return c;
}

absl::Status Checkpoints::NoteFlash(const std::string& session_id, const LocalAccount* account,
                                    const std::string& board, const std::string& image,
                                    const std::string& sha256) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadAs(image, account, limits_.max_file_bytes));
  const std::string sha = BytesSha256Hex(bytes);
  if (sha != sha256) {
    return absl::FailedPreconditionError(absl::StrCat(image, " changed after it was flashed (",
                                                      sha.substr(0, 12), ", flashed ",
                                                      sha256.substr(0, 12), "): not kept"));
  }
  const std::shared_ptr<Mutex> session_mu = SessionLock(session_id);
  MutexLock one(session_mu.get());
  ReaderMutexLock shared(&gc_mu_);
  RETURN_IF_ERROR(PutObject(sha, bytes));
  ASSIGN_OR_RETURN(auto was, storage_.Get(Cf::kCheckpoints, FlashedKey(session_id)));
  json j = was ? json::parse(*was, nullptr, false) : json::object();
  if (!j.is_object()) j = json::object();
  j[board] = sha;
  return storage_.Put(Cf::kCheckpoints, FlashedKey(session_id), j.dump(), /*sync=*/true);
}

absl::StatusOr<std::vector<Checkpoint>> Checkpoints::List(const std::string& session_id) const {
  std::vector<Checkpoint> out;
  absl::Status bad;
  const std::string prefix = ManifestPrefix(session_id);
  RETURN_IF_ERROR(storage_.Scan(Cf::kCheckpoints, prefix, PrefixEnd(prefix),
                                [&](std::string_view, std::string_view v) {
                                  auto c = Checkpoint::FromJson(json::parse(v, nullptr, false));
                                  if (!c.ok()) {
                                    bad = c.status();
                                    return false;
                                  }
                                  out.push_back(*std::move(c));
                                  return true;
                                }));
  RETURN_IF_ERROR(bad);
  return out;
}

absl::StatusOr<Checkpoint> Checkpoints::Find(const std::string& session_id,
                                             const std::string& to) const {
  ASSIGN_OR_RETURN(auto all, List(session_id));
  if (all.empty())
    return absl::NotFoundError(absl::StrCat("session ", session_id, " has no checkpoints"));
  if (to.empty()) return all.back();
  uint64_t seq = 0;
  const bool by_number = absl::SimpleAtoi(to, &seq);
  for (const auto& c : all) {
    if (by_number ? c.seq == seq : c.turn_id == to) return c;
  }
  return absl::NotFoundError(absl::StrCat("session ", session_id, " has no checkpoint '", to,
                                          "': it has ", all.front().seq, " to ", all.back().seq,
                                          " (fwai rewind ", session_id, " --list)"));
}

bool Checkpoint::PassedOver(const std::string& rel) const {
  return std::find(not_kept.begin(), not_kept.end(), rel) != not_kept.end() ||
         UnderIgnored(rel, ignored);
}

absl::StatusOr<std::vector<FileChange>> Checkpoints::Diff(const Checkpoint& c,
                                                          const LocalAccount* account) const {
  ASSIGN_OR_RETURN(Listing listing, ProjectFiles(c.project_root, account));
  AsAccount as(account);
  RETURN_IF_ERROR(as.status());
  ASSIGN_OR_RETURN(auto pfs, ProjectFs::Open(c.project_root));
  const std::set<std::string> not_kept(c.not_kept.begin(), c.not_kept.end());
  std::vector<FileChange> out;
  std::set<std::string> now;
  for (const std::string& rel : listing.names) {
    auto it = c.files.find(rel);
    auto seen =
        SeeFile(pfs, rel, it == c.files.end() ? nullptr : &it->second, limits_.max_file_bytes);
    if (!seen.ok()) continue;  // not a file it keeps (a symlink, too large): left alone
    now.insert(rel);
    if (it == c.files.end()) {
      // New since, unless it was there and not kept, or ignored then: left alone.
      if (not_kept.count(rel) || UnderIgnored(rel, c.ignored)) continue;
      out.push_back({rel, "delete", seen->file.sha256, ""});
    } else if (seen->file.sha256 != it->second.sha256) {
      out.push_back({rel, "restore", seen->file.sha256, it->second.sha256});
    }
  }
  for (const auto& [rel, f] : c.files) {
    if (!now.count(rel)) out.push_back({rel, "create", "", f.sha256});
  }
  std::sort(out.begin(), out.end(),
            [](const FileChange& a, const FileChange& b) { return a.path < b.path; });
  return out;
}

absl::Status Checkpoints::Restore(const Checkpoint& c, const std::vector<FileChange>& changes,
                                  const LocalAccount* account) const {
  // Every object first: a rewind that cannot finish does not start.
  std::map<std::string, std::string> bytes;
  for (const auto& ch : changes) {
    if (ch.action == "delete" || bytes.count(ch.then_sha256)) continue;
    auto b = ReadObject(ch.then_sha256);
    if (!b.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint ", c.seq, " of session ",
                                                        c.session_id, " cannot restore ", ch.path,
                                                        ": ", b.status().message()));
    }
    bytes[ch.then_sha256] = *std::move(b);
  }
  AsAccount as(account);
  RETURN_IF_ERROR(as.status());
  ASSIGN_OR_RETURN(auto pfs, ProjectFs::Open(c.project_root));
  // No directory on the way may be a symlink now: the restore would write
  // (or delete) through it, into files that were never in the plan.
  for (const auto& ch : changes) {
    std::string dir;
    for (const auto& part : fs::path(ch.path).parent_path()) {
      dir = dir.empty() ? part.string() : dir + "/" + part.string();
      auto fd = pfs.OpenAt(dir, O_PATH | O_NOFOLLOW);
      if (!fd.ok()) break;  // not there: made as a directory
      struct stat st {};
      if (fstat(fd->get(), &st) == 0 && S_ISLNK(st.st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat(ch.path, ": its directory ", dir,
                         " is a symlink now; a rewind does not write through it. Nothing was "
                         "changed"));
      }
    }
  }
  // Deletions first, deepest first (a file may go where a directory was),
  // then the writes.
  std::vector<const FileChange*> order;
  for (const auto& ch : changes) order.push_back(&ch);
  std::stable_sort(order.begin(), order.end(), [](const FileChange* a, const FileChange* b) {
    const bool da = a->action == "delete", db = b->action == "delete";
    if (da != db) return da;
    return da ? a->path > b->path : a->path < b->path;
  });
  for (const FileChange* ch : order) {
    if (ch->action == "delete") {
      if (auto s = pfs.Remove(ch->path); !s.ok() && !absl::IsNotFound(s)) return s;
      // The directories it leaves empty go too (the deepest first).
      for (fs::path dir = fs::path(ch->path).parent_path(); !dir.empty(); dir = dir.parent_path()) {
        if (!pfs.RemoveEmptyDir(dir.string()).ok()) break;
      }
      continue;
    }
    // The checkpoint had a file here: a symlink now in its place goes, and
    // the file is written in its stead, never through it.
    if (auto link = pfs.OpenAt(ch->path, O_PATH | O_NOFOLLOW); link.ok()) {
      struct stat st {};
      if (fstat(link->get(), &st) == 0 && S_ISLNK(st.st_mode))
        RETURN_IF_ERROR(pfs.Remove(ch->path));
    }
    RETURN_IF_ERROR(pfs.WriteFile(ch->path, bytes[ch->then_sha256]));
    auto it = c.files.find(ch->path);
    if (it == c.files.end()) continue;
    ASSIGN_OR_RETURN(UniqueFd fd, pfs.OpenAt(ch->path, O_RDONLY | O_NOFOLLOW));
    if (fchmod(fd.get(), it->second.mode) != 0)
      return absl::InternalError(absl::StrCat(ch->path, ": chmod: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status Checkpoints::PruneProject(const std::string& root) {
  struct Kept {
    std::string key;
    int64_t time_us = 0;
    std::set<std::string> objects;
  };
  std::vector<Kept> kept;
  RETURN_IF_ERROR(storage_.Scan(Cf::kCheckpoints, "m/", PrefixEnd("m/"),
                                [&](std::string_view k, std::string_view v) {
                                  auto c = Checkpoint::FromJson(json::parse(v, nullptr, false));
                                  if (!c.ok() || c->project_root != root) return true;
                                  Kept e{std::string(k), c->time_us, {}};
                                  for (const auto& [p, f] : c->files) e.objects.insert(f.sha256);
                                  for (const auto& [b, sha] : c->boards) e.objects.insert(sha);
                                  kept.push_back(std::move(e));
                                  return true;
                                }));
  std::sort(kept.begin(), kept.end(),
            [](const Kept& a, const Kept& b) { return a.time_us < b.time_us; });
  std::map<std::string, uint64_t> sizes;
  auto total = [&] {
    std::set<std::string> all;
    for (const auto& e : kept) all.insert(e.objects.begin(), e.objects.end());
    uint64_t sum = 0;
    std::error_code ec;
    for (const auto& sha : all) {
      auto [it, added] = sizes.try_emplace(sha, 0);
      if (added) {
        const auto n = fs::file_size(ObjectPath(sha), ec);
        it->second = ec ? 0 : n;
      }
      sum += it->second;
    }
    return sum;
  };
  bool pruned = false;
  while (kept.size() > 1 && total() > limits_.max_bytes) {
    RETURN_IF_ERROR(storage_.Delete(Cf::kCheckpoints, kept.front().key, /*sync=*/true));
    kept.erase(kept.begin());
    pruned = true;
  }
  const uint64_t bytes = total();
  {
    // What the project's checkpoints name now: the next Takes add to it and
    // scan again only once it is past the limit.
    MutexLock lock(&usage_mu_);
    Usage& u = usage_[root];
    u.objects.clear();
    for (const auto& e : kept)
      for (const auto& sha : e.objects) u.objects.emplace(sha, sizes[sha]);
    u.bytes = bytes;
    u.known = true;
  }
  return pruned ? CollectGarbage() : absl::OkStatus();
}

absl::Status Checkpoints::CollectGarbage() {
  std::set<std::string> named;
  RETURN_IF_ERROR(
      storage_.Scan(Cf::kCheckpoints, "", "", [&](std::string_view k, std::string_view v) {
        const json j = json::parse(v, nullptr, false);
        if (k.substr(0, 2) == "f/" && j.is_object()) {
          for (const auto& [b, sha] : j.items()) named.insert(sha.get<std::string>());
        } else if (auto c = Checkpoint::FromJson(j); c.ok()) {
          for (const auto& [p, f] : c->files) named.insert(f.sha256);
          for (const auto& [b, sha] : c->boards) named.insert(sha);
        }
        return true;
      }));
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(dir_ + "/objects", ec)) {
    for (const auto& f : fs::directory_iterator(d.path(), ec)) {
      if (!named.count(f.path().filename().string())) fs::remove(f.path(), ec);
    }
  }
  return absl::OkStatus();
}

absl::Status Checkpoints::DropSession(const std::string& session_id) {
  {
    MutexLock lock(&map_mu_);
    session_mu_.erase(session_id);
  }
  WriterMutexLock alone(&gc_mu_);
  WriteBatch batch;
  const std::string prefix = ManifestPrefix(session_id);
  batch.DeleteRange(Cf::kCheckpoints, prefix, PrefixEnd(prefix));
  batch.Delete(Cf::kCheckpoints, FlashedKey(session_id));
  RETURN_IF_ERROR(storage_.Write(batch, /*sync=*/true));
  return CollectGarbage();
}

}  // namespace fwai
