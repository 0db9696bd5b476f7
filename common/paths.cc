#include "common/paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace fwai {
namespace {

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

std::string Home() { return EnvOr("HOME", "/tmp"); }

}  // namespace

std::string DefaultRuntimeDir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && *xdg != '\0') return absl::StrCat(xdg, "/fwai");
  return absl::StrCat("/tmp/fwai-", getuid());
}

std::string DefaultSocketPath() { return DefaultRuntimeDir() + "/fwaid.sock"; }

std::string DefaultDataDir() { return EnvOr("XDG_DATA_HOME", Home() + "/.local/share") + "/fwai"; }

std::string DefaultConfigPath() {
  return EnvOr("XDG_CONFIG_HOME", Home() + "/.config") + "/fwai/fwaid.yaml";
}

absl::Status MakeDirs(const std::string& dir, unsigned mode) {
  std::error_code ec;
  std::filesystem::path p(dir);
  if (p.has_parent_path()) {
    std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create directory ", p.parent_path().string(), ": ", ec.message()));
    }
  }
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", dir, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  if ((st.st_mode & 07777) != mode && chmod(dir.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set mode of ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes, unsigned mode) {
  // Its own temporary name per call: two threads writing the same path
  // (the same content-addressed object, say) never share one.
  static std::atomic<uint64_t> calls{0};
  const std::string tmp = absl::StrCat(path, ".tmp-", getpid(), "-", calls.fetch_add(1));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot sync ", path, ": ", std::strerror(err)));
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot replace ", path, ": ", std::strerror(err)));
  }
  // The rename itself survives a crash once the directory is synced.
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace fwai
