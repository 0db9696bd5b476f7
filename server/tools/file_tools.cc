#include <fnmatch.h>
#include <re2/re2.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "server/tools/tool.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

void ToolRegistry::Register(std::unique_ptr<Tool> tool) {
  std::string n = tool->name();
  std::unique_lock<std::shared_mutex> lock(mu_);
  tools_[n] = std::move(tool);
}

bool ToolRegistry::Add(std::unique_ptr<Tool> tool) {
  std::string n = tool->name();
  std::unique_lock<std::shared_mutex> lock(mu_);
  return tools_.emplace(n, std::move(tool)).second;
}

Tool* ToolRegistry::Find(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = tools_.find(name);
  return it == tools_.end() || !it->second->available() ? nullptr : it->second.get();
}

std::vector<Tool*> ToolRegistry::All() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
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

std::string Rel(const std::string& root, const fs::path& p) {
  std::string s = p.string();
  if (s == root) return ".";
  if (absl::StartsWith(s, root + "/")) return s.substr(root.size() + 1);
  return s;
}

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

bool SkipDir(const fs::path& p) {
  const std::string n = p.filename().string();
  return n == ".git" || n == "node_modules" || n == ".fwai" || n == "__pycache__";
}

// Walks regular files under `dir` (skipping VCS and dependency folders,
// staying inside `root`), calling fn(path) until it returns false.
void Walk(const std::string& root, const fs::path& dir, CancelToken* cancel,
          const std::function<bool(const fs::path&)>& fn) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (cancel && cancel->cancelled()) return;
    const auto& entry = *it;
    std::error_code e2;
    if (entry.is_directory(e2)) {
      if (SkipDir(entry.path()) || entry.is_symlink(e2)) it.disable_recursion_pending();
      continue;
    }
    if (entry.is_symlink(e2)) {
      auto target = ResolveInRoot(root, entry.path().string());
      if (!target.ok()) continue;  // a link leading outside the root is invisible
    }
    if (!entry.is_regular_file(e2)) continue;
    if (!fn(entry.path())) return;
  }
}

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

  ToolResult Run(const json& in, ToolContext& ctx) override {
    if (!in.contains("path") || !in["path"].is_string()) return Err("path: required string");
    auto p = ResolveInRoot(ctx.project_root, in["path"].get<std::string>());
    if (!p.ok()) return Err(std::string(p.status().message()));
    int64_t offset = in.value("offset", 1);
    int64_t limit = in.value("limit", 2000);
    if (offset < 1) return Err("offset: must be >= 1");
    if (limit < 1) return Err("limit: must be >= 1");
    std::error_code ec;
    if (fs::is_directory(*p, ec)) return Err(absl::StrCat(in["path"].get<std::string>(), " is a directory; use list_dir"));
    std::ifstream f(*p, std::ios::binary);
    if (!f) return Err(absl::StrCat("cannot open ", in["path"].get<std::string>(), ": no such file or not readable"));
    const int64_t cap = ctx.limits ? ctx.limits->read_file_max_bytes : 256 * 1024;
    std::string out, line;
    int64_t n = 0, shown = 0;
    bool truncated = false;
    std::string head(512, '\0');
    f.read(head.data(), head.size());
    head.resize(f.gcount());
    if (LooksBinary(head)) return Err(absl::StrCat(in["path"].get<std::string>(), " looks like a binary file"));
    f.clear();
    f.seekg(0);
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
    if (n < offset && n > 0) return Err(absl::StrCat("offset ", offset, " is past the end (", n, " lines)"));
    if (truncated) {
      absl::StrAppend(&out, "... (truncated; continue with offset=", offset + shown, ")\n");
    }
    return {out, false};
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
            {"properties", {{"path", {{"type", "string"}, {"description", "Directory relative to the project root; default '.'"}}}}}};
  }
  bool read_only() const override { return true; }
  ToolResult Run(const json& in, ToolContext& ctx) override {
    std::string path = in.contains("path") && in["path"].is_string() ? in["path"].get<std::string>() : ".";
    auto p = ResolveInRoot(ctx.project_root, path);
    if (!p.ok()) return Err(std::string(p.status().message()));
    std::error_code ec;
    if (!fs::is_directory(*p, ec)) return Err(absl::StrCat(path, " is not a directory"));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(*p, fs::directory_options::skip_permission_denied, ec)) {
      std::error_code e2;
      names.push_back(e.path().filename().string() + (e.is_directory(e2) ? "/" : ""));
    }
    if (ec) return Err(absl::StrCat("cannot list ", path, ": ", ec.message()));
    std::sort(names.begin(), names.end());
    const size_t cap = ctx.limits ? ctx.limits->list_dir_max_entries : 1000;
    std::string out;
    for (size_t i = 0; i < names.size() && i < cap; ++i) absl::StrAppend(&out, names[i], "\n");
    if (names.size() > cap) absl::StrAppend(&out, "... (", names.size() - cap, " more)\n");
    if (names.empty()) out = "(empty directory)\n";
    return {out, false};
  }
};

class GrepTool final : public Tool {
 public:
  std::string name() const override { return "grep"; }
  std::string description() const override {
    return "Search project files for a regular expression (RE2 syntax). Returns file:line: text.";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"pattern", {{"type", "string"}, {"description", "RE2 regular expression"}}},
              {"path", {{"type", "string"}, {"description", "Directory or file to search; default '.'"}}},
              {"include", {{"type", "string"}, {"description", "Glob the file path must match, e.g. '**/*.c'"}}},
              {"ignore_case", {{"type", "boolean"}}},
              {"max_results", {{"type", "integer"}}}}},
            {"required", {"pattern"}}};
  }
  bool read_only() const override { return true; }
  ToolResult Run(const json& in, ToolContext& ctx) override {
    if (!in.contains("pattern") || !in["pattern"].is_string()) return Err("pattern: required string");
    RE2::Options opt;
    opt.set_case_sensitive(!in.value("ignore_case", false));
    opt.set_log_errors(false);
    RE2 re(in["pattern"].get<std::string>(), opt);
    if (!re.ok()) return Err(absl::StrCat("pattern: invalid regular expression: ", re.error()));
    std::unique_ptr<RE2> include;
    if (in.contains("include") && in["include"].is_string()) {
      include = std::make_unique<RE2>(GlobToRegex(in["include"].get<std::string>()));
      if (!include->ok()) return Err("include: invalid glob");
    }
    std::string path = in.contains("path") && in["path"].is_string() ? in["path"].get<std::string>() : ".";
    auto p = ResolveInRoot(ctx.project_root, path);
    if (!p.ok()) return Err(std::string(p.status().message()));
    int cap = ctx.limits ? ctx.limits->grep_max_results : 200;
    if (in.contains("max_results") && in["max_results"].is_number_integer()) {
      cap = std::clamp(in["max_results"].get<int>(), 1, cap);
    }
    std::string out;
    int hits = 0;
    bool more = false;
    auto scan = [&](const fs::path& file) {
      const std::string rel = Rel(ctx.project_root, file);
      if (include && !RE2::FullMatch(rel, *include)) return true;
      std::error_code ec;
      if (fs::file_size(file, ec) > (8u << 20)) return true;
      std::ifstream f(file, std::ios::binary);
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
          absl::StrAppend(&out, rel, ":", n, ": ", line, "\n");
          ++hits;
        }
      }
      return true;
    };
    std::error_code ec;
    if (fs::is_regular_file(*p, ec)) {
      scan(*p);
    } else {
      Walk(ctx.project_root, *p, ctx.cancel, scan);
    }
    if (hits == 0) return {"no matches\n", false};
    if (more) absl::StrAppend(&out, "... (more matches; narrow the pattern or path)\n");
    return {out, false};
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
  ToolResult Run(const json& in, ToolContext& ctx) override {
    if (!in.contains("pattern") || !in["pattern"].is_string()) return Err("pattern: required string");
    std::string pattern = in["pattern"].get<std::string>();
    if (absl::StartsWith(pattern, "./")) pattern = pattern.substr(2);
    if (absl::StrContains(pattern, "..")) return Err("pattern: '..' is not allowed");
    RE2 re(GlobToRegex(pattern));
    if (!re.ok()) return Err("pattern: invalid glob");
    const int cap = ctx.limits ? ctx.limits->glob_max_results : 1000;
    std::vector<std::string> found;
    bool more = false;
    Walk(ctx.project_root, ctx.project_root, ctx.cancel, [&](const fs::path& f) {
      std::string rel = Rel(ctx.project_root, f);
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
  }
};

}  // namespace

void RegisterFileTools(ToolRegistry& registry) {
  registry.Register(std::make_unique<ReadFileTool>());
  registry.Register(std::make_unique<ListDirTool>());
  registry.Register(std::make_unique<GrepTool>());
  registry.Register(std::make_unique<GlobTool>());
}

}  // namespace fwai
