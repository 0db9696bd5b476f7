// write_file, edit_file and bash: the tools that change things. Every write
// and command passes the policy check first; bash runs in the sandbox.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/tools/process_runner.h"
#include "server/tools/project_fs.h"
#include "server/tools/tool.h"

namespace fwai {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

ToolResult Err(std::string msg) { return {std::move(msg), true}; }

constexpr size_t kMaxEditBytes = 64u << 20;

absl::Status Check(ToolContext& ctx, const std::string& kind, const std::string& target,
                   const std::string& tool, int lines = 0) {
  if (!ctx.policy) return absl::OkStatus();
  return ctx.policy(PolicyQuery{kind, target, tool, lines});
}

// Lines only on one side, counted with multiplicity (like git's numstat, without moves).
int LinesChanged(const std::string& before, const std::string& after) {
  std::map<std::string_view, int> count;
  auto each = [](const std::string& text, auto&& fn) {
    size_t start = 0;
    while (start < text.size()) {
      size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      fn(std::string_view(text).substr(start, nl - start));
      start = nl + 1;
    }
  };
  each(before, [&](std::string_view l) { count[l]++; });
  each(after, [&](std::string_view l) { count[l]--; });
  int n = 0;
  for (const auto& [l, c] : count) n += c < 0 ? -c : c;
  return n;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out = absl::StrSplit(s, '\n');
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

// A unified-style diff of one replaced region, with context.
std::string RegionDiff(const std::string& path, const std::string& before, size_t pos,
                       size_t old_len, const std::string& replacement) {
  const size_t line_start = before.rfind('\n', pos == 0 ? 0 : pos - 1);
  const size_t first = line_start == std::string::npos || pos == 0 ? 0 : line_start + 1;
  size_t end = before.find('\n', pos + old_len);
  if (end == std::string::npos) end = before.size();
  const std::string old_block = before.substr(first, end - first);
  const std::string new_block = before.substr(first, pos - first) + replacement +
                                before.substr(pos + old_len, end - pos - old_len);
  const int line_no =
      1 + static_cast<int>(
              std::count(before.begin(), before.begin() + static_cast<ptrdiff_t>(first), '\n'));
  std::string out = absl::StrCat("--- a/", path, "\n+++ b/", path, "\n");
  auto ol = Lines(old_block), nl = Lines(new_block);
  absl::StrAppend(&out, "@@ -", line_no, ",", ol.size(), " +", line_no, ",", nl.size(), " @@\n");
  for (const auto& l : ol) absl::StrAppend(&out, "-", l, "\n");
  for (const auto& l : nl) absl::StrAppend(&out, "+", l, "\n");
  return out;
}

// The 1-based lines of `text` that the bytes [from, to) lie on.
void AddLines(const std::string& text, size_t from, size_t to, std::set<int>& lines) {
  const int first =
      1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(from), '\n'));
  const int last = first + static_cast<int>(std::count(
                               text.begin() + static_cast<long>(from),
                               text.begin() + static_cast<long>(std::max(from, to)), '\n'));
  for (int l = first; l <= last; ++l) lines.insert(l);
}

// The result, with what the hook says of the lines written.
ToolResult AfterWrite(const WriteToolHooks& hooks, ToolContext& ctx, ToolResult r,
                      const std::string& rel, const std::set<int>& lines) {
  if (r.is_error || rel.empty() || !hooks.after_write) return r;
  r.content += hooks.after_write(ctx, rel, lines);
  return r;
}

class WriteFileTool final : public Tool {
 public:
  explicit WriteFileTool(WriteToolHooks hooks) : hooks_(std::move(hooks)) {}
  std::string name() const override { return "write_file"; }
  std::string description() const override {
    return "Create or overwrite a file in the project with the given content (parent directories "
           "are created).";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"path", {{"type", "string"}, {"description", "Path relative to the project root"}}},
              {"content", {{"type", "string"}, {"description", "The whole new content"}}}}},
            {"required", {"path", "content"}}};
  }
  bool read_only() const override { return false; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    if (!input.contains("path") || !input["path"].is_string())
      return Err("path: expected a string");
    if (!input.contains("content") || !input["content"].is_string())
      return Err("content: expected a string");
    const std::string path = input["path"].get<std::string>();
    const std::string& content = input["content"].get_ref<const std::string&>();
    std::string written;
    ToolResult r = InProject(ctx, [&](const ProjectFs& pfs) -> ToolResult {
      auto rel = pfs.Relative(path);
      if (!rel.ok()) return Err(std::string(rel.status().message()));
      written = *rel;
      auto st = pfs.Stat(*rel);
      if (!st.ok() && !absl::IsNotFound(st.status()))
        return Err(std::string(st.status().message()));
      const bool existed = st.ok();
      if (existed && S_ISDIR(st->st_mode)) return Err(absl::StrCat(*rel, " is a directory"));
      std::string before;
      if (existed) {
        auto text = pfs.ReadFile(*rel, kMaxEditBytes);
        if (!text.ok()) return Err(std::string(text.status().message()));
        before = std::move(*text);
      }
      if (auto s = Check(ctx, "write", *rel, name(), LinesChanged(before, content)); !s.ok()) {
        return Err(std::string(s.message()));
      }
      if (auto s = pfs.WriteFile(*rel, content); !s.ok()) return Err(std::string(s.message()));
      return {absl::StrCat(existed ? "replaced " : "created ", *rel, " (", content.size(),
                           " bytes, ", Lines(content).size(), " lines)"),
              false};
    });
    std::set<int> lines;
    AddLines(content, 0, content.size(), lines);
    return AfterWrite(hooks_, ctx, std::move(r), written, lines);
  }

 private:
  const WriteToolHooks hooks_;
};

class EditFileTool final : public Tool {
 public:
  explicit EditFileTool(WriteToolHooks hooks) : hooks_(std::move(hooks)) {}
  std::string name() const override { return "edit_file"; }
  std::string description() const override {
    return "Replace an exact string in a project file. old_string must occur exactly once (include "
           "enough "
           "surrounding lines to make it unique) unless replace_all is true. Returns the diff.";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"path", {{"type", "string"}}},
              {"old_string", {{"type", "string"}, {"description", "Exact text to replace"}}},
              {"new_string", {{"type", "string"}, {"description", "Replacement text"}}},
              {"replace_all", {{"type", "boolean"}}}}},
            {"required", {"path", "old_string", "new_string"}}};
  }
  bool read_only() const override { return false; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    for (const char* k : {"path", "old_string", "new_string"}) {
      if (!input.contains(k) || !input[k].is_string())
        return Err(absl::StrCat(k, ": expected a string"));
    }
    const std::string path = input["path"].get<std::string>();
    std::string written;
    std::set<int> lines;
    ToolResult r = InProject(ctx, [&](const ProjectFs& pfs) -> ToolResult {
      return Edit(input, ctx, pfs, path, written, lines);
    });
    return AfterWrite(hooks_, ctx, std::move(r), written, lines);
  }

 private:
  // Sets `written` and the `lines` of the new text the replacements are on.
  ToolResult Edit(const json& input, ToolContext& ctx, const ProjectFs& pfs,
                  const std::string& path, std::string& written, std::set<int>& lines) {
    auto relp = pfs.Relative(path);
    if (!relp.ok()) return Err(std::string(relp.status().message()));
    const std::string rel = *relp;
    auto read = pfs.ReadFile(rel, kMaxEditBytes);
    if (!read.ok()) {
      if (absl::IsNotFound(read.status()))
        return Err(absl::StrCat(rel, ": no such file (use write_file to create it)"));
      return Err(std::string(read.status().message()));
    }
    std::string text = std::move(*read);
    const std::string& old_s = input["old_string"].get_ref<const std::string&>();
    const std::string& new_s = input["new_string"].get_ref<const std::string&>();
    if (old_s.empty()) return Err("old_string: empty");
    if (old_s == new_s) return Err("old_string and new_string are the same");
    size_t count = 0;
    for (size_t p = text.find(old_s); p != std::string::npos;
         p = text.find(old_s, p + old_s.size()))
      ++count;
    if (count == 0)
      return Err(absl::StrCat("old_string not found in ", rel,
                              " (it must match exactly, whitespace included)"));
    const bool all = input.contains("replace_all") && input["replace_all"].is_boolean() &&
                     input["replace_all"].get<bool>();
    if (count > 1 && !all) {
      return Err(absl::StrCat("old_string occurs ", count, " times in ", rel,
                              "; add surrounding lines to make it unique, or set replace_all"));
    }
    std::string diff;
    std::string out;
    std::vector<std::pair<size_t, size_t>> spans;  // the new text's replacements
    size_t last = 0;
    for (size_t p = text.find(old_s); p != std::string::npos;
         p = text.find(old_s, p + old_s.size())) {
      if (diff.size() < 8000) diff += RegionDiff(rel, text, p, old_s.size(), new_s);
      out.append(text, last, p - last);
      spans.emplace_back(out.size(), out.size() + new_s.size());
      out += new_s;
      last = p + old_s.size();
    }
    out.append(text, last, std::string::npos);
    if (auto s = Check(ctx, "write", rel, name(), LinesChanged(text, out)); !s.ok())
      return Err(std::string(s.message()));
    if (auto s = pfs.WriteFile(rel, out); !s.ok()) return Err(std::string(s.message()));
    written = rel;
    for (const auto& [from, to] : spans) AddLines(out, from, to, lines);
    return {absl::StrCat("edited ", rel, " (", count, count == 1 ? " replacement" : " replacements",
                         ")\n", diff),
            false};
  }

  const WriteToolHooks hooks_;
};

class BashTool final : public Tool {
 public:
  std::string name() const override { return "bash"; }
  std::string description() const override {
    return "Run a shell command in the project root (bash -c) and return its output and exit code. "
           "Runs in a "
           "sandbox: the project is writable, the rest of the system read-only, no network unless "
           "policy allows.";
  }
  json input_schema() const override {
    return {{"type", "object"},
            {"properties",
             {{"command", {{"type", "string"}}},
              {"timeout_s",
               {{"type", "integer"},
                {"description", "Time limit in seconds (default 120, max 1800)"}}}}},
            {"required", {"command"}}};
  }
  bool read_only() const override { return false; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    if (!input.contains("command") || !input["command"].is_string())
      return Err("command: expected a string");
    const std::string cmd = input["command"].get<std::string>();
    // The same refusals as the file tools: a project, and an account to run as.
    auto where = InProject(ctx, [](const ProjectFs&) -> ToolResult { return {"", false}; });
    if (where.is_error) return where;
    if (auto s = Check(ctx, "command", cmd, name()); !s.ok()) return Err(std::string(s.message()));
    CommandOptions o;
    o.command = cmd;
    o.project_root = ctx.project_root;
    o.network = ctx.network_allowed;
    int t = input.contains("timeout_s") && input["timeout_s"].is_number_integer()
                ? input["timeout_s"].get<int>()
                : 120;
    o.timeout_ms = std::clamp(t, 1, 1800) * 1000;
    o.output = ctx.output;
    o.cancel = ctx.cancel;
    o.run_as = ctx.account;
    auto r = RunCommand(o);
    if (!r.ok()) return Err(std::string(r.status().message()));
    std::string head;
    if (r->cancelled) {
      head = "cancelled; the command and its children were killed";
    } else if (r->timed_out) {
      head = absl::StrCat("timed out after ", o.timeout_ms / 1000, " s; killed");
    } else if (r->signal) {
      head = absl::StrCat("killed by signal ", r->signal);
    } else {
      head = absl::StrCat("exit code ", r->exit_code);
    }
    if (!r->sandboxed)
      head += " (unsandboxed: bubblewrap is not available; time and memory limits still applied)";
    return {absl::StrCat(head, "\n", r->output), r->exit_code != 0};
  }
};

}  // namespace

void RegisterWriteTools(ToolRegistry& registry, WriteToolHooks hooks) {
  registry.Register(std::make_unique<WriteFileTool>(hooks));
  registry.Register(std::make_unique<EditFileTool>(std::move(hooks)));
  registry.Register(std::make_unique<BashTool>());
}

}  // namespace fwai
