// Register truth through a real fwaid: `fwai check registers` (text, --json,
// --sarif, exit codes, a part added with `fwai kb add`), the agent's
// checkRegisters tool and the findings edit_file brings back, a skill step
// `tool: check_registers`, and the flash guard's register_check (warn, block)
// on the simulated board.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fwai/v1/sessions.grpc.pb.h"
#include "tests/fakes/fake_llm_server.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Replace(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = Read(path);
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << path;
  text.replace(at, from.size(), to);
  std::ofstream(path, std::ios::trunc) << text;
}

constexpr char kWrongBit[] = "#define RCC_APB2ENR_USART1EN (1u << 13)";
constexpr char kRightBit[] = "#define RCC_APB2ENR_USART1EN (1u << 14)";

class RegistersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.Start();
    d_ = std::make_unique<Daemon>(&fake_);
    ASSERT_TRUE(d_->Start()) << d_->log();
    project_ = d_->dir() + "/stm32vl-blinky";
    fs::copy(std::string(BLINKY_SRC_DIR), project_, fs::copy_options::recursive);
    fs::remove_all(project_ + "/build");
    fs::remove_all(project_ + "/.fwai/runs");
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err, int timeout_s = 180) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(),
                                     "--project", project_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, out, err, {}, timeout_s);
  }

  static json LastJsonLine(const std::string& out) {
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    return json::parse(last, nullptr, false);
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  std::string project_;
};

TEST_F(RegistersTest, TheCliChecksTheProjectAndSaysSoInItsExitCode) {
  std::string out, err;
  EXPECT_EQ(Fwai({"check", "registers"}, &out, &err), 0) << out << err << d_->log();
  EXPECT_NE(out.find("against STM32F100.svd: 0 error(s)"), std::string::npos) << out;

  Replace(project_ + "/src/main.c", kRightBit, kWrongBit);
  const std::string sarif = d_->dir() + "/registers.sarif";
  EXPECT_EQ(Fwai({"--json", "check", "registers", "--sarif", sarif}, &out, &err), 1) << out << err;
  const json report = json::parse(out, nullptr, false);
  ASSERT_TRUE(report.is_object()) << out;
  ASSERT_EQ(report["findings"].size(), 1u) << out;
  const json& f = report["findings"][0];
  for (const char* key : {"file", "line", "column", "severity", "kind", "symbol", "code_says",
                          "svd_says", "source", "fix"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing: " << f.dump();
  }
  EXPECT_EQ(f["file"], "src/main.c");
  EXPECT_EQ(f["line"], 17);
  EXPECT_EQ(f["kind"], "field-position");
  EXPECT_EQ(f["source"], "STM32F100.svd: RCC/APB2ENR/USART1EN");
  EXPECT_EQ(report["checked"]["errors"], 1);
  const json s = json::parse(Read(sarif), nullptr, false);
  ASSERT_TRUE(s.is_object()) << Read(sarif);
  EXPECT_EQ(s["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"],
            17);

  // From a subdirectory: the project is found upwards, paths are the user's.
  const std::vector<std::string> argv = {
      "/bin/sh",
      "-c",
      "cd \"$1\" && exec \"$2\" --daemon \"$3\" check registers main.c",
      "sh",
      project_ + "/src",
      std::string(FWAI_BIN_DIR) + "/fwai",
      d_->address()};
  EXPECT_EQ(RunCommand(argv, &out, &err, {}, 60), 1) << out << err;
  EXPECT_NE(out.find("src/main.c:17:1: error [field-position] RCC_APB2ENR_USART1EN"),
            std::string::npos)
      << out;

  // Bad usage: exit 2 and what is wrong.
  EXPECT_EQ(Fwai({"check", "registers", "--target", "nrf52840"}, &out, &err), 2);
  EXPECT_NE(err.find("no SVD for part 'nrf52840' (parts with an SVD: LM3S6965, STM32F100)"),
            std::string::npos)
      << err;
  EXPECT_EQ(Fwai({"check", "registers", "--target", "x", "--svd", "y.svd"}, &out, &err), 2);
  EXPECT_EQ(Fwai({"check", "registers", "/etc/passwd"}, &out, &err), 2) << out << err;
  EXPECT_NE(out.find("/etc/passwd: not checked: outside the project"), std::string::npos) << out;
}

TEST_F(RegistersTest, AnSvdAddedToTheKnowledgeBaseMakesItsPartCheckable) {
  const std::string svd = d_->dir() + "/TESTCHIP.svd";
  std::ofstream(svd) << R"(<?xml version="1.0"?>
<device schemaVersion="1.3"><name>TESTCHIP</name><description>A test chip</description>
<width>32</width><size>32</size><access>read-write</access><resetValue>0</resetValue>
<peripherals><peripheral><name>CTRL</name><description>Control block</description><baseAddress>0x50000000</baseAddress>
<registers><register><name>EN</name><description>Enable</description><addressOffset>0x4</addressOffset>
<fields><field><name>ON</name><description>Turns it on</description><bitOffset>0</bitOffset><bitWidth>1</bitWidth></field>
</fields></register></registers></peripheral></peripherals></device>
)";
  std::ofstream(project_ + "/src/chip.c") << "#define CTRL_EN (*(volatile unsigned *)0x50000004)\n"
                                             "void on(void) { CTRL_EN = 2; }\n";
  std::string out, err;
  const std::string chip_c = project_ + "/src/chip.c";
  EXPECT_EQ(Fwai({"check", "registers", "--target", "testchip-a1", chip_c}, &out, &err), 2);
  ASSERT_EQ(Fwai({"kb", "add", svd}, &out, &err), 0) << out << err;
  EXPECT_EQ(Fwai({"--json", "check", "registers", "--target", "testchip-a1", chip_c}, &out, &err),
            1)
      << out << err << d_->log();
  const json report = json::parse(out, nullptr, false);
  ASSERT_TRUE(report.is_object()) << out << err;
  ASSERT_EQ(report["findings"].size(), 1u) << out;
  EXPECT_EQ(report["findings"][0]["kind"], "reserved-bits");
  EXPECT_EQ(report["findings"][0]["line"], 2);
  EXPECT_EQ(report["checked"]["device"], "TESTCHIP");
  // A file that is no SVD adds no part.
  std::ofstream(d_->dir() + "/notes.svd") << "<device><name>../../escape</name></device>";
  Fwai({"kb", "add", d_->dir() + "/notes.svd"}, &out, &err);
  EXPECT_FALSE(fs::exists(d_->data_dir() + "/escape.svd"));
  for (const auto& e : fs::directory_iterator(d_->data_dir() + "/svd")) {
    EXPECT_EQ(e.path().filename(), "TESTCHIP.svd");
  }
}

TEST_F(RegistersTest, TheAgentSeesFindingsOnTheLinesItWritesAndChecksOnRequest) {
  auto session = [&] {
    grpc::ClientContext cctx;
    fwai::v1::CreateSessionRequest creq;
    creq.set_project_root(project_);
    fwai::v1::Session s;
    EXPECT_TRUE(d_->sessions()->Create(&cctx, creq, &s).ok());
    return s.id();
  }();
  FakeReply r1;
  r1.tool_calls = {
      {"e1", "edit_file",
       json{{"path", "src/main.c"}, {"old_string", kRightBit}, {"new_string", kWrongBit}}},
      {"e2", "edit_file",
       json{{"path", "src/main.c"},
            {"old_string", "#define LED_BLUE (1u << 8)"},
            {"new_string", "#define LED_BLUE (1u << 8)  // PC8"}}}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.tool_calls = {{"c1", "checkRegisters", json{{"json", true}}}};
  fake_.Enqueue(r2);
  FakeReply r3;
  r3.chunks = {"USART1EN is bit 14; fixing it."};
  fake_.Enqueue(r3);
  auto outcome = RunChat(*d_->sessions(), session, "enable the USART1 clock", 120);
  ASSERT_TRUE(outcome.finished) << d_->log();
  auto reqs = fake_.requests();
  ASSERT_GE(reqs.size(), 3u);
  // The tool results the model got after the edits: the wrong bit's finding
  // with the SVD's truth, and nothing for the edit of a correct line.
  const std::string after_edits = reqs[1].body.dump();
  EXPECT_NE(after_edits.find("Register check of the lines written, against STM32F100.svd"),
            std::string::npos)
      << after_edits;
  EXPECT_NE(after_edits.find("src/main.c:17:1: error [field-position] RCC_APB2ENR_USART1EN"),
            std::string::npos)
      << after_edits;
  EXPECT_NE(after_edits.find("RCC.APB2ENR.USART1EN is bit 14"), std::string::npos) << after_edits;
  EXPECT_EQ(after_edits.find("src/main.c:23"), std::string::npos)
      << "a finding on the correct line it edited";
  // checkRegisters on request, as JSON.
  json checked;
  for (const auto& m : reqs[2].body["messages"]) {
    if (!m["content"].is_array()) continue;
    for (const auto& c : m["content"]) {
      if (c.value("tool_use_id", "") == "c1")
        checked = json::parse(c.value("content", ""), nullptr, false);
    }
  }
  ASSERT_TRUE(checked.is_object()) << reqs[2].body.dump().substr(0, 2000);
  EXPECT_EQ(checked["checked"]["errors"], 1);
  ASSERT_EQ(checked["findings"].size(), 1u);
  EXPECT_EQ(checked["findings"][0]["kind"], "field-position");
}

TEST_F(RegistersTest, ASkillStepChecksRegistersAndItsFindingsAreDiagnostics) {
  fs::create_directories(project_ + "/.fwai/skills");
  std::ofstream(project_ + "/.fwai/skills/registers.yaml")
      << "name: registers\ndescription: register code against the SVD\nsteps:\n"
         "  - name: svd\n    tool: check_registers\n    paths: [src]\n";
  std::string out, err;
  ASSERT_EQ(Fwai({"run", "registers", "--ci"}, &out, &err), 0) << out << err << d_->log();
  Replace(project_ + "/src/main.c", "#define USART1_CR1 REG(0x4001380C)",
          "#define USART1_CR1 REG(0x4001380E)");
  EXPECT_EQ(Fwai({"--json", "run", "registers", "--ci"}, &out, &err), 21) << out << err;
  const json summary = LastJsonLine(out)["data"];
  ASSERT_TRUE(summary.is_object()) << out;
  EXPECT_NE(summary.value("error", "")
                .find("1 register error against STM32F100.svd, first: src/main.c:28"),
            std::string::npos)
      << summary.dump(1);
  bool diagnostic = false;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const json ev = json::parse(line, nullptr, false);
    if (!ev.is_object() || ev.value("kind", "") != "diagnostic") continue;
    const json d = ev.contains("data") ? ev["data"] : ev;
    diagnostic =
        diagnostic || (d.value("file", "") == "src/main.c" && d.value("line", 0) == 28 &&
                       d.value("severity", "") == "error" && d.value("kind", "") == "register");
  }
  EXPECT_TRUE(diagnostic) << out;
  // A step that names no device in a project without one says so.
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << "name: bare\nbuild:\n  command: make\n";
  fs::remove(project_ + "/stm32f100rb.ld");
  EXPECT_EQ(Fwai({"run", "registers", "--ci"}, &out, &err), 11) << out << err;
  EXPECT_NE(LastJsonLine(out).value("error", "").find("which device?"), std::string::npos) << out;
}

TEST_F(RegistersTest, TheFlashGuardBlocksOrWarnsOnRegisterErrors) {
  const std::string yaml = Read(project_ + "/.fwai/project.yaml");
  Replace(project_ + "/src/main.c", kRightBit, kWrongBit);
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  flash:\n    register_check: block\n";
  std::string out, err;
  EXPECT_EQ(Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err), 13) << out << err;
  const std::string refused = LastJsonLine(out).value("error", "");
  EXPECT_NE(
      refused.find(
          "flash guard (register_check): 1 register error in the sources against STM32F100.svd: "
          "src/main.c:17: RCC_APB2ENR_USART1EN"),
      std::string::npos)
      << out;
  // warn: the flash goes on, and says what it went on despite.
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  flash:\n    register_check: warn\n";
  EXPECT_EQ(Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err), 0)
      << out << err << d_->log();
  EXPECT_NE((out + err).find("warning: register_check: 1 register error"), std::string::npos)
      << out << err;
  // Fixed: block lets it through and the guard says the registers match.
  Replace(project_ + "/src/main.c", kWrongBit, kRightBit);
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  flash:\n    register_check: block\n";
  EXPECT_EQ(Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err), 0) << out << err;
  EXPECT_NE((out + err).find("registers match STM32F100.svd"), std::string::npos) << out << err;
  // A value the policy does not know is named with its line.
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  flash:\n    register_check: sometimes\n";
  EXPECT_NE(Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err), 0);
  EXPECT_NE((out + err).find("flash.register_check: expected off, warn or block"),
            std::string::npos)
      << out << err;
}

}  // namespace
}  // namespace fwai::testing
