#include "server/firmware/check_registers.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/mutex.h"
#include "common/utf8.h"
#include "server/firmware/register_check.h"

namespace fwai {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxSourceBytes = 4 << 20;
constexpr uint64_t kMaxSvdBytes = 64 << 20;

std::string Lower(std::string s) {
  absl::AsciiStrToLower(&s);
  return s;
}

std::string Extension(const std::string& path) {
  return Lower(fs::path(path).extension().string());
}

bool IsHeaderName(const std::string& path) {
  const std::string e = Extension(path);
  return e == ".h" || e == ".hh" || e == ".hpp" || e == ".hxx";
}

// A part's name as SVD files are named: "STM32F100xx.svd" serves "stm32f100rb".
std::string PartStem(const std::string& file) {
  std::string stem = Lower(fs::path(file).stem().string());
  while (absl::EndsWith(stem, "x")) stem.pop_back();
  return stem;
}

bool IsBuildOutputDir(const std::string& name) {
  return name == ".git" || name == ".fwai" || name == "node_modules" || name == "build" ||
         absl::StartsWith(name, "build-") || absl::StartsWith(name, "cmake-build-") ||
         name == ".pio";
}

// `path` made relative to `root` when inside it (lexically); nullopt when not.
std::optional<std::string> InsideProject(const std::string& root, const std::string& path) {
  const fs::path r = fs::path(root).lexically_normal();
  const fs::path p = (fs::path(path).is_absolute() ? fs::path(path) : r / path).lexically_normal();
  const fs::path rel = p.lexically_relative(r);
  if (rel.empty() || *rel.begin() == "..") return std::nullopt;
  return rel == "." ? std::string(".") : rel.string();
}

}  // namespace

bool IsCSourceName(const std::string& path) {
  static const std::set<std::string> kExtensions = {".c",   ".h",  ".cc",  ".cpp",
                                                    ".cxx", ".hh", ".hpp", ".hxx"};
  return kExtensions.count(Extension(path)) > 0;
}

FileAccess LocalFileAccess() {
  FileAccess a;
  a.read = [](const std::string& path, uint64_t max_bytes) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return errno == EACCES
                 ? absl::PermissionDeniedError(absl::StrCat(path, ": permission denied"))
                 : absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (!ec && size > max_bytes) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": ", size, " bytes, over the ", max_bytes, " a check reads"));
    }
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  a.list = [](const std::string& dir, const std::function<bool(const std::string&)>& skip)
      -> absl::StatusOr<std::vector<std::string>> {
    std::error_code ec;
    std::vector<std::string> out;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      const auto& e = *it;
      if (e.is_directory(ec) && !e.is_symlink(ec)) {
        if (skip(e.path().filename().string())) it.disable_recursion_pending();
        continue;
      }
      if (e.is_regular_file(ec)) out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  a.is_dir = [](const std::string& path) {
    std::error_code ec;
    return fs::is_directory(path, ec);
  };
  return a;
}

// ---- SvdCatalog ----

struct SvdCatalog::Cache {
  struct Entry {
    int64_t size = 0;
    int64_t mtime_ns = 0;
    std::shared_ptr<const SvdDevice> device;
  };
  Mutex mu;
  std::map<std::string, Entry> entries ABSL_GUARDED_BY(mu);
};

SvdCatalog::SvdCatalog(std::vector<std::string> dirs, std::string added_dir)
    : dirs_(std::move(dirs)), added_dir_(std::move(added_dir)), cache_(std::make_unique<Cache>()) {
  if (!added_dir_.empty()) dirs_.push_back(added_dir_);
}
SvdCatalog::~SvdCatalog() = default;

absl::StatusOr<std::string> SvdCatalog::Add(std::string_view xml, const std::string& name) const {
  if (added_dir_.empty()) return absl::FailedPreconditionError("no directory for added SVDs");
  auto device = ParseSvdDevice(xml, name);
  if (!device.ok()) return device.status();
  const std::string& dev = device->name;
  const bool plain = !dev.empty() && dev.size() <= 64 && dev[0] != '.' &&
                     std::all_of(dev.begin(), dev.end(), [](char c) {
                       return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                              c == '-' || c == '.';
                     });
  if (!plain)
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": its device name '", dev, "' is no file name"));
  std::error_code ec;
  fs::create_directories(added_dir_, ec);
  const fs::path final_path = fs::path(added_dir_) / (dev + ".svd");
  const fs::path tmp = fs::path(added_dir_) / ("." + dev + ".svd.tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(xml.data(), static_cast<std::streamsize>(xml.size()));
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  fs::rename(tmp, final_path, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot keep ", final_path.string(), ": ", ec.message()));
  return dev;
}

std::vector<std::string> SvdCatalog::Parts() const {
  std::set<std::string> parts;
  for (const auto& dir : dirs_) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (Extension(it->path().string()) == ".svd") parts.insert(it->path().stem().string());
    }
  }
  return {parts.begin(), parts.end()};
}

absl::StatusOr<std::string> SvdCatalog::FindForPart(const std::string& part) const {
  const std::string want = Lower(std::string(absl::StripAsciiWhitespace(part)));
  std::string best;
  size_t best_len = 0;
  for (const auto& dir : dirs_) {
    std::error_code ec;
    std::vector<fs::path> files;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (Extension(it->path().string()) == ".svd") files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const std::string stem = PartStem(f.string());
      if (!stem.empty() && absl::StartsWith(want, stem) && stem.size() > best_len) {
        best = f.string();
        best_len = stem.size();
      }
    }
  }
  if (best.empty()) {
    const auto parts = Parts();
    return absl::NotFoundError(absl::StrCat(
        "no SVD for part '", part, "'",
        parts.empty() ? "" : absl::StrCat(" (parts with an SVD: ", absl::StrJoin(parts, ", "), ")"),
        "; give one with --svd FILE, or add it with `fwai kb add FILE.svd`"));
  }
  return best;
}

absl::StatusOr<std::shared_ptr<const SvdDevice>> SvdCatalog::Load(const FileAccess& access,
                                                                  const std::string& path) const {
  bool ours = false;
  for (const auto& dir : dirs_) ours = ours || InsideProject(dir, path).has_value();
  const std::string name = fs::path(path).filename().string();
  if (!ours) {
    auto text = access.read(path, kMaxSvdBytes);
    if (!text.ok()) return text.status();
    auto d = ParseSvdDevice(*text, name);
    if (!d.ok()) return d.status();
    return std::make_shared<const SvdDevice>(std::move(*d));
  }
  // fwaid's own SVDs: read as fwaid, parsed once per version of the file.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  {
    MutexLock lock(&cache_->mu);
    auto it = cache_->entries.find(path);
    if (it != cache_->entries.end() && it->second.size == st.st_size &&
        it->second.mtime_ns == mtime) {
      return it->second.device;
    }
  }
  auto text = LocalFileAccess().read(path, kMaxSvdBytes);
  if (!text.ok()) return text.status();
  auto d = ParseSvdDevice(*text, name);
  if (!d.ok()) return d.status();
  auto device = std::make_shared<const SvdDevice>(std::move(*d));
  MutexLock lock(&cache_->mu);
  cache_->entries[path] = {st.st_size, mtime, device};
  return device;
}

// ---- The check ----

namespace {

struct Sources {
  std::vector<std::pair<std::string, std::string>> files;  // (path as read, path as reported)
  nlohmann::json skipped = nlohmann::json::array();
};

void Skip(Sources& s, const std::string& path, const std::string& why) {
  s.skipped.push_back({{"path", path}, {"why", why}});
}

Sources CollectSources(const FileAccess& access, const std::string& root,
                       const std::vector<std::string>& paths) {
  Sources s;
  const std::vector<std::string> wanted = paths.empty() ? std::vector<std::string>{"."} : paths;
  std::set<std::string> seen;
  auto add = [&](const std::string& full, const std::string& rel) {
    if (seen.insert(rel).second) s.files.emplace_back(full, rel);
  };
  for (const auto& p : wanted) {
    auto rel = InsideProject(root, p);
    if (!rel) {
      Skip(s, p, "outside the project: only the project's files are checked");
      continue;
    }
    const std::string full = *rel == "." ? root : (fs::path(root) / *rel).string();
    if (access.is_dir(full)) {
      auto files = access.list(full, IsBuildOutputDir);
      if (!files.ok()) {
        Skip(s, p, std::string(files.status().message()));
        continue;
      }
      for (const auto& f : *files) {
        if (!IsCSourceName(f)) continue;
        if (auto r = InsideProject(root, f)) add(f, *r);
      }
    } else {
      add(full, *rel);  // named: checked whatever its extension
    }
  }
  // Headers first: their macros serve every source.
  std::stable_sort(s.files.begin(), s.files.end(), [](const auto& a, const auto& b) {
    return IsHeaderName(a.second) && !IsHeaderName(b.second);
  });
  return s;
}

absl::StatusOr<std::string> ChooseSvd(const SvdCatalog& catalog, const RegisterCheckRequest& req) {
  auto in_project = [&](const std::string& f) {
    return fs::path(f).is_absolute() ? f : (fs::path(req.project_root) / f).string();
  };
  if (!req.svd.empty()) return in_project(req.svd);
  if (!req.target.empty()) return catalog.FindForPart(req.target);
  if (!req.project_svd.empty()) return in_project(req.project_svd);
  if (!req.project_target.empty()) {
    auto found = catalog.FindForPart(req.project_target);
    if (!found.ok()) {
      return absl::NotFoundError(absl::StrCat("the project's target: ", found.status().message(),
                                              ", or set svd: in .fwai/project.yaml"));
    }
    return found;
  }
  const auto parts = catalog.Parts();
  return absl::InvalidArgumentError(absl::StrCat(
      "which device? give --svd FILE or --target PART, or set target: (or svd:) in "
      ".fwai/project.yaml",
      parts.empty() ? "" : absl::StrCat("; parts with an SVD: ", absl::StrJoin(parts, ", "))));
}

void KeepOnlyLines(nlohmann::json& report, const std::map<std::string, std::set<int>>& only) {
  nlohmann::json kept = nlohmann::json::array();
  int errors = 0, warnings = 0;
  for (const auto& f : report["findings"]) {
    auto it = only.find(f.value("file", ""));
    if (it == only.end() || !it->second.count(f.value("line", 0))) continue;
    (f.value("severity", "") == "error" ? errors : warnings)++;
    kept.push_back(f);
  }
  report["findings"] = std::move(kept);
  report["checked"]["errors"] = errors;
  report["checked"]["warnings"] = warnings;
}

}  // namespace

absl::StatusOr<nlohmann::json> CheckRegisters(const SvdCatalog& catalog, const FileAccess& access,
                                              const RegisterCheckRequest& req) {
  if (req.project_root.empty() || !access.is_dir(req.project_root)) {
    return absl::InvalidArgumentError(
        absl::StrCat("project root '", req.project_root, "' is not a directory"));
  }
  auto svd_path = ChooseSvd(catalog, req);
  if (!svd_path.ok()) return absl::InvalidArgumentError(svd_path.status().message());
  auto device = catalog.Load(access, *svd_path);
  if (!device.ok()) return absl::InvalidArgumentError(device.status().message());
  Sources sources = CollectSources(access, req.project_root, req.paths);
  RegisterChecker checker(**device);
  for (const auto& [full, rel] : sources.files) {
    auto text = access.read(full, kMaxSourceBytes);
    if (!text.ok()) {
      Skip(sources, rel, std::string(text.status().message()));
      continue;
    }
    if (text->find('\0') != std::string::npos) {
      Skip(sources, rel, "a binary file, not C or C++ source");
      continue;
    }
    if (!IsValidUtf8(*text)) {
      size_t at = 0;
      while (at < text->size() && Utf8SequenceLength(*text, at) > 0)
        at += Utf8SequenceLength(*text, at);
      Skip(sources, rel, absl::StrCat("not UTF-8 (byte ", at, " is not)"));
      continue;
    }
    checker.Check(rel, *text);
  }
  nlohmann::json report = checker.ToJson();
  report["checked"]["svd_path"] = *svd_path;
  report["skipped"] = std::move(sources.skipped);
  if (!req.only_lines.empty()) KeepOnlyLines(report, req.only_lines);
  return report;
}

nlohmann::json RegisterFindingsSarif(const nlohmann::json& report) {
  std::set<std::string> kinds;
  nlohmann::json results = nlohmann::json::array();
  for (const auto& f : report.value("findings", nlohmann::json::array())) {
    const std::string kind = f.value("kind", "");
    kinds.insert(kind);
    results.push_back({
        {"ruleId", kind},
        {"level", f.value("severity", "error") == "error" ? "error" : "warning"},
        {"message",
         {{"text", absl::StrCat(f.value("code_says", ""), "; the SVD: ", f.value("svd_says", ""),
                                " (", f.value("source", ""), "). Fix: ", f.value("fix", ""))}}},
        {"locations",
         {{{"physicalLocation",
            {{"artifactLocation", {{"uri", f.value("file", "")}, {"uriBaseId", "PROJECTROOT"}}},
             {"region",
              {{"startLine", std::max(1, f.value("line", 1))},
               {"startColumn", std::max(1, f.value("column", 1))}}}}}}}},
        {"properties", {{"symbol", f.value("symbol", "")}, {"source", f.value("source", "")}}},
    });
  }
  nlohmann::json rules = nlohmann::json::array();
  for (const auto& k : kinds) rules.push_back({{"id", k}, {"name", k}});
  return {{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
          {"version", "2.1.0"},
          {"runs",
           {{{"tool", {{"driver", {{"name", "fwai check registers"}, {"rules", rules}}}}},
             {"results", results}}}}};
}

std::string RegisterFindingsText(const nlohmann::json& report) {
  std::string out;
  for (const auto& f : report.value("findings", nlohmann::json::array())) {
    absl::StrAppend(&out, f.value("file", ""), ":", f.value("line", 0), ":", f.value("column", 0),
                    ": ", f.value("severity", ""), " [", f.value("kind", ""), "] ",
                    f.value("symbol", ""), "\n", "  code: ", f.value("code_says", ""), "\n",
                    "  SVD:  ", f.value("svd_says", ""), " (", f.value("source", ""), ")\n",
                    "  fix:  ", f.value("fix", ""), "\n");
  }
  for (const auto& s : report.value("skipped", nlohmann::json::array())) {
    absl::StrAppend(&out, s.value("path", ""), ": not checked: ", s.value("why", ""), "\n");
  }
  const auto& c = report["checked"];
  absl::StrAppend(&out, "checked ", c.value("files", 0), " file(s), ", c.value("lines", 0),
                  " lines, ", c.value("accesses", 0), " register accesses against ",
                  c.value("svd", ""), ": ", c.value("errors", 0), " error(s), ",
                  c.value("warnings", 0), " warning(s)\n");
  return out;
}

}  // namespace fwai
