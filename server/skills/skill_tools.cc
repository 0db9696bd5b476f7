#include "server/skills/skill_tools.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/local_account.h"

namespace fwai {

namespace {

using json = nlohmann::json;

class BuildTool final : public Tool {
 public:
  explicit BuildTool(SkillRunner& runner) : runner_(runner) {}
  std::string name() const override { return "build"; }
  std::string description() const override {
    return "Build the firmware with the project's build command (the `build` skill). The result "
           "has the errors and "
           "warnings, the images made with their SHA-256, the memory used per region with the "
           "change since the previous "
           "build, and whether the toolchain verified. Build before asking to flash.";
  }
  json input_schema() const override {
    return {{"type", "object"}, {"properties", json::object()}};
  }
  bool read_only() const override { return false; }
  bool needs_project() const override { return true; }
  ToolResult Run(const json&, ToolContext& ctx) override {
    SkillRunRequest req;
    if (ctx.account) req.caller.account = *ctx.account;
    req.project_root = ctx.project_root;
    req.skill = "build";
    req.ci = true;
    req.caller.identity = ctx.owner;
    req.caller.session_id = ctx.session_id;
    if (ctx.owner.rfind("uid:", 0) == 0)
      (void)absl::SimpleAtoi(ctx.owner.substr(4), &req.caller.uid);
    req.caller.display = absl::StrCat(ctx.owner, " (agent, session ", ctx.session_id, ")");
    CancelToken local;
    CancelToken& cancel = ctx.cancel ? *ctx.cancel : local;
    auto result = runner_.Run(
        req,
        [&ctx](const SkillEventOut& e) {
          if (ctx.output && e.kind == "output") ctx.output(e.text + "\n");
        },
        cancel);
    const json& s = result.summary;
    std::string text = absl::StrCat(
        "build ",
        result.ok ? "ok"
                  : absl::StrCat("failed (", result.failure_class, "): ", s.value("error", "")),
        " — run ", result.run_id, "\n");
    const json diag = s.value("diagnostics", json::object());
    absl::StrAppend(&text, diag.value("errors", 0), " errors, ", diag.value("warnings", 0),
                    " warnings\n");
    int shown = 0;
    for (const auto& d : s.value("diagnostic_items", json::array())) {
      if (++shown > 20) break;
      absl::StrAppend(&text, "  ", d.value("file", ""),
                      d.contains("line") ? absl::StrCat(":", d.value("line", 0)) : "", ": ",
                      d.value("severity", ""), ": ", d.value("message", ""), "\n");
    }
    for (const auto& a : s.value("artifacts", json::array())) {
      for (const auto& f : a.value("files", json::array())) {
        absl::StrAppend(&text, "image ", f.value("path", ""), " (", f.value("format", ""), ", ",
                        f.value("bytes", 0), " bytes) sha256 ", f.value("sha256", ""), "\n");
      }
    }
    if (s.contains("memory") && s["memory"].contains("report")) {
      std::map<std::string, int64_t> delta;
      const bool have_diff = s["memory"].contains("diff");
      if (have_diff) {
        for (const auto& d : s["memory"]["diff"]["regions"])
          delta[d.value("name", "")] = d.value("delta", int64_t{0});
      }
      for (const auto& r : s["memory"]["report"]["regions"]) {
        const std::string n = r.value("name", "");
        absl::StrAppend(&text, "memory ", n, ": ", r.value("used", 0), " of ", r.value("length", 0),
                        " bytes (", r.value("percent", 0.0), "%)",
                        have_diff ? absl::StrCat(", ", delta[n] >= 0 ? "+" : "", delta[n],
                                                 " bytes since the previous build")
                                  : "",
                        "\n");
      }
      if (have_diff) {
        int n = 0;
        for (const char* kind : {"added", "grown"}) {
          for (const auto& d : s["memory"]["diff"]["symbols"][kind]) {
            if (++n > 8) break;
            absl::StrAppend(&text, "  ", kind, " ", d.value("name", ""), " ",
                            d.contains("delta") ? absl::StrCat("+", d.value("delta", 0))
                                                : absl::StrCat(d.value("size", 0)),
                            " bytes\n");
          }
        }
      }
    }
    if (s.contains("toolchain")) {
      absl::StrAppend(
          &text, "toolchain ",
          s["toolchain"].value("verified", false) ? "verified (dpkg -V)" : "NOT verified", "\n");
    }
    return {text, !result.ok};
  }

 private:
  SkillRunner& runner_;
};

}  // namespace

void RegisterSkillTools(ToolRegistry& registry, SkillRunner& runner) {
  registry.Register(std::make_unique<BuildTool>(runner));
}

}  // namespace fwai
