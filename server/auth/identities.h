// Identities: what a transport verified (a unix peer's uid, a bearer token,
// an mTLS certificate's subject) becomes a Principal, using the `users:` of
// fwaid.yaml. The local account a principal acts as is granted only when
// fwaid can act as it (fwaid runs as root, or it is fwaid's own account).
// Reloadable; thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/security_config.h"
#include "server/auth/principal.h"
#include "server/auth/token_store.h"

namespace fwai {

// Whether an RFC 2253 subject (as gRPC gives it) carries the lab node unit
// (OU=fwai-lab-node, common/lab_config.h): a lab node's certificate.
bool SubjectIsLabNode(const std::string& subject);

// What admins get: no limit that could ever be reached.
LimitsConfig UnlimitedLimits();

class Identities {
 public:
  Identities(SecurityConfig config, TokenStore& tokens, uint32_t daemon_uid);
  Identities(const Identities&) = delete;
  Identities& operator=(const Identities&) = delete;

  // Users, limits and writers from a reloaded config.
  void Reload(SecurityConfig config);

  // Root and fwaid's own user are admins; a uid whose account is some
  // user's local_user takes that user's role and also owns what it made.
  [[nodiscard]] absl::StatusOr<Principal> ForUnixPeer(uint32_t uid, const std::string& peer);
  // UNAUTHENTICATED says why a token is refused.
  [[nodiscard]] absl::StatusOr<Principal> ForToken(const std::string& token,
                                                   const std::string& peer);
  // For a token this daemon verified earlier on the same connection.
  [[nodiscard]] absl::StatusOr<Principal> ForTokenId(const std::string& token_id,
                                                     const std::string& peer);
  // A certificate from the trusted CA that maps to no configured user is
  // refused (UNAUTHENTICATED naming its subject).
  [[nodiscard]] absl::StatusOr<Principal> ForCertificate(const std::string& subject,
                                                         const std::string& common_name,
                                                         const std::string& peer);

  // A node of a lab: a node's certificate from the trusted CA (OU
  // fwai-lab-node) is another node (its CN), principal "node:CN", limited
  // to LabNode calls by the gate. Without this, node certificates are refused.
  void AcceptLabNodes(bool accept) { accept_lab_nodes_ = accept; }

  // Personal collections ("~NAME", "~NAME/..."): whose NAME is. A name in
  // users: is that user's ("user:NAME"); any other name is the local
  // account's of that name ("uid:N") if there is one, else "user:NAME". So a
  // token made for a local account's name does not reach that account's
  // collections unless users.NAME says it acts as it.
  std::string OwnerOfName(const std::string& name);
  // Whether the owner of sessions `owner` ("uid:N" | "user:NAME"), or the
  // same person under another id (users.NAME.local_user), owns `name`.
  bool OwnerOwnsName(const std::string& owner, const std::string& name);

  // Admins (root and fwaid's own user included) are not limited.
  // Whom a session share for `name` reaches, verified now: a configured
  // user ("user:NAME"), a local account ("uid:N"), a user some valid token
  // names ("user:NAME"), or "role:admin|user|ci" for everyone of a role.
  // NOT_FOUND naming `name` for anyone else: a share never names a
  // principal nobody could be.
  [[nodiscard]] absl::StatusOr<std::string> GranteeOf(const std::string& name);
  LimitsConfig LimitsOf(const Principal& p);
  bool MayWriteSharedKnowledge(const Principal& p);
  TokenStore& tokens() { return tokens_; }
  uint32_t daemon_uid() const { return daemon_uid_; }

 private:
  Principal FromToken(const TokenInfo& info, const std::string& peer);
  // The account `name` for a principal, or why it gets none.
  void GrantAccount(const std::string& name, Principal& p);
  const UserConfig* UserByLocalAccount(const std::string& account)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string OwnerOfNameLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TokenStore& tokens_;
  const uint32_t daemon_uid_;
  std::atomic<bool> accept_lab_nodes_{false};
  Mutex mu_;
  SecurityConfig config_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
