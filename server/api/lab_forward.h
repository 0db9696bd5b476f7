// Board work between the nodes of a lab. A front forwards flash and serial
// for a board of another node to the bench that owns it, over mutual TLS
// with its node certificate; the bench (LabNode service) does the work only
// while the calling node holds the board's lease in the lab, under a local
// lease that stands for the lab lease and ends with it. Internal to server/api.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/api/api.h"
#include "server/hardware/broker.h"
#include "server/lab/lab_leases.h"

namespace fwai {

class CancelToken;

// Channels of this node to the other nodes of the lab (one per node).
class LabLinks {
 public:
  explicit LabLinks(const ApiDeps& deps) : deps_(deps) {}
  // The node's advertised address (etcd) over mutual TLS with this node's
  // certificate (lab.cert/key/ca, else tls.cert/key/client_ca).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelTo(const std::string& node);

 private:
  const ApiDeps& deps_;
  std::mutex mu_;
  std::map<std::string, std::pair<std::string, std::shared_ptr<grpc::Channel>>>
      channels_;  // node -> (address, channel)
};

// Flashes the image at `path` (read as the caller's account) on the lab
// board of `lease` through its bench; `progress` hears the bench's stages.
// Returns the bench's last message (done, boot line) or why it failed.
struct ForwardedFlash {
  std::string sha256, boot_line, message;
  double seconds = 0;
};
// The flash guard's rules of the caller's project for an image flashed on a
// board of another node. The front judges what it can see — the image, its
// freshness against the project's sources, its build record's toolchain —
// before a byte moves; the memory budgets go with the image to the bench,
// which applies them against its board's regions along with its own rules
// (lease, target, fit, its board policy).
struct FrontFlashGuard {
  std::string project_root;  // "": found from the image's path
  FlashGuardPolicy policy;
  std::function<nlohmann::json(const std::string& sha256)> build_record;  // null: none
};
[[nodiscard]] absl::StatusOr<ForwardedFlash> ForwardFlash(
    LabLinks& links, const lab::LabLease& lease, const Caller& caller, const std::string& path,
    bool approved, const std::function<void(const FlashProgressUpdate&)>& progress,
    CancelToken* cancel, const FrontFlashGuard& guard);

// Debug commands and a reset on the lab board of `lease`, through its bench.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ForwardDebug(
    LabLinks& links, const lab::LabLease& lease, const std::vector<std::string>& commands,
    int timeout_s, std::string* result_json);
[[nodiscard]] absl::Status ForwardReset(LabLinks& links, const lab::LabLease& lease);

std::unique_ptr<grpc::Service> MakeLabNodeService(const ApiDeps& deps);

}  // namespace fwai
