// ProjectFs: a project root opened once, and every file under it opened
// relative to that descriptor by the kernel (openat2 with RESOLVE_BENEATH).
// `..` past the root, absolute paths and symlinks that lead outside fail at
// the open itself: no window between a check and the use. Opens run with the
// calling thread's file identity (ScopedFsIdentity), so the owner's own
// permissions apply too.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cancel.h"

namespace fwai {

// A file descriptor that closes itself.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

class ProjectFs {
 public:
  struct Entry {
    std::string name;
    bool is_dir = false;
  };

  // Opens `root` (canonical, absolute) as the calling thread's identity.
  [[nodiscard]] static absl::StatusOr<ProjectFs> Open(const std::string& root);
  ProjectFs(ProjectFs&&) = default;
  ProjectFs& operator=(ProjectFs&&) = default;

  const std::string& root() const { return root_; }
  // `path` relative to the root, or absolute and lexically inside it, as a
  // normalised relative path ("." for the root itself). PERMISSION_DENIED
  // for an absolute path elsewhere; `..` is left to the kernel.
  [[nodiscard]] absl::StatusOr<std::string> Relative(const std::string& path) const;
  // Opens `rel` beneath the root (O_CLOEXEC added). PERMISSION_DENIED when
  // it leads outside the root; NOT_FOUND when it does not exist.
  [[nodiscard]] absl::StatusOr<UniqueFd> OpenAt(const std::string& rel, int flags,
                                                mode_t mode = 0) const;
  // stat of what `rel` names (symlinks inside the root followed).
  [[nodiscard]] absl::StatusOr<struct stat> Stat(const std::string& rel) const;
  // The whole file, at most `max_bytes` (FAILED_PRECONDITION past it).
  [[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& rel,
                                                     size_t max_bytes) const;
  // Replaces or creates `rel` with `content`: parents created, a temp file
  // in the same directory renamed over it, an existing file's mode kept.
  [[nodiscard]] absl::Status WriteFile(const std::string& rel, const std::string& content) const;
  // Removes the file (or symlink) `rel`; never a directory. NOT_FOUND when
  // it is not there.
  [[nodiscard]] absl::Status Remove(const std::string& rel) const;
  // Removes directory `rel` if it is empty (FAILED_PRECONDITION if not).
  [[nodiscard]] absl::Status RemoveEmptyDir(const std::string& rel) const;
  // The entries of directory `rel`, sorted by name.
  [[nodiscard]] absl::StatusOr<std::vector<Entry>> List(const std::string& rel) const;
  // Regular files under directory `rel` (relative paths from the root), in
  // name order, not descending into symlinked directories or into names
  // `skip` accepts; a link to a file outside the root is not seen. Stops
  // when `fn` returns false or `cancel` fires.
  void Walk(const std::string& rel, const CancelToken* cancel,
            const std::function<bool(const std::string&)>& skip,
            const std::function<bool(const std::string&)>& fn) const;

 private:
  ProjectFs(std::string root, UniqueFd fd) : root_(std::move(root)), fd_(std::move(fd)) {}
  absl::Status Error(const std::string& rel, int err) const;
  absl::StatusOr<UniqueFd> MakeParents(const std::string& rel) const;

  std::string root_;
  UniqueFd fd_;
};

}  // namespace fwai
