// Local accounts, and acting as one. A fwaid that runs as root serves other
// users without lending them its rights: file access runs under the user's
// filesystem identity (fsuid, fsgid and supplementary groups, which Linux
// keeps per thread) for the length of a scope, so the kernel checks every
// open as that user; processes started for them drop to the account before
// they exec.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fwai {

struct LocalAccount {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included
  std::string name;
  std::string home;
};

// NOT_FOUND names the uid or user.
[[nodiscard]] absl::StatusOr<LocalAccount> LookupAccount(uint32_t uid);
[[nodiscard]] absl::StatusOr<LocalAccount> LookupAccount(const std::string& name);
// The gid of a group name; NOT_FOUND if there is none.
[[nodiscard]] absl::StatusOr<uint32_t> LookupGroup(const std::string& name);

// True when this process can act as other accounts (it runs as root).
bool CanActAsOtherAccounts();

// While alive, the calling thread opens, creates and lists files as
// `account` (its fsuid, fsgid and groups; root's file capabilities are
// dropped by the kernel meanwhile). Nothing else of the process changes.
// A no-op when `account` is this process's own uid. Not movable: it belongs
// to the thread that made it.
class ScopedFsIdentity {
 public:
  explicit ScopedFsIdentity(const LocalAccount& account);
  ~ScopedFsIdentity();
  ScopedFsIdentity(const ScopedFsIdentity&) = delete;
  ScopedFsIdentity& operator=(const ScopedFsIdentity&) = delete;
  // OK, or why the identity could not be taken (then nothing may be opened).
  const absl::Status& status() const { return status_; }

 private:
  bool switched_ = false;
  uint32_t saved_fsuid_ = 0, saved_fsgid_ = 0;
  std::vector<gid_t> saved_groups_;
  absl::Status status_;
};

// In a forked child before exec: become `account` for good (groups, gid,
// uid; raw system calls only, so it is safe after fork). Returns 0, or an
// errno value.
int BecomeAccountInChild(const LocalAccount& account);

}  // namespace fwai
