#include "server/tools/project_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/ids.h"

namespace fwai {
namespace {

int OpenBeneath(int dirfd, const std::string& rel, int flags, mode_t mode) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  int fd;
  do {
    fd = static_cast<int>(syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof how));
  } while (fd < 0 && errno == EAGAIN);
  return fd;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<ProjectFs> ProjectFs::Open(const std::string& root) {
  if (root.empty() || root[0] != '/') {
    return absl::FailedPreconditionError(
        "this session has no project root: file tools are not available to it");
  }
  int fd = open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return absl::InvalidArgumentError(
          absl::StrCat("project_root: '", root, "' is not an existing directory"));
    }
    return absl::PermissionDeniedError(
        absl::StrCat("cannot open the project root ", root, ": ", std::strerror(errno)));
  }
  // O_PATH needs no permission on the directory itself: check that the
  // caller may search it, as the file identity in force.
  if (faccessat(fd, ".", X_OK, AT_EACCESS) != 0) {
    int e = errno;
    close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat("the project root ", root, " is not accessible: ", std::strerror(e)));
  }
  return ProjectFs(root, UniqueFd(fd));
}

absl::StatusOr<std::string> ProjectFs::Relative(const std::string& path) const {
  std::string p = path.empty() ? "." : path;
  if (p[0] == '/') {
    if (p == root_) return std::string(".");
    if (!absl::StartsWith(p, root_ + "/")) {
      return absl::PermissionDeniedError(
          absl::StrCat("path '", path, "' is outside the project root ", root_));
    }
    p = p.substr(root_.size() + 1);
  }
  std::string norm = std::filesystem::path(p).lexically_normal().string();
  while (!norm.empty() && norm.back() == '/') norm.pop_back();
  if (norm.empty()) norm = ".";
  return norm;
}

absl::Status ProjectFs::Error(const std::string& rel, int err) const {
  switch (err) {
    case EXDEV:
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat("path '", rel, "' leads outside the project root ", root_));
    case ENOENT:
      return absl::NotFoundError(absl::StrCat(rel, ": no such file or directory"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(rel, ": permission denied"));
    case ENOTDIR:
      return absl::FailedPreconditionError(
          absl::StrCat(rel, ": a part of the path is not a directory"));
    case EISDIR:
      return absl::FailedPreconditionError(absl::StrCat(rel, " is a directory"));
    default:
      return absl::InternalError(absl::StrCat(rel, ": ", std::strerror(err)));
  }
}

absl::StatusOr<UniqueFd> ProjectFs::OpenAt(const std::string& rel, int flags, mode_t mode) const {
  int fd = OpenBeneath(fd_.get(), rel, flags, mode);
  if (fd < 0) return Error(rel, errno);
  return UniqueFd(fd);
}

absl::StatusOr<struct stat> ProjectFs::Stat(const std::string& rel) const {
  auto fd = OpenAt(rel, O_PATH);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  if (fstat(fd->get(), &st) != 0) return Error(rel, errno);
  return st;
}

absl::StatusOr<std::string> ProjectFs::ReadFile(const std::string& rel, size_t max_bytes) const {
  auto fd = OpenAt(rel, O_RDONLY | O_NOCTTY | O_NONBLOCK);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  if (fstat(fd->get(), &st) != 0) return Error(rel, errno);
  if (S_ISDIR(st.st_mode)) return Error(rel, EISDIR);
  if (!S_ISREG(st.st_mode))
    return absl::FailedPreconditionError(absl::StrCat(rel, " is not a regular file"));
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(rel, " has ", st.st_size, " bytes, over the limit of ", max_bytes));
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = read(fd->get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error(rel, errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

absl::Status ProjectFs::Remove(const std::string& rel) const {
  const std::filesystem::path p(rel);
  const std::string up = p.parent_path().string();
  auto dir = OpenAt(up.empty() ? "." : up, O_PATH | O_DIRECTORY);
  if (!dir.ok()) return dir.status();
  if (unlinkat(dir->get(), p.filename().c_str(), 0) != 0) return Error(rel, errno);
  return absl::OkStatus();
}

absl::Status ProjectFs::RemoveEmptyDir(const std::string& rel) const {
  const std::filesystem::path p(rel);
  const std::string up = p.parent_path().string();
  auto dir = OpenAt(up.empty() ? "." : up, O_PATH | O_DIRECTORY);
  if (!dir.ok()) return dir.status();
  if (unlinkat(dir->get(), p.filename().c_str(), AT_REMOVEDIR) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST)
      return absl::FailedPreconditionError(absl::StrCat(rel, " is not empty"));
    return Error(rel, errno);
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> ProjectFs::MakeParents(const std::string& rel) const {
  std::filesystem::path parent = std::filesystem::path(rel).parent_path();
  std::string so_far;
  for (const auto& part : parent) {
    so_far = so_far.empty() ? part.string() : so_far + "/" + part.string();
    int fd = OpenBeneath(fd_.get(), so_far, O_PATH | O_DIRECTORY, 0);
    if (fd >= 0) {
      close(fd);
      continue;
    }
    if (errno != ENOENT) return Error(so_far, errno);
    // Create the missing directory inside its (already checked) parent.
    std::filesystem::path p(so_far);
    std::string up = p.parent_path().string();
    auto dir = OpenAt(up.empty() ? "." : up, O_PATH | O_DIRECTORY);
    if (!dir.ok()) return dir.status();
    if (mkdirat(dir->get(), p.filename().c_str(), 0777) != 0 && errno != EEXIST)
      return Error(so_far, errno);
  }
  const std::string dir = parent.string();
  return OpenAt(dir.empty() ? "." : dir, O_PATH | O_DIRECTORY);
}

absl::Status ProjectFs::WriteFile(const std::string& rel, const std::string& content) const {
  if (rel == "." || rel.empty()) return Error(rel, EISDIR);
  auto dir = MakeParents(rel);
  if (!dir.ok()) return dir.status();
  const std::string name = std::filesystem::path(rel).filename().string();
  mode_t mode = 0666;
  bool existed = false;
  {
    auto st = Stat(rel);
    if (st.ok()) {
      if (S_ISDIR(st->st_mode)) return Error(rel, EISDIR);
      mode = st->st_mode & 07777;
      existed = true;
    } else if (!absl::IsNotFound(st.status())) {
      return st.status();
    }
  }
  // The file is replaced in place when `rel` is a symlink inside the root:
  // renaming over the link would turn it into a plain file.
  struct stat lst {};
  const bool is_link =
      fstatat(dir->get(), name.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode);
  if (is_link) {
    auto fd = OpenAt(rel, O_WRONLY | O_TRUNC | O_NOCTTY);
    if (!fd.ok()) return fd.status();
    for (size_t off = 0; off < content.size();) {
      ssize_t n = write(fd->get(), content.data() + off, content.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Error(rel, errno);
      off += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  const std::string tmp = absl::StrCat(".", name, ".", NewId("w-"), ".fwai-tmp");
  int fd =
      openat(dir->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return Error(rel, errno);
  UniqueFd out(fd);
  for (size_t off = 0; off < content.size();) {
    ssize_t n = write(out.get(), content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      unlinkat(dir->get(), tmp.c_str(), 0);
      return Error(rel, e);
    }
    off += static_cast<size_t>(n);
  }
  if (existed) fchmod(out.get(), mode);  // umask does not narrow a kept mode
  if (renameat(dir->get(), tmp.c_str(), dir->get(), name.c_str()) != 0) {
    int e = errno;
    unlinkat(dir->get(), tmp.c_str(), 0);
    return Error(rel, e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ProjectFs::Entry>> ProjectFs::List(const std::string& rel) const {
  auto fd = OpenAt(rel, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return fd.status();
  DIR* d = fdopendir(fd->get());
  if (d == nullptr) return Error(rel, errno);
  const int dfd = fd->release();
  std::vector<Entry> out;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
      // A link counts as a directory when it leads to one inside the root.
      auto st = Stat(rel == "." ? n : rel + "/" + n);
      is_dir = st.ok() && S_ISDIR(st->st_mode);
    }
    out.push_back({n, is_dir});
  }
  (void)dfd;
  closedir(d);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return out;
}

void ProjectFs::Walk(const std::string& rel, const CancelToken* cancel,
                     const std::function<bool(const std::string&)>& skip,
                     const std::function<bool(const std::string&)>& fn) const {
  std::vector<std::string> stack = {rel};
  while (!stack.empty()) {
    if (cancel && cancel->cancelled()) return;
    const std::string dir = stack.back();
    stack.pop_back();
    auto fd = OpenAt(dir, O_RDONLY | O_DIRECTORY);
    if (!fd.ok()) continue;
    DIR* d = fdopendir(fd->get());
    if (d == nullptr) continue;
    const int dfd = fd->release();
    std::vector<std::pair<std::string, unsigned char>> entries;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") entries.emplace_back(n, e->d_type);
    }
    std::vector<std::string> subdirs;
    std::sort(entries.begin(), entries.end());
    for (auto& [n, type] : entries) {
      if (cancel && cancel->cancelled()) break;
      const std::string path = dir == "." ? n : dir + "/" + n;
      if (type == DT_UNKNOWN) {
        struct stat st {};
        if (fstatat(dfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        type = S_ISDIR(st.st_mode)   ? DT_DIR
               : S_ISLNK(st.st_mode) ? DT_LNK
               : S_ISREG(st.st_mode) ? DT_REG
                                     : DT_UNKNOWN;
      }
      if (type == DT_DIR) {
        if (!skip || !skip(n)) subdirs.push_back(path);
        continue;
      }
      if (type == DT_LNK) {
        // Followed only to a regular file inside the root.
        auto st = Stat(path);
        if (!st.ok() || !S_ISREG(st->st_mode)) continue;
      } else if (type != DT_REG) {
        continue;
      }
      if (!fn(path)) {
        closedir(d);
        return;
      }
    }
    closedir(d);
    // Depth first, in name order.
    for (auto it = subdirs.rbegin(); it != subdirs.rend(); ++it) stack.push_back(*it);
  }
}

}  // namespace fwai
