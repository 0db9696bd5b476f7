#include "common/local_account.h"

#include <grp.h>
#include <pwd.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fwai {
namespace {

absl::StatusOr<LocalAccount> FromPasswd(const passwd& pw) {
  LocalAccount a;
  a.uid = pw.pw_uid;
  a.gid = pw.pw_gid;
  a.name = pw.pw_name;
  a.home = pw.pw_dir ? pw.pw_dir : "";
  int n = 64;
  std::vector<gid_t> groups(n);
  while (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    if (n > 65536) return absl::InternalError(absl::StrCat("groups of ", pw.pw_name, ": too many"));
    groups.resize(static_cast<size_t>(n) * 2);
    n = static_cast<int>(groups.size());
  }
  groups.resize(n);
  a.groups = std::move(groups);
  return a;
}

}  // namespace

absl::StatusOr<LocalAccount> LookupAccount(uint32_t uid) {
  passwd pw{}, *res = nullptr;
  std::vector<char> buf(16384);
  int rc = getpwuid_r(uid, &pw, buf.data(), buf.size(), &res);
  if (rc != 0 || res == nullptr)
    return absl::NotFoundError(absl::StrCat("no local account has uid ", uid));
  return FromPasswd(pw);
}

absl::StatusOr<LocalAccount> LookupAccount(const std::string& name) {
  passwd pw{}, *res = nullptr;
  std::vector<char> buf(16384);
  int rc = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &res);
  if (rc != 0 || res == nullptr)
    return absl::NotFoundError(absl::StrCat("no local account named '", name, "'"));
  return FromPasswd(pw);
}

absl::StatusOr<uint32_t> LookupGroup(const std::string& name) {
  group gr{}, *res = nullptr;
  std::vector<char> buf(16384);
  int rc = getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &res);
  if (rc != 0 || res == nullptr)
    return absl::NotFoundError(absl::StrCat("no group named '", name, "'"));
  return gr.gr_gid;
}

bool CanActAsOtherAccounts() { return geteuid() == 0; }

// The raw system calls change the calling thread only; glibc's wrappers for
// setgroups and friends would change every thread of the process.
ScopedFsIdentity::ScopedFsIdentity(const LocalAccount& a) {
  if (a.uid == geteuid()) return;
  if (!CanActAsOtherAccounts()) {
    status_ = absl::PermissionDeniedError(absl::StrCat(
        "fwaid runs as uid ", geteuid(), " and cannot act as ", a.name, " (uid ", a.uid, ")"));
    return;
  }
  int n = static_cast<int>(syscall(SYS_getgroups, 0, nullptr));
  saved_groups_.resize(n > 0 ? n : 0);
  if (n > 0) syscall(SYS_getgroups, n, saved_groups_.data());
  saved_fsuid_ = static_cast<uint32_t>(syscall(SYS_setfsuid, -1));
  saved_fsgid_ = static_cast<uint32_t>(syscall(SYS_setfsgid, -1));
  if (syscall(SYS_setgroups, a.groups.size(), a.groups.data()) != 0) {
    status_ = absl::PermissionDeniedError(
        absl::StrCat("setgroups for ", a.name, ": ", std::strerror(errno)));
    return;
  }
  switched_ = true;
  syscall(SYS_setfsgid, a.gid);
  syscall(SYS_setfsuid, a.uid);
  // setfsuid reports no error: read the identity back.
  if (static_cast<uint32_t>(syscall(SYS_setfsuid, -1)) != a.uid ||
      static_cast<uint32_t>(syscall(SYS_setfsgid, -1)) != a.gid) {
    status_ =
        absl::PermissionDeniedError(absl::StrCat("cannot take the file identity of ", a.name));
  }
}

ScopedFsIdentity::~ScopedFsIdentity() {
  if (!switched_) return;
  syscall(SYS_setfsuid, saved_fsuid_);
  syscall(SYS_setfsgid, saved_fsgid_);
  syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data());
}

int BecomeAccountInChild(const LocalAccount& a) {
  // Already that account (a fwaid serving its own user): nothing to drop.
  if (static_cast<uint32_t>(getuid()) == a.uid && getuid() != 0) return 0;
  if (syscall(SYS_setgroups, a.groups.size(), a.groups.data()) != 0) return errno;
  if (syscall(SYS_setresgid, a.gid, a.gid, a.gid) != 0) return errno;
  if (syscall(SYS_setresuid, a.uid, a.uid, a.uid) != 0) return errno;
  return 0;
}

}  // namespace fwai
