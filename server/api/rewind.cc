#include "server/api/rewind.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

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

// A board to flash back, checked: resolved for the caller, held by them.
struct BoardBack {
  BoardRef ref;
  std::string sha256;
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
    if (auto o = d.checkpoints->ReadObject(sha); !o.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("board ", board, ": its image ", sha, " is no longer kept"));
    }
    todo.push_back({*ref, sha});
  }
  return todo;
}

absl::Status FlashBack(const ApiDeps& d, const Caller& caller, const SessionInfo& s,
                       const std::vector<BoardBack>& todo) {
  for (const auto& b : todo) {
    ASSIGN_OR_RETURN(const std::string bytes, d.checkpoints->ReadObject(b.sha256));
    ASSIGN_OR_RETURN(auto image, ExportedImage::Write(bytes, caller.account));
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

absl::Status RewindSession(const ApiDeps& d, const Caller& caller, const SessionInfo& s,
                           const pb::RewindRequest& req, pb::RewindResponse* out) {
  if (!d.checkpoints) return absl::UnavailableError("this fwaid keeps no checkpoints");
  if (d.turns->Running(s.id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("a turn is running in session ", s.id, "; rewind it once the turn ends"));
  }
  const bool any = req.files() || req.boards() || req.conversation();
  const bool files = any ? req.files() : true;
  const bool boards = any ? req.boards() : true;
  ASSIGN_OR_RETURN(const Checkpoint c, d.checkpoints->Find(s.id, req.to()));
  ToProto(c, out->mutable_checkpoint());
  std::optional<LocalAccount> account;
  if (!s.account.empty()) {
    ASSIGN_OR_RETURN(account, LookupAccount(s.account));
  }
  const LocalAccount* as = account ? &*account : nullptr;
  std::vector<FileChange> changes;
  if (files) {
    ASSIGN_OR_RETURN(changes, d.checkpoints->Diff(c, as));
    for (const auto& ch : changes) {
      auto* f = out->add_files();
      f->set_path(ch.path);
      f->set_action(ch.action);
      f->set_now_sha256(ch.now_sha256);
      f->set_then_sha256(ch.then_sha256);
    }
  }
  std::vector<BoardBack> todo;
  if (boards) {
    ASSIGN_OR_RETURN(todo, PlanBoards(d, caller, c, out));
  }
  ASSIGN_OR_RETURN(std::vector<HistoryEntry> history, d.sessions->LoadHistory(s.id));
  if (req.conversation() && history.size() > c.history_len)
    out->set_history_dropped(history.size() - c.history_len);
  if (req.dry_run()) return absl::OkStatus();
  // The project as it is now, first: the rewind itself can be rewound.
  if (files && !changes.empty()) {
    auto now = d.checkpoints->Take(s.id, s.project_root, as, "", "before rewind", history.size());
    if (!now.ok()) {
      return absl::Status(now.status().code(),
                          absl::StrCat("keeping the files as they are: ", now.status().message()));
    }
    out->set_undo_checkpoint(now->seq);
  }
  if (files) RETURN_IF_ERROR(d.checkpoints->Restore(c, changes, as));
  RETURN_IF_ERROR(FlashBack(d, caller, s, todo));
  if (out->history_dropped() > 0) {
    history.resize(c.history_len);
    RETURN_IF_ERROR(d.sessions->ReplaceHistory(s.id, history));
  }
  out->set_applied(true);
  pb::ServerEvent ev;
  auto* r = ev.mutable_rewound();
  r->set_checkpoint(c.seq);
  r->set_turn_id(c.turn_id);
  r->set_files(static_cast<int32_t>(changes.size()));
  for (const auto& b : todo) r->add_boards(b.ref.id);
  r->set_history_dropped(out->history_dropped());
  r->set_by(caller.display);
  (void)d.sessions->Publish(s.id, ev.SerializeAsString());
  if (d.audit) {
    d.audit({{"kind", "rewind"},
             {"session_id", s.id},
             {"checkpoint", c.seq},
             {"turn_id", c.turn_id},
             {"files", changes.size()},
             {"boards", r->boards().size()},
             {"history_dropped", out->history_dropped()},
             {"by", caller.display}});
  }
  return absl::OkStatus();
}

}  // namespace fwai
