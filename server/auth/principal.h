// Principal: who is calling, as verified for a connection — a unix peer's
// uid, a token, or an mTLS certificate — with its role and the local
// account its sessions act as. Everything a principal owns (sessions, runs,
// evidence, leases) carries its `id`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/local_account.h"

namespace fwai {

enum class Role { kCi = 0, kUser = 1, kAdmin = 2 };

const char* RoleName(Role r);
// "admin" | "user" | "ci"; false for anything else.
bool ParseRole(const std::string& name, Role* out);

struct Principal {
  std::string id;    // "uid:1000" or "user:alice": the owner of what it makes
  std::string user;  // the configured user, or the unix account's name
  Role role = Role::kUser;
  std::string verified_by;  // "unix peer credentials", "token tk-…", "client certificate CN=alice"
  std::string token_id;     // set when a token verified it
  int64_t token_expires_us = 0;
  std::string peer;  // where the connection comes from
  // The local account its sessions act as; none: no file or command tools.
  std::optional<LocalAccount> account;
  std::string no_account_reason;  // why there is none, for the person
  // Other owner ids of the same person (a user whose local_user is this
  // unix account owns what that uid made, and the other way round).
  std::vector<std::string> aliases;

  bool admin() const { return role == Role::kAdmin; }
  // True for its own id and aliases.
  bool Owns(const std::string& owner) const;
  // Owns, or is an admin.
  bool MaySee(const std::string& owner) const { return admin() || Owns(owner); }
};

}  // namespace fwai
