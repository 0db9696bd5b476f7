#include "server/boards/local_boards.h"

#include "common/clock.h"

namespace fwai {

namespace {

// A reader of one of the broker's serial hubs; writes go through the broker
// under the opener's lease.
class LocalSerial final : public BoardSerial {
 public:
  LocalSerial(HardwareBroker& broker, Caller caller, std::string board, std::string stream,
              std::shared_ptr<SerialReader> reader, uint64_t next_seq)
      : broker_(broker),
        caller_(std::move(caller)),
        board_(std::move(board)),
        stream_(std::move(stream)),
        reader_(std::move(reader)),
        next_seq_(next_seq) {}
  ~LocalSerial() override { broker_.CloseSerial(board_, reader_, stream_); }

  SerialReader::Next Wait(SerialLine& line, int timeout_ms) override {
    return reader_->Wait(line, timeout_ms);
  }
  std::string end_reason() const override { return reader_->end_reason(); }
  uint64_t dropped() const override { return reader_->dropped(); }
  absl::Status Write(std::string_view bytes) override {
    return broker_.SerialWrite(caller_, board_, bytes, stream_);
  }
  absl::Status SendLine(std::string_view line) override {
    return broker_.SerialSendLine(caller_, board_, line, stream_);
  }
  uint64_t next_seq() const override { return next_seq_; }
  bool host_stopping() const override { return broker_.stopping(); }
  void Notice(const std::string& text) override { reader_->PushNotice(text, NowMicros()); }

 private:
  HardwareBroker& broker_;
  const Caller caller_;
  const std::string board_;
  const std::string stream_;
  const std::shared_ptr<SerialReader> reader_;
  const uint64_t next_seq_;
};

}  // namespace

bool LocalBoards::Has(const std::string& board) const {
  for (const auto& d : broker_.List()) {
    if (d.id == board) return true;
  }
  return false;
}

bool LocalBoards::HoldsAny(const Caller& caller) const {
  for (const auto& l : broker_.Leases()) {
    if (l.identity == caller.identity) return true;
  }
  return false;
}

absl::Status LocalBoards::CheckHeld(const Caller& caller, const BoardRef& board) const {
  return broker_.CheckHolder(caller, board.id);
}

absl::StatusOr<BoardRef> LocalBoards::Pick(const Caller& caller, const std::string& wanted) const {
  auto id = broker_.ResolveBoard(wanted, caller);
  if (!id.ok()) return id.status();
  BoardRef ref;
  ref.id = *id;
  return ref;
}

absl::StatusOr<FlashResult> LocalBoards::Flash(
    const Caller& caller, const BoardRef& board, const FlashOrder& order, bool approved,
    const FlashGuardPolicy& guard, const std::function<void(const FlashProgressUpdate&)>& progress,
    CancelToken* cancel) {
  return broker_.Flash(caller, board.id, order.image, approved, order.project_root, progress,
                       cancel, guard);
}

absl::StatusOr<std::unique_ptr<BoardSerial>> LocalBoards::OpenSerial(const Caller& caller,
                                                                     const BoardRef& board,
                                                                     bool from_history,
                                                                     const std::string& stream) {
  auto reader = broker_.OpenSerial(caller, board.id, from_history, stream);
  // Read after the reader subscribed: every line below it is in its queue.
  auto seq = broker_.SerialNextSeq(board.id, stream);
  if (!reader.ok()) return reader.status();
  return std::unique_ptr<BoardSerial>(std::make_unique<LocalSerial>(
      broker_, caller, board.id, stream, *std::move(reader), seq.ok() ? *seq : 0));
}

absl::StatusOr<std::vector<SerialLine>> LocalBoards::SerialHistory(const Caller&,
                                                                   const BoardRef& board,
                                                                   size_t max_lines,
                                                                   const std::string& stream) {
  return broker_.SerialHistory(board.id, max_lines, stream);
}

absl::StatusOr<DebugResult> LocalBoards::Debug(const Caller& caller, const BoardRef& board,
                                               const std::vector<std::string>& commands,
                                               int timeout_ms, CancelToken* cancel) {
  return broker_.Debug(caller, board.id, commands, timeout_ms, cancel);
}

absl::Status LocalBoards::Reset(const Caller& caller, const BoardRef& board) {
  return broker_.Reset(caller, board.id);
}

absl::Status LocalBoards::SetHealth(const Caller& caller, const BoardRef& board,
                                    const std::string& health, const std::string& reason) {
  return broker_.SetHealth(caller, board.id, health, reason);
}

absl::StatusOr<std::string> LocalBoards::SelfTest(const Caller& caller, const BoardRef& board) {
  return broker_.SelfTest(caller, board.id);
}

absl::Status LocalBoards::OtaStage(const Caller& caller, const BoardRef& board,
                                   const std::string& image, bool permanent) {
  return broker_.OtaStage(caller, board.id, image, permanent);
}

absl::StatusOr<OtaBootResult> LocalBoards::OtaRestart(const Caller& caller, const BoardRef& board,
                                                      int boot_timeout_ms) {
  return broker_.OtaRestart(caller, board.id, boot_timeout_ms);
}

absl::Status LocalBoards::OtaConfirm(const Caller& caller, const BoardRef& board) {
  return broker_.OtaConfirm(caller, board.id);
}

absl::Status LocalBoards::OtaRestorePrevious(const Caller& caller, const BoardRef& board) {
  return broker_.OtaRestorePrevious(caller, board.id);
}

absl::StatusOr<OtaSlotsInfo> LocalBoards::OtaSlots(const BoardRef& board) {
  return broker_.OtaSlots(board.id);
}

absl::StatusOr<uint64_t> LocalBoards::SerialNextSeq(const Caller&, const BoardRef& board,
                                                    const std::string& stream) {
  return broker_.SerialNextSeq(board.id, stream);
}

}  // namespace fwai
