// LocalBoards: the BoardHost of this node's own boards, over the hardware
// broker (leases, serial hubs, flashing, GDB). Thread-safe, as the broker is.
#pragma once

#include "server/boards/boards.h"

namespace fwai {

class LocalBoards final : public BoardHost {
 public:
  explicit LocalBoards(HardwareBroker& broker) : broker_(broker) {}

  bool Has(const std::string& board) const override;
  bool HoldsAny(const Caller& caller) const override;
  [[nodiscard]] absl::Status CheckHeld(const Caller& caller, const BoardRef& board) const override;
  [[nodiscard]] absl::StatusOr<BoardRef> Pick(const Caller& caller,
                                              const std::string& wanted) const override;

  [[nodiscard]] absl::StatusOr<FlashResult> Flash(
      const Caller& caller, const BoardRef& board, const FlashOrder& order, bool approved,
      const FlashGuardPolicy& guard,
      const std::function<void(const FlashProgressUpdate&)>& progress,
      CancelToken* cancel) override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<BoardSerial>> OpenSerial(
      const Caller& caller, const BoardRef& board, bool from_history,
      const std::string& stream) override;
  [[nodiscard]] absl::StatusOr<uint64_t> SerialNextSeq(const Caller& caller, const BoardRef& board,
                                                       const std::string& stream) override;
  [[nodiscard]] absl::StatusOr<std::vector<SerialLine>> SerialHistory(
      const Caller& caller, const BoardRef& board, size_t max_lines,
      const std::string& stream) override;
  [[nodiscard]] absl::StatusOr<DebugResult> Debug(const Caller& caller, const BoardRef& board,
                                                  const std::vector<std::string>& commands,
                                                  int timeout_ms, CancelToken* cancel) override;
  [[nodiscard]] absl::Status Reset(const Caller& caller, const BoardRef& board) override;
  [[nodiscard]] absl::Status SetHealth(const Caller& caller, const BoardRef& board,
                                       const std::string& health,
                                       const std::string& reason) override;
  [[nodiscard]] absl::StatusOr<std::string> SelfTest(const Caller& caller,
                                                     const BoardRef& board) override;
  [[nodiscard]] absl::Status OtaStage(const Caller& caller, const BoardRef& board,
                                      const std::string& image, bool permanent) override;
  [[nodiscard]] absl::StatusOr<OtaBootResult> OtaRestart(const Caller& caller,
                                                         const BoardRef& board,
                                                         int boot_timeout_ms) override;
  [[nodiscard]] absl::Status OtaConfirm(const Caller& caller, const BoardRef& board) override;
  [[nodiscard]] absl::Status OtaRestorePrevious(const Caller& caller,
                                                const BoardRef& board) override;
  [[nodiscard]] absl::StatusOr<OtaSlotsInfo> OtaSlots(const BoardRef& board) override;

  HardwareBroker& broker() { return broker_; }

 private:
  HardwareBroker& broker_;
};

}  // namespace fwai
