// SessionShares: who besides its owner may use a session, and how far.
//
// A share gives one grantee — a verified principal id ("uid:1001",
// "user:bob") or every principal of a role ("role:ci") — one role on one
// session, until it expires or is removed:
//   watch    attach, history and evidence of the session;
//   answer   also answer the agent's questions;
//   approve  also decide plans and approval prompts;
//   drive    also send messages, cancel and switch the mode.
// Each role includes the ones above it. A share never makes the grantee an
// owner: sharing, deleting, rewinding and the session's files stay the
// owner's. Records live in the database (synced writes) and in memory, so a
// check on every call costs a map lookup. Expiry is timed by the clock given
// to Open. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace fwai {

class Clock;
class Storage;

enum class ShareRole { kWatch = 1, kAnswer = 2, kApprove = 3, kDrive = 4 };

const char* ShareRoleName(ShareRole r);
// "watch" | "answer" | "approve" | "drive"; false for anything else.
bool ParseShareRole(std::string_view name, ShareRole* out);

struct SessionShare {
  std::string session_id;
  std::string grantee;  // a principal id, or "role:NAME"
  std::string user;     // the name it was made for, as the owner gave it
  ShareRole role = ShareRole::kWatch;
  int64_t created_us = 0;
  int64_t expires_us = 0;  // 0: until removed
  std::string created_by;  // the owner's principal id
};

// Who a share is checked against: a principal's id, its aliases and role.
struct ShareSubject {
  std::vector<std::string> ids;  // id first, then aliases
  std::string role;              // "admin" | "user" | "ci"
};

class SessionShares {
 public:
  // Loads every share (they are few). `clock` null: the system's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SessionShares>> Open(
      Storage& storage, const Clock* clock = nullptr);
  SessionShares(const SessionShares&) = delete;
  SessionShares& operator=(const SessionShares&) = delete;

  // Stores `share`, replacing the grantee's earlier share of that session.
  // INVALID_ARGUMENT for an empty session or grantee, or an expiry already
  // past.
  [[nodiscard]] absl::Status Put(const SessionShare& share) ABSL_LOCKS_EXCLUDED(mu_);
  // NOT_FOUND when the session has no share for `grantee`.
  [[nodiscard]] absl::Status Remove(const std::string& session_id, const std::string& grantee)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The highest role an unexpired share of `session_id` gives `who`.
  std::optional<ShareRole> RoleFor(const std::string& session_id, const ShareSubject& who) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The session's shares, expired ones included (`expires_us` says so).
  std::vector<SessionShare> OfSession(const std::string& session_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // The unexpired shares that reach `who`, every session's.
  std::vector<SessionShare> SharedWith(const ShareSubject& who) const ABSL_LOCKS_EXCLUDED(mu_);
  // Drops every share of the session (it was deleted).
  [[nodiscard]] absl::Status DeleteSession(const std::string& session_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  SessionShares(Storage& storage, const Clock& clock) : storage_(storage), clock_(clock) {}
  bool Reaches(const SessionShare& s, const ShareSubject& who, int64_t now_us) const;

  Storage& storage_;
  const Clock& clock_;
  mutable Mutex mu_;
  // By session id, then grantee.
  std::map<std::string, std::map<std::string, SessionShare>> by_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
