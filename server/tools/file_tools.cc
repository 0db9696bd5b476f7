#include <fnmatch.h>
#include <re2/re2.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/local_account.h"
#include "server/tools/project_fs.h"
#include "server/tools/tool.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

void ToolRegistry::Register(std::unique_ptr<Tool> tool) {
  std::string n = tool->name();
  WriterMutexLock lock(&mu_);
  tools_[n] = std::move(tool);
}

bool ToolRegistry::Add(std::unique_ptr<Tool> tool) {
  std::string n = tool->name();
  WriterMutexLock lock(&mu_);
  return tools_.emplace(n, std::move(tool)).second;
}

Tool* ToolRegistry::Find(const std::string& name) const {
  ReaderMutexLock lock(&mu_);
  auto it = tools_.find(name);
  return it == tools_.end() || !it->second->available() ? nullptr : it->second.get();
}

std::vector<Tool*> ToolRegistry::All() const {
  ReaderMutexLock lock(&mu_);
  std::vector<Tool*> out;
  for (const auto& [n, t] : tools_) {
    if (t->available()) out.push_back(t.get());
  }
  return out;
}

absl::StatusOr<std::string> ResolveInRoot(const std::string& root, const std::string& path) {
  fs::path p = path.empty() ? fs::path(".") : fs::path(path);
  fs::path joined = p.is_absolute() ? p : fs::path(root) / p;
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(joined, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("path '", path, "': ", ec.message()));
  const std::string r = resolved.string();
  if (r != root && !absl::StartsWith(r, root + "/")) {
    return absl::PermissionDeniedError(
        absl::StrCat("path '", path, "' is outside the project root ", root));
  }
  return r;
}

namespace {

ToolResult Err(std::string msg) { return {std::move(msg), true}; }

bool LooksBinary(const std::string& head) { return head.find('\0') != std::string::npos; }

// Glob with `**` (any number of directories), `*`, `?`, `[...]` -> RE2.
std::string GlobToRegex(const std::string& glob) {
  std::string re = "^";
  for (size_t i = 0; i < glob.size(); ++i) {
    char c = glob[i];
    if (c == '*') {
      if (i + 1 < glob.size() && glob[i + 1] == '*') {
        ++i;
        if (i + 1 < glob.size() && glob[i + 1] == '/') {
          ++i;
          re += "(?:.*/)?";
        } else {
          re += ".*";
        }
      } else {
        re += "[^/]*";
      }
    } else if (c == '?') {
      re += "[^/]";
    } else if (c == '[') {
      size_t j = glob.find(']', i + 1);
      if (j == std::string::npos) {
        re += "\\[";
      } else {
        std::string cls = glob.substr(i + 1, j - i - 1);
        if (!cls.empty() && cls[0] == '!') cls[0] = '^';
        re += "[" + cls + "]";
        i = j;
      }
    } else if (c == '{') {
      size_t j = glob.find('}', i + 1);
      if (j == std::string::npos) {
        re += "\\{";
      } else {
        std::string alts = glob.substr(i + 1, j - i - 1);
        re += "(?:";
        for (char a : alts) re += (a == ',') ? std::string("|") : RE2::QuoteMeta(std::string(1, a));
        re += ")";
        i = j;
      }
    } else {
      re += RE2::QuoteMeta(std::string(1, c));
    }
  }
  return re + "$";
}

bool SkipDirName(const std::string& n) {
  return n == ".git" || n == "node_modules" || n == ".fwai" || n == "__pycache__";
}

constexpr size_t kMaxReadBytes = 64u << 20;

// ---------------------------------------------------------------------------
class ReadFileTool final : public Tool {
 public:
  std::string name() const override { return "read_file"; }
  std::string description() const override {
    return "Read a text file of the project. Lines are numbered. Use offset/limit for large "
           "files (line ranges are 1-based).";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"path", {{"type", "string"}, {"description", "Path relative to the project root"}}},
              {"offset", {{"type", "integer"}, {"description", "First line to read (1-based)"}}},
              {"limit", {{"type", "integer"}, {"description", "Number of lines to read"}}}}},
            {"required", {"path"}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }

  ToolResult Run(const json& in, ToolContext& ctx) override {
    if (!in.contains("path") || !in["path"].is_string()) return Err("path: required string");
    if (!in.value("offset", json(1)).is_number_integer()) return Err("offset: expected an integer");
    if (!in.value("limit", json(1)).is_number_integer()) return Err("limit: expected an integer");
    const std::string path = in["path"].get<std::string>();
    int64_t offset = in.value("offset", 1);
    int64_t limit = in.value("limit", 2000);
    if (offset < 1) return Err("offset: must be >= 1");
    if (limit < 1) return Err("limit: must be >= 1");
    return InProject(ctx, [&](const ProjectFs& pfs) -> ToolResult {
      auto rel = pfs.Relative(path);
      if (!rel.ok()) return Err(std::string(rel.status().message()));
      auto st = pfs.Stat(*rel);
      if (!st.ok()) return Err(std::string(st.status().message()));
      if (S_ISDIR(st->st_mode)) return Err(absl::StrCat(path, " is a directory; use list_dir"));
      if (!S_ISREG(st->st_mode)) return Err(absl::StrCat(path, " is not a regular file"));
      auto text = pfs.ReadFile(*rel, kMaxReadBytes);
      if (!text.ok()) return Err(std::string(text.status().message()));
      const int64_t cap = ctx.limits ? ctx.limits->read_file_max_bytes : 256 * 1024;
      if (LooksBinary(text->substr(0, 512)))
        return Err(absl::StrCat(path, " looks like a binary file"));
      std::string out;
      int64_t n = 0, shown = 0;
      bool truncated = false;
      std::istringstream f(*text);
      std::string line;
      while (std::getline(f, line)) {
        ++n;
        if (n < offset) continue;
        if (shown >= limit) {
          truncated = true;
          break;
        }
        std::string numbered = absl::StrCat(n, "\t", line, "\n");
        if (static_cast<int64_t>(out.size() + numbered.size()) > cap) {
          truncated = true;
          break;
        }
        out += numbered;
        ++shown;
      }
      if (n < offset && n > 0)
        return Err(absl::StrCat("offset ", offset, " is past the end (", n, " lines)"));
      if (truncated)
        absl::StrAppend(&out, "... (truncated; continue with offset=", offset + shown, ")\n");
      return {out, false};
    });
  }
};

class ListDirTool final : public Tool {
 public:
  std::string name() const override { return "list_dir"; }
  std::string description() const override {
    return "List the entries of a project directory (directories end with '/').";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"path",
               {{"type", "string"},
                {"description", "Directory relative to the project root; default '.'"}}}}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& in, ToolContext& ctx) override {
    std::string path =
        in.contains("path") && in["path"].is_string() ? in["path"].get<std::string>() : ".";
    return InProject(ctx, [&](const ProjectFs& pfs) -> ToolResult {
      auto rel = pfs.Relative(path);
      if (!rel.ok()) return Err(std::string(rel.status().message()));
      auto st = pfs.Stat(*rel);
      if (!st.ok()) return Err(std::string(st.status().message()));
      if (!S_ISDIR(st->st_mode)) return Err(absl::StrCat(path, " is not a directory"));
      auto entries = pfs.List(*rel);
      if (!entries.ok())
        return Err(absl::StrCat("cannot list ", path, ": ", entries.status().message()));
      const size_t cap = ctx.limits ? ctx.limits->list_dir_max_entries : 1000;
      std::string out;
      for (size_t i = 0; i < entries->size() && i < cap; ++i) {
        absl::StrAppend(&out, (*entries)[i].name, (*entries)[i].is_dir ? "/" : "", "\n");
      }
      if (entries->size() > cap) absl::StrAppend(&out, "... (", entries->size() - cap, " more)\n");
      if (entries->empty()) out = "(empty directory)\n";
      return {out, false};
    });
  }
};

class GrepTool final : public Tool {
 public:
  std::string name() const override { return "grep"; }
  std::string description() const override {
    return "Search project files for a regular expression (RE2 syntax). Returns file:line: text.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"pattern", {{"type", "string"}, {"description", "RE2 regular expression"}}},
          {"path",
           {{"type", "string"}, {"description", "Directory or file to search; default '.'"}}},
          {"include",
           {{"type", "string"}, {"description", "Glob the file path must match, e.g. '**/*.c'"}}},
          {"ignore_case", {{"type", "boolean"}}},
          {"max_results", {{"type", "integer"}}}}},
        {"required", {"pattern"}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& in, ToolContext& ctx) override {
    if (!in.contains("pattern") || !in["pattern"].is_string())
      return Err("pattern: required string");
    RE2::Options opt;
    opt.set_case_sensitive(!(in.contains("ignore_case") && in["ignore_case"].is_boolean() &&
                             in["ignore_case"].get<bool>()));
    opt.set_log_errors(false);
    RE2 re(in["pattern"].get<std::string>(), opt);
    if (!re.ok()) return Err(absl::StrCat("pattern: invalid regular expression: ", re.error()));
    std::unique_ptr<RE2> include;
    if (in.contains("include") && in["include"].is_string()) {
      include = std::make_unique<RE2>(GlobToRegex(in["include"].get<std::string>()));
      if (!include->ok()) return Err("include: invalid glob");
    }
    std::string path =
        in.contains("path") && in["path"].is_string() ? in["path"].get<std::string>() : ".";
    int cap = ctx.limits ? ctx.limits->grep_max_results : 200;
    if (in.contains("max_results") && in["max_results"].is_number_integer()) {
      cap = std::clamp(in["max_results"].get<int>(), 1, cap);
    }
    return InProject(ctx, [&](const ProjectFs& pfs) -> ToolResult {
      auto rel = pfs.Relative(path);
      if (!rel.ok()) return Err(std::string(rel.status().message()));
      auto st = pfs.Stat(*rel);
      if (!st.ok()) return Err(std::string(st.status().message()));
      std::string out;
      int hits = 0;
      bool more = false;
      auto scan = [&](const std::string& file) {
        if (include && !RE2::FullMatch(file, *include)) return true;
        auto text = pfs.ReadFile(file, 8u << 20);  // larger files are skipped
        if (!text.ok()) return true;
        std::istringstream f(*text);
        std::string line;
        int n = 0;
        while (std::getline(f, line)) {
          ++n;
          if (line.find('\0') != std::string::npos) return true;  // binary
          if (RE2::PartialMatch(line, re)) {
            if (hits >= cap) {
              more = true;
              return false;
            }
            if (line.size() > 300) line = line.substr(0, 300) + "...";
            absl::StrAppend(&out, file, ":", n, ": ", line, "\n");
            ++hits;
          }
        }
        return true;
      };
      if (S_ISREG(st->st_mode)) {
        scan(*rel);
      } else {
        pfs.Walk(*rel, ctx.cancel, SkipDirName, scan);
      }
      if (hits == 0) return {"no matches\n", false};
      if (more) absl::StrAppend(&out, "... (more matches; narrow the pattern or path)\n");
      return {out, false};
    });
  }
};

class GlobTool final : public Tool {
 public:
  std::string name() const override { return "glob"; }
  std::string description() const override {
    return "Find project files whose path matches a glob ('**' matches any number of "
           "directories), e.g. 'src/**/*.c'.";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties", {{"pattern", {{"type", "string"}}}}},
            {"required", {"pattern"}}};
  }
  bool read_only() const override { return true; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& in, ToolContext& ctx) override {
    if (!in.contains("pattern") || !in["pattern"].is_string())
      return Err("pattern: required string");
    std::string pattern = in["pattern"].get<std::string>();
    if (absl::StartsWith(pattern, "./")) pattern = pattern.substr(2);
    if (absl::StrContains(pattern, "..")) return Err("pattern: '..' is not allowed");
    RE2 re(GlobToRegex(pattern));
    if (!re.ok()) return Err("pattern: invalid glob");
    const int cap = ctx.limits ? ctx.limits->glob_max_results : 1000;
    return InProject(ctx, [&](const ProjectFs& pfs) -> ToolResult {
      std::vector<std::string> found;
      bool more = false;
      pfs.Walk(".", ctx.cancel, SkipDirName, [&](const std::string& rel) {
        if (RE2::FullMatch(rel, re)) {
          if (static_cast<int>(found.size()) >= cap) {
            more = true;
            return false;
          }
          found.push_back(rel);
        }
        return true;
      });
      std::sort(found.begin(), found.end());
      std::string out;
      for (const auto& f : found) absl::StrAppend(&out, f, "\n");
      if (found.empty()) out = "no files match\n";
      if (more) absl::StrAppend(&out, "... (more files; narrow the pattern)\n");
      return {out, false};
    });
  }
};

}  // namespace

ToolResult InProject(ToolContext& ctx, const std::function<ToolResult(const ProjectFs&)>& fn) {
  if (ctx.project_root.empty()) {
    return Err(
        "this session has no project: file and command tools need a session created with a project "
        "root "
        "(fwai chat in a project directory, or --project-root)");
  }
  if (!ctx.account) {
    return Err(absl::StrCat("the project ", ctx.project_root,
                            " is read and written as a local account, and this session has none "
                            "(a token or certificate user needs local_user in fwaid.yaml)"));
  }
  ScopedFsIdentity as(*ctx.account);
  if (!as.status().ok())
    return Err(absl::StrCat("cannot act as ", ctx.account->name, ": ", as.status().message()));
  auto pfs = ProjectFs::Open(ctx.project_root);
  if (!pfs.ok()) return Err(std::string(pfs.status().message()));
  return fn(*pfs);
}

void RegisterFileTools(ToolRegistry& registry) {
  registry.Register(std::make_unique<ReadFileTool>());
  registry.Register(std::make_unique<ListDirTool>());
  registry.Register(std::make_unique<GrepTool>());
  registry.Register(std::make_unique<GlobTool>());
}

}  // namespace fwai
