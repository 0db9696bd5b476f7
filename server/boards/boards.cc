#include "server/boards/boards.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/cancel.h"
#include "common/clock.h"
#include "common/local_account.h"
#include "common/verdict.h"
#include "server/hardware/firmware_image.h"
#include "server/lab/lab_leases.h"
#include "server/project/policy.h"
#include "server/telemetry/telemetry.h"

namespace fwai {

// The readers opened through a Boards, by board.
struct OpenBoardReaders {
  Mutex mu;
  std::multimap<std::string, BoardSerial*> by_board ABSL_GUARDED_BY(mu);
};

namespace {

// A host's reader, listed while it is open so that Boards::Notice reaches it.
// A notice is about a line of the board (a watch matched it); it is shown
// after that line. The watch read the line through its own reader, which may
// be ahead of this one (another hub reader, another stream from a bench), so
// the notice waits here until this reader has passed the line — or at once
// when this reader opened after it, and after kNoticeHoldUs at most when the
// line never comes (this reader lost it falling behind).
class ListedSerial final : public BoardSerial {
 public:
  ListedSerial(std::unique_ptr<BoardSerial> inner, std::string board, const std::string& stream,
               bool from_history, std::shared_ptr<OpenBoardReaders> open)
      : inner_(std::move(inner)),
        stream_(StreamName(stream)),
        first_live_(from_history ? 0 : inner_->next_seq()),
        open_(std::move(open)) {
    MutexLock lock(&open_->mu);
    it_ = open_->by_board.emplace(std::move(board), this);
  }
  ~ListedSerial() override {
    MutexLock lock(&open_->mu);
    open_->by_board.erase(it_);
  }
  SerialReader::Next Wait(SerialLine& line, int timeout_ms) override;
  std::string end_reason() const override { return inner_->end_reason(); }
  uint64_t dropped() const override { return inner_->dropped(); }
  absl::Status Write(std::string_view bytes) override { return inner_->Write(bytes); }
  absl::Status SendLine(std::string_view line) override { return inner_->SendLine(line); }
  std::string TakeRefusal() override { return inner_->TakeRefusal(); }
  uint64_t next_seq() const override { return inner_->next_seq(); }
  bool host_stopping() const override { return inner_->host_stopping(); }
  void Notice(const std::string& text) override { inner_->Notice(text); }
  // A notice about the line numbered `after_seq` of `stream` (0: about no
  // line). Lines of another stream are numbered apart: shown at once.
  void NoticeAfter(const std::string& text, const std::string& stream, uint64_t after_seq)
      ABSL_LOCKS_EXCLUDED(mu_);
  static std::string StreamName(const std::string& s) { return s.empty() ? "uart" : s; }

 private:
  struct Held {
    std::string text;
    uint64_t after_seq;
    int64_t due_us;  // shown by then whatever came
  };
  static constexpr int64_t kNoticeHoldUs = 1'000'000;
  static constexpr int kSliceMs = 200;  // how often a wait looks at notices held
  // Hands the held notices now due to the host's reader, behind the lines
  // already there.
  void ReleaseDue() ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<BoardSerial> inner_;
  const std::string stream_;
  const uint64_t first_live_;  // lines numbered below it never come (0: unknown, or from history)
  const std::shared_ptr<OpenBoardReaders> open_;
  std::multimap<std::string, BoardSerial*>::iterator it_;  // set once, in the constructor
  Mutex mu_;
  uint64_t passed_ ABSL_GUARDED_BY(mu_) = 0;  // the last board line Wait returned
  std::deque<Held> held_ ABSL_GUARDED_BY(mu_);
};

void ListedSerial::NoticeAfter(const std::string& text, const std::string& stream,
                               uint64_t after_seq) {
  {
    MutexLock lock(&mu_);
    const bool seen = after_seq == 0 || StreamName(stream) != stream_ || after_seq < first_live_ ||
                      after_seq <= passed_;
    if (!seen) {
      held_.push_back(Held{text, after_seq, NowMicros() + kNoticeHoldUs});
      return;
    }
  }
  inner_->Notice(text);
}

void ListedSerial::ReleaseDue() {
  std::vector<std::string> due;
  {
    MutexLock lock(&mu_);
    const int64_t now = NowMicros();
    while (!held_.empty() && (held_.front().after_seq <= passed_ || held_.front().due_us <= now)) {
      due.push_back(std::move(held_.front().text));
      held_.pop_front();
    }
  }
  for (const auto& t : due) inner_->Notice(t);
}

SerialReader::Next ListedSerial::Wait(SerialLine& line, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    ReleaseDue();
    bool holding;
    {
      MutexLock lock(&mu_);
      holding = !held_.empty();
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    const int slice =
        static_cast<int>(std::max<int64_t>(0, holding ? std::min<int64_t>(left, kSliceMs) : left));
    const auto n = inner_->Wait(line, slice);
    if (n == SerialReader::Next::kLine) {
      if (!line.notice) {
        MutexLock lock(&mu_);
        passed_ = std::max(passed_, line.seq);
      }
      return n;
    }
    // Ended: every line came; a notice whose line never did goes with the stream.
    if (n == SerialReader::Next::kEnded || left <= slice) return n;
  }
}

}  // namespace

Boards::Boards(BoardHost& local, BoardHost* lab, std::string node)
    : local_(local),
      lab_(lab),
      node_(std::move(node)),
      open_(std::make_shared<OpenBoardReaders>()) {}

using lab::IsLabLeaseId;

absl::StatusOr<BoardRef> Boards::Resolve(const Caller& caller, const std::string& wanted,
                                         const std::string& lease_id) const {
  if (!lab_) return local_.Pick(caller, wanted);
  if (!wanted.empty() && local_.Has(wanted)) return local_.Pick(caller, wanted);
  // "" picks the caller's leased board: one of this node first.
  if (wanted.empty() && !IsLabLeaseId(lease_id) && local_.HoldsAny(caller))
    return local_.Pick(caller, wanted);
  std::vector<BoardRef> found = lab_->Held(caller, wanted, lease_id);
  if (found.size() == 1) return found[0];
  // A lab lease id that is not one of the caller's: as unknown (another
  // holder's lease is not revealed).
  if (found.empty() && IsLabLeaseId(lease_id)) {
    if (auto why = lab_->WhyEnded(caller, lease_id)) {
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, " has ended: ", *why));
    }
    return absl::NotFoundError(absl::StrCat("no lab lease ", lease_id, " of yours",
                                            wanted.empty() ? "" : " on board " + wanted,
                                            " (rule: a lease is used by its holder only)"));
  }
  if (wanted.empty()) {
    if (found.empty()) return local_.Pick(caller, wanted);  // it says what is missing
    return absl::FailedPreconditionError("you hold several boards of the lab: name one (--board)");
  }
  if (auto holder = lab_->HeldByAnother(caller, wanted)) {
    return absl::PermissionDeniedError(
        absl::StrCat("board ", wanted, " is held by ", *holder,
                     "; only its holder works on it (rule: the board's lease holder)"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("board ", wanted,
                   " is not on this node and you hold no lab lease on it "
                   "(fwai hw lease ",
                   wanted, ")"));
}

absl::StatusOr<FlashGuardPolicy> Boards::GuardFor(const Caller& caller, const BoardRef& board,
                                                  const FlashOrder& order, bool* approved) const {
  *approved = order.approved;
  if (order.guard) return *order.guard;
  // The policy's flash settings (project and organisation): which boards,
  // whether a person must approve, whether sources must be older.
  // The project's files are read as the caller (a policy it cannot read
  // is refused, never read by fwaid for it).
  const LocalAccount* account = caller.account ? &*caller.account : nullptr;
  std::string root = order.project_root;
  if (root.empty()) {
    std::optional<ScopedFsIdentity> as;
    if (account) as.emplace(*account);
    if (as && !as->status().ok()) return as->status();
    root = FindProjectRoot(order.image);
  }
  auto rules = LoadPolicy(root, policy_file_, account);
  if (!rules.ok())
    return absl::FailedPreconditionError(absl::StrCat("policy: ", rules.status().message()));
  PolicyDecision d = CheckFlashPolicy(*rules, board.id, order.approved);
  if (!d.allowed && d.rule.rfind("flash.allowed_boards", 0) == 0) {
    if (recorder_) {
      nlohmann::json rec = {{"kind", "policy_refusal"}, {"action", "flash"},
                            {"board", board.id},        {"image", order.image},
                            {"rule", d.rule},           {"by", caller.display}};
      if (!board.node.empty()) rec["node"] = board.node;
      recorder_(rec);
    }
    return absl::PermissionDeniedError(
        absl::StrCat("refused by policy (", d.rule, "): ", d.reason));
  }
  if (!rules->flash_require_approval) *approved = true;  // waived by the policy
  return FlashGuardFromRules(*rules);
}

FlashGuardPolicy FlashGuardFromRules(const PolicyRules& rules) {
  FlashGuardPolicy g;
  g.check_fresh = rules.flash_require_fresh;
  g.require_verified_toolchain = rules.flash_require_verified_toolchain;
  g.flash_max_pct = rules.memory_flash_max_pct;
  g.ram_max_pct = rules.memory_ram_max_pct;
  g.max_growth_bytes = rules.memory_max_growth_bytes;
  g.register_check = rules.flash_register_check;
  return g;
}

void Boards::Record(nlohmann::json rec, const Caller& caller, const BoardRef& board,
                    const FlashOrder& order) const {
  if (!recorder_) return;
  if (!rec.is_object()) rec = nlohmann::json::object();
  rec["kind"] = "flash";
  rec["board"] = board.id;
  if (!board.node.empty() || !node_.empty()) rec["node"] = board.node.empty() ? node_ : board.node;
  if (board.remote) rec["lease_id"] = board.lease_id;
  if (!rec.contains("image")) rec["image"] = order.image;
  rec["principal"] = caller.identity;
  rec["peer"] = caller.peer;
  rec["by"] = caller.display;
  rec["session_id"] = caller.session_id;
  if (!order.via.empty()) rec["via"] = order.via;
  recorder_(rec);
}

absl::StatusOr<FlashResult> Boards::Flash(
    const Caller& caller, const BoardRef& board, const FlashOrder& order,
    const std::function<void(const FlashProgressUpdate&)>& progress, CancelToken* cancel) {
  // flash {board}: the record's hash is noted on the span when it is appended.
  telemetry::ActiveSpan span("flash", board.id);
  if (span) {
    span->Set("fwai.board", board.id);
    span->Set("fwai.node", board.node.empty() ? node_ : board.node);
    span->Set("fwai.principal", caller.identity);
    if (!caller.session_id.empty()) span->Set("gen_ai.conversation.id", caller.session_id);
  }
  auto r = GuardAndFlash(caller, board, order, progress, cancel);
  if (r.ok()) {
    span->Set("fwai.image.sha256", r->sha256);
    span->SetDouble("fwai.flash.seconds", r->seconds);
    span->SetBool("fwai.flash.booted", !r->boot_line.empty());
    Record(r->record, caller, board, order);
    if (flash_observer_) flash_observer_(caller, board, order, *r);
  } else {
    span->Fail(std::string(r.status().message()));
  }
  telemetry::RecordFlash(board.id, r.ok());
  return r;
}

absl::StatusOr<FlashResult> Boards::GuardAndFlash(
    const Caller& caller, const BoardRef& board, const FlashOrder& order,
    const std::function<void(const FlashProgressUpdate&)>& progress, CancelToken* cancel) {
  bool approved = false;
  // The policy refusing the flash: the request's (config), nothing was written.
  auto guard = GuardFor(caller, board, order, &approved);
  if (!guard.ok()) return WithVerdict(guard.status(), kVerdictConfig);
  return HostOf(board).Flash(caller, board, order, approved, *guard, progress, cancel);
}

absl::StatusOr<std::unique_ptr<BoardSerial>> Boards::OpenSerial(const Caller& caller,
                                                                const BoardRef& board,
                                                                bool from_history,
                                                                const std::string& stream,
                                                                bool hears_notices) {
  auto serial = HostOf(board).OpenSerial(caller, board, from_history, stream);
  if (!serial.ok() || !hears_notices) return serial;
  return std::unique_ptr<BoardSerial>(
      std::make_unique<ListedSerial>(*std::move(serial), board.id, stream, from_history, open_));
}

int Boards::Notice(const std::string& board, const std::string& text, const std::string& stream,
                   uint64_t after_seq) {
  MutexLock lock(&open_->mu);
  int n = 0;
  auto [b, e] = open_->by_board.equal_range(board);
  // Every reader listed is a ListedSerial (only OpenSerial lists them).
  for (auto it = b; it != e; ++it, ++n)
    static_cast<ListedSerial*>(it->second)->NoticeAfter(text, stream, after_seq);
  return n;
}

absl::StatusOr<std::vector<SerialLine>> Boards::SerialHistory(const Caller& caller,
                                                              const BoardRef& board,
                                                              size_t max_lines,
                                                              const std::string& stream) {
  return HostOf(board).SerialHistory(caller, board, max_lines, stream);
}

absl::StatusOr<DebugResult> Boards::Debug(const Caller& caller, const BoardRef& board,
                                          const std::vector<std::string>& commands, int timeout_ms,
                                          CancelToken* cancel) {
  return HostOf(board).Debug(caller, board, commands, timeout_ms, cancel);
}

absl::Status Boards::Reset(const Caller& caller, const BoardRef& board) {
  return HostOf(board).Reset(caller, board);
}

absl::Status Boards::SetHealth(const Caller& caller, const BoardRef& board,
                               const std::string& health, const std::string& reason) {
  return HostOf(board).SetHealth(caller, board, health, reason);
}

absl::StatusOr<std::string> Boards::SelfTest(const Caller& caller, const BoardRef& board) {
  return HostOf(board).SelfTest(caller, board);
}

absl::Status Boards::OtaStage(const Caller& caller, const BoardRef& board, const std::string& image,
                              bool permanent) {
  return HostOf(board).OtaStage(caller, board, image, permanent);
}

absl::StatusOr<OtaBootResult> Boards::OtaRestart(const Caller& caller, const BoardRef& board,
                                                 int boot_timeout_ms) {
  return HostOf(board).OtaRestart(caller, board, boot_timeout_ms);
}

absl::Status Boards::OtaConfirm(const Caller& caller, const BoardRef& board) {
  return HostOf(board).OtaConfirm(caller, board);
}

absl::Status Boards::OtaRestorePrevious(const Caller& caller, const BoardRef& board) {
  return HostOf(board).OtaRestorePrevious(caller, board);
}

absl::StatusOr<OtaSlotsInfo> Boards::OtaSlots(const BoardRef& board) {
  return HostOf(board).OtaSlots(board);
}

absl::StatusOr<uint64_t> Boards::SerialNextSeq(const Caller& caller, const BoardRef& board,
                                               const std::string& stream) {
  return HostOf(board).SerialNextSeq(caller, board, stream);
}

}  // namespace fwai
