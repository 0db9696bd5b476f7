// Skills: the diagnostics parser on real gcc/clang/ld output, skill files and
// their errors, interpolation, intent resolution (all three tiers), secret
// redaction on real-looking samples, and the flash / budget policy rules.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/local_account.h"
#include "server/llm/provider.h"
#include "server/project/policy.h"
#include "server/project/secrets.h"
#include "server/skills/diagnostics.h"
#include "server/skills/intent.h"
#include "server/skills/runner.h"
#include "server/skills/skill.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

TEST(DiagnosticsTest, GccAndClangLines) {
  auto d =
      ParseDiagnosticLine("src/main.c:139:3: error: 'x' undeclared (first use in this function)");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, "compiler");
  EXPECT_EQ(d->severity, "error");
  EXPECT_EQ(d->file, "src/main.c");
  EXPECT_EQ(d->line, 139);
  EXPECT_EQ(d->column, 3);
  EXPECT_EQ(d->message, "'x' undeclared (first use in this function)");
  d = ParseDiagnosticLine(
      "drivers/uart.c:12:10: warning: unused variable 'n' [-Wunused-variable]\r\n");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->severity, "warning");
  EXPECT_EQ(d->message, "unused variable 'n' [-Wunused-variable]");
  d = ParseDiagnosticLine("inc/board.h:4:10: fatal error: stm32f1xx.h: No such file or directory");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->severity, "error");
  EXPECT_EQ(d->message, "stm32f1xx.h: No such file or directory");
  d = ParseDiagnosticLine("main.cpp:7: note: candidate expects 2 arguments");  // no column
  ASSERT_TRUE(d);
  EXPECT_EQ(d->severity, "note");
  EXPECT_EQ(d->column, 0);
  EXPECT_FALSE(ParseDiagnosticLine("arm-none-eabi-gcc -c src/main.c -o build/main.o"));
  EXPECT_FALSE(ParseDiagnosticLine("src/main.c: In function 'main':"));
  EXPECT_FALSE(ParseDiagnosticLine("  139 |   x = 3;"));
  EXPECT_FALSE(ParseDiagnosticLine("make: *** [Makefile:16: build/blinky.elf] Error 1"));
}

TEST(DiagnosticsTest, LinkerErrorsAndRegionOverflow) {
  const std::string out =
      "/usr/lib/gcc/arm-none-eabi/12.2.1/../../../arm-none-eabi/bin/ld: build/blinky.elf section "
      "`.rodata' will not fit in region `FLASH'\n"
      "/usr/lib/gcc/arm-none-eabi/12.2.1/../../../arm-none-eabi/bin/ld: region `FLASH' overflowed "
      "by 131412 bytes\n"
      "/usr/bin/arm-none-eabi-ld: build/main.o: in function `main':\n"
      "main.c:(.text.main+0x1c): undefined reference to `HAL_Init'\n"
      "/usr/lib/gcc/arm-none-eabi/12.2.1/../../../arm-none-eabi/bin/ld: cannot find -lhal: No such "
      "file or directory\n"
      "collect2: error: ld returned 1 exit status\n"
      "ld.lld: error: undefined symbol: SystemInit\n";
  auto all = ParseDiagnostics(out);
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0].kind, "region_overflow");
  EXPECT_EQ(all[0].region, "FLASH");
  EXPECT_EQ(all[1].kind, "region_overflow");
  EXPECT_EQ(all[1].bytes, 131412);
  EXPECT_EQ(all[2].kind, "linker");
  EXPECT_EQ(all[2].symbol, "HAL_Init");
  EXPECT_EQ(all[2].file, "main.c");
  EXPECT_EQ(all[3].message, "cannot find -lhal: No such file or directory");
  EXPECT_EQ(all[4].message, "ld returned 1 exit status");
  EXPECT_EQ(all[5].message, "undefined symbol: SystemInit");
  EXPECT_EQ(all[1].ToJson()["bytes"], 131412);
}

TEST(SkillFileTest, BuiltinsParseAndProjectSkillsReplaceThem) {
  const auto& b = BuiltinSkills();
  std::vector<std::string> names;
  for (const auto& s : b) names.push_back(s.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"build", "flash", "monitor", "test", "build-flash-verify"}));
  EXPECT_TRUE(b[4].flashes());
  EXPECT_FALSE(b[0].flashes());
  const fs::path root = fs::temp_directory_path() / ("fwai-skills-" + std::to_string(getpid()));
  fs::create_directories(root / ".fwai" / "skills");
  std::ofstream(root / ".fwai" / "skills" / "build.yml")
      << "name: build\nsteps:\n  - tool: shell\n    command: ./build.sh\n";
  std::ofstream(root / ".fwai" / "skills" / "lint.yaml")
      << "name: lint\nsteps:\n  - tool: shell\n    command: make lint\n";
  auto all = LoadSkills(root.string());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 6u);
  EXPECT_FALSE((*all)[0].builtin);
  EXPECT_EQ((*all)[0].steps[0].command, "./build.sh");
  EXPECT_EQ((*all)[5].name, "lint");
  std::ofstream(root / ".fwai" / "skills" / "twin.yaml") << "name: lint\nsteps:\n  - tool: test\n";
  auto dup = LoadSkills(root.string());
  EXPECT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("also defined in"), std::string::npos) << dup.status();
  fs::remove_all(root);
}

// A plugin's skills are parsed from what fwaid read when the set was made:
// loading them as a caller who cannot read fwaid's plugin store (here: a
// directory that does not exist at all) still finds them.
TEST(SkillFileTest, PluginSkillsComeFromTheTextsFwaidRead) {
  PluginSkillSet set;
  set.dir = "/nonexistent/fwaid-data/plugins/p";
  set.files = {"skills/hello.yaml", "skills/broken.yaml"};
  set.texts = {"name: hello\nsteps:\n  - name: a\n    tool: shell\n    command: \"true\"\n",
               "name: [unclosed\n"};
  set.scope.plugin = "p";
  auto skills = LoadSkills("", {set});
  ASSERT_TRUE(skills.ok()) << skills.status();
  int found = 0;
  for (const auto& s : *skills) {
    if (s.name.rfind("p:", 0) == 0) {
      ++found;
      EXPECT_EQ(s.name, "p:hello");
      ASSERT_TRUE(s.scope.has_value());
      EXPECT_EQ(s.scope->plugin, "p");
    }
  }
  EXPECT_EQ(found, 1) << "the broken file is left out, the good one kept";
}

TEST(SkillFileTest, ErrorsNameFileLineAndField) {
  auto err = [](const std::string& yaml) {
    auto s = ParseSkill(yaml, "s.yaml");
    EXPECT_FALSE(s.ok()) << yaml;
    return std::string(s.status().message());
  };
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: shell\n    command: a\n    on_fail: sometimes\n"),
            "s.yaml:5: steps[0].on_fail: expected abort, retry or continue, got 'sometimes'");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: compile\n"),
            "s.yaml:3: steps[0].tool: unknown tool 'compile' (expected build, flash, monitor, "
            "test, shell or check_registers)");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: shell\n"),
            "s.yaml:3: steps[0].command: a shell step needs a command");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: check_registers\n    paths: src\n"),
            "s.yaml:4: steps[0].paths: expected a list of files or directories");
  auto regs = ParseSkill(
      "name: x\nsteps:\n  - tool: check_registers\n    paths: [src, inc]\n    target: lm3s6965\n",
      "s.yaml");
  ASSERT_TRUE(regs.ok()) << regs.status();
  EXPECT_EQ(regs->steps[0].paths, (std::vector<std::string>{"src", "inc"}));
  EXPECT_EQ(regs->steps[0].target, "lm3s6965");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: build\n    stream: rtt:0\n"),
            "s.yaml:4: steps[0].stream: only a monitor step reads a stream");
  EXPECT_EQ(err("name: x\nsteps: []\n"), "s.yaml:2: steps: expected a non-empty list of steps");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: build\n    agentic: fix it\n"),
            "s.yaml:3: steps[0]: needs exactly one of tool, evidence, llm_analyze, agentic");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: build\n    timeout: soon\n"),
            "s.yaml:4: steps[0].timeout: expected a positive duration, got 'soon'");
  EXPECT_EQ(err("name: x\nsteps:\n  - tool: build\n  - tool: build\n"),
            "s.yaml:4: steps[1].name: 'build' is used twice");
  EXPECT_EQ(err("name: x\nsteps:\n  - name: why\n    llm_analyze:\n      log: later\n      prompt: "
                "p\n  - name: later\n    tool: build\n"),
            "s.yaml:3: steps[0].llm_analyze.log: 'later' is not an earlier step (or a file path)");
  EXPECT_NE(err("name: x\nsteps:\n  - tool: build\n  bad indent: [\n").find("s.yaml:"),
            std::string::npos);
  EXPECT_EQ(err("name: x y\nsteps:\n  - tool: build\n"),
            "s.yaml:1: name: 'x y': use letters, digits, - _ .");
  auto ok = ParseSkill(
      "name: x\ntimeout: 5m\nsteps:\n  - tool: monitor\n    expect: ready\n    timeout: 30s\n    "
      "on_fail: retry\n    retries: 4\n",
      "s.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->timeout_s, 300);
  EXPECT_EQ(ok->steps[0].timeout_s, 30);
  EXPECT_EQ(ok->steps[0].retries, 4);
  EXPECT_EQ(ok->steps[0].name, "monitor");
  // A timeout given by variables is kept as text until a run knows them.
  auto by_var = ParseSkill(
      "name: x\nvars:\n  WAIT: 3s\nsteps:\n  - tool: monitor\n    expect: ready\n    timeout: "
      "${WAIT}\n",
      "s.yaml");
  ASSERT_TRUE(by_var.ok()) << by_var.status();
  EXPECT_EQ(by_var->steps[0].timeout_text, "${WAIT}");
  EXPECT_EQ(by_var->steps[0].timeout_s, 0);
  EXPECT_EQ(*ParseDuration("90"), 90);
  EXPECT_EQ(*ParseDuration("5m"), 300);
  EXPECT_EQ(ParseDuration("-1").status().message(), "expected a positive duration, got '-1'");
  EXPECT_FALSE(ParseDuration("8d").ok());
  EXPECT_FALSE(ParseDuration("").ok());
}

TEST(SkillFileTest, Interpolation) {
  std::map<std::string, std::string> v = {{"A", "1"}, {"BOARD", "sim"}};
  EXPECT_EQ(*Interpolate("flash ${BOARD} x${A}y", v), "flash sim x1y");
  EXPECT_EQ(*Interpolate("cost $$5 and $HOME", v), "cost $5 and $HOME");
  auto bad = Interpolate("echo ${NOPE}", v);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "unknown variable ${NOPE}");
  EXPECT_FALSE(Interpolate("echo ${A", v).ok());
  EXPECT_EQ(ReferencedVars("${A} $${B} ${C}"), (std::vector<std::string>{"A", "C"}));
}

// A provider that answers with a fixed text (for the third tier).
class CannedProvider final : public Provider {
 public:
  explicit CannedProvider(std::string reply) : reply_(std::move(reply)) {
    config_.kind = "anthropic";
    config_.model = "m";
  }
  absl::StatusOr<ChatResult> Stream(const ChatRequest& request, StreamObserver& observer,
                                    CancelToken&) override {
    ++calls;
    last_request = request.messages.at(0).content.dump();
    observer.OnText(reply_);
    ChatResult r;
    r.content = nlohmann::json::array({{{"type", "text"}, {"text", reply_}}});
    return r;
  }
  const ProviderConfig& config() const override { return config_; }
  int calls = 0;
  std::string last_request;

 private:
  std::string reply_;
  ProviderConfig config_;
};

TEST(IntentTest, ThreeTiers) {
  const auto& skills = BuiltinSkills();
  auto m = ResolveIntent("flash", skills, nullptr, nullptr);
  EXPECT_EQ(m.skill, "flash");
  EXPECT_EQ(m.tier, "exact");
  EXPECT_EQ(m.action, "run");
  m = ResolveIntent("/build-flash-verify", skills, nullptr, nullptr);
  EXPECT_EQ(m.skill, "build-flash-verify");
  m = ResolveIntent("Build flash verify", skills, nullptr, nullptr);
  EXPECT_EQ(m.skill, "build-flash-verify");
  EXPECT_EQ(m.tier, "exact");
  m = ResolveIntent("compile the firmware", skills, nullptr, nullptr);
  EXPECT_EQ(m.skill, "build");
  EXPECT_EQ(m.tier, "keywords");
  EXPECT_GE(m.confidence, kIntentRun);
  m = ResolveIntent("build it, flash it and check that it boots", skills, nullptr, nullptr);
  EXPECT_EQ(m.skill, "build-flash-verify");
  EXPECT_EQ(m.action, "run");
  m = ResolveIntent("build the firmware and explain every warning in detail", skills, nullptr,
                    nullptr);
  EXPECT_EQ(m.skill, "build");
  EXPECT_NE(m.action, "run");  // more than the skill does: ask, or chat
  m = ResolveIntent("how do I configure the PLL for 24 MHz?", skills, nullptr, nullptr);

  EXPECT_EQ(m.action, "chat");
  m = ResolveIntent("what does the flash guard check?", skills, nullptr, nullptr);
  EXPECT_NE(m.action, "run");  // a question about flashing is not a flash
  // Tier 3: only for the uncertain, and only with a provider.
  m = ResolveIntent("tail the uart", skills, nullptr, nullptr);
  const double without = m.confidence;
  ASSERT_LT(without, kIntentRun);
  ASSERT_GE(without, 0.3);
  CannedProvider p(R"({"skill": "monitor", "confidence": 0.9})");
  m = ResolveIntent("tail the uart", skills, &p, nullptr);
  EXPECT_EQ(p.calls, 1);
  EXPECT_NE(p.last_request.find("build-flash-verify"),
            std::string::npos);  // the skills were listed
  EXPECT_EQ(m.skill, "monitor");
  EXPECT_EQ(m.tier, "provider");
  EXPECT_EQ(m.action, "run");
  CannedProvider none(R"(Sure: {"skill": "", "confidence": 0.8})");
  m = ResolveIntent("tail the uart", skills, &none, nullptr);
  EXPECT_EQ(m.action, "chat");
  CannedProvider junk("I think monitor");
  m = ResolveIntent("tail the uart", skills, &junk, nullptr);
  EXPECT_EQ(m.tier, "keywords");  // an unusable answer keeps tier 2
  CannedProvider unused(R"({"skill": "flash", "confidence": 1})");
  m = ResolveIntent("flash", skills, &unused, nullptr);
  EXPECT_EQ(unused.calls, 0);  // certain answers never cost a provider call
}

TEST(SecretsTest, RealLookingSamplesAreRedacted) {
  auto s = SecretScanner::Default();
  struct Case {
    std::string text, secret, kind;
  };
  const std::vector<Case> cases = {
      {"export ANTHROPIC_API_KEY=sk-ant-api03-Zx9_kQ2vLm8pRt4wYb7nCd1eFg5hJk3lMn6oPq",
       "sk-ant-api03-Zx9_kQ2vLm8pRt4wYb7nCd1eFg5hJk3lMn6oPq", "anthropic_key"},
      {"OPENAI_API_KEY: sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56",
       "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56", "openai_key"},
      {"aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE", "aws_access_key"},
      {"remote: https://ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8@github.com/acme/fw.git",
       "ghp_1A2b3C4d5E6f7G8h9I0jK1l2M3n4O5p6Q7r8", "github_token"},
      {"GITLAB token glpat-xY12_ab34CD56ef78GH90", "glpat-xY12_ab34CD56ef78GH90", "gitlab_token"},
      {"key=AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
       "google_api_key"},
      {"hook xoxb-2048-4096-AbCdEfGhIjKl", "xoxb-2048-4096-AbCdEfGhIjKl", "slack_token"},
      {"Authorization: Bearer 8f2c1d9e7a6b5c4d3e2f1a0b", "8f2c1d9e7a6b5c4d3e2f1a0b",
       "bearer_token"},
      {"git clone https://builder:pa55w0rd!x@git.example.com/fw.git", "pa55w0rd!x", "url_password"},
      {"mqtt://dev:hunter22@10.0.0.7:1883", "hunter22", "url_password"},
      {"{\"wifi_password\": \"Tr0ub4dor&3\"}", "Tr0ub4dor&3", "assignment"},
      {"WIFI_PASSWORD=correcthorse", "correcthorse", "env_assignment"},
      {"token "
       "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_"
       "XgL0n3I9PlFUP0THsR8U",
       "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_"
       "XgL0n3I9PlFUP0THsR8U",
       "jwt"},
  };
  for (const auto& c : cases) {
    int n = 0;
    std::string r = s->Redact(c.text, &n);
    EXPECT_EQ(r.find(c.secret), std::string::npos) << c.text << " -> " << r;
    EXPECT_NE(r.find("[REDACTED:"), std::string::npos) << r;
    EXPECT_GE(n, 1) << c.text;
    EXPECT_NE(r.find("[REDACTED:" + c.kind + "]"), std::string::npos) << c.kind << ": " << r;
  }
  const std::string pem =
      "key:\n-----BEGIN OPENSSH PRIVATE "
      "KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
      "QyNTUxOQAAACDx\n-----END OPENSSH PRIVATE KEY-----\nafter\n";
  std::string r = s->Redact(pem);
  EXPECT_EQ(r, "key:\n[REDACTED:private_key]\nafter\n");
  // Code and ordinary output stay as they are.
  for (const std::string keep :
       {"const char *token = next_token(p);", "uint32_t key = HAL_GetTick();",
        "password_len = strlen(pw);", "see https://example.com/path?a=b",
        "TOKEN=$GITHUB_TOKEN make", "sk-short", "region `FLASH' overflowed by 20 bytes"}) {
    EXPECT_EQ(s->Redact(keep), keep);
  }
  nlohmann::json doc = {{"tools", {{{"output", "user=x AKIAIOSFODNN7EXAMPLE"}}}}, {"n", 3}};
  EXPECT_EQ(s->RedactJson(doc), 1);
  EXPECT_EQ(doc["tools"][0]["output"], "user=x [REDACTED:aws_access_key]");
  // Configured patterns, and a bad one named.
  auto custom = SecretScanner::Make({"serial_key=FW-[0-9]{4}-[0-9]{4}"});
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ((*custom)->Redact("licence FW-1234-5678 ok"), "licence [REDACTED:serial_key] ok");
  auto bad = SecretScanner::Make({"(unclosed"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

TEST(PolicyRulesTest, FlashSettingsAndBudgets) {
  auto r = ParsePolicy(R"(policy:
  change_budget:
    max_files: 3
    max_lines: 200
    max_lines_per_run: 500
  flash:
    require_approval: false
    allowed_boards: ["sim-*", lab-f4]
)",
                       "p.yaml");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_files_per_turn, 3);
  EXPECT_EQ(r->max_lines_per_turn, 200);
  EXPECT_EQ(r->max_lines_per_run, 500);
  EXPECT_FALSE(r->flash_require_approval);
  EXPECT_TRUE(CheckFlashPolicy(*r, "sim-stm32vl", false).allowed);
  auto d = CheckFlashPolicy(*r, "prod-board", true);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "flash.allowed_boards: sim-*, lab-f4");
  PolicyRules defaults;
  d = CheckFlashPolicy(defaults, "sim-stm32vl", false);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "flash.require_approval: true");
  // The organisation: approval required again, the tighter budget.
  auto org = ParsePolicy(
      "policy:\n  change_budget:\n    max_lines: 50\n  flash:\n    require_approval: true\n",
      "org.yaml");
  ASSERT_TRUE(org.ok());
  PolicyRules m = MergePolicy(*r, *org, true);
  EXPECT_TRUE(m.flash_require_approval);
  EXPECT_EQ(m.max_lines_per_turn, 50);
  EXPECT_EQ(m.max_lines_per_run, 500);
  auto bad = ParsePolicy("policy:\n  flash:\n    require_aproval: false\n", "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "p.yaml:3: policy.flash.require_aproval: unknown (require_approval, allowed_boards, "
            "require_fresh, require_verified_toolchain, register_check)");
  // register_check: off | warn | block, the stricter of project and organisation.
  auto warn = ParsePolicy("policy:\n  flash:\n    register_check: warn\n", "p.yaml");
  ASSERT_TRUE(warn.ok()) << warn.status();
  EXPECT_EQ(warn->flash_register_check, "warn");
  auto block = ParsePolicy("policy:\n  flash:\n    register_check: block\n", "org.yaml");
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(MergePolicy(*warn, *block, true).flash_register_check, "block");
  EXPECT_EQ(MergePolicy(*block, *warn, true).flash_register_check, "block");
  EXPECT_EQ(MergePolicy(*r, *warn, true).flash_register_check, "warn");
  bad = ParsePolicy("policy:\n  flash:\n    register_check: sometimes\n", "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "p.yaml:3: policy.flash.register_check: expected off, warn or block");
  bad = ParsePolicy("policy:\n  change_budget:\n    max_lines: lots\n", "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "p.yaml:3: policy.change_budget.max_lines: expected a number (0: no limit)");
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

class SkillRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() / ("fwai-runner-" + std::to_string(getpid()))).string();
    fs::create_directories(root_ + "/.fwai/skills");
    root_ = fs::canonical(root_).string();
  }
  void TearDown() override { fs::remove_all(root_); }
  SkillRunResult Run(SkillDeps deps, const std::string& skill,
                     std::vector<SkillEventOut>* events = nullptr, CancelToken* cancel = nullptr) {
    SkillRunner runner(std::move(deps));
    SkillRunRequest req;
    req.project_root = root_;
    req.skill = skill;
    req.ci = true;
    req.caller.identity = "uid:1";
    if (auto me = LookupAccount(getuid()); me.ok()) req.caller.account = *me;
    CancelToken local;
    return runner.Run(
        req,
        [&](const SkillEventOut& e) {
          if (events) events->push_back(e);
        },
        cancel ? *cancel : local);
  }
  std::string root_;
};

TEST_F(SkillRunnerTest, ARunWhoseRecordCannotBeWrittenFails) {
  std::ofstream(root_ + "/.fwai/skills/hi.yaml")
      << "name: hi\nsteps:\n  - tool: shell\n    command: echo hi\n";
  SkillDeps ok;
  std::vector<nlohmann::json> records;
  ok.append_evidence = [&](const nlohmann::json& r) -> absl::StatusOr<uint64_t> {
    records.push_back(r);
    return records.size() - 1;
  };
  auto r = Run(ok, "hi");
  EXPECT_TRUE(r.ok) << r.summary.dump();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["kind"], "skill_run");
  EXPECT_EQ(records[0]["steps"][0]["exit_code"], 0);
  SkillDeps broken;
  broken.append_evidence = [](const nlohmann::json&) -> absl::StatusOr<uint64_t> {
    return absl::DataLossError("evidence log stopped: disk full");
  };
  std::vector<SkillEventOut> events;
  r = Run(broken, "hi", &events);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.exit_code, 10);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, "run_finished");
  EXPECT_NE(events.back().text.find("disk full"), std::string::npos) << events.back().text;
}

TEST_F(SkillRunnerTest, CancelStopsTheRunningStepAtOnce) {
  std::ofstream(root_ + "/.fwai/skills/long.yaml")
      << "name: long\nsteps:\n  - tool: shell\n    command: sleep 30\n";
  CancelToken cancel;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.Cancel();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Run(SkillDeps{}, "long", nullptr, &cancel);
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(r.failure_class, "cancelled");
  EXPECT_EQ(r.exit_code, 130);
}

TEST_F(SkillRunnerTest, HardwareAndProviderStepsFailWithTheirClassWhenAbsent) {
  std::ofstream(root_ + "/.fwai/skills/hw.yaml") << "name: hw\nsteps:\n  - tool: flash\n";
  std::ofstream(root_ + "/.fwai/skills/ask.yaml")
      << "name: ask\nsteps:\n  - llm_analyze:\n      prompt: why?\n";
  auto r = Run(SkillDeps{}, "hw");
  EXPECT_EQ(r.failure_class, "hardware");
  EXPECT_EQ(r.exit_code, 18);
  r = Run(SkillDeps{}, "ask");
  EXPECT_EQ(r.failure_class, "provider");
  EXPECT_EQ(r.exit_code, 19);
  EXPECT_NE(r.summary.value("error", "").find("ANTHROPIC_API_KEY"), std::string::npos);
}

}  // namespace
}  // namespace fwai
