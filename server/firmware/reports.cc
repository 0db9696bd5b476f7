#include "server/firmware/reports.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/local_account.h"
#include "server/firmware/artifacts.h"
#include "server/firmware/elf_file.h"
#include "server/firmware/memory.h"
#include "server/firmware/sbom.h"
#include "server/firmware/toolchain.h"

namespace fwai {

absl::Status AccountCanRead(const LocalAccount& account, const std::string& root,
                            const std::vector<std::string>& paths) {
  ScopedFsIdentity as(account);
  if (!as.status().ok()) return as.status();
  for (const auto& p : paths) {
    if (p.empty() || (p.find('/') == std::string::npos && p.find('.') == std::string::npos))
      continue;
    const std::string abs = p[0] == '/' ? p : root + "/" + p;
    int fd = open(abs.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat(abs, ": ", account.name, " cannot read it (", std::strerror(errno), ")"));
    }
    close(fd);
  }
  return absl::OkStatus();
}

namespace {

// The session's account may read every path a tool call names.
absl::Status CallerCanRead(const ToolContext& ctx, const std::vector<std::string>& paths) {
  if (!ctx.account)
    return absl::PermissionDeniedError(
        "firmware reports read the project as a local account; this session has none");
  return AccountCanRead(*ctx.account, ctx.project_root, paths);
}

}  // namespace

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The ELF a build record lists, absolute.
std::string RecordElf(const json& rec, const std::string& root, std::string* sha) {
  for (const auto& a : rec.value("artifacts", json::array())) {
    for (const auto& f : a.value("files", json::array())) {
      if (f.value("format", "") != "elf") continue;
      std::string p = f.value("path", "");
      if (!p.empty() && p[0] != '/') p = (fs::path(root) / p).string();
      if (sha) *sha = f.value("sha256", "");
      return p;
    }
  }
  return "";
}

std::string Resolve(const std::string& path, const std::string& root) {
  if (path.empty() || path[0] == '/' || root.empty()) return path;
  return (fs::path(root) / path).lexically_normal().string();
}

}  // namespace

absl::StatusOr<json> MemoryReportFor(const FirmwareReportDeps& deps, const std::string& root,
                                     const std::string& image_in, const std::string& diff_with) {
  const json latest = deps.latest_build ? deps.latest_build(root) : json();
  std::string latest_sha;
  const std::string latest_elf = latest.is_object() ? RecordElf(latest, root, &latest_sha) : "";
  std::string image = Resolve(image_in, root);
  if (image.empty()) image = latest_elf;
  if (image.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no image: give one (fwai mem build/app.elf), or build the project first "
                     "(fwai run build) in ",
                     root));
  }
  std::error_code ec;
  if (!fs::is_regular_file(image, ec))
    return absl::NotFoundError(absl::StrCat(image, ": no such file"));
  auto digest = HashFile(image);
  if (!digest.ok()) return digest.status();
  json out = {{"image", image}, {"sha256", digest->sha256}};
  // The newest build made this very image: its recorded report and diff.
  if (diff_with.empty() && latest.is_object() && latest_sha == digest->sha256 &&
      latest.contains("memory") && latest["memory"].contains("report")) {
    out["report"] = latest["memory"]["report"];
    if (latest["memory"].contains("diff")) out["diff"] = latest["memory"]["diff"];
    out["source"] = absl::StrCat("build record ", latest.value("run_id", ""));
    return out;
  }
  MemoryOptions mo;
  mo.project_root = root;
  auto report = AnalyzeMemory(image, mo);
  if (!report.ok()) return report.status();
  out["report"] = *report;
  out["source"] = "analysed now";
  json before;
  json against;
  if (diff_with.empty()) {
    if (latest.is_object() && latest.contains("memory") && latest["memory"].contains("report")) {
      before = latest["memory"]["report"];
      against = {{"run_id", latest.value("run_id", "")},
                 {"image", latest["memory"].value("image", "")}};
    }
  } else if (std::string other = Resolve(diff_with, root); fs::is_regular_file(other, ec)) {
    auto r = AnalyzeMemory(other, mo);
    if (!r.ok()) return r.status();
    before = *r;
    against = {{"image", other}};
  } else {
    const json rec = deps.record ? deps.record(diff_with) : json();
    if (!rec.is_object())
      return absl::NotFoundError(
          absl::StrCat("--diff ", diff_with, ": neither a file nor a run in the evidence log"));
    if (!rec.contains("memory") || !rec["memory"].contains("report")) {
      return absl::FailedPreconditionError(
          absl::StrCat("run ", diff_with, " has no memory report (not a build run?)"));
    }
    before = rec["memory"]["report"];
    against = {{"run_id", diff_with}, {"image", rec["memory"].value("image", "")}};
  }
  if (before.is_object()) {
    out["diff"] = DiffMemory(before, *report);
    out["diff"]["against"] = against;
  }
  return out;
}

absl::StatusOr<json> SbomFor(const FirmwareReportDeps& deps, const std::string& root,
                             const std::string& which, const std::string& format) {
  if (!format.empty() && format != "cyclonedx" && format != "spdx") {
    return absl::InvalidArgumentError(
        absl::StrCat("format '", format, "': expected cyclonedx or spdx"));
  }
  json bom;
  std::error_code ec;
  const std::string path = Resolve(which, root);
  const json latest = deps.latest_build ? deps.latest_build(root) : json();
  if (!which.empty() && !fs::is_regular_file(path, ec)) {
    const json rec = deps.record ? deps.record(which) : json();
    if (!rec.is_object())
      return absl::NotFoundError(
          absl::StrCat("'", which, "' is neither an image file nor a run in the evidence log"));
    if (!rec.contains("sbom") || !rec["sbom"].contains("bomFormat")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "run ", which, " has no SBOM",
          rec.contains("sbom") ? absl::StrCat(" (", rec["sbom"].value("error", ""), ")")
                               : " (it built and flashed nothing)"));
    }
    bom = rec["sbom"];
  } else {
    std::string image = path;
    std::string latest_sha;
    const std::string latest_elf = latest.is_object() ? RecordElf(latest, root, &latest_sha) : "";
    if (image.empty()) image = latest_elf;
    if (image.empty())
      return absl::NotFoundError(absl::StrCat(
          "no image: give a run id or an image, or build the project first (fwai run build) in ",
          root));
    auto digest = HashFile(image);
    if (!digest.ok()) return digest.status();
    if (latest.is_object() && latest_sha == digest->sha256 && latest.contains("sbom") &&
        latest["sbom"].contains("bomFormat")) {
      bom = latest["sbom"];
    } else {
      auto elf = ReadElfFile(image, true);
      if (!elf.ok()) return elf.status();
      SbomInput in;
      in.image = image;
      in.project_root = root;
      in.project_name = fs::path(root).filename().string();
      in.tool_version = deps.version;
      ToolchainOptions to;
      to.dpkg_admindir = deps.dpkg_admindir;
      in.toolchain =
          AttestToolchain(elf->machine, elf->units.empty() ? "" : elf->units.front().producer,
                          elf->comments.empty() ? "" : elf->comments.front(), to);
      auto made = MakeSbom(in);
      if (!made.ok()) return made.status();
      bom = *made;
    }
  }
  return format == "spdx" ? SbomToSpdx(bom) : bom;
}

namespace {

class MemoryReportTool final : public Tool {
 public:
  explicit MemoryReportTool(FirmwareReportDeps deps) : deps_(std::move(deps)) {}
  std::string name() const override { return "memoryReport"; }
  std::string description() const override {
    return "Memory use of the firmware image: per region (FLASH, RAM) used and free, per section, "
           "the largest symbols "
           "with file:line, stack use per function (-fstack-usage) and what changed since the "
           "previous build. With no "
           "image, the project's newest build. Use it after a build and before asking to flash.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"image",
           {{"type", "string"},
            {"description", "ELF path (relative to the project); default: the newest build's"}}},
          {"diff",
           {{"type", "string"},
            {"description", "compare with this image or run id instead of the previous build"}}},
          {"top",
           {{"type", "integer"},
            {"description", "how many symbols and functions to list (default 10)"}}},
          {"json", {{"type", "boolean"}, {"description", "the full report as JSON"}}}}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    std::string image = input.value("image", ""), diff = input.value("diff", "");
    if (!image.empty()) {
      auto p = ResolveInRoot(ctx.project_root, image);
      if (!p.ok()) return {std::string(p.status().message()), true};
      image = *p;
    }
    if (auto s = CallerCanRead(ctx, {image, diff}); !s.ok())
      return {std::string(s.message()), true};
    auto r = MemoryReportFor(deps_, ctx.project_root, image, diff);
    if (!r.ok()) return {std::string(r.status().message()), true};
    if (input.value("json", false)) return {r->dump(1), false};
    const int top = std::clamp(input.value("top", 10), 1, 100);
    return {absl::StrCat(MemorySummaryText((*r)["report"], r->value("diff", json()),
                                           static_cast<size_t>(top)),
                         "(", r->value("source", ""), ")\n"),
            false};
  }

 private:
  const FirmwareReportDeps deps_;
};

class SbomTool final : public Tool {
 public:
  explicit SbomTool(FirmwareReportDeps deps) : deps_(std::move(deps)) {}
  std::string name() const override { return "sbom"; }
  std::string description() const override {
    return "The SBOM (CycloneDX 1.6, or SPDX 2.3) of a build or flash run, or of an image: the "
           "firmware's SHA-256, the "
           "toolchain with its Debian package versions and whether dpkg -V verified it, the "
           "libraries and object files "
           "linked and the sources compiled in, with hashes. Default: a summary of the project's "
           "newest build.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"run",
           {{"type", "string"},
            {"description", "a run id or an image path; default: the newest build"}}},
          {"format", {{"type", "string"}, {"enum", {"cyclonedx", "spdx"}}}},
          {"full",
           {{"type", "boolean"}, {"description", "the whole document instead of a summary"}}}}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    std::string which = input.value("run", "");
    if (!which.empty() && which.find('/') != std::string::npos) {
      auto p = ResolveInRoot(ctx.project_root, which);
      if (!p.ok()) return {std::string(p.status().message()), true};
      which = *p;
    }
    if (auto s = CallerCanRead(ctx, {which}); !s.ok()) return {std::string(s.message()), true};
    auto r = SbomFor(deps_, ctx.project_root, which, input.value("format", "cyclonedx"));
    if (!r.ok()) return {std::string(r.status().message()), true};
    if (input.value("full", false) || input.value("format", "cyclonedx") == "spdx")
      return {r->dump(1), false};
    const json fw = (*r)["metadata"]["component"];
    std::string text = absl::StrCat("firmware ", fw.value("name", ""), " sha256 ",
                                    fw["hashes"][0].value("content", ""), "\n");
    for (const auto& p : fw.value("properties", json::array()))
      absl::StrAppend(&text, "  ", p.value("name", ""), ": ", p.value("value", ""), "\n");
    std::map<std::string, int> roles;
    for (const auto& c : (*r)["components"]) {
      std::string role;
      for (const auto& p : c.value("properties", json::array())) {
        if (p.value("name", "") == "fwai:role") role = p.value("value", "");
      }
      ++roles[role];
      if (role == "toolchain") {
        std::string verify;
        for (const auto& p : c.value("properties", json::array())) {
          if (p.value("name", "") == "fwai:dpkg_verify") verify = p.value("value", "");
        }
        absl::StrAppend(&text, "toolchain ", c.value("name", ""), " ", c.value("version", ""),
                        " (dpkg -V ", verify, ")\n");
      }
    }
    absl::StrAppend(&text, roles["library"], " libraries, ", roles["object"], " object files, ",
                    roles["source"],
                    " source files (full: true for the whole CycloneDX document)\n");
    return {text, false};
  }

 private:
  const FirmwareReportDeps deps_;
};

}  // namespace

void RegisterFirmwareTools(ToolRegistry& registry, FirmwareReportDeps deps) {
  registry.Register(std::make_unique<MemoryReportTool>(deps));
  registry.Register(std::make_unique<SbomTool>(std::move(deps)));
}

}  // namespace fwai
