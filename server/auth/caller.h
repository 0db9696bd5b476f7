// Caller: who acts on a board, a skill run or a plugin's behalf, once the
// gate has admitted them — the verified principal, what it may be limited
// to, and the local account its files are read as. A plain value; copy it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/local_account.h"

namespace fwai {

// What a plugin declared it may do with boards; the boards refuse the rest.
struct CapabilityScope {
  std::string plugin;
  bool flash = false;               // flash and OTA updates
  std::vector<std::string> boards;  // tags: a board must carry one to be leased or touched
};

struct Caller {
  std::optional<CapabilityScope> scope;  // set when a plugin's code acts
  std::string identity;                  // the principal: "uid:N" | "user:NAME"
  std::vector<std::string> aliases;      // the principal's other ids (Principal::aliases)
  std::string user;                      // its user name (limits are per user)
  int64_t uid = -1;
  std::string display;  // "alice (uid 1000)"
  bool admin = false;
  std::string session_id;
  std::string lease_id;
  // The token that verified the caller, for a lease taken by hand
  // (Hardware.Acquire): that lease ends when the token is revoked.
  std::string token_id;
  std::string peer;  // where the call came from, for the record
  // The local account the caller's files are read as (flash images, project
  // files); none: the caller reads no files through fwaid.
  std::optional<LocalAccount> account;
};

}  // namespace fwai
