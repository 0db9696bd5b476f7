#include "common/paths.h"

#include <sys/stat.h>
#include <unistd.h>

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

std::string DefaultDataDir() {
  return EnvOr("XDG_DATA_HOME", Home() + "/.local/share") + "/fwai";
}

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

}  // namespace fwai
