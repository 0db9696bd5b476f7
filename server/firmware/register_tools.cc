#include "server/firmware/register_tools.h"

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "server/project/project.h"

namespace fwai {
namespace fs = std::filesystem;

SvdCatalog MakeSvdCatalog(const std::string& data_dir) {
  std::error_code ec;
  std::string shipped;
  if (const char* env = std::getenv("FWAI_SVD_DIR"); env && *env) {
    shipped = env;
  } else {
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    const fs::path installed = exe.parent_path().parent_path() / "share" / "fwai" / "svd";
    shipped = !ec && fs::is_directory(installed, ec) ? installed.string()
                                                     : std::string(FWAI_SOURCE_SVD_DIR);
  }
  return SvdCatalog({shipped}, data_dir.empty() ? "" : (fs::path(data_dir) / "svd").string());
}

FileAccess AccountFileAccess(const LocalAccount* account) {
  FileAccess local = LocalFileAccess();
  if (!account) return local;
  const LocalAccount who = *account;
  FileAccess a;
  a.read = [who, local](const std::string& path,
                        uint64_t max_bytes) -> absl::StatusOr<std::string> {
    ScopedFsIdentity as(who);
    if (!as.status().ok()) return as.status();
    return local.read(path, max_bytes);
  };
  a.list = [who, local](const std::string& dir, const std::function<bool(const std::string&)>& skip)
      -> absl::StatusOr<std::vector<std::string>> {
    ScopedFsIdentity as(who);
    if (!as.status().ok()) return as.status();
    return local.list(dir, skip);
  };
  a.is_dir = [who, local](const std::string& path) {
    ScopedFsIdentity as(who);
    return as.status().ok() && local.is_dir(path);
  };
  return a;
}

namespace {

// The project's svd: and target: (read as `account`); a project.yaml that
// does not parse is an error naming it.
absl::Status FillProjectDevice(const FileAccess& access, const LocalAccount* account,
                               RegisterCheckRequest& req) {
  const std::string yaml = (fs::path(req.project_root) / ".fwai" / "project.yaml").string();
  auto text = access.read(yaml, 1 << 20);
  if (text.ok()) {
    auto settings = ParseProjectYaml(*text, ".fwai/project.yaml");
    if (!settings.ok()) return settings.status();
    req.project_svd = settings->svd;
    req.project_target = settings->target;
  }
  if (req.project_target.empty() && req.project_svd.empty()) {
    std::optional<ScopedFsIdentity> as;
    if (account) as.emplace(*account);
    if (as && !as->status().ok()) return as->status();
    req.project_target = DetectProject(req.project_root).target;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<nlohmann::json> CheckProjectRegisters(const SvdCatalog& catalog,
                                                     const LocalAccount* account,
                                                     RegisterCheckRequest req) {
  const FileAccess access = AccountFileAccess(account);
  if (req.svd.empty() && req.target.empty()) {
    if (auto s = FillProjectDevice(access, account, req); !s.ok()) return s;
  }
  return CheckRegisters(catalog, access, req);
}

std::string RegisterNoteAfterWrite(const SvdCatalog& catalog, ToolContext& ctx,
                                   const std::string& rel, const std::set<int>& lines) {
  if (!IsCSourceName(rel) || !ctx.account || ctx.project_root.empty()) return "";
  RegisterCheckRequest req;
  req.project_root = ctx.project_root;
  req.only_lines = {{rel, lines}};
  auto report = CheckProjectRegisters(catalog, ctx.account, std::move(req));
  if (!report.ok() || (*report)["findings"].empty()) return "";
  return absl::StrCat("\n\nRegister check of the lines written, against ",
                      (*report)["checked"].value("svd", ""), " (fix these before building):\n",
                      RegisterFindingsText(*report));
}

namespace {

class CheckRegistersTool final : public Tool {
 public:
  explicit CheckRegistersTool(const SvdCatalog* catalog) : catalog_(catalog) {}
  std::string name() const override { return "checkRegisters"; }
  std::string description() const override {
    return "Check register addresses and bit fields in the project's C/C++ code against the "
           "device's CMSIS-SVD "
           "(the vendor's register map): wrong or misaligned addresses, reserved bits, read-only "
           "fields written, "
           "field macros at the wrong position. Each finding says what the code says, what the SVD "
           "says and a fix. "
           "Use it after writing register code and before building.";
  }
  nlohmann::json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"paths",
               {{"type", "array"},
                {"items", {{"type", "string"}}},
                {"description",
                 "Files or directories relative to the project (default: all its sources)"}}},
              {"target",
               {{"type", "string"},
                {"description", "The part, e.g. stm32f100rb (default: the project's)"}}},
              {"svd",
               {{"type", "string"},
                {"description", "An SVD file in the project (default: the project's)"}}},
              {"json", {{"type", "boolean"}, {"description", "The report as JSON"}}}}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }
  ToolResult Run(const nlohmann::json& input, ToolContext& ctx) override {
    if (!ctx.account)
      return {"checkRegisters reads the project as a local account, and this session has none",
              true};
    RegisterCheckRequest req;
    req.project_root = ctx.project_root;
    if (input.contains("paths")) {
      if (!input["paths"].is_array()) return {"paths: expected a list of paths", true};
      for (const auto& p : input["paths"]) {
        if (!p.is_string()) return {"paths: expected a list of paths", true};
        req.paths.push_back(p.get<std::string>());
      }
    }
    req.target = input.value("target", "");
    req.svd = input.value("svd", "");
    auto report = CheckProjectRegisters(*catalog_, ctx.account, std::move(req));
    if (!report.ok()) return {std::string(report.status().message()), true};
    if (input.value("json", false)) return {report->dump(1), false};
    return {RegisterFindingsText(*report), false};
  }

 private:
  const SvdCatalog* catalog_;
};

}  // namespace

void RegisterRegisterTools(ToolRegistry& registry, const SvdCatalog* catalog) {
  registry.Register(std::make_unique<CheckRegistersTool>(catalog));
}

}  // namespace fwai
