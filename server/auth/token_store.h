// TokenStore: bearer tokens for people and CI jobs that reach fwaid over TCP.
// A token is "fwai_<id>_<secret>": the id names it in listings and
// revocations, the secret (256 random bits) is shown once and stored only
// as its SHA-256, compared in constant time. Tokens expire and can be
// revoked; a revoked or expired token is refused saying so. Records live in
// the database (synced writes). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "server/auth/principal.h"

namespace fwai {

class Clock;

class Storage;

struct TokenInfo {
  std::string id;
  std::string user;
  Role role = Role::kUser;
  int64_t created_us = 0;
  int64_t expires_us = 0;  // 0: never
  int64_t revoked_us = 0;  // 0: not revoked
  std::string created_by;
  std::string note;
  int64_t last_used_us = 0;  // since fwaid started
};

struct NewToken {
  std::string token;  // the secret form, shown once
  TokenInfo info;
};

class TokenStore {
 public:
  // Loads the token records (there are few). Creation, expiry, revocation
  // and use are timed by `clock` (null: the system's).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TokenStore>> Open(
      Storage& storage, const Clock* clock = nullptr);
  TokenStore(const TokenStore&) = delete;
  TokenStore& operator=(const TokenStore&) = delete;

  // `ttl_s` 0: no expiry. INVALID_ARGUMENT for a bad user name.
  [[nodiscard]] absl::StatusOr<NewToken> Create(const std::string& user, Role role, int64_t ttl_s,
                                                const std::string& created_by,
                                                const std::string& note);
  // The token's record when it is valid now; UNAUTHENTICATED saying why not
  // (malformed, unknown, wrong secret, revoked when, expired when).
  [[nodiscard]] absl::StatusOr<TokenInfo> Verify(const std::string& token);
  // The record of token `id` while it is still valid (for connections it
  // verified before); UNAUTHENTICATED saying why not.
  [[nodiscard]] absl::StatusOr<TokenInfo> Valid(const std::string& id);
  [[nodiscard]] absl::Status Revoke(const std::string& id);
  std::vector<TokenInfo> List();

 private:
  TokenStore(Storage& storage, const Clock& clock) : storage_(storage), clock_(clock) {}
  struct Record {
    TokenInfo info;
    std::string secret_sha256;  // raw digest
  };
  absl::Status Save(const Record& r);
  absl::Status ValidLocked(const Record& r, int64_t now_us) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Storage& storage_;
  const Clock& clock_;
  Mutex mu_;
  std::map<std::string, Record> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
