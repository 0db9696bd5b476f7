// The firmware module against the real toolchain: the examples built with
// arm-none-eabi-gcc, memory reports checked against arm-none-eabi-size, nm
// and the linker's own --print-memory-usage; SBOMs checked with the CycloneDX
// library's schema validator and sha256sum; toolchain attestation with dpkg.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/subprocess.h"
#include "server/firmware/artifacts.h"
#include "server/firmware/elf_file.h"
#include "server/firmware/memory.h"
#include "server/firmware/sbom.h"
#include "server/firmware/toolchain.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Sh(const std::vector<std::string>& argv, const std::string& cwd = "",
               int* rc = nullptr) {
  ProcessOptions po;
  po.timeout_ms = 120000;
  po.cwd = cwd;
  auto r = RunProcess(argv, po);
  EXPECT_TRUE(r.ok()) << argv[0];
  if (!r.ok()) return "";
  if (rc) {
    *rc = r->exit_code;
  } else {
    EXPECT_EQ(r->exit_code, 0) << argv[0] << ": " << r->out << r->err;
  }
  return r->out + r->err;
}

std::string Sha256sum(const std::string& path) { return Sh({"sha256sum", path}).substr(0, 64); }

class FirmwareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (FindProgram("arm-none-eabi-gcc").empty())
      GTEST_SKIP() << "arm-none-eabi-gcc is not installed (scripts/setup)";
    std::string t = (fs::temp_directory_path() / "fwai-firmware-XXXXXX").string();
    dir_ = mkdtemp(t.data());
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // A copy of an example, built; returns its root. `make_output` gets what make printed.
  std::string BuildExample(const std::string& name, std::string* make_output = nullptr,
                           const std::string& extra = "") {
    const std::string root = dir_ + "/" + name;
    fs::create_directories(root);
    for (const auto& f : fs::directory_iterator(fs::path(FWAI_EXAMPLES_DIR) / name)) {
      const std::string n = f.path().filename().string();
      if (n == "build" || n == ".fwai") continue;
      fs::copy(f.path(), fs::path(root) / n,
               fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    }
    std::vector<std::string> argv = {"make", "-s", "-C", root};
    if (!extra.empty()) argv.push_back(extra);
    std::string out = Sh(argv);
    if (make_output) *make_output = out;
    return root;
  }
  std::string dir_;
};

// arm-none-eabi-size's Berkeley line: text data bss.
std::vector<uint64_t> SizeTotals(const std::string& elf) {
  std::string out = Sh({"arm-none-eabi-size", elf});
  std::istringstream in(out);
  std::string header, line;
  std::getline(in, header);
  std::getline(in, line);
  std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  std::vector<uint64_t> v(3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(absl::SimpleAtoi(f[i], &v[i])) << line;
  return v;
}

// The linker's "Memory region Used Size" lines: region -> bytes.
std::map<std::string, uint64_t> LinkerUsage(const std::string& make_output) {
  std::map<std::string, uint64_t> out;
  static const std::regex kLine(R"(^\s*(\w+):\s+(\d+) B\s)");
  for (absl::string_view l : absl::StrSplit(make_output, '\n')) {
    std::string line(l);
    std::smatch m;
    if (std::regex_search(line, m, kLine)) out[m[1]] = std::stoull(m[2]);
  }
  return out;
}

TEST_F(FirmwareTest, MemoryReportEqualsSizeNmAndTheLinkerOnBothExamples) {
  for (const std::string example : {"stm32vl-blinky", "lm3s6965-hello"}) {
    SCOPED_TRACE(example);
    std::string make_out;
    const std::string root = BuildExample(example, &make_out);
    const std::string elf =
        root + (example == "stm32vl-blinky" ? "/build/blinky.elf" : "/build/hello.elf");
    MemoryOptions mo;
    mo.project_root = root;
    mo.max_symbols = 100000;
    auto r = AnalyzeMemory(elf, mo);
    ASSERT_TRUE(r.ok()) << r.status();
    // Berkeley totals: arm-none-eabi-size.
    auto size = SizeTotals(elf);
    EXPECT_EQ((*r)["totals"]["text"].get<uint64_t>(), size[0]);
    EXPECT_EQ((*r)["totals"]["data"].get<uint64_t>(), size[1]);
    EXPECT_EQ((*r)["totals"]["bss"].get<uint64_t>(), size[2]);
    // Sections: arm-none-eabi-size -A (every allocated one, same size and address).
    std::map<std::string, std::pair<uint64_t, uint64_t>> sections;
    for (const auto& s : (*r)["sections"])
      sections[s["name"]] = {s["size"].get<uint64_t>(), s["address"].get<uint64_t>()};
    int alloc_seen = 0;
    for (absl::string_view l : absl::StrSplit(Sh({"arm-none-eabi-size", "-A", "-d", elf}), '\n')) {
      std::vector<std::string> f = absl::StrSplit(l, ' ', absl::SkipWhitespace());
      if (f.size() != 3 || f[0][0] != '.' || f[0].rfind(".debug", 0) == 0 || f[0] == ".comment" ||
          f[0] == ".ARM.attributes")
        continue;
      uint64_t sz = 0, addr = 0;
      ASSERT_TRUE(absl::SimpleAtoi(f[1], &sz) && absl::SimpleAtoi(f[2], &addr));
      if (sz == 0) continue;
      ++alloc_seen;
      ASSERT_TRUE(sections.count(f[0])) << f[0];
      EXPECT_EQ(sections[f[0]].first, sz) << f[0];
      EXPECT_EQ(sections[f[0]].second, addr) << f[0];
    }
    EXPECT_GT(alloc_seen, 1);
    EXPECT_EQ(static_cast<int>(sections.size()), alloc_seen);
    // Symbols: nm --size-sort (every sized symbol, same sizes).
    std::multiset<std::pair<std::string, uint64_t>> nm, ours;
    for (absl::string_view l : absl::StrSplit(Sh({"arm-none-eabi-nm", "-S", "--size-sort", elf}),
                                              '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(l, ' ', absl::SkipWhitespace());
      ASSERT_EQ(f.size(), 4u) << l;
      uint64_t sz = 0;
      ASSERT_TRUE(absl::SimpleHexAtoi(f[1], &sz));
      nm.insert({f[3], sz});
    }
    for (const auto& s : (*r)["symbols"]) ours.insert({s["name"], s["size"].get<uint64_t>()});
    EXPECT_EQ(ours, nm);
    EXPECT_EQ((*r)["symbols_total"].get<size_t>(), nm.size());
    // Largest first.
    for (size_t i = 1; i < (*r)["symbols"].size(); ++i) {
      EXPECT_GE((*r)["symbols"][i - 1]["size"].get<uint64_t>(),
                (*r)["symbols"][i]["size"].get<uint64_t>());
    }
    // Regions: what the linker itself printed (--print-memory-usage).
    auto linker = LinkerUsage(make_out);
    ASSERT_EQ(linker.size(), 2u) << make_out;
    EXPECT_EQ((*r)["regions"].size(), 2u);
    for (const auto& g : (*r)["regions"]) {
      ASSERT_TRUE(linker.count(g["name"])) << g.dump();
      EXPECT_EQ(g["used"].get<uint64_t>(), linker[g["name"]]) << g.dump();
      EXPECT_EQ(g["free"].get<uint64_t>(), g["length"].get<uint64_t>() - linker[g["name"]]);
    }
    EXPECT_EQ((*r)["regions_source"],
              example == "stm32vl-blinky" ? "build/blinky.map" : "lm3s6965.ld");
  }
}

TEST_F(FirmwareTest, SymbolsHaveTheirDeclaringLineAndStackUseComesFromSuFiles) {
  const std::string root = BuildExample("stm32vl-blinky");
  MemoryOptions mo;
  mo.project_root = root;
  auto r = AnalyzeMemory(root + "/build/blinky.elf", mo);
  ASSERT_TRUE(r.ok()) << r.status();
  // Where main and Reset_Handler are declared, read from the sources.
  auto line_of = [&](const std::string& file, const std::string& needle) {
    std::ifstream in(root + "/" + file);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find(needle) != std::string::npos) return n;
    }
    return 0;
  };
  std::map<std::string, json> by_name;
  for (const auto& s : (*r)["symbols"]) by_name[s["name"]] = s;
  ASSERT_TRUE(by_name.count("main"));
  EXPECT_EQ(by_name["main"]["file"], "src/main.c");
  EXPECT_EQ(by_name["main"]["line"].get<int>(), line_of("src/main.c", "int main(void)"));
  ASSERT_TRUE(by_name.count("Reset_Handler"));
  EXPECT_EQ(by_name["Reset_Handler"]["file"], "src/startup.c");
  EXPECT_EQ(by_name["Reset_Handler"]["line"].get<int>(),
            line_of("src/startup.c", "void Reset_Handler(void) {"));
  // Stack use: the .su files GCC wrote, for the functions linked in.
  std::map<std::string, uint64_t> su;
  for (const char* f : {"/build/main.su", "/build/startup.su", "/build/rtt.su"}) {
    std::ifstream in(root + f);
    std::string line;
    while (std::getline(in, line)) {
      std::vector<std::string> cols = absl::StrSplit(line, '\t');
      ASSERT_GE(cols.size(), 2u);
      su[cols[0].substr(cols[0].rfind(':') + 1)] = std::stoull(cols[1]);
    }
  }
  ASSERT_FALSE((*r)["stack"].empty());
  for (const auto& s : (*r)["stack"]) {
    ASSERT_TRUE(su.count(s["function"])) << s.dump();
    EXPECT_EQ(s["bytes"].get<uint64_t>(), su[s["function"]]);
  }
  EXPECT_EQ((*r)["stack"][0]["function"], "main");  // the deepest frame first
}

TEST_F(FirmwareTest, DiffNamesWhatGrewAndTheBudgetNamesTheRegion) {
  const std::string root = BuildExample("stm32vl-blinky");
  MemoryOptions mo;
  mo.project_root = root;
  auto before = AnalyzeMemory(root + "/build/blinky.elf", mo);
  ASSERT_TRUE(before.ok());
  // A 600-byte buffer in RAM and a table in flash, used by main.
  std::string src;
  {
    std::ifstream in(root + "/src/main.c");
    std::stringstream ss;
    ss << in.rdbuf();
    src = ss.str();
  }
  const size_t at = src.find("int main(void) {");
  ASSERT_NE(at, std::string::npos);
  src.insert(at + std::string("int main(void) {").size(),
             "\n  grow_buffer[0] = (unsigned char)grow_table[grow_buffer[1] & 63u];");
  src.insert(
      at,
      "volatile unsigned char grow_buffer[600];\nconst unsigned int grow_table[64] = {1, 2, 3};\n");
  std::ofstream(root + "/src/main.c", std::ios::trunc) << src;
  Sh({"make", "-s", "-C", root});
  auto after = AnalyzeMemory(root + "/build/blinky.elf", mo);
  ASSERT_TRUE(after.ok());
  json diff = DiffMemory(*before, *after);
  std::map<std::string, int64_t> delta;
  for (const auto& d : diff["regions"]) delta[d["name"]] = d["delta"].get<int64_t>();
  EXPECT_GE(delta["RAM"], 600);
  EXPECT_GE(delta["FLASH"], 256);
  std::set<std::string> added;
  for (const auto& s : diff["symbols"]["added"]) added.insert(s["name"]);
  EXPECT_TRUE(added.count("grow_buffer")) << diff.dump();
  EXPECT_TRUE(added.count("grow_table")) << diff.dump();
  // Budgets: the refusal names the region and the rule.
  auto st = CheckMemoryBudget(*after, diff, MemoryBudget{0, 5.0, 0});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("RAM is"), std::string::npos) << st;
  EXPECT_NE(st.message().find("memory.ram_max_pct 5"), std::string::npos) << st;
  st = CheckMemoryBudget(*after, diff, MemoryBudget{0, 0, 512});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("RAM grew by"), std::string::npos) << st;
  EXPECT_NE(st.message().find("memory.max_growth_bytes 512"), std::string::npos) << st;
  EXPECT_TRUE(CheckMemoryBudget(*after, diff, MemoryBudget{90, 90, 4096}).ok());
}

TEST_F(FirmwareTest, ArtifactsAreTheElfExecutablesTheBuildWroteWithTheirSiblings) {
  const std::string root = BuildExample("stm32vl-blinky");
  // Before this "build": nothing new, so the newest ELF, marked not fresh.
  const int64_t later = (static_cast<int64_t>(time(nullptr)) + 5) * 1000000000;
  auto stale = FindBuildArtifacts(root, "", later);
  ASSERT_EQ(stale.size(), 3u);
  EXPECT_FALSE(stale[0].fresh);
  // A build that started before the files: the ELF (not the .o, also ELF), its .bin and .hex.
  auto found = FindBuildArtifacts(root, "", 0);
  std::map<std::string, BuildArtifact> by_format;
  for (const auto& a : found) by_format[a.format] = a;
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(by_format["elf"].path, "build/blinky.elf");
  EXPECT_EQ(by_format["bin"].path, "build/blinky.bin");
  EXPECT_EQ(by_format["hex"].path, "build/blinky.hex");
  for (const auto& [f, a] : by_format) {
    EXPECT_TRUE(a.fresh);
    EXPECT_EQ(a.sha256, Sha256sum(a.abs_path)) << f;
  }
  EXPECT_TRUE(IsElfExecutable(root + "/build/blinky.elf"));
  EXPECT_FALSE(IsElfExecutable(root + "/build/main.o"));
  EXPECT_FALSE(IsElfExecutable(root + "/build/blinky.bin"));
  // The configured image wins over what is found.
  fs::copy_file(root + "/build/blinky.elf", root + "/other.elf");
  auto configured = FindBuildArtifacts(root, "other.elf", 0);
  ASSERT_EQ(configured.size(), 1u);
  EXPECT_EQ(configured[0].path, "other.elf");
}

class SbomTest : public FirmwareTest {
 protected:
  json MakeFor(const std::string& root, const std::string& elf) {
    auto info = ReadElfFile(elf, true);
    EXPECT_TRUE(info.ok());
    SbomInput in;
    in.image = elf;
    in.project_root = root;
    in.project_name = "blinky";
    in.target = "stm32f100rb";
    in.run_id = "run-test";
    in.skill = "build";
    in.toolchain =
        AttestToolchain(info->machine, info->units.empty() ? "" : info->units[0].producer,
                        info->comments.empty() ? "" : info->comments[0], {});
    in.steps = json::array({{{"name", "build"},
                             {"type", "build"},
                             {"command", "make"},
                             {"exit_code", 0},
                             {"ok", true}}});
    auto bom = MakeSbom(in);
    EXPECT_TRUE(bom.ok()) << bom.status();
    return bom.ok() ? *bom : json();
  }
  // The CycloneDX library's JSON schema validator (npm, installed by scripts/setup).
  int Validate(const json& doc, std::string* errors) {
    const std::string file = dir_ + "/bom.json";
    std::ofstream(file) << doc.dump(2);
    ProcessOptions po;
    po.timeout_ms = 60000;
    auto r = RunProcess(
        {"/usr/bin/env",
         std::string("NODE_PATH=") + FWAI_SOURCE_DIR + "/.cache/sbom-validator/node_modules",
         "node", std::string(FWAI_SOURCE_DIR) + "/tests/sbom/validate.js", file},
        po);
    EXPECT_TRUE(r.ok());
    *errors = r.ok() ? r->out + r->err : "";
    return r.ok() ? r->exit_code : -1;
  }
  static std::map<std::string, json> ByRef(const json& bom) {
    std::map<std::string, json> out;
    for (const auto& c : bom["components"]) out[c["bom-ref"]] = c;
    return out;
  }
  static std::string Sha(const json& c) {
    for (const auto& h : c["hashes"]) {
      if (h["alg"] == "SHA-256") return h["content"];
    }
    return "";
  }
};

TEST_F(SbomTest, ValidatesAgainstCycloneDx16AndHashesEqualSha256sum) {
  const std::string root = BuildExample("stm32vl-blinky");
  const std::string elf = root + "/build/blinky.elf";
  json bom = MakeFor(root, elf);
  std::string errors;
  ASSERT_EQ(Validate(bom, &errors), 0) << errors;
  // Break it once: the validator really checks (a type CycloneDX does not know).
  json broken = bom;
  broken["metadata"]["component"]["type"] = "firmwares";
  EXPECT_EQ(Validate(broken, &errors), 1) << errors;

  EXPECT_EQ(bom["specVersion"], "1.6");
  EXPECT_EQ(bom["metadata"]["component"]["type"], "firmware");
  EXPECT_EQ(bom["metadata"]["component"]["hashes"][0]["content"], Sha256sum(elf));
  auto refs = ByRef(bom);
  // The objects the map says were linked, and the sources DWARF names.
  for (const char* obj : {"build/main.o", "build/startup.o"}) {
    ASSERT_TRUE(refs.count(std::string("object:") + obj)) << bom.dump(1);
    EXPECT_EQ(Sha(refs[std::string("object:") + obj]), Sha256sum(root + "/" + obj));
  }
  for (const char* src : {"src/main.c", "src/startup.c"}) {
    ASSERT_TRUE(refs.count(std::string("source:") + src)) << bom.dump(1);
    EXPECT_EQ(Sha(refs[std::string("source:") + src]), Sha256sum(root + "/" + src));
  }
  // The toolchain: Debian packages with versions, binaries by hash, dpkg -V.
  ASSERT_TRUE(refs.count("toolchain:gcc-arm-none-eabi")) << bom.dump(1);
  const json& gcc = refs["toolchain:gcc-arm-none-eabi"];
  const std::string version = Sh({"dpkg-query", "-W", "-f=${Version}", "gcc-arm-none-eabi"});
  EXPECT_EQ(gcc["version"], version);
  bool driver = false;
  for (const auto& f : gcc["components"]) {
    if (f["name"] == FindProgram("arm-none-eabi-gcc")) {
      driver = true;
      EXPECT_EQ(Sha(f), Sha256sum(f["name"]));
    }
  }
  EXPECT_TRUE(driver) << gcc.dump(1);
  EXPECT_TRUE(refs.count("toolchain:binutils-arm-none-eabi"));
  EXPECT_TRUE(refs.count("toolchain:libnewlib-arm-none-eabi"));
  // Formulation: the build step.
  EXPECT_EQ(bom["formulation"][0]["workflows"][0]["steps"][0]["commands"][0]["executed"], "make");

  // After a flash: the flashed bytes' hash and the deploy step; still valid.
  json flashed = AddFlashToSbom(bom, "sim-stm32vl", Sha256sum(root + "/build/blinky.bin"),
                                root + "/build/blinky.bin", "test");
  ASSERT_EQ(Validate(flashed, &errors), 0) << errors;
  bool has_flashed = false;
  for (const auto& p : flashed["metadata"]["component"]["properties"]) {
    has_flashed |=
        p["name"] == "fwai:flashed_sha256" && p["value"] == Sha256sum(root + "/build/blinky.bin");
  }
  EXPECT_TRUE(has_flashed);

  // SPDX 2.3: the same image, files with SHA-1 and SHA-256, relationships.
  json spdx = SbomToSpdx(bom);
  EXPECT_EQ(spdx["spdxVersion"], "SPDX-2.3");
  EXPECT_EQ(spdx["dataLicense"], "CC0-1.0");
  EXPECT_EQ(spdx["packages"][0]["checksums"][0]["checksumValue"], Sha256sum(elf));
  bool main_c = false;
  for (const auto& f : spdx["files"]) {
    if (f["fileName"] == "./src/main.c") {
      main_c = true;
      EXPECT_EQ(f["checksums"][1]["checksumValue"], Sha256sum(root + "/src/main.c"));
      EXPECT_EQ(f["checksums"][0]["checksumValue"],
                Sh({"sha1sum", root + "/src/main.c"}).substr(0, 40));
    }
  }
  EXPECT_TRUE(main_c) << spdx.dump(1);
}

TEST_F(SbomTest, AChangedObjectFileChangesTheSbom) {
  const std::string root = BuildExample("stm32vl-blinky");
  const std::string elf = root + "/build/blinky.elf";
  json first = MakeFor(root, elf);
  const std::string main_o = Sha(ByRef(first)["object:build/main.o"]);
  const std::string startup_o = Sha(ByRef(first)["object:build/startup.o"]);
  // One source changes: its object changes, the other's stays as it was.
  std::ofstream(root + "/src/main.c", std::ios::app) << "\nint sbom_marker(void) { return 42; }\n";
  Sh({"make", "-s", "-C", root});
  json second = MakeFor(root, elf);
  EXPECT_NE(Sha(ByRef(second)["object:build/main.o"]), main_o);
  EXPECT_EQ(Sha(ByRef(second)["object:build/main.o"]), Sha256sum(root + "/build/main.o"));
  EXPECT_EQ(Sha(ByRef(second)["object:build/startup.o"]),
            startup_o);  // unchanged object, same hash
  EXPECT_NE(second["metadata"]["component"]["hashes"][0]["content"],
            first["metadata"]["component"]["hashes"][0]["content"]);
}

// A copy of dpkg's database for the toolchain packages, so a test can make
// dpkg see a changed file without touching the system.
std::string CopyDpkgDatabase(const std::string& dir) {
  const std::string admin = dir + "/dpkg";
  fs::create_directories(admin + "/info");
  fs::copy_file("/var/lib/dpkg/status", admin + "/status");
  for (const char* pkg :
       {"gcc-arm-none-eabi", "binutils-arm-none-eabi", "libnewlib-arm-none-eabi"}) {
    for (const char* ext : {".list", ".md5sums"}) {
      const fs::path p = fs::path("/var/lib/dpkg/info") / (std::string(pkg) + ext);
      if (fs::exists(p)) fs::copy_file(p, fs::path(admin) / "info" / p.filename());
    }
  }
  return admin;
}

TEST_F(FirmwareTest, ToolchainAttestationFailsWhenDpkgFindsAChangedFile) {
  const std::string root = BuildExample("lm3s6965-hello");
  auto info = ReadElfFile(root + "/build/hello.elf", true);
  ASSERT_TRUE(info.ok());
  ASSERT_FALSE(info->units.empty());
  EXPECT_NE(info->units[0].producer.find("GNU C"), std::string::npos);
  ToolchainOptions o;
  o.dpkg_admindir = CopyDpkgDatabase(dir_);
  json good = AttestToolchain(info->machine, info->units[0].producer, "", o);
  EXPECT_TRUE(good["verified"].get<bool>()) << good.dump(1);
  EXPECT_EQ(good["prefix"], "arm-none-eabi-");
  std::set<std::string> roles;
  for (const auto& b : good["binaries"]) {
    roles.insert(b["role"]);
    EXPECT_EQ(b["sha256"], Sha256sum(b["path"]));
  }
  EXPECT_EQ(roles, (std::set<std::string>{"compiler driver", "compiler", "assembler", "linker",
                                          "c library"}));
  EXPECT_FALSE(good["files_reused"].get<bool>());
  // The same answer again comes from the cache: files, packages and dpkg -V.
  json again = AttestToolchain(info->machine, "", "", o);
  EXPECT_TRUE(again["dpkg_verify"]["reused"].get<bool>());
  EXPECT_TRUE(again["files_reused"].get<bool>());
  EXPECT_EQ(again["binaries"], good["binaries"]);
  EXPECT_EQ(again["packages"], good["packages"]);
  // dpkg's status changed (a package installed or removed): its files are looked up again.
  { std::ofstream(o.dpkg_admindir + "/status", std::ios::app) << "\n"; }
  json after_install = AttestToolchain(info->machine, "", "", o);
  EXPECT_FALSE(after_install["files_reused"].get<bool>());
  EXPECT_EQ(after_install["binaries"], good["binaries"]);
  // dpkg's record of the compiler driver no longer matches the file on disk.
  const std::string md5 = o.dpkg_admindir + "/info/gcc-arm-none-eabi.md5sums";
  std::ifstream in(md5);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text =
      std::regex_replace(ss.str(), std::regex("[0-9a-f]{32}(  usr/bin/arm-none-eabi-gcc\n)"),
                         "00000000000000000000000000000000$1");
  ASSERT_NE(text, ss.str());
  std::ofstream(md5, std::ios::trunc) << text;
  json bad = AttestToolchain(info->machine, "", "", o);
  EXPECT_FALSE(bad["verified"].get<bool>()) << bad.dump(1);
  EXPECT_FALSE(bad["dpkg_verify"]["reused"].get<bool>());
  EXPECT_NE(bad["dpkg_verify"]["problems"].dump().find("/usr/bin/arm-none-eabi-gcc"),
            std::string::npos)
      << bad.dump(1);
}

}  // namespace
}  // namespace fwai
