#include "server/firmware/toolchain.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "server/firmware/artifacts.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ToolPrefixFor(int machine) {
  switch (machine) {
    case 40:
      return "arm-none-eabi-";  // EM_ARM
    case 83:
      return "avr-";  // EM_AVR
    case 243:
      return "riscv64-unknown-elf-";  // EM_RISCV
    case 105:
      return "msp430-";  // EM_MSP430
    case 94:
      return "xtensa-lx106-elf-";  // EM_XTENSA
    default:
      return "";
  }
}

namespace {

std::vector<std::string> DpkgArgs(const ToolchainOptions& o) {
  std::vector<std::string> argv = {"dpkg"};
  if (!o.dpkg_admindir.empty()) argv.push_back("--admindir=" + o.dpkg_admindir);
  return argv;
}

std::string AdminDir(const ToolchainOptions& o) {
  return o.dpkg_admindir.empty() ? "/var/lib/dpkg" : o.dpkg_admindir;
}

std::string Output(const std::vector<std::string>& argv, int timeout_ms = 20000) {
  ProcessOptions po;
  po.timeout_ms = timeout_ms;
  auto r = RunProcess(argv, po);
  if (!r.ok() || r->exit_code != 0) return "";
  return std::string(absl::StripAsciiWhitespace(r->out));
}

// The state of a file for the cache: a change of content changes its ctime.
std::string StatKey(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return path + ":missing;";
  return absl::StrCat(path, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":",
                      st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec, ":", st.st_ino, ";");
}

std::string PackageInfoFile(const std::string& admindir, const std::string& pkg,
                            const std::string& ext) {
  std::error_code ec;
  for (const std::string& name : {pkg + "." + ext, pkg + ":amd64." + ext, pkg + ":arm64." + ext}) {
    fs::path p = fs::path(admindir) / "info" / name;
    if (fs::exists(p, ec)) return p.string();
  }
  return (fs::path(admindir) / "info" / (pkg + "." + ext)).string();
}

// Every file the packages installed, with dpkg's own records of them.
std::string Fingerprint(const std::vector<std::string>& binaries,
                        const std::vector<std::string>& packages, const std::string& admindir) {
  std::string fp;
  for (const auto& b : binaries) fp += StatKey(b);
  fp += StatKey((fs::path(admindir) / "status").string());
  for (const auto& pkg : packages) {
    const std::string list = PackageInfoFile(admindir, pkg, "list");
    fp += StatKey(list) + StatKey(PackageInfoFile(admindir, pkg, "md5sums"));
    std::ifstream in(list);
    std::string line;
    while (std::getline(in, line)) {
      struct stat st {};
      if (lstat(line.c_str(), &st) == 0 && S_ISREG(st.st_mode)) fp += StatKey(line);
    }
  }
  return fp;
}

struct Cached {
  std::string fingerprint;
  json verify;
};
Mutex cache_mu;  // Cache() and Found()
std::map<std::string, Cached>& Cache() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu) {
  static auto* cache = new std::map<std::string, Cached>();
  return *cache;
}

// What gcc and dpkg said about a toolchain's files.
struct Discovered {
  std::string status_stat;  // dpkg's status file when asked
  std::string files_stat;   // the files when hashed
  json binaries, packages;
  bool all_packaged = false;
};
std::map<std::string, Discovered>& Found() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu) {
  static auto* found = new std::map<std::string, Discovered>();
  return *found;
}

// A toolchain's files, their packages and whether every file is packaged.
struct ToolchainFiles {
  std::vector<std::string> binaries, packages;
  bool all_packaged = true;
};

// What an earlier attestation found, while neither the files nor dpkg's
// status have changed since (fills out's binaries and packages); false if
// nothing may be reused.
bool ReuseFound(const std::string& found_key, const std::string& status_stat, json& out,
                ToolchainFiles& t) {
  MutexLock lock(&cache_mu);
  auto it = Found().find(found_key);
  if (it == Found().end() || it->second.status_stat != status_stat) return false;
  std::string now;
  for (const auto& b : it->second.binaries) now += StatKey(b["path"].get<std::string>());
  if (now != it->second.files_stat) return false;
  out["binaries"] = it->second.binaries;
  out["packages"] = it->second.packages;
  for (const auto& b : it->second.binaries) t.binaries.push_back(b["path"]);
  for (const auto& p : it->second.packages) t.packages.push_back(p["name"]);
  t.all_packaged = it->second.all_packaged;
  return true;
}

// The programs that turn sources into the image, and the C library, by role.
std::vector<std::pair<std::string, std::string>> ToolchainPrograms(const std::string& gcc) {
  std::vector<std::pair<std::string, std::string>> files = {{"compiler driver", gcc}};
  for (const auto& [role, arg] :
       std::vector<std::pair<std::string, std::string>>{{"compiler", "-print-prog-name=cc1"},
                                                        {"assembler", "-print-prog-name=as"},
                                                        {"linker", "-print-prog-name=ld"},
                                                        {"c library", "-print-file-name=libc.a"}}) {
    std::string p = Output({gcc, arg});
    if (p.empty() || p.find('/') == std::string::npos) continue;
    std::error_code ec;
    fs::path canonical = fs::canonical(p, ec);
    if (!ec) files.push_back({role, canonical.string()});
  }
  return files;
}

// One dpkg -S for all of them: "gcc-arm-none-eabi: /usr/bin/arm-none-eabi-gcc"
// per file it knows (a file it does not know only makes it exit 1).
std::map<std::string, std::string> PackageOwners(
    const std::vector<std::pair<std::string, std::string>>& files, const ToolchainOptions& o) {
  auto argv = DpkgArgs(o);
  argv.push_back("-S");
  for (const auto& [role, path] : files) argv.push_back(path);
  std::map<std::string, std::string> owner_of;
  ProcessOptions po;
  po.timeout_ms = 20000;
  if (auto r = RunProcess(argv, po); r.ok() && !r->timed_out) {
    for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty())) {
      const size_t sep = line.find(": ");
      if (sep == absl::string_view::npos) continue;
      owner_of[std::string(absl::StripAsciiWhitespace(line.substr(sep + 2)))] =
          std::string(line.substr(0, sep));
    }
  }
  return owner_of;
}

// Asks gcc and dpkg which files, their hashes, packages and package versions
// (into out), and remembers the answer for ReuseFound.
void DiscoverFiles(const std::string& gcc, const std::string& found_key,
                   const std::string& status_stat, const ToolchainOptions& o, json& out,
                   ToolchainFiles& t) {
  const auto files = ToolchainPrograms(gcc);
  const auto owner_of = PackageOwners(files, o);
  for (const auto& [role, path] : files) {
    json b = {{"role", role}, {"path", path}};
    if (auto d = HashFile(path); d.ok()) b["sha256"] = d->sha256;
    auto owner = owner_of.find(path);
    const std::string pkg =
        owner == owner_of.end() ? "" : owner->second.substr(0, owner->second.find(':'));
    if (pkg.empty() || pkg.find(' ') != std::string::npos || pkg.find(',') != std::string::npos) {
      t.all_packaged = false;
      b["package"] = "";
    } else {
      b["package"] = pkg;
      if (std::find(t.packages.begin(), t.packages.end(), pkg) == t.packages.end())
        t.packages.push_back(pkg);
    }
    t.binaries.push_back(path);
    out["binaries"].push_back(std::move(b));
  }
  for (const auto& pkg : t.packages) {
    std::vector<std::string> q = {"dpkg-query"};
    if (!o.dpkg_admindir.empty()) q.push_back("--admindir=" + o.dpkg_admindir);
    q.insert(q.end(), {"-W", "-f=${Version}\t${Architecture}", pkg});
    std::vector<std::string> f = absl::StrSplit(Output(q), '\t');
    out["packages"].push_back({{"name", pkg},
                               {"version", f.size() > 0 ? f[0] : ""},
                               {"architecture", f.size() > 1 ? f[1] : ""}});
  }
  Discovered d{status_stat, "", out["binaries"], out["packages"], t.all_packaged};
  for (const auto& b : t.binaries) d.files_stat += StatKey(b);
  MutexLock lock(&cache_mu);
  Found()[found_key] = std::move(d);
}

// dpkg -V of the packages: ok, the command and what it found.
json RunDpkgVerify(const std::vector<std::string>& packages, const ToolchainOptions& o) {
  auto argv = DpkgArgs(o);
  argv.push_back("-V");
  argv.insert(argv.end(), packages.begin(), packages.end());
  ProcessOptions po;
  po.timeout_ms = 120000;
  auto r = RunProcess(argv, po);
  json problems = json::array();
  bool ok = r.ok() && !r->timed_out;
  if (r.ok()) {
    for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipEmpty()))
      problems.push_back(std::string(line));
    for (absl::string_view line : absl::StrSplit(r->err, '\n', absl::SkipEmpty())) {
      if (absl::StrContains(line, "warning")) continue;
      problems.push_back(std::string(line));
    }
  } else {
    problems.push_back(std::string(r.status().message()));
  }
  ok = ok && problems.empty() && r->exit_code == 0;
  return {{"ok", ok},
          {"command", absl::StrJoin(argv, " ")},
          {"problems", problems},
          {"checked_us", NowMicros()},
          {"reused", false}};
}

// dpkg -V, reused while nothing of these packages changed.
json VerifyPackages(const ToolchainFiles& t, const std::string& admindir,
                    const ToolchainOptions& o) {
  const std::string key = absl::StrCat(admindir, "|", absl::StrJoin(t.packages, ","));
  const std::string fp = Fingerprint(t.binaries, t.packages, admindir);
  {
    MutexLock lock(&cache_mu);
    auto it = Cache().find(key);
    if (it != Cache().end() && it->second.fingerprint == fp) {
      json verify = it->second.verify;
      verify["reused"] = true;
      return verify;
    }
  }
  json verify = RunDpkgVerify(t.packages, o);
  MutexLock lock(&cache_mu);
  Cache()[key] = {fp, verify};
  return verify;
}

}  // namespace

json AttestToolchain(int machine, const std::string& producer, const std::string& comment,
                     const ToolchainOptions& o) {
  json out = {{"producer", producer},
              {"comment", comment},
              {"binaries", json::array()},
              {"packages", json::array()},
              {"verified", false}};
  const std::string prefix = ToolPrefixFor(machine);
  out["prefix"] = prefix;
  if (prefix.empty()) {
    out["error"] = absl::StrCat("no known toolchain for ELF machine ", machine);
    return out;
  }
  const std::string gcc = FindProgram(prefix + "gcc");
  if (gcc.empty()) {
    out["error"] = absl::StrCat(prefix, "gcc is not on PATH");
    return out;
  }
  // Which files, their hashes and their packages: asked of gcc and dpkg once
  // (dpkg -S reads every package's file list: most of a second), then reused
  // while neither the files nor dpkg's status have changed.
  const std::string admindir = AdminDir(o);
  const std::string found_key = absl::StrCat(admindir, "|", gcc);
  const std::string status_stat = StatKey((fs::path(admindir) / "status").string());
  ToolchainFiles t;
  const bool reused = ReuseFound(found_key, status_stat, out, t) && !t.binaries.empty();
  out["files_reused"] = reused;
  if (!reused) {
    t = ToolchainFiles{};
    DiscoverFiles(gcc, found_key, status_stat, o, out, t);
  }
  if (t.packages.empty()) {
    out["error"] = absl::StrCat("the toolchain (", gcc, ") is not from a Debian package");
    out["dpkg_verify"] = {{"ok", false}, {"problems", json::array()}};
    return out;
  }
  out["dpkg_verify"] = VerifyPackages(t, admindir, o);
  out["verified"] = t.all_packaged && out["dpkg_verify"].value("ok", false);
  if (!t.all_packaged) out["error"] = "some toolchain files are not from a Debian package";
  return out;
}

}  // namespace fwai
