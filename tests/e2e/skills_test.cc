// Skills through the CLI and a real fwaid: the built-in build-flash-verify on
// the simulated board (arm-none-eabi-gcc, QEMU), typed build diagnostics,
// YAML skills (variables, retry, continue, when: failure, timeouts),
// failure classes and exit codes, llm_analyze and agentic steps against the
// fake provider (with secrets redacted before they leave), the change budget
// of a run, intent resolution, and the REPL's /build.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/fakes/fake_llm_server.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class SkillsTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_.Start(); }

  void StartDaemon(const std::string& extra_yaml = "", bool providers = false) {
    d_ = std::make_unique<Daemon>(&fake_, extra_yaml, providers);
    ASSERT_TRUE(d_->Start()) << d_->log();
    project_ = d_->dir() + "/blinky";
    fs::copy(BLINKY_SRC_DIR, project_, fs::copy_options::recursive);
    fs::remove_all(project_ + "/build");
    fs::remove_all(project_ + "/.fwai/runs");
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr,
           int timeout_s = 120, const std::string& stdin_path = "") {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(),
                                     "--project", project_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string o, e;
    int rc = RunCommand(argv, &o, &e, {}, timeout_s, stdin_path);
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  }

  // The JSON summary: the last line of stdout in CI mode.
  static json Summary(const std::string& out) {
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    return json::parse(last, nullptr, false);
  }

  static std::vector<json> Events(const std::string& out, const std::string& kind) {
    std::vector<json> v;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("type", "") == "skill_event" && j.value("kind", "") == kind)
        v.push_back(j);
    }
    return v;
  }

  void WriteFile(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(project_ + "/" + rel).parent_path());
    std::ofstream(project_ + "/" + rel) << text;
  }

  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  void InsertIntoMain(const std::string& before_main) {
    std::string src = Read(project_ + "/src/main.c");
    auto pos = src.find("int main(void)");
    ASSERT_NE(pos, std::string::npos);
    src.insert(pos, before_main);
    std::ofstream(project_ + "/src/main.c") << src;
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  std::string project_;
};

TEST_F(SkillsTest, BuildFlashVerifyOnTheSimulatedBoardInCiMode) {
  StartDaemon();
  std::string out, err;
  int rc = Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err);
  ASSERT_EQ(rc, 0) << out << err << d_->log();
  json s = Summary(out);
  ASSERT_TRUE(s.is_object()) << out;
  EXPECT_TRUE(s["ok"].get<bool>());
  EXPECT_EQ(s["skill"], "build-flash-verify");
  EXPECT_EQ(s["board"], "sim-stm32vl");
  ASSERT_EQ(s["steps"].size(), 4u);
  for (const auto& st : s["steps"]) EXPECT_TRUE(st["ok"].get<bool>()) << st.dump();
  EXPECT_EQ(s["steps"][0]["command"], "make");
  EXPECT_EQ(s["steps"][0]["exit_code"], 0);
  // The image that was flashed is the one that was built, by hash.
  std::string sha_out, sha_err;
  ASSERT_EQ(RunCommand({"/usr/bin/sha256sum", project_ + "/build/blinky.elf"}, &sha_out, &sha_err),
            0);
  ASSERT_EQ(s["images"].size(), 1u);
  EXPECT_EQ(s["images"][0]["sha256"], sha_out.substr(0, 64));
  EXPECT_EQ(s["artifacts"][0]["files"][0]["sha256"], sha_out.substr(0, 64));
  EXPECT_TRUE(s["boot"]["ok"].get<bool>());
  EXPECT_NE(s["boot"]["line"].get<std::string>().find("booted"), std::string::npos);
  // Logs per step, and the summary, under .fwai/runs/<run_id>/.
  const std::string dir = s["log_dir"];
  EXPECT_EQ(dir, project_ + "/.fwai/runs/" + s["run_id"].get<std::string>());
  EXPECT_NE(Read(dir + "/build.log").find("arm-none-eabi-gcc"), std::string::npos);
  EXPECT_NE(Read(dir + "/verify.log").find("booted"), std::string::npos);
  EXPECT_TRUE(json::parse(Read(dir + "/summary.json"), nullptr, false).is_object());
  // Progress went to stderr; the evidence holds the run and verifies.
  EXPECT_NE(err.find("build-flash-verify"), std::string::npos);
  ASSERT_TRUE(s.contains("evidence_index"));
  std::string shown;
  ASSERT_EQ(Fwai({"evidence", "show", s["run_id"]}, &shown, &err), 0) << err;
  EXPECT_NE(shown.find("skill_run"), std::string::npos);
  EXPECT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << out << err;
  // The run's lease is gone with the run.
  EXPECT_EQ(Fwai({"hw", "who"}, &out, &err), 0);
  EXPECT_EQ(out.find("sim-stm32vl"), std::string::npos) << out;
}

TEST_F(SkillsTest, BuildOutputBecomesTypedDiagnostics) {
  StartDaemon();
  InsertIntoMain("static int helper(void) { int unused_local; return undeclared_thing; }\n");
  std::string out, err;
  int rc = Fwai({"--json", "run", "build", "--ci"}, &out, &err);
  EXPECT_EQ(rc, 12) << out << err;  // build
  auto diags = Events(out, "diagnostic");
  ASSERT_FALSE(diags.empty()) << out;
  bool error = false, warning = false;
  for (const auto& d : diags) {
    const json& x = d["data"];
    EXPECT_EQ(x["kind"], "compiler");
    EXPECT_EQ(x["file"], "src/main.c");
    EXPECT_GT(x["line"].get<int>(), 0);
    if (x["severity"] == "error" &&
        x["message"].get<std::string>().find("undeclared_thing") != std::string::npos)
      error = true;
    if (x["severity"] == "warning" &&
        x["message"].get<std::string>().find("unused") != std::string::npos)
      warning = true;
  }
  EXPECT_TRUE(error) << out;
  EXPECT_TRUE(warning) << out;
  auto fin = Events(out, "run_finished");
  ASSERT_EQ(fin.size(), 1u);
  EXPECT_EQ(fin[0]["data"]["failure_class"], "build");
  EXPECT_GE(fin[0]["data"]["diagnostics"]["errors"].get<int>(), 1);
  // The diagnostics are in the evidence, and export as SARIF.
  ASSERT_EQ(Fwai({"evidence", "export", "--format", "sarif"}, &out, &err), 0) << err;
  auto sarif = json::parse(out, nullptr, false);
  ASSERT_TRUE(sarif.is_object()) << out;
  bool found = false;
  for (const auto& r : sarif["runs"].back()["results"]) {
    found |=
        r["level"] == "error" &&
        r["message"]["text"].get<std::string>().find("undeclared_thing") != std::string::npos &&
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/main.c";
  }
  EXPECT_TRUE(found) << out;
  ASSERT_EQ(Fwai({"evidence", "export", "--format", "html", "-o", d_->dir() + "/report.html"}, &out,
                 &err),
            0)
      << err;
  EXPECT_NE(Read(d_->dir() + "/report.html").find("undeclared_thing"), std::string::npos);
}

TEST_F(SkillsTest, FlashRegionOverflowIsNamed) {
  StartDaemon();
  // 256 KiB of constant data cannot fit in the STM32F100RB's 128 KiB of flash.
  InsertIntoMain(
      "const unsigned char fwai_big_table[256 * 1024] = {1};\n"
      "const unsigned char* volatile fwai_keep;\n");
  std::string src = Read(project_ + "/src/main.c");
  const std::string open = "int main(void) {\n";
  ASSERT_NE(src.find(open), std::string::npos);
  src.insert(src.find(open) + open.size(), "  fwai_keep = fwai_big_table;\n");
  std::ofstream(project_ + "/src/main.c") << src;
  std::string out, err;
  int rc = Fwai({"--json", "run", "build", "--ci"}, &out, &err);
  EXPECT_EQ(rc, 12) << out << err;
  bool overflow = false;
  for (const auto& d : Events(out, "diagnostic")) {
    if (d["data"]["kind"] == "region_overflow" && d["data"].value("region", "") == "FLASH") {
      overflow = overflow || d["data"].value("bytes", 0) > 100000 ||
                 d["data"]["message"].get<std::string>().find("will not fit") != std::string::npos;
    }
  }
  EXPECT_TRUE(overflow) << out;
}

// A monitor step reads the firmware's RTT channel as it reads the UART: the
// boot line logged there since the run began, and a command written to the
// down-channel answered there; a channel the firmware lacks fails the step
// naming the ones it has.
TEST_F(SkillsTest, AMonitorStepReadsTheFirmwaresRttChannel) {
  StartDaemon();
  WriteFile(".fwai/skills/rtt-check.yaml", R"(name: rtt-check
steps:
  - {name: build, tool: build}
  - {name: flash, tool: flash}
  - {name: boot, tool: monitor, stream: "rtt:0", expect: "^rtt: stm32vl-blinky .* booted$", timeout: 30s}
  - {name: ping, tool: monitor, stream: "rtt:0", send: ping, expect: "^pong$", since: now, timeout: 30s}
  - {name: trace, tool: monitor, stream: "rtt:1", expect: "^tick counter=", since: now, timeout: 30s}
  - {name: missing, tool: monitor, stream: "rtt:6", expect: "x", timeout: 5s, on_fail: continue}
)");
  std::string out, err;
  int rc = Fwai({"--json", "run", "rtt-check", "--ci", "--yes"}, &out, &err);
  EXPECT_EQ(rc, 0) << out << err << d_->log();
  json s = Events(out, "run_finished")[0]["data"];
  ASSERT_EQ(s["steps"].size(), 6u) << s.dump();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s["steps"][i]["ok"].get<bool>()) << s["steps"][i].dump();
  EXPECT_EQ(s["steps"][2]["command"],
            "monitor sim-stm32vl rtt:0 until '^rtt: stm32vl-blinky .* booted$'");
  EXPECT_FALSE(s["steps"][5]["ok"].get<bool>());
  EXPECT_NE(s["steps"][5].dump().find("RTT up-channels 0 to 1, not rtt:6"), std::string::npos)
      << s["steps"][5].dump();
}

TEST_F(SkillsTest, YamlSkillWithVariablesRetryContinueAndWhen) {
  StartDaemon();
  WriteFile(".fwai/skills/check.yaml", R"(name: check
description: exercise the runner
vars:
  GREETING: hello
steps:
  - name: greet
    tool: shell
    command: echo "${GREETING} from ${PROJECT_NAME} run ${RUN_ID}"
  - name: flaky
    tool: shell
    command: test -f .fwai/tried || { touch .fwai/tried; echo first try fails; exit 1; }
    on_fail: retry
    retries: 2
  - name: tolerated
    tool: shell
    command: exit 3
    on_fail: continue
  - name: only-on-failure
    when: failure
    tool: shell
    command: echo should not run
  - name: literal
    tool: shell
    command: echo 'cost $$5'
)");
  std::string out, err;
  int rc = Fwai({"--json", "run", "check", "--ci", "--var", "GREETING=howdy"}, &out, &err);
  EXPECT_EQ(rc, 0) << out << err;
  bool greeted = false, literal = false;
  for (const auto& e : Events(out, "output")) {
    const std::string t = e["text"];
    if (e["step"] == "greet" && t.find("howdy from stm32vl-blinky run run-") == 0) greeted = true;
    if (e["step"] == "literal" && t == "cost $5") literal = true;
  }
  EXPECT_TRUE(greeted) << out;
  EXPECT_TRUE(literal) << out;
  auto retries = Events(out, "step_retry");
  ASSERT_EQ(retries.size(), 1u) << out;
  EXPECT_EQ(retries[0]["step"], "flaky");
  auto skipped = Events(out, "step_skipped");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]["step"], "only-on-failure");
  json s = Events(out, "run_finished")[0]["data"];
  EXPECT_TRUE(s["ok"].get<bool>());
  EXPECT_EQ(s["steps"][1]["attempts"], 2);
  EXPECT_FALSE(s["steps"][2]["ok"].get<bool>());
  EXPECT_EQ(s["steps"][2]["exit_code"], 3);
  EXPECT_EQ(s["steps"][2]["on_fail"], "continue");
}

TEST_F(SkillsTest, FailureClassesHaveTheirExitCodes) {
  StartDaemon();
  std::string out, err;
  // Unknown skill: config.
  EXPECT_EQ(Fwai({"run", "no-such-skill", "--ci"}, &out, &err), 11) << err;
  EXPECT_EQ(Fwai({"run", "no-such-skill", "--ci", "--exit-by", "verdict"}, &out, &err), 33) << err;
  EXPECT_NE(err.find("build-flash-verify"), std::string::npos) << err;  // lists what exists
  // An unknown variable is caught before anything runs, with file:line.
  WriteFile(".fwai/skills/vars.yaml",
            "name: vars\nsteps:\n  - name: x\n    tool: shell\n    command: echo ${NOPE}\n");
  EXPECT_EQ(Fwai({"run", "vars", "--ci"}, &out, &err), 11);
  EXPECT_NE(out.find("vars.yaml:3"), std::string::npos) << out;
  EXPECT_NE(out.find("${NOPE}"), std::string::npos) << out;
  // Flashing in CI mode without approval: the policy refuses and says which rule.
  EXPECT_EQ(Fwai({"run", "flash", "--ci"}, &out, &err), 16) << out << err;
  EXPECT_NE(out.find("flash.require_approval"), std::string::npos) << out;
  // By verdict (CI that tells the lab from the firmware): the request's.
  EXPECT_EQ(Fwai({"run", "flash", "--ci", "--exit-by", "verdict"}, &out, &err), 33) << out << err;
  EXPECT_EQ(json::parse(out).value("verdict", ""), "config") << out;
  // A monitor that never sees its pattern: verify.
  WriteFile(".fwai/skills/wait.yaml",
            "name: wait\nsteps:\n  - name: boot\n    tool: monitor\n    expect: "
            "never-printed-\\d+\n    since: now\n    timeout: 2\n");
  EXPECT_EQ(Fwai({"run", "wait", "--ci"}, &out, &err), 14) << out << err;
  EXPECT_NE(out.find("never-printed"), std::string::npos);
  // The boot pattern absent: the firmware's failure.
  EXPECT_EQ(Fwai({"run", "wait", "--ci", "--exit-by", "verdict"}, &out, &err), 30) << out << err;
  json waited = json::parse(out);
  EXPECT_EQ(waited.value("verdict", ""), "firmware") << out;
  EXPECT_EQ(waited["steps"][0].value("verdict", ""), "firmware") << out;
  EXPECT_NE(err.find("FAILED (verify, verdict firmware)"), std::string::npos) << err;
  // A timeout given by a variable: applied as given, and a value that is not
  // a duration is refused before anything runs, naming file:line and value.
  WriteFile(".fwai/skills/waitvar.yaml",
            "name: waitvar\nvars:\n  WAIT: 10m\nsteps:\n  - name: boot\n    tool: monitor\n    "
            "expect: never-printed-\\d+\n    since: now\n    timeout: ${WAIT}\n");
  EXPECT_EQ(Fwai({"run", "waitvar", "--ci", "--var", "WAIT=2s"}, &out, &err), 14) << out << err;
  EXPECT_EQ(Fwai({"run", "waitvar", "--ci", "--var", "WAIT=soon"}, &out, &err), 11) << out << err;
  EXPECT_NE(out.find("waitvar.yaml:5: step 'boot' timeout: ${WAIT}: expected a positive "
                     "duration, got 'soon'"),
            std::string::npos)
      << out;
  // A step past its own timeout, and a run past the run's: timeout.
  WriteFile(".fwai/skills/slow.yaml",
            "name: slow\nsteps:\n  - name: nap\n    tool: shell\n    command: sleep 30\n    "
            "timeout: 1\n");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Fwai({"run", "slow", "--ci"}, &out, &err), 17) << out << err;
  EXPECT_EQ(json::parse(out).value("verdict", ""), "unknown") << out;  // not guessed
  WriteFile(".fwai/skills/slow2.yaml",
            "name: slow2\nsteps:\n  - name: nap\n    tool: shell\n    command: sleep 30\n");
  EXPECT_EQ(Fwai({"run", "slow2", "--ci", "--timeout", "2"}, &out, &err), 17) << out << err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  // A broken skill file is named by file:line and field, and nothing runs.
  WriteFile(".fwai/skills/broken.yaml",
            "name: broken\nsteps:\n  - name: x\n    tool: shell\n    command: true\n    on_fial: "
            "abort\n");
  EXPECT_NE(Fwai({"skills", "ls"}, &out, &err), 0);
  EXPECT_NE(err.find("broken.yaml:6: steps[0].on_fial: unknown field"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"run", "build", "--ci"}, &out, &err), 11);
}

// A run cut by fwaid dying: the CI client exits 20 with a JSON summary, and
// the next fwaid records the run as interrupted with the steps it finished.
TEST_F(SkillsTest, ARunCutByACrashIsRecordedAsInterrupted) {
  StartDaemon();
  WriteFile(".fwai/skills/long.yaml",
            "name: long\nsteps:\n  - name: first\n    tool: shell\n    command: echo first done\n"
            "  - name: nap\n    tool: shell\n    command: echo napping; sleep 60\n");
  BackgroundCommand run({std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(),
                         "--project", project_, "run", "long", "--ci"});
  ASSERT_TRUE(run.WaitForOutput("napping")) << run.err();
  d_->Kill9();
  EXPECT_EQ(run.Wait(), 20) << run.out() << run.err();
  json summary = Summary(run.out());
  EXPECT_EQ(summary.value("failure_class", ""), "interrupted") << run.out();
  const std::string run_id = summary.value("run_id", "");
  ASSERT_FALSE(run_id.empty());
  ASSERT_TRUE(d_->Start()) << d_->log();
  // summary.json and the evidence record say what happened.
  auto written =
      json::parse(Read(project_ + "/.fwai/runs/" + run_id + "/summary.json"), nullptr, false);
  ASSERT_TRUE(written.is_object()) << "no summary.json for " << run_id;
  EXPECT_EQ(written["failure_class"], "interrupted");
  EXPECT_EQ(written["exit_code"], 20);
  ASSERT_EQ(written["steps"].size(), 1u) << written.dump();
  EXPECT_EQ(written["steps"][0]["name"], "first");
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "evidence", "show", run_id}, &out, &err), 0) << err;
  auto rec = json::parse(out, nullptr, false);
  ASSERT_TRUE(rec.is_object()) << out;
  EXPECT_NE(rec.dump().find("\"failure_class\":\"interrupted\""), std::string::npos) << out;
  EXPECT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << out << err;
  // Recorded once: a second restart adds nothing.
  ASSERT_EQ(d_->Stop(), 0);
  ASSERT_TRUE(d_->Start()) << d_->log();
  ASSERT_EQ(Fwai({"--json", "evidence", "ls"}, &out, &err), 0) << err;
  size_t count = 0;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    count += j.is_object() && j.value("run_id", "") == run_id;
  }
  EXPECT_EQ(count, 1u) << out;
}

TEST_F(SkillsTest, LlmAnalyzeSeesTheLogWithSecretsRedacted) {
  StartDaemon("", /*providers=*/true);
  WriteFile(".fwai/skills/diagnose.yaml", R"(name: diagnose
steps:
  - name: upload
    tool: shell
    command: |
      echo "connecting to https://ci:Sup3rS3cretPw@artifacts.example.com/fw"
      echo "AWS key AKIAIOSFODNN7EXAMPLE rejected"
      echo 'api_key = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789"'
      exit 1
  - name: explain
    when: failure
    llm_analyze:
      log: upload
      prompt: Why did the upload of ${PROJECT_NAME} fail?
)");
  FakeReply r;
  r.chunks = {"The credentials ", "were rejected.\nRotate them."};
  fake_.Enqueue(r);
  std::string out, err;
  int rc = Fwai({"--json", "run", "diagnose", "--ci"}, &out, &err);
  EXPECT_EQ(rc, 10) << out << err;  // the shell step's failure decides the class
  auto reqs = fake_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  const std::string body = reqs[0].body.dump();
  EXPECT_NE(body.find("Why did the upload of stm32vl-blinky fail?"), std::string::npos);
  EXPECT_NE(body.find("rejected"), std::string::npos);
  for (const char* secret : {"Sup3rS3cretPw", "AKIAIOSFODNN7EXAMPLE",
                             "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789"}) {
    EXPECT_EQ(body.find(secret), std::string::npos) << secret;
    EXPECT_EQ(out.find(secret), std::string::npos) << secret;
  }
  EXPECT_NE(body.find("[REDACTED:url_password]"), std::string::npos) << body;
  EXPECT_NE(body.find("[REDACTED:aws_access_key]"), std::string::npos) << body;
  bool answered = false;
  for (const auto& e : Events(out, "output"))
    answered |= e["step"] == "explain" && e["text"] == "were rejected.";
  // (The first line is "The credentials were rejected.")
  for (const auto& e : Events(out, "output"))
    answered |= e["step"] == "explain" && e["text"] == "The credentials were rejected.";
  EXPECT_TRUE(answered) << out;
  json s = Events(out, "run_finished")[0]["data"];
  ASSERT_EQ(s["llm_calls"].size(), 1u);
  EXPECT_EQ(s["llm_calls"][0]["input_tokens"], 12);
  EXPECT_EQ(s["failure_class"], "failed");
  // The log on disk is redacted too.
  const std::string log = Read(s["log_dir"].get<std::string>() + "/upload.log");
  EXPECT_NE(log.find("artifacts.example.com"), std::string::npos);
  EXPECT_EQ(log.find("Sup3rS3cretPw"), std::string::npos);
  EXPECT_EQ(Fwai({"evidence", "show", s["run_id"]}, &out, &err), 0);
  EXPECT_EQ(out.find("AKIAIOSFODNN7EXAMPLE"), std::string::npos);
}

TEST_F(SkillsTest, AgenticStepRunsAnAgentTurn) {
  StartDaemon("", /*providers=*/true);
  WriteFile(".fwai/skills/review.yaml",
            "name: review\nsteps:\n  - name: look\n    agentic:\n      goal: Summarise "
            "${PROJECT_NAME} in one line.\n");
  FakeReply look;
  look.chunks = {"Reading the Makefile.\n"};
  look.tool_calls = {{"c1", "read_file", {{"path", "Makefile"}}}};
  fake_.Enqueue(look);
  FakeReply r;
  r.chunks = {"A blinky for the ", "STM32VLDISCOVERY."};
  fake_.Enqueue(r);
  std::string out, err;
  ASSERT_EQ(Fwai({"--json", "run", "review", "--ci"}, &out, &err), 0) << out << err;
  // The agent's text and tool calls stream as the step's output, in order.
  std::vector<std::string> texts;
  for (const auto& e : Events(out, "output")) texts.push_back(e["text"]);
  auto at = [&](const std::string& t) {
    return std::find(texts.begin(), texts.end(), t) - texts.begin();
  };
  ASSERT_LT(at("Reading the Makefile."), static_cast<long>(texts.size())) << out;
  EXPECT_LT(at("Reading the Makefile."), at("→ read_file"));
  EXPECT_LT(at("→ read_file"), at("A blinky for the STM32VLDISCOVERY."));
  EXPECT_NE(std::find_if(texts.begin(), texts.end(),
                         [](const std::string& t) { return t.rfind("← ok", 0) == 0; }),
            texts.end());
  json s = Events(out, "run_finished")[0]["data"];
  ASSERT_EQ(s["llm_calls"].size(), 1u);
  const std::string session = s["llm_calls"][0]["session_id"];
  EXPECT_FALSE(session.empty());
  bool said = false;
  for (const auto& e : Events(out, "output"))
    said |= e["text"] == "A blinky for the STM32VLDISCOVERY.";
  EXPECT_TRUE(said) << out;
  ASSERT_GE(fake_.requests().size(), 2u);
  EXPECT_NE(fake_.requests()[0].body.dump().find("Summarise stm32vl-blinky in one line."),
            std::string::npos);
}

TEST_F(SkillsTest, ChangeBudgetOfARun) {
  StartDaemon();
  std::string out, err;
  for (std::vector<std::string> g :
       {std::vector<std::string>{"init", "-q"},
        {"add", "-A"},
        {"-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "base"}}) {
    std::vector<std::string> argv = {"/usr/bin/git", "-C", project_};
    argv.insert(argv.end(), g.begin(), g.end());
    ASSERT_EQ(RunCommand(argv, &out, &err), 0) << err;
  }
  std::string yaml = Read(project_ + "/.fwai/project.yaml");
  std::ofstream(project_ + "/.fwai/project.yaml")
      << yaml << "policy:\n  change_budget:\n    max_files_per_run: 1\n";
  WriteFile(".fwai/skills/churn.yaml", R"(name: churn
steps:
  - name: edit
    tool: shell
    command: echo "// a" >> src/main.c && echo "// b" >> Makefile
  - name: after
    tool: shell
    command: echo never
)");
  int rc = Fwai({"--json", "run", "churn", "--ci"}, &out, &err);
  EXPECT_EQ(rc, 16) << out << err;
  json s = Events(out, "run_finished")[0]["data"];
  EXPECT_NE(s["error"].get<std::string>().find("max_files_per_run 1"), std::string::npos)
      << s.dump();
  EXPECT_EQ(s["files_changed"].size(), 2u)
      << s.dump();  // main.c, Makefile (not what changed before the run)
  EXPECT_EQ(Events(out, "step_skipped").size(), 1u);
}

TEST_F(SkillsTest, IntentResolutionWithoutAProvider) {
  StartDaemon();
  auto resolve = [&](const std::string& text) {
    std::string out, err;
    EXPECT_EQ(Fwai({"--json", "skills", "resolve", text}, &out, &err), 0) << err;
    return json::parse(out, nullptr, false);
  };
  json a = resolve("build-flash-verify");
  EXPECT_EQ(a["skill"], "build-flash-verify");
  EXPECT_EQ(a["tier"], "exact");
  EXPECT_EQ(a["action"], "run");
  json b = resolve("please build the firmware");
  EXPECT_EQ(b["skill"], "build");
  EXPECT_EQ(b["action"], "run");
  json c = resolve("why does the ADC read zero after wake-up from stop mode?");
  EXPECT_EQ(c["action"], "chat") << c.dump();
  json d = resolve("show me the uart console");
  EXPECT_EQ(d["skill"], "monitor") << d.dump();
  EXPECT_NE(d["action"], "chat");
}

TEST_F(SkillsTest, ABareMetalTemplateBuildsFlashesAndBoots) {
  StartDaemon();
  const std::string dir = d_->dir() + "/newfw";
  std::string out, err;
  ASSERT_EQ(Fwai({"init", "--template", "bare-metal", dir}, &out, &err), 0) << out << err;
  EXPECT_NE(out.find("created src/main.c"), std::string::npos) << out;
  EXPECT_NE(Read(dir + "/.fwai/project.yaml").find("image: build/newfw.elf"), std::string::npos);
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai",
                                   "--daemon",
                                   d_->address(),
                                   "--project",
                                   dir,
                                   "run",
                                   "build-flash-verify",
                                   "--ci",
                                   "--yes"};
  ASSERT_EQ(RunCommand(argv, &out, &err, {}, 120), 0) << out << err;
  json s = Summary(out);
  EXPECT_NE(s["boot"]["line"].get<std::string>().find("newfw 0.1.0 booted"), std::string::npos)
      << s.dump();
  // A second init does not overwrite the person's files.
  EXPECT_NE(Fwai({"init", "--template", "bare-metal", dir}, &out, &err), 0);
  EXPECT_NE(err.find("exists"), std::string::npos) << err;
  // The other templates: files, and settings detection agrees with.
  for (const auto& [name, system] : std::vector<std::pair<std::string, std::string>>{
           {"freertos", "make"}, {"zephyr", "zephyr"}, {"arduino", "arduino"}}) {
    const std::string p = d_->dir() + "/t-" + name;
    ASSERT_EQ(Fwai({"init", "--template", name, p}, &out, &err), 0) << name << out << err;
    fs::remove(p + "/.fwai/project.yaml");
    ASSERT_EQ(Fwai({"--json", "init", "--yes", p}, &out, &err), 0) << name << err;
    EXPECT_EQ(json::parse(out)["build_system"], system) << name << out;
  }
  EXPECT_TRUE(fs::exists(d_->dir() + "/t-freertos/src/FreeRTOSConfig.h"));
  EXPECT_TRUE(fs::exists(d_->dir() + "/t-arduino/t-arduino.ino"));
  EXPECT_TRUE(fs::exists(d_->dir() + "/t-zephyr/prj.conf"));
}

TEST_F(SkillsTest, FlashPolicyAppliesToFwaiFlashAndRuns) {
  StartDaemon();
  std::string out, err;
  ASSERT_EQ(RunCommand({"/usr/bin/make", "-s", "-C", project_}, &out, &err, {}, 120), 0) << err;
  const std::string yaml = Read(project_ + "/.fwai/project.yaml");
  std::ofstream(project_ + "/.fwai/project.yaml")
      << yaml << "policy:\n  flash:\n    allowed_boards: [\"lab-*\"]\n";
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  EXPECT_NE(Fwai({"flash", "--yes", "sim-stm32vl", project_ + "/build/blinky.elf"}, &out, &err), 0);
  EXPECT_NE(err.find("refused by policy (flash.allowed_boards: lab-*)"), std::string::npos) << err;
  EXPECT_EQ(Fwai({"run", "flash", "--ci", "--yes"}, &out, &err), 16) << out << err;
  EXPECT_NE(out.find("flash.allowed_boards"), std::string::npos) << out;
  // A project that waives approval flashes without --yes (and without a prompt).
  std::ofstream(project_ + "/.fwai/project.yaml")
      << yaml << "policy:\n  flash:\n    require_approval: false\n";
  EXPECT_EQ(Fwai({"flash", "sim-stm32vl", project_ + "/build/blinky.elf"}, &out, &err), 0)
      << out << err;
  EXPECT_EQ(Fwai({"run", "flash", "--ci"}, &out, &err), 0) << out << err;
  // The refusal is in the evidence.
  ASSERT_EQ(Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0);
  EXPECT_NE(out.find("\"kind\":\"policy_refusal\""), std::string::npos) << out;
}

TEST_F(SkillsTest, OldRunLogsArePruned) {
  StartDaemon();
  for (int i = 0; i < 205; ++i)
    fs::create_directories(project_ + "/.fwai/runs/run-old" + std::to_string(i));
  WriteFile(".fwai/skills/hi.yaml", "name: hi\nsteps:\n  - tool: shell\n    command: echo hi\n");
  std::string out, err;
  ASSERT_EQ(Fwai({"run", "hi", "--ci"}, &out, &err), 0) << err;
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(project_ + "/.fwai/runs"))
    n += e.is_directory() ? 1 : 0;
  EXPECT_EQ(n, 200u);
  EXPECT_TRUE(fs::exists(Summary(out)["log_dir"].get<std::string>() + "/shell.log"));
}

TEST_F(SkillsTest, ReplSlashBuildRunsTheSkill) {
  StartDaemon();
  const std::string input = d_->dir() + "/repl-input";
  std::ofstream(input) << "/build\n/exit\n";
  std::string out, err;
  EXPECT_EQ(Fwai({}, &out, &err, 120, input), 0) << out << err;
  EXPECT_NE(out.find("ok  build"), std::string::npos) << out << err;
  EXPECT_TRUE(fs::exists(project_ + "/build/blinky.elf"));
}

}  // namespace
}  // namespace fwai::testing
