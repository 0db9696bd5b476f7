#include "server/api/rewind.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/local_account.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/turn_manager.h"
#include "server/boards/boards.h"
#include "server/boards/leases.h"
#include "server/session/checkpoints.h"
#include "server/session/session_manager.h"

namespace fwai {

namespace {

namespace pb = fwai::v1;
namespace fs = std::filesystem;

void ToProto(const Checkpoint& c, pb::CheckpointInfo* out) {
  out->set_seq(c.seq);
  out->set_turn_id(c.turn_id);
  out->set_reason(c.reason);
  out->set_time_us(c.time_us);
  out->set_files(static_cast<int32_t>(c.files.size()));
  out->set_bytes(c.bytes);
  for (const auto& [board, sha] : c.boards) (*out->mutable_boards())[board] = sha;
  for (const auto& s : c.skipped) out->add_skipped(s);
  out->set_history_len(c.history_len);
}

// The image each board runs now, as the listing knows it.
std::map<std::string, std::string> RunningImages(const ApiDeps& d) {
  std::map<std::string, std::string> out;
  if (!d.leases) return out;
  for (const auto& b : d.leases->List().boards) out[b.device.id] = b.device.image_sha256;
  return out;
}

// A board to flash back, checked: resolved for the caller, held by them,
// its image read (so nothing pruned meanwhile can take it away).
struct BoardBack {
  BoardRef ref;
  std::string sha256;
  std::string image;
};

// The checkpoint's image written where the flash reads it as the caller's
// account; the directory goes when this does.
class ExportedImage {
 public:
  static absl::StatusOr<ExportedImage> Write(const std::string& bytes,
                                             const std::optional<LocalAccount>& account) {
    std::string tmpl = (fs::temp_directory_path() / "fwai-rewind-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr)
      return absl::InternalError(absl::StrCat("a directory for the image: ", std::strerror(errno)));
    ExportedImage e(tmpl);
    RETURN_IF_ERROR(WriteFileAtomic(e.path(), bytes, 0600));
    if (account && account->uid != getuid()) {
      if (chown(tmpl.c_str(), account->uid, account->gid) != 0 ||
          chown(e.path().c_str(), account->uid, account->gid) != 0) {
        return absl::InternalError(
            absl::StrCat("the image for ", account->name, ": ", std::strerror(errno)));
      }
    }
    return e;
  }
  ExportedImage(ExportedImage&& o) noexcept : dir_(std::move(o.dir_)) { o.dir_.clear(); }
  ~ExportedImage() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  std::string path() const { return dir_ + "/image.elf"; }

 private:
  explicit ExportedImage(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// Checks the boards of `c` to flash back; fills `out` with each one's plan.
absl::StatusOr<std::vector<BoardBack>> PlanBoards(const ApiDeps& d, const Caller& caller,
                                                  const Checkpoint& c, pb::RewindResponse* out) {
  std::vector<BoardBack> todo;
  const auto running = RunningImages(d);
  for (const auto& [board, sha] : c.boards) {
    auto* b = out->add_boards();
    b->set_board(board);
    b->set_then_sha256(sha);
    auto it = running.find(board);
    b->set_now_sha256(it == running.end() ? "" : it->second);
    b->set_action(b->now_sha256() == sha ? "unchanged" : "flash");
    if (b->action() == "unchanged") continue;
    auto ref = d.boards->Resolve(caller, board);
    const absl::Status held = ref.ok() ? d.boards->CheckHeld(caller, *ref) : ref.status();
    if (!held.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("board ", board, ": ", held.message(), "; nothing was changed"));
    }
    auto image = d.checkpoints->ReadObject(sha);
    if (!image.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("board ", board, ": its image ", sha,
                                                        " is no longer kept; nothing was changed"));
    }
    todo.push_back({*ref, sha, *std::move(image)});
  }
  return todo;
}

absl::Status FlashBack(const ApiDeps& d, const Caller& caller, const SessionInfo& s,
                       const std::vector<BoardBack>& todo) {
  for (const auto& b : todo) {
    ASSIGN_OR_RETURN(auto image, ExportedImage::Write(b.image, caller.account));
    FlashOrder order;
    order.image = image.path();
    order.project_root = s.project_root;
    order.approved = true;  // the rewind was asked for, with its plan shown
    order.via = "rewind";
    auto r = d.boards->Flash(
        caller, b.ref, order, [](const FlashProgressUpdate&) {}, nullptr);
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("flashing ", b.ref.id, " back: ", r.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ListSessionCheckpoints(const ApiDeps& d, const SessionInfo& s,
                                    pb::ListCheckpointsResponse* out) {
  if (!d.checkpoints) return absl::UnavailableError("this fwaid keeps no checkpoints");
  ASSIGN_OR_RETURN(auto all, d.checkpoints->List(s.id));
  for (const auto& c : all) ToProto(c, out->add_checkpoints());
  return absl::OkStatus();
}

namespace {

// What the rewind changes, as `out` says it: checked, nothing changed yet.
struct RewindPlan {
  Checkpoint checkpoint;
  std::optional<LocalAccount> account;
  std::vector<FileChange> files;
  std::vector<BoardBack> boards;
  std::vector<HistoryEntry> history;
};

// The changes to the files `req.paths` names; each must be one of them.
absl::StatusOr<std::vector<FileChange>> OnlyPaths(std::vector<FileChange> all,
                                                  const pb::RewindRequest& req,
                                                  const Checkpoint& c) {
  std::vector<FileChange> out;
  for (const auto& path : req.paths()) {
    auto it =
        std::find_if(all.begin(), all.end(), [&](const FileChange& ch) { return ch.path == path; });
    if (it == all.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": not changed since checkpoint ", c.seq,
                                                     " (or not kept there); nothing was changed"));
    }
    out.push_back(*it);
  }
  return out;
}

absl::StatusOr<RewindPlan> PlanRewind(const ApiDeps& d, const Caller& caller, const SessionInfo& s,
                                      const pb::RewindRequest& req, pb::RewindResponse* out) {
  const bool files = req.files() || req.paths_size() > 0;
  const bool any = files || req.boards() || req.conversation();
  RewindPlan p;
  ASSIGN_OR_RETURN(p.checkpoint, d.checkpoints->Find(s.id, req.to()));
  const Checkpoint& c = p.checkpoint;
  ToProto(c, out->mutable_checkpoint());
  if (!s.account.empty()) {
    ASSIGN_OR_RETURN(p.account, LookupAccount(s.account));
  }
  if (any ? files : true) {
    ASSIGN_OR_RETURN(p.files, d.checkpoints->Diff(c, p.account ? &*p.account : nullptr));
    if (req.paths_size() > 0) {
      ASSIGN_OR_RETURN(p.files, OnlyPaths(std::move(p.files), req, c));
    }
    for (const auto& ch : p.files) {
      auto* f = out->add_files();
      f->set_path(ch.path);
      f->set_action(ch.action);
      f->set_now_sha256(ch.now_sha256);
      f->set_then_sha256(ch.then_sha256);
    }
  }
  if (any ? req.boards() : true) {
    ASSIGN_OR_RETURN(p.boards, PlanBoards(d, caller, c, out));
  }
  ASSIGN_OR_RETURN(p.history, d.sessions->LoadHistory(s.id));
  if (req.conversation()) {
    // Compaction rewrites the conversation: an index into it then means nothing.
    if (p.history.size() < c.history_len ||
        HistoryPrefixSha(p.history, c.history_len) != c.history_sha) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the conversation was compacted since checkpoint ", c.seq,
          ": it cannot be cut back to it (files and boards can: leave out --conversation); "
          "nothing was changed"));
    }
    out->set_history_dropped(p.history.size() - c.history_len);
  }
  return p;
}

// The rewind's event in the session and its evidence record (`error` set
// when it stopped part way).
void Tell(const ApiDeps& d, const Caller& caller, const SessionInfo& s, const RewindPlan& p,
          const pb::RewindResponse& out, const absl::Status& error) {
  pb::ServerEvent ev;
  auto* r = ev.mutable_rewound();
  r->set_checkpoint(p.checkpoint.seq);
  r->set_turn_id(p.checkpoint.turn_id);
  r->set_files(static_cast<int32_t>(p.files.size()));
  for (const auto& b : p.boards) r->add_boards(b.ref.id);
  r->set_history_dropped(out.history_dropped());
  r->set_by(caller.display);
  (void)d.sessions->Publish(s.id, std::move(ev));
  if (!d.audit) return;
  nlohmann::json rec = {{"kind", "rewind"},
                        {"session_id", s.id},
                        {"checkpoint", p.checkpoint.seq},
                        {"turn_id", p.checkpoint.turn_id},
                        {"files", p.files.size()},
                        {"boards", r->boards().size()},
                        {"history_dropped", out.history_dropped()},
                        {"undo_checkpoint", out.undo_checkpoint()},
                        {"by", caller.display}};
  if (!error.ok()) rec["error"] = std::string(error.message());
  d.audit(rec);
}

}  // namespace

absl::Status ReadCheckpointFile(const ApiDeps& d, const SessionInfo& s,
                                const pb::ReadCheckpointFileRequest& req,
                                pb::ReadCheckpointFileResponse* out) {
  if (!d.checkpoints) return absl::UnavailableError("this fwaid keeps no checkpoints");
  ASSIGN_OR_RETURN(Checkpoint c, d.checkpoints->Find(s.id, req.to()));
  ToProto(c, out->mutable_checkpoint());
  auto it = c.files.find(req.path());
  if (it == c.files.end()) {
    // Only a path the checkpoint looked at and found absent reads as "did not
    // exist": a name as the checkpoint writes them (relative, normalised),
    // not passed over, not one it never keeps.
    const std::string& p = req.path();
    const bool normal = !p.empty() && p[0] != '/' && p.back() != '/' &&
                        !absl::StrContains(absl::StrCat("/", p, "/"), "/../") &&
                        !absl::StrContains(absl::StrCat("/", p, "/"), "/./") &&
                        !absl::StrContains(p, "//");
    if (!normal || c.PassedOver(p) || p == ".git" || absl::StartsWith(p, ".git/") ||
        absl::StartsWith(p, ".fwai/runs/") || absl::StartsWith(p, ".fwai/captures/")) {
      return absl::NotFoundError(
          absl::StrCat(req.path(), ": checkpoint ", c.seq, " did not keep it"));
    }
    return absl::OkStatus();  // kept = false: not there then
  }
  constexpr uint64_t kMaxAnswer = 3u << 20;  // within one gRPC answer
  if (it->second.size > kMaxAnswer) {
    return absl::FailedPreconditionError(absl::StrCat(
        req.path(), ": ", it->second.size, " bytes at checkpoint ", c.seq,
        " is more than one answer holds (", kMaxAnswer, "); rewind it or read it with git"));
  }
  ASSIGN_OR_RETURN(std::string bytes, d.checkpoints->ReadObject(it->second.sha256));
  out->set_kept(true);
  out->set_content(std::move(bytes));
  out->set_sha256(it->second.sha256);
  return absl::OkStatus();
}

absl::Status RewindSession(const ApiDeps& d, const Caller& caller, const SessionInfo& s,
                           const pb::RewindRequest& req, pb::RewindResponse* out) {
  if (!d.checkpoints) return absl::UnavailableError("this fwaid keeps no checkpoints");
  // No turn starts while the session is looked at and changed.
  ASSIGN_OR_RETURN(auto hold, d.turns->HoldStarts(s.id, "being rewound"));
  ASSIGN_OR_RETURN(RewindPlan p, PlanRewind(d, caller, s, req, out));
  if (req.dry_run()) return absl::OkStatus();
  const LocalAccount* as = p.account ? &*p.account : nullptr;
  // The project and boards as they are now, first: the rewind itself can be
  // rewound. Nothing is pruned by it (the checkpoint gone back to stays).
  if (!p.files.empty() || !p.boards.empty()) {
    auto now = d.checkpoints->Take(s.id, s.project_root, as, "", "before rewind", p.history.size(),
                                   HistoryPrefixSha(p.history, p.history.size()),
                                   /*prune=*/false);
    if (!now.ok()) {
      return absl::Status(now.status().code(),
                          absl::StrCat("keeping the files as they are: ", now.status().message()));
    }
    out->set_undo_checkpoint(now->seq);
  }
  // A refusal by Restore's checks changes nothing; a failure part way
  // leaves the checkpoint just taken to go back to.
  absl::Status st = d.checkpoints->Restore(p.checkpoint, p.files, as);
  if (!st.ok()) return st;
  st = FlashBack(d, caller, s, p.boards);
  if (st.ok() && out->history_dropped() > 0) {
    p.history.resize(p.checkpoint.history_len);
    st = d.sessions->ReplaceHistory(s.id, p.history);
  }
  out->set_applied(st.ok());
  Tell(d, caller, s, p, *out, st);  // also when it stopped part way: say what it did
  return st;
}

}  // namespace fwai
