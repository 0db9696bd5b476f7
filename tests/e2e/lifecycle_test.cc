// Build records that name what they built, SBOMs and memory reports through
// the CLI and a real fwaid: `fwai init` on the examples, `fwai run build`
// records artifacts (ELF, .bin, .hex by SHA-256) with the memory report, the
// toolchain attestation and a CycloneDX SBOM; the in-toto export has a
// subject per artifact; `fwai sbom` / `fwai mem`; the flash guard's memory
// budgets and toolchain rule on the simulated board.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/escaping.h"
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

std::string Sha256sum(const std::string& path) {
  std::string out, err;
  EXPECT_EQ(RunCommand({"/usr/bin/sha256sum", path}, &out, &err), 0) << err;
  return out.substr(0, 64);
}

class LifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override { fake_.Start(); }

  void StartDaemon(const std::string& example, const std::string& extra_yaml = "",
                   bool providers = false) {
    d_ = std::make_unique<Daemon>(&fake_, extra_yaml, providers);
    ASSERT_TRUE(d_->Start()) << d_->log();
    project_ = d_->dir() + "/" + example;
    fs::copy(std::string(BLINKY_SRC_DIR) + "/../" + example, project_, fs::copy_options::recursive);
    fs::remove_all(project_ + "/build");
    fs::remove_all(project_ + "/.fwai/runs");
  }

  int Fwai(std::vector<std::string> args, std::string* out, std::string* err = nullptr,
           int timeout_s = 180) {
    std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwai", "--daemon", d_->address(),
                                     "--project", project_};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string o, e;
    int rc = RunCommand(argv, &o, &e, {}, timeout_s);
    if (out) *out = o;
    if (err) *err = e;
    return rc;
  }

  static json Summary(const std::string& out) {
    std::istringstream in(out);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    return json::parse(last, nullptr, false);
  }

  json Build() {
    std::string out, err;
    int rc = Fwai({"run", "build", "--ci"}, &out, &err);
    EXPECT_EQ(rc, 0) << out << err << d_->log();
    return Summary(out);
  }

  // The in-toto Statement inside the exported DSSE envelope.
  json InTotoStatement() {
    std::string out, err;
    EXPECT_EQ(Fwai({"evidence", "export", "--format", "in-toto"}, &out, &err), 0) << err;
    json env = json::parse(out, nullptr, false);
    std::string payload;
    EXPECT_TRUE(absl::Base64Unescape(env.value("payload", ""), &payload));
    return json::parse(payload, nullptr, false);
  }

  int Validate(const std::string& file, std::string* errors) {
    std::string out;
    int rc = RunCommand(
        {"/usr/bin/env",
         std::string("NODE_PATH=") + FWAI_SOURCE_DIR + "/.cache/sbom-validator/node_modules",
         "node", std::string(FWAI_SOURCE_DIR) + "/tests/sbom/validate.js", file},
        &out, errors);
    *errors += out;
    return rc;
  }

  FakeLlmServer fake_;
  std::unique_ptr<Daemon> d_;
  std::string project_;
};

// `fwai init --yes` on the LM3S6965 example finds the part and the image;
// the build run's record names the ELF by hash, and the in-toto statement
// has it as its subject.
TEST_F(LifecycleTest, InitThenBuildRecordsTheImageAndInTotoNamesIt) {
  StartDaemon("lm3s6965-hello");
  std::string out, err;
  ASSERT_EQ(Fwai({"init", "--yes"}, &out, &err), 0) << out << err;
  const std::string yaml = Read(project_ + "/.fwai/project.yaml");
  EXPECT_NE(yaml.find("target: lm3s6965"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("image: build/hello.elf"), std::string::npos) << yaml;

  json s = Build();
  ASSERT_TRUE(s.is_object());
  const std::string sha = Sha256sum(project_ + "/build/hello.elf");
  ASSERT_EQ(s["artifacts"].size(), 1u) << s.dump(1);
  ASSERT_EQ(s["artifacts"][0]["files"].size(), 1u);
  const json& f = s["artifacts"][0]["files"][0];
  EXPECT_EQ(f["path"], "build/hello.elf");
  EXPECT_EQ(f["format"], "elf");
  EXPECT_EQ(f["sha256"], sha);
  EXPECT_TRUE(f["fresh"].get<bool>());
  // The stored record says the same.
  ASSERT_EQ(Fwai({"--json", "evidence", "show", s["run_id"]}, &out, &err), 0) << err;
  json rec = json::parse(out, nullptr, false);
  EXPECT_EQ(rec["artifacts"][0]["files"][0]["sha256"], sha);
  EXPECT_EQ(rec["target"], "lm3s6965");
  json st = InTotoStatement();
  ASSERT_EQ(st["subject"].size(), 1u) << st.dump(1);
  EXPECT_EQ(st["subject"][0]["name"], "build/hello.elf");
  EXPECT_EQ(st["subject"][0]["digest"]["sha256"], sha);
}

// With no image configured, the build's own outputs: the ELF it wrote and the
// .bin and .hex made from it, one in-toto subject each.
TEST_F(LifecycleTest, WithoutAConfiguredImageTheBuildOutputsAreFound) {
  StartDaemon("stm32vl-blinky");
  std::string yaml = Read(project_ + "/.fwai/project.yaml");
  yaml = std::regex_replace(yaml, std::regex("\n  image: [^\n]*"), "");
  ASSERT_EQ(yaml.find("image:"), std::string::npos);
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc) << yaml;
  json s = Build();
  std::map<std::string, std::string> sha;
  for (const auto& f : s["artifacts"][0]["files"]) sha[f["path"]] = f["sha256"];
  ASSERT_EQ(sha.size(), 3u) << s.dump(1);
  for (const char* p : {"build/blinky.elf", "build/blinky.bin", "build/blinky.hex"}) {
    EXPECT_EQ(sha[p], Sha256sum(project_ + "/" + p)) << p;
  }
  json st = InTotoStatement();
  std::map<std::string, std::string> subjects;
  for (const auto& x : st["subject"]) subjects[x["name"]] = x["digest"]["sha256"];
  EXPECT_EQ(subjects, sha);
}

// The build record carries the SBOM (valid CycloneDX 1.6) and the memory
// report; `fwai sbom` and `fwai mem` give them; a second build shows what grew.
TEST_F(LifecycleTest, SbomAndMemoryOfBuildRuns) {
  StartDaemon("stm32vl-blinky");
  json first = Build();
  ASSERT_TRUE(first.contains("sbom")) << first.dump(1);
  EXPECT_TRUE(first["toolchain"]["verified"].get<bool>()) << first["toolchain"].dump(1);
  std::string out, err;
  const std::string bom_file = d_->dir() + "/bom.json";
  ASSERT_EQ(Fwai({"sbom", first["run_id"], "--format", "cyclonedx", "-o", bom_file}, &out, &err), 0)
      << err;
  std::string errors;
  ASSERT_EQ(Validate(bom_file, &errors), 0) << errors;
  json bom = json::parse(Read(bom_file), nullptr, false);
  EXPECT_EQ(bom["metadata"]["component"]["hashes"][0]["content"],
            Sha256sum(project_ + "/build/blinky.elf"));
  EXPECT_EQ(bom, first["sbom"]);  // the record's own SBOM, covered by the log's checkpoint
  ASSERT_EQ(Fwai({"sbom", "--format", "spdx"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out, nullptr, false)["spdxVersion"], "SPDX-2.3");
  // Memory: the record's report through `fwai mem`.
  ASSERT_EQ(Fwai({"--json", "mem"}, &out, &err), 0) << err;
  json mem = json::parse(out, nullptr, false);
  EXPECT_EQ(mem["report"], first["memory"]["report"]);
  ASSERT_EQ(Fwai({"mem"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("FLASH"), std::string::npos) << out;
  EXPECT_NE(out.find("largest symbols"), std::string::npos) << out;
  // A bigger build: the diff against the previous one names the new symbol.
  std::string src = Read(project_ + "/src/main.c");
  const size_t at = src.find("int main(void) {");
  ASSERT_NE(at, std::string::npos);
  src.insert(at + std::string("int main(void) {").size(), "\n  big_buffer[0] = big_buffer[1];");
  src.insert(at, "volatile unsigned char big_buffer[700];\n");
  std::ofstream(project_ + "/src/main.c", std::ios::trunc) << src;
  json second = Build();
  ASSERT_TRUE(second["memory"].contains("diff")) << second["memory"].dump(1);
  EXPECT_EQ(second["memory"]["diff"]["against"]["run_id"], first["run_id"]);
  int64_t ram = 0;
  for (const auto& r : second["memory"]["diff"]["regions"]) {
    if (r["name"] == "RAM") ram = r["delta"];
  }
  EXPECT_GE(ram, 700);
  EXPECT_EQ(second["memory"]["diff"]["symbols"]["added"][0]["name"], "big_buffer");
  // The build step's own result carries the delta (what the agent's build tool shows).
  bool step_delta = false;
  for (const auto& r : second["steps"][0]["memory"]["regions"])
    step_delta |= r["name"] == "RAM" && r["delta"].get<int64_t>() >= 700;
  EXPECT_TRUE(step_delta) << second["steps"][0].dump(1);
  ASSERT_EQ(Fwai({"mem", "--diff", first["run_id"]}, &out, &err), 0) << err;
  EXPECT_NE(out.find("added big_buffer"), std::string::npos) << out;
  // A changed object file: a different SBOM.
  EXPECT_NE(second["sbom"]["metadata"]["component"]["hashes"][0]["content"],
            first["sbom"]["metadata"]["component"]["hashes"][0]["content"]);
  EXPECT_EQ(Fwai({"evidence", "verify"}, &out, &err), 0) << out << err;
}

// The flash guard refuses an image over the memory budget and names the
// region; a flash within it records the SBOM of what was flashed.
TEST_F(LifecycleTest, FlashGuardEnforcesMemoryBudgetsAndRecordsTheFlashedSbom) {
  StartDaemon("stm32vl-blinky");
  const std::string yaml = Read(project_ + "/.fwai/project.yaml");
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  memory:\n    ram_max_pct: 0.1\n";
  std::string out, err;
  int rc = Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err);
  EXPECT_EQ(rc, 13) << out << err;
  json s = Summary(out);
  EXPECT_NE(s.value("error", "").find("flash guard (memory): RAM is"), std::string::npos)
      << s.dump(1);
  EXPECT_NE(s.value("error", "").find("memory.ram_max_pct 0.1"), std::string::npos) << s.dump(1);
  // Within budget: flashed, and the flash record carries the SBOM with the flashed bytes' hash.
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  memory:\n    ram_max_pct: 50\n    flash_max_pct: 50\n";
  ASSERT_EQ(Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err), 0)
      << out << err << d_->log();
  ASSERT_EQ(Fwai({"--json", "evidence", "ls", "-n", "0"}, &out, &err), 0) << err;
  json flash;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j["record"].value("kind", "") == "flash") flash = j["record"];
  }
  ASSERT_TRUE(flash.is_object()) << out;
  const std::string sha = Sha256sum(project_ + "/build/blinky.elf");
  EXPECT_EQ(flash["flashed_sha256"], sha);  // the simulated board runs the ELF itself
  ASSERT_TRUE(flash.contains("sbom")) << flash.dump(1);
  EXPECT_EQ(flash["sbom"]["metadata"]["component"]["hashes"][0]["content"], sha);
  const std::string file = d_->dir() + "/flash-bom.json";
  std::ofstream(file) << flash["sbom"].dump();
  std::string errors;
  EXPECT_EQ(Validate(file, &errors), 0) << errors;
  bool flashed = false;
  for (const auto& p : flash["sbom"]["metadata"]["component"]["properties"])
    flashed |= p["name"] == "fwai:flashed_sha256" && p["value"] == sha;
  EXPECT_TRUE(flashed);
}

// policy flash.require_verified_toolchain: an image whose build's toolchain
// does not verify with dpkg -V is refused (a copy of dpkg's database whose
// record of the compiler no longer matches the file).
TEST_F(LifecycleTest, AnImageBuiltByAToolchainThatDoesNotVerifyIsRefused) {
  const std::string admin = MakeTempDir("fwai-dpkg-");
  fs::create_directories(admin + "/info");
  fs::copy_file("/var/lib/dpkg/status", admin + "/status");
  for (const char* pkg :
       {"gcc-arm-none-eabi", "binutils-arm-none-eabi", "libnewlib-arm-none-eabi"}) {
    for (const char* ext : {".list", ".md5sums"}) {
      const fs::path p = fs::path("/var/lib/dpkg/info") / (std::string(pkg) + ext);
      if (fs::exists(p)) fs::copy_file(p, fs::path(admin) / "info" / p.filename());
    }
  }
  const std::string md5 = admin + "/info/gcc-arm-none-eabi.md5sums";
  std::string text =
      std::regex_replace(Read(md5), std::regex("[0-9a-f]{32}(  usr/bin/arm-none-eabi-gcc\n)"),
                         "00000000000000000000000000000000$1");
  std::ofstream(md5, std::ios::trunc) << text;
  StartDaemon("stm32vl-blinky", "toolchain:\n  dpkg_admindir: " + admin + "\n");
  const std::string yaml = Read(project_ + "/.fwai/project.yaml");
  std::ofstream(project_ + "/.fwai/project.yaml", std::ios::trunc)
      << yaml << "policy:\n  flash:\n    require_verified_toolchain: true\n";
  std::string out, err;
  EXPECT_EQ(Fwai({"run", "build-flash-verify", "--ci", "--yes"}, &out, &err), 13) << out << err;
  json s = Summary(out);
  EXPECT_FALSE(s["toolchain"]["verified"].get<bool>());
  EXPECT_NE(s.value("error", "").find("flash guard (toolchain)"), std::string::npos) << s.dump(1);
  EXPECT_NE(s.value("error", "").find("/usr/bin/arm-none-eabi-gcc"), std::string::npos)
      << s.dump(1);
  // `fwai flash` refuses it the same way.
  ASSERT_EQ(Fwai({"hw", "lease", "sim-stm32vl"}, &out, &err), 0) << err;
  EXPECT_EQ(Fwai({"flash", "--yes", "sim-stm32vl", project_ + "/build/blinky.elf"}, &out, &err),
            33);
  EXPECT_NE(err.find("flash guard (toolchain)"), std::string::npos) << err;
  fs::remove_all(admin);
}

// The agent's build tool answers with the images, the memory change since the
// previous build and the toolchain verdict; memoryReport and sbom read them.
TEST_F(LifecycleTest, TheAgentSeesTheMemoryDeltaInTheBuildResult) {
  StartDaemon("stm32vl-blinky", "", true);
  Build();  // the previous build
  std::string src = Read(project_ + "/src/main.c");
  const size_t at = src.find("int main(void) {");
  ASSERT_NE(at, std::string::npos);
  src.insert(at + std::string("int main(void) {").size(), "\n  agent_buffer[0] = agent_buffer[1];");
  src.insert(at, "volatile unsigned char agent_buffer[300];\n");
  std::ofstream(project_ + "/src/main.c", std::ios::trunc) << src;
  grpc::ClientContext cctx;
  fwai::v1::CreateSessionRequest creq;
  creq.set_project_root(project_);
  fwai::v1::Session session;
  ASSERT_TRUE(d_->sessions()->Create(&cctx, creq, &session).ok());
  FakeReply r1;
  r1.tool_calls = {{"b1", "build", json::object()}};
  fake_.Enqueue(r1);
  FakeReply r2;
  r2.tool_calls = {{"m1", "memoryReport", json{{"top", 3}}}, {"s1", "sbom", json::object()}};
  fake_.Enqueue(r2);
  FakeReply r3;
  r3.chunks = {"RAM grew by 300 bytes; ready to flash."};
  fake_.Enqueue(r3);
  auto outcome = RunChat(*d_->sessions(), session.id(), "build it and tell me what changed", 120);
  ASSERT_TRUE(outcome.finished) << d_->log();
  auto reqs = fake_.requests();
  ASSERT_GE(reqs.size(), 3u);
  const std::string after_build = reqs[1].body.dump();
  EXPECT_NE(after_build.find("build ok"), std::string::npos) << after_build;
  EXPECT_NE(after_build.find("image build/blinky.elf (elf"), std::string::npos) << after_build;
  EXPECT_NE(after_build.find("memory RAM: "), std::string::npos) << after_build;
  EXPECT_NE(after_build.find(" bytes since the previous build"), std::string::npos) << after_build;
  EXPECT_NE(after_build.find("added agent_buffer 300 bytes"), std::string::npos) << after_build;
  EXPECT_NE(after_build.find("toolchain verified"), std::string::npos) << after_build;
  const std::string after_reports = reqs[2].body.dump();
  EXPECT_NE(after_reports.find("largest symbols"), std::string::npos) << after_reports;
  EXPECT_NE(after_reports.find("toolchain gcc-arm-none-eabi"), std::string::npos) << after_reports;
}

}  // namespace
}  // namespace fwai::testing
