// Skill runs on boards of other nodes of a lab: the skill runner's flash and
// monitor steps reach the owning bench the way Hardware.Flash and
// Hardware.Serial do on a front (LabNode over mutual TLS, under the caller's
// lab lease).
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "server/api/lab_forward.h"
#include "server/skills/runner.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;

bool IsLabLeaseId(const std::string& id) { return id.rfind("lab-", 0) == 0; }

// LabNode.Serial of one board, read by a thread into a queue.
class LabSerial : public RemoteSerial {
 public:
  static absl::StatusOr<std::unique_ptr<LabSerial>> Open(const std::shared_ptr<grpc::Channel>& channel,
                                                         const pb::SerialOpen& open) {
    std::unique_ptr<LabSerial> s(new LabSerial);
    s->stub_ = pb::LabNode::NewStub(channel);
    s->stream_ = s->stub_->Serial(&s->ctx_);
    pb::SerialClientMessage m;
    *m.mutable_open() = open;
    pb::SerialServerMessage first;
    // The bench answers an open with the board and port, or refuses it.
    if (!s->stream_->Write(m) || !s->stream_->Read(&first)) {
      grpc::Status st = s->stream_->Finish();
      return absl::UnavailableError(absl::StrCat("the bench of board ", open.device_id(), ": ",
                                                 st.ok() ? "the serial stream ended at once" : st.error_message()));
    }
    s->Take(first);
    s->pump_ = std::thread([p = s.get()] { p->Pump(); });
    return s;
  }

  ~LabSerial() override {
    ctx_.TryCancel();
    if (pump_.joinable()) pump_.join();
  }

  SerialReader::Next Wait(SerialLine& line, int timeout_ms) override {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !lines_.empty() || ended_; });
    if (!lines_.empty()) {
      line = std::move(lines_.front());
      lines_.pop_front();
      return SerialReader::Next::kLine;
    }
    return ended_ ? SerialReader::Next::kEnded : SerialReader::Next::kTimeout;
  }

  std::string end_reason() const override {
    std::lock_guard lock(mu_);
    return reason_;
  }

  absl::Status SendLine(const std::string& text) override {
    pb::SerialClientMessage m;
    m.set_send_line(text);
    std::lock_guard lock(write_mu_);
    if (!stream_->Write(m)) return absl::UnavailableError("the bench's serial stream has ended");
    return absl::OkStatus();
  }

 private:
  LabSerial() = default;

  void Take(const pb::SerialServerMessage& m) {
    std::lock_guard lock(mu_);
    for (const auto& l : m.lines()) lines_.push_back(SerialLine{l.seq(), l.time_us(), l.line()});
    // A refused write ends what a skill step can expect from the port.
    if (!m.error().empty() && !ended_) {
      ended_ = true;
      reason_ = absl::StrCat("write refused: ", m.error());
    }
    if (m.end_of_stream() && !ended_) {
      ended_ = true;
      reason_ = m.reason().empty() ? "the bench ended the stream" : m.reason();
    }
    cv_.notify_all();
  }

  void Pump() {
    pb::SerialServerMessage m;
    while (stream_->Read(&m)) Take(m);
    grpc::Status st = stream_->Finish();
    std::lock_guard lock(mu_);
    if (!ended_) {
      ended_ = true;
      reason_ = st.ok() ? "the bench ended the stream" : absl::StrCat("the bench: ", st.error_message());
    }
    cv_.notify_all();
  }

  grpc::ClientContext ctx_;
  std::unique_ptr<pb::LabNode::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SerialClientMessage, pb::SerialServerMessage>> stream_;
  std::thread pump_;
  std::mutex write_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SerialLine> lines_;
  bool ended_ = false;
  std::string reason_;
};

class LabSkillBoards : public RemoteBoards {
 public:
  explicit LabSkillBoards(const ApiDeps& deps) : deps_(deps) {}

  absl::StatusOr<std::optional<std::string>> Resolve(const Caller& c, const std::string& wanted) override {
    if (!deps_.lab_leases || !deps_.hardware) return std::optional<std::string>();
    if (!wanted.empty()) {
      for (const auto& d : deps_.hardware->List()) {
        if (d.id == wanted) return std::optional<std::string>();
      }
    } else {
      // "" is the caller's leased board: one of this node first.
      for (const auto& l : deps_.hardware->Leases()) {
        if (l.identity == c.identity) return std::optional<std::string>();
      }
    }
    std::vector<lab::LabLease> found = Held(c, wanted);
    if (found.size() == 1) return std::optional<std::string>(found[0].board);
    if (wanted.empty()) {
      if (found.empty()) return std::optional<std::string>();  // the local broker says what is missing
      return absl::FailedPreconditionError("you hold several boards of the lab: name one (--board)");
    }
    // Another user's board: refused by rule, nothing of theirs touched.
    if (auto holder = deps_.lab_leases->Holder(wanted);
        holder.ok() && holder->has_value() &&
        ((*holder)->identity != c.identity || (*holder)->via != deps_.lab_node)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "board ", wanted, " is held by ", (*holder)->holder, " through ", (*holder)->via,
          "; only its holder works on it (rule: the board's lease holder)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "board ", wanted, " is not on this node and you hold no lab lease on it (fwai hw lease ", wanted, ")"));
  }

  absl::StatusOr<FlashResult> Flash(const Caller& c, const std::string& board,
                                    const std::string& path, bool approved,
                                    const std::string& project_root, const FlashGuardPolicy& policy,
                                    const std::function<void(const FlashProgressUpdate&)>& progress,
                                    CancelToken* cancel) override {
    auto lease = LeaseOf(c, board);
    if (!lease.ok()) return lease.status();
    FrontFlashGuard guard;
    guard.project_root = project_root;
    guard.policy = policy;
    guard.build_record = [hw = deps_.hardware](const std::string& sha) {
      return hw->BuildRecordOf(sha);
    };
    auto r = ForwardFlash(links_, *lease, c, path, approved, progress, cancel, guard);
    if (!r.ok()) return r.status();
    if (deps_.audit) {
      deps_.audit({{"kind", "lab_flash"},
                   {"board", board},
                   {"node", lease->node},
                   {"lease_id", lease->lease_id},
                   {"image", path},
                   {"image_sha256", r->sha256},
                   {"by", c.display},
                   {"via", "skill run"}});
    }
    return FlashResult{r->sha256, r->boot_line, r->seconds};
  }

  absl::StatusOr<std::unique_ptr<RemoteSerial>> OpenSerial(const Caller& c, const std::string& board) override {
    auto lease = LeaseOf(c, board);
    if (!lease.ok()) return lease.status();
    auto channel = links_.ChannelTo(lease->node);
    if (!channel.ok()) return channel.status();
    pb::SerialOpen open;
    open.set_device_id(lease->board);
    open.set_lease_id(lease->lease_id);
    auto s = LabSerial::Open(*channel, open);
    if (!s.ok()) return s.status();
    return std::unique_ptr<RemoteSerial>(*std::move(s));
  }

 private:
  std::vector<lab::LabLease> Held(const Caller& c, const std::string& board) const {
    std::vector<lab::LabLease> found;
    for (const auto& l : deps_.lab_leases->Mine()) {
      if (!IsLabLeaseId(l.lease_id) || l.identity != c.identity) continue;
      if (!board.empty() && l.board != board) continue;
      found.push_back(l);
    }
    return found;
  }

  absl::StatusOr<lab::LabLease> LeaseOf(const Caller& c, const std::string& board) const {
    auto found = Held(c, board);
    if (found.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("you no longer hold the lab lease on board ", board, " (it was released or expired)"));
    }
    return found[0];
  }

  const ApiDeps deps_;
  LabLinks links_{deps_};
};

}  // namespace

std::unique_ptr<RemoteBoards> MakeLabSkillBoards(const ApiDeps& deps) {
  return std::make_unique<LabSkillBoards>(deps);
}

}  // namespace fwai
