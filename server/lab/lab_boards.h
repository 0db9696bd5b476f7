// LabBoards: the BoardHost of the boards of other nodes of a lab. Work on
// such a board goes to the bench that owns it (its LabNode service) over
// mutual TLS with this node's certificate, under the caller's lab lease
// taken through this node; the bench does it only while that lease holds,
// under a local lease standing for it. The front judges what only it can
// see — the image read as the caller, its freshness against the caller's
// sources, its build record's toolchain, the project's register code against
// its SVD — and sends the memory budgets with the image for the bench to
// apply to its board's regions.
//
// Thread-safe. Channels to the benches are made once per node and address.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "server/boards/boards.h"

namespace grpc {
class Channel;
}

namespace fwai {

struct DaemonConfig;

namespace lab {

class EtcdClient;
class LabLeases;

// Channels of this node to the other nodes of the lab (one per node).
class LabLinks {
 public:
  LabLinks(const DaemonConfig& config, EtcdClient& etcd) : config_(config), etcd_(etcd) {}
  // The node's advertised address (etcd) over mutual TLS with this node's
  // certificate (lab.cert/key/ca, else tls.cert/key/client_ca).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelTo(const std::string& node);

 private:
  const DaemonConfig& config_;
  EtcdClient& etcd_;
  Mutex mu_;
  std::map<std::string, std::pair<std::string, std::shared_ptr<grpc::Channel>>> channels_
      ABSL_GUARDED_BY(mu_);  // node -> (address, channel)
};

class LabBoards final : public BoardHost {
 public:
  // `build_record` finds the build record of an image by its SHA-256 (the
  // guard's toolchain and growth rules); `register_check` checks the
  // project's register code (the guard's register_check); null: none.
  LabBoards(const DaemonConfig& config, EtcdClient& etcd, LabLeases& leases, std::string node,
            std::function<nlohmann::json(const std::string&)> build_record,
            RegisterCheckHook register_check);

  std::vector<BoardRef> Held(const Caller& caller, const std::string& board,
                             const std::string& lease_id) const override;
  std::optional<std::string> HeldByAnother(const Caller& caller,
                                           const std::string& board) const override;
  std::optional<std::string> WhyEnded(const Caller& caller,
                                      const std::string& lease_id) const override;

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

 private:
  LabLeases& leases_;
  const std::string node_;
  const std::function<nlohmann::json(const std::string&)> build_record_;
  const RegisterCheckHook register_check_;
  LabLinks links_;
};

}  // namespace lab
}  // namespace fwai
