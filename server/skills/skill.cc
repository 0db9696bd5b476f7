#include "server/skills/skill.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/yaml.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBuiltins[] = {
    R"(name: build
description: Build the firmware with the project's build command; errors, warnings, linker errors and region overflows come back as typed diagnostics
keywords: [build, compile, make, rebuild, compiler, firmware]
timeout: 900
steps:
  - name: build
    tool: build
    timeout: 600
)",
    R"(name: flash
description: Flash the project's image onto the board behind the flash guard and wait for it to boot
keywords: [flash, program, download, upload, burn, write, board, image]
timeout: 300
steps:
  - name: flash
    tool: flash
    timeout: 180
)",
    R"(name: monitor
description: Show the board's serial output (and wait for UNTIL when it is set; SEND is sent first)
keywords: [monitor, serial, console, uart, output, log, logs, watch]
vars:
  UNTIL: ""
  SEND: ""
steps:
  - name: monitor
    tool: monitor
    expect: ${UNTIL}
    send: ${SEND}
    since: now
    timeout: 10
)",
    R"(name: test
description: Run the project's tests (test.command in .fwai/project.yaml)
keywords: [test, tests, unit, check, ctest, verify]
timeout: 1800
steps:
  - name: test
    tool: test
    timeout: 1200
)",
    R"(name: build-flash-verify
description: Build, flash the board, check that it boots (BOOT_PATTERN on the serial port within BOOT_TIMEOUT) and record the image in the evidence
keywords: [build, flash, verify, deploy, boot, check, run, board, firmware, hil, end-to-end]
timeout: 1200
vars:
  BOOT_TIMEOUT: 30s
steps:
  - name: build
    tool: build
    timeout: 600
  - name: flash
    tool: flash
    timeout: 180
  - name: verify
    tool: monitor
    expect: ${BOOT_PATTERN}
    since: run
    timeout: ${BOOT_TIMEOUT}
  - name: record
    evidence:
      files: ["${IMAGE}"]
      note: built, flashed and booted on ${BOARD}
)",
};

absl::Status Err(const std::string& source, const YAML::Node& n, const std::string& field,
                 const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ":", n.Mark().line + 1, ": ", field, ": ", what));
}

absl::StatusOr<int> Duration(const std::string& source, const YAML::Node& n,
                             const std::string& field) {
  if (!n.IsScalar()) return Err(source, n, field, "expected seconds (30, \"30s\", \"5m\", \"1h\")");
  auto d = ParseDuration(n.Scalar());
  if (!d.ok()) return Err(source, n, field, std::string(d.status().message()));
  return *d;
}

absl::Status Str(const std::string& source, const YAML::Node& n, const std::string& field,
                 std::string& out) {
  if (!n.IsScalar()) return Err(source, n, field, "expected a string");
  out = n.Scalar();
  return absl::OkStatus();
}

absl::Status CheckKeys(const std::string& source, const YAML::Node& map, const std::string& where,
                       const std::set<std::string>& allowed) {
  for (const auto& kv : map) {
    const std::string k = kv.first.Scalar();
    if (!allowed.count(k)) {
      return Err(
          source, kv.first, where.empty() ? k : absl::StrCat(where, ".", k),
          absl::StrCat("unknown field (expected one of: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SkillStep> ParseStep(const std::string& source, const YAML::Node& n, size_t index) {
  const std::string where = absl::StrCat("steps[", index, "]");
  if (!n.IsMap())
    return Err(source, n, where,
               "expected a mapping (name, and one of tool, evidence, llm_analyze, agentic)");
  if (auto s = CheckKeys(source, n, where,
                         {"name", "tool", "command", "image", "board", "expect", "send", "since",
                          "stream", "evidence", "llm_analyze", "agentic", "on_fail", "retries",
                          "timeout", "when", "paths", "target", "svd"});
      !s.ok()) {
    return s;
  }
  SkillStep st;
  st.line = n.Mark().line + 1;
  int kinds = 0;
  for (const char* k : {"tool", "evidence", "llm_analyze", "agentic"}) kinds += n[k] ? 1 : 0;
  if (kinds != 1)
    return Err(source, n, where, "needs exactly one of tool, evidence, llm_analyze, agentic");
  if (n["tool"]) {
    st.type = "tool";
    if (auto s = Str(source, n["tool"], where + ".tool", st.tool); !s.ok()) return s;
    static const std::set<std::string> kTools = {"build", "flash", "monitor",
                                                 "test",  "shell", "check_registers"};
    if (!kTools.count(st.tool)) {
      return Err(
          source, n["tool"], where + ".tool",
          absl::StrCat("unknown tool '", st.tool,
                       "' (expected build, flash, monitor, test, shell or check_registers)"));
    }
    if (const auto& p = n["paths"]) {
      if (!p.IsSequence())
        return Err(source, p, where + ".paths", "expected a list of files or directories");
      for (const auto& x : p) {
        std::string v;
        if (auto s = Str(source, x, where + ".paths", v); !s.ok()) return s;
        st.paths.push_back(v);
      }
    }
  } else if (const auto& e = n["evidence"]) {
    st.type = "evidence";
    if (!e.IsMap())
      return Err(source, e, where + ".evidence", "expected {files: [...], note: ...}");
    if (auto s = CheckKeys(source, e, where + ".evidence", {"files", "note"}); !s.ok()) return s;
    if (const auto& f = e["files"]) {
      if (!f.IsSequence())
        return Err(source, f, where + ".evidence.files", "expected a list of paths or globs");
      for (const auto& x : f) {
        std::string v;
        if (auto s = Str(source, x, where + ".evidence.files", v); !s.ok()) return s;
        st.files.push_back(v);
      }
    }
    if (e["note"]) {
      if (auto s = Str(source, e["note"], where + ".evidence.note", st.note); !s.ok()) return s;
    }
  } else if (const auto& l = n["llm_analyze"]) {
    st.type = "llm_analyze";
    if (!l.IsMap())
      return Err(source, l, where + ".llm_analyze", "expected {log: STEP-or-FILE, prompt: ...}");
    if (auto s = CheckKeys(source, l, where + ".llm_analyze", {"log", "prompt"}); !s.ok()) return s;
    if (!l["prompt"]) return Err(source, l, where + ".llm_analyze.prompt", "required");
    if (auto s = Str(source, l["prompt"], where + ".llm_analyze.prompt", st.prompt); !s.ok())
      return s;
    if (l["log"]) {
      if (auto s = Str(source, l["log"], where + ".llm_analyze.log", st.log); !s.ok()) return s;
    }
  } else if (const auto& a = n["agentic"]) {
    st.type = "agentic";
    if (a.IsScalar()) {
      st.goal = a.Scalar();
    } else if (a.IsMap() && a["goal"]) {
      if (auto s = CheckKeys(source, a, where + ".agentic", {"goal"}); !s.ok()) return s;
      if (auto s = Str(source, a["goal"], where + ".agentic.goal", st.goal); !s.ok()) return s;
    } else {
      return Err(source, a, where + ".agentic", "expected a goal (a string, or {goal: ...})");
    }
    if (st.goal.empty()) return Err(source, a, where + ".agentic.goal", "must not be empty");
  }
  for (auto [k, f] : std::vector<std::pair<const char*, std::string*>>{{"name", &st.name},
                                                                       {"command", &st.command},
                                                                       {"image", &st.image},
                                                                       {"board", &st.board},
                                                                       {"expect", &st.expect},
                                                                       {"send", &st.send},
                                                                       {"since", &st.since},
                                                                       {"stream", &st.stream},
                                                                       {"on_fail", &st.on_fail},
                                                                       {"target", &st.target},
                                                                       {"svd", &st.svd},
                                                                       {"when", &st.when}}) {
    if (n[k]) {
      if (auto s = Str(source, n[k], absl::StrCat(where, ".", k), *f); !s.ok()) return s;
    }
  }
  if (st.name.empty()) st.name = st.type == "tool" ? st.tool : st.type;
  if (st.on_fail != "abort" && st.on_fail != "retry" && st.on_fail != "continue") {
    return Err(source, n["on_fail"], where + ".on_fail",
               absl::StrCat("expected abort, retry or continue, got '", st.on_fail, "'"));
  }
  if (st.when != "success" && st.when != "failure" && st.when != "always") {
    return Err(source, n["when"], where + ".when",
               absl::StrCat("expected success, failure or always, got '", st.when, "'"));
  }
  if (!st.stream.empty() && st.tool != "monitor") {
    return Err(source, n["stream"], where + ".stream", "only a monitor step reads a stream");
  }
  if (st.since != "run" && st.since != "now") {
    return Err(source, n["since"], where + ".since",
               absl::StrCat("expected run or now, got '", st.since, "'"));
  }
  if (n["retries"]) {
    if (!n["retries"].IsScalar() || !absl::SimpleAtoi(n["retries"].Scalar(), &st.retries) ||
        st.retries < 1 || st.retries > 20) {
      return Err(source, n["retries"], where + ".retries", "expected a number 1..20");
    }
  }
  if (n["timeout"]) {
    if (n["timeout"].IsScalar() && !ReferencedVars(n["timeout"].Scalar()).empty()) {
      st.timeout_text = n["timeout"].Scalar();  // resolved when a run starts
    } else {
      auto t = Duration(source, n["timeout"], where + ".timeout");
      if (!t.ok()) return t.status();
      st.timeout_s = *t;
    }
  }
  if (st.tool == "shell" && st.command.empty())
    return Err(source, n, where + ".command", "a shell step needs a command");
  if (!st.command.empty() && st.type == "tool" && st.tool != "shell" && st.tool != "build" &&
      st.tool != "test") {
    return Err(source, n["command"], where + ".command",
               absl::StrCat("the ", st.tool, " tool takes no command"));
  }
  return st;
}

}  // namespace

bool Skill::flashes() const {
  return std::any_of(steps.begin(), steps.end(),
                     [](const SkillStep& s) { return s.tool == "flash"; });
}

absl::StatusOr<Skill> ParseSkill(const std::string& text, const std::string& source) {
  ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(text, source));
  if (!root.IsMap())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":1: expected a mapping (name, description, steps)"));
  if (auto s = CheckKeys(source, root, "",
                         {"name", "description", "keywords", "vars", "timeout", "steps"});
      !s.ok())
    return s;
  Skill sk;
  sk.source = source;
  if (!root["name"]) return absl::InvalidArgumentError(absl::StrCat(source, ":1: name: required"));
  if (auto s = Str(source, root["name"], "name", sk.name); !s.ok()) return s;
  for (char c : sk.name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) {
      return Err(source, root["name"], "name",
                 absl::StrCat("'", sk.name, "': use letters, digits, - _ ."));
    }
  }
  if (sk.name.empty()) return Err(source, root["name"], "name", "must not be empty");
  if (root["description"]) {
    if (auto s = Str(source, root["description"], "description", sk.description); !s.ok()) return s;
  }
  if (const auto& k = root["keywords"]) {
    if (!k.IsSequence()) return Err(source, k, "keywords", "expected a list of words");
    for (const auto& w : k) {
      std::string v;
      if (auto s = Str(source, w, "keywords", v); !s.ok()) return s;
      sk.keywords.push_back(v);
    }
  }
  if (const auto& v = root["vars"]) {
    if (!v.IsMap()) return Err(source, v, "vars", "expected a mapping of NAME: default");
    for (const auto& kv : v) {
      std::string val;
      if (auto s = Str(source, kv.second, absl::StrCat("vars.", kv.first.Scalar()), val); !s.ok())
        return s;
      sk.vars[kv.first.Scalar()] = val;
    }
  }
  if (root["timeout"]) {
    auto t = Duration(source, root["timeout"], "timeout");
    if (!t.ok()) return t.status();
    sk.timeout_s = *t;
  }
  const auto& steps = root["steps"];
  if (!steps || !steps.IsSequence() || steps.size() == 0) {
    return Err(source, steps ? steps : root, "steps", "expected a non-empty list of steps");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < steps.size(); ++i) {
    auto st = ParseStep(source, steps[i], i);
    if (!st.ok()) return st.status();
    if (!names.insert(st->name).second) {
      return Err(source, steps[i], absl::StrCat("steps[", i, "].name"),
                 absl::StrCat("'", st->name, "' is used twice"));
    }
    sk.steps.push_back(std::move(*st));
  }
  // An llm_analyze log naming a step must name an earlier one (or be a file).
  for (size_t i = 0; i < sk.steps.size(); ++i) {
    const auto& s = sk.steps[i];
    if (s.type == "llm_analyze" && !s.log.empty() && s.log.find('/') == std::string::npos &&
        s.log.find('.') == std::string::npos && s.log.find("${") == std::string::npos) {
      bool earlier = false;
      for (size_t j = 0; j < i; ++j) earlier |= sk.steps[j].name == s.log;
      if (!earlier) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ":", s.line, ": steps[", i, "].llm_analyze.log: '", s.log,
                         "' is not an earlier step (or a file path)"));
      }
    }
  }
  return sk;
}

const std::vector<Skill>& BuiltinSkills() {
  static const std::vector<Skill> skills = [] {
    std::vector<Skill> out;
    for (const char* text : kBuiltins) {
      auto s = ParseSkill(text, "built-in");
      if (!s.ok()) std::abort();  // a broken built-in is a bug caught by the first test
      s->builtin = true;
      out.push_back(std::move(*s));
    }
    return out;
  }();
  return skills;
}

namespace {

// A plugin's skills (a file that does not parse is left out with a warning:
// one plugin must not break every skill run).
void AddPluginSkills(const std::vector<PluginSkillSet>& plugins, std::vector<Skill>& out) {
  for (const auto& p : plugins) {
    for (size_t i = 0; i < p.files.size(); ++i) {
      const std::string path = p.dir + "/" + p.files[i];
      if (i >= p.texts.size()) continue;  // not read when the set was made
      auto sk = ParseSkill(p.texts[i], path);
      if (!sk.ok()) continue;
      sk->name = p.scope.plugin + ":" + sk->name;
      sk->scope = p.scope;
      out.push_back(std::move(*sk));
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<Skill>> LoadSkills(const std::string& project_root,
                                              const std::vector<PluginSkillSet>& plugins) {
  std::vector<Skill> out = BuiltinSkills();
  const fs::path dir = fs::path(project_root) / ".fwai" / "skills";
  std::error_code ec;
  if (project_root.empty() || !fs::is_directory(dir, ec)) {
    AddPluginSkills(plugins, out);
    return out;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto ext = e.path().extension();
    if (e.is_regular_file(ec) && (ext == ".yaml" || ext == ".yml")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, std::string> seen;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) return absl::InvalidArgumentError(absl::StrCat(f.string(), ": cannot read"));
    auto sk = ParseSkill(ss.str(), f.string());
    if (!sk.ok()) return sk.status();
    if (auto it = seen.find(sk->name); it != seen.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.string(), ":1: name: '", sk->name, "' is also defined in ", it->second));
    }
    seen[sk->name] = f.string();
    auto it =
        std::find_if(out.begin(), out.end(), [&](const Skill& s) { return s.name == sk->name; });
    if (it != out.end()) {
      *it = std::move(*sk);
    } else {
      out.push_back(std::move(*sk));
    }
  }
  AddPluginSkills(plugins, out);
  return out;
}

absl::StatusOr<int> ParseDuration(const std::string& text) {
  std::string v = text;
  int mult = 1;
  if (!v.empty() && (v.back() == 's' || v.back() == 'm' || v.back() == 'h')) {
    mult = v.back() == 'h' ? 3600 : v.back() == 'm' ? 60 : 1;
    v.pop_back();
  }
  int x = 0;
  if (!absl::SimpleAtoi(v, &x) || x <= 0 || x > 7 * 24 * 3600 / mult) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a positive duration, got '", text, "'"));
  }
  return x * mult;
}

absl::StatusOr<std::string> Interpolate(const std::string& text,
                                        const std::map<std::string, std::string>& vars) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$') {
      out += text[i];
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (i + 1 < text.size() && text[i + 1] == '{') {
      size_t end = text.find('}', i + 2);
      if (end == std::string::npos)
        return absl::InvalidArgumentError(absl::StrCat("unclosed ${ in '", text, "'"));
      std::string name = text.substr(i + 2, end - i - 2);
      auto it = vars.find(name);
      if (it == vars.end())
        return absl::InvalidArgumentError(absl::StrCat("unknown variable ${", name, "}"));
      out += it->second;
      i = end;
      continue;
    }
    out += '$';
  }
  return out;
}

std::vector<std::string> ReferencedVars(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] == '$' && text[i + 1] == '$') {
      ++i;
    } else if (text[i] == '$' && text[i + 1] == '{') {
      size_t end = text.find('}', i + 2);
      if (end == std::string::npos) break;
      out.push_back(text.substr(i + 2, end - i - 2));
      i = end;
    }
  }
  return out;
}

}  // namespace fwai
