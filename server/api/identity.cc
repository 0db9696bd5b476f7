#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/api/api.h"

#include <grpcpp/grpcpp.h>

namespace fwai {

void PeerRegistry::Add(int fd, uint32_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  by_fd_[fd] = uid;
}

int64_t PeerRegistry::Uid(const std::string& peer) const {
  // gRPC names connections handed over by file descriptor "fd:N".
  if (!absl::StartsWith(peer, "fd:")) return -1;
  int fd = 0;
  if (!absl::SimpleAtoi(peer.substr(3), &fd)) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_fd_.find(fd);
  return it == by_fd_.end() ? -1 : static_cast<int64_t>(it->second);
}

std::string PeerRegistry::Identity(const std::string& peer) const {
  int64_t uid = Uid(peer);
  if (uid >= 0) return absl::StrCat("uid:", uid);
  return absl::StrCat("peer:", peer);
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace fwai
