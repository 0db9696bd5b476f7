#include <grpcpp/grpcpp.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/api/caller.h"
#include "server/api/gate.h"

namespace fwai {

void PeerRegistry::Add(int fd, uint32_t uid) {
  MutexLock lock(&mu_);
  by_fd_[fd] = uid;
}

int64_t PeerRegistry::Uid(const std::string& peer) const {
  // gRPC names connections handed over by file descriptor "fd:N".
  if (!absl::StartsWith(peer, "fd:")) return -1;
  int fd = 0;
  if (!absl::SimpleAtoi(peer.substr(3), &fd)) return -1;
  MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  return it == by_fd_.end() ? -1 : static_cast<int64_t>(it->second);
}

void PeerRegistry::AddRelayed(const std::string& inner, const std::string& real) {
  MutexLock lock(&mu_);
  relayed_[inner] = real;
}

void PeerRegistry::RemoveRelayed(const std::string& inner) {
  MutexLock lock(&mu_);
  relayed_.erase(inner);
}

std::string PeerRegistry::Real(const std::string& peer) const {
  MutexLock lock(&mu_);
  auto it = relayed_.find(peer);
  return it == relayed_.end() ? peer : absl::StrCat(it->second, " (relayed)");
}

std::string PeerRegistry::Identity(const std::string& peer) const {
  int64_t uid = Uid(peer);
  if (uid >= 0) return absl::StrCat("uid:", uid);
  return absl::StrCat("peer:", peer);
}

Caller CallerFor(const Principal& p, grpc::CallbackServerContext* ctx, const std::string& lease_id,
                 const std::string& session_id) {
  Caller c;
  c.identity = p.id;
  c.aliases = p.aliases;
  c.user = p.user;
  c.uid = p.account ? static_cast<int64_t>(p.account->uid) : -1;
  c.admin = p.admin();
  c.peer = p.peer;
  c.account = p.account;
  c.display = absl::StartsWith(p.id, "uid:") ? absl::StrCat(p.user, " (uid ", p.id.substr(4), ")")
                                             : absl::StrCat(p.user, " (", p.verified_by, ")");
  auto md = ctx->client_metadata().find("fwai-client");
  if (md != ctx->client_metadata().end()) {
    absl::StrAppend(&c.display, " via ", std::string(md->second.data(), md->second.size()));
  }
  c.lease_id = lease_id;
  c.session_id = session_id;
  return c;
}

absl::StatusOr<Caller> AdmitCaller(const ApiDeps& deps, grpc::CallbackServerContext* ctx,
                                   std::string_view rpc, const std::string& lease_id,
                                   const std::string& session_id) {
  auto p = deps.gate->Admit(ctx, rpc);
  if (!p.ok()) return p.status();
  return CallerFor(*p, ctx, lease_id, session_id);
}

absl::StatusOr<std::string> CanonicalProjectRoot(const std::string& r) {
  if (r.empty()) return absl::InvalidArgumentError("project_root: required");
  std::error_code ec;
  std::filesystem::path p = std::filesystem::canonical(r, ec);
  if (ec || !std::filesystem::is_directory(p)) {
    return absl::InvalidArgumentError(absl::StrCat("project_root: '", r, "' is not a directory"));
  }
  return p.string();
}

grpc::Status ToGrpcStatus(const absl::Status& s) { return ToGrpc(s); }

}  // namespace fwai
