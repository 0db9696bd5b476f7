// Project detection for fwai init, project.yaml validation, EMBEDDER.md.
#include "server/project/project.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "server/project/policy.h"
#include "server/project/templates.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

// The message of a parse that must fail (empty if it succeeded).
template <typename T>
std::string ErrorOf(const absl::StatusOr<T>& r) {
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : std::string(r.status().message());
}

class ProjectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "fwai-project-XXXXXX").string();
    root_ = mkdtemp(t.data());
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((fs::path(root_) / rel).parent_path());
    std::ofstream(fs::path(root_) / rel) << text;
  }
  std::string root_;
};

TEST_F(ProjectTest, DetectsMakeWithTheTargetFromTheLinkerScript) {
  Write("Makefile",
        "all:\n\tarm-none-eabi-gcc -mcpu=cortex-m3 ...\nflash: all\n\topenocd -f board.cfg\n");
  Write("stm32f100rb.ld", "MEMORY {}\n");
  auto s = DetectProject(root_);
  EXPECT_EQ(s.build_system, "make");
  EXPECT_EQ(s.build_command, "make");
  EXPECT_EQ(s.flash_command, "make flash");
  EXPECT_EQ(s.debug_interface, "openocd");
  EXPECT_EQ(s.target, "stm32f100rb");
  EXPECT_TRUE(s.missing.empty());
}

TEST_F(ProjectTest, DetectsPlatformioZephyrCargoCmakeAndArduino) {
  Write("platformio.ini",
        "[env:nucleo]\nplatform = ststm32\nboard = nucleo_f401re\nupload_protocol = "
        "stlink\nmonitor_speed = 921600\n");
  auto pio = DetectProject(root_);
  EXPECT_EQ(pio.build_system, "platformio");
  EXPECT_EQ(pio.board, "nucleo_f401re");
  EXPECT_EQ(pio.debug_interface, "stlink");
  EXPECT_EQ(pio.baud, 921600);
  EXPECT_EQ(pio.flash_command, "pio run -t upload");
  fs::remove(fs::path(root_) / "platformio.ini");

  Write("prj.conf", "CONFIG_GPIO=y\n");
  Write("CMakeLists.txt", "set(BOARD nrf52840dk_nrf52840)\nfind_package(Zephyr)\n");
  auto z = DetectProject(root_);
  EXPECT_EQ(z.build_system, "zephyr");
  EXPECT_EQ(z.build_command, "west build -b nrf52840dk_nrf52840");
  EXPECT_EQ(z.flash_command, "west flash");
  fs::remove(fs::path(root_) / "prj.conf");

  auto cm = DetectProject(root_);
  EXPECT_EQ(cm.build_system, "cmake");
  fs::remove(fs::path(root_) / "CMakeLists.txt");

  Write("Cargo.toml", "[package]\nname = \"app\"\n");
  Write(".cargo/config.toml",
        "[target.thumbv7em-none-eabihf]\nrunner = \"probe-rs run --chip STM32F411CEUx\"\n");
  auto c = DetectProject(root_);
  EXPECT_EQ(c.build_system, "cargo");
  EXPECT_EQ(c.target, "stm32f411ceux");
  EXPECT_EQ(c.flash_command, "probe-rs run --chip STM32F411CEUx");
  EXPECT_EQ(c.debug_interface, "probe-rs");
  fs::remove_all(fs::path(root_) / ".cargo");
  fs::remove(fs::path(root_) / "Cargo.toml");

  Write("blink.ino", "void setup(){}\nvoid loop(){}\n");
  auto a = DetectProject(root_);
  EXPECT_EQ(a.build_system, "arduino");
  EXPECT_NE(a.build_command.find("arduino-cli compile"), std::string::npos);
  EXPECT_EQ(a.missing, std::vector<std::string>{"target"});
}

// `fwai init` on the examples as they are in the repository (nothing built):
// the part from the linker script, the image from the Makefile's rules.
TEST_F(ProjectTest, DetectsTheTargetAndImageOfBothExamples) {
  struct Example {
    const char* dir;
    const char* target;
    const char* image;
  };
  for (const Example& e : {Example{"lm3s6965-hello", "lm3s6965", "build/hello.elf"},
                           Example{"stm32vl-blinky", "stm32f100rb", "build/blinky.elf"}}) {
    const fs::path copy = fs::path(root_) / e.dir;
    fs::create_directories(copy);
    for (const auto& f : fs::directory_iterator(fs::path(FWAI_EXAMPLES_DIR) / e.dir)) {
      const std::string name = f.path().filename().string();
      if (name == "build" || name == ".fwai") continue;
      fs::copy(f.path(), copy / name, fs::copy_options::recursive);
    }
    auto s = DetectProject(copy.string());
    EXPECT_EQ(s.build_system, "make") << e.dir;
    EXPECT_EQ(s.target, e.target) << e.dir;
    EXPECT_EQ(s.image, e.image) << e.dir;
    EXPECT_TRUE(s.missing.empty()) << e.dir;
  }
}

// A project made from a template and detected afresh finds the settings the
// template gives it.
TEST_F(ProjectTest, DetectsTheTargetAndImageOfEveryTemplate) {
  for (const auto& name : TemplateNames()) {
    auto t = MakeTemplate(name, "fw1");
    ASSERT_TRUE(t.ok()) << t.status();
    const std::string dir = root_ + "/" + name;
    ASSERT_TRUE(WriteTemplate(*t, dir, false).ok());
    auto s = DetectProject(dir);
    EXPECT_EQ(s.build_system, t->settings.build_system) << name;
    EXPECT_EQ(s.target, t->settings.target) << name;
    EXPECT_EQ(s.image, t->settings.image) << name;
    EXPECT_EQ(s.board, name == "bare-metal" || name == "freertos" ? "" : t->settings.board) << name;
  }
}

TEST_F(ProjectTest, EmbedderMdIsReadAndWritten) {
  Write("Makefile", "all:\n");
  Write("EMBEDDER.md",
        "# x\n<OVERVIEW>\nMCU = stm32h743zi\nboard = nucleo-h743zi\n</OVERVIEW>\n<COMMANDS>\nbuild "
        "= make -j8\n"
        "flash = st-flash write build/app.bin 0x08000000\nbaudrate = 230400\n</COMMANDS>\n");
  auto s = DetectProject(root_);
  ApplyEmbedderMd(root_, s);
  EXPECT_EQ(s.target, "stm32h743zi");
  EXPECT_EQ(s.board, "nucleo-h743zi");
  EXPECT_EQ(s.build_command, "make -j8");
  EXPECT_EQ(s.flash_command, "st-flash write build/app.bin 0x08000000");
  EXPECT_EQ(s.baud, 230400);
  EXPECT_TRUE(s.missing.empty());
  // Round trip through our own writer.
  Write("EMBEDDER.md", EmbedderMd(s));
  ProjectSettings back = DetectProject(root_);
  ApplyEmbedderMd(root_, back);
  EXPECT_EQ(back.flash_command, s.flash_command);
  EXPECT_EQ(back.target, s.target);
}

TEST_F(ProjectTest, ProjectYamlRoundTripsAndBadFilesNameTheLine) {
  ProjectSettings s;
  s.name = "blinky";
  s.build_system = "make";
  s.build_command = "make";
  s.flash_command = "fwai flash";
  s.target = "stm32f100rb";
  s.baud = 115200;
  auto back = ParseProjectYaml(ProjectYaml(s), "project.yaml");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->target, "stm32f100rb");
  EXPECT_EQ(back->flash_command, "fwai flash");
  const std::string bad = ErrorOf(ParseProjectYaml(
      "name: x\nbuild:\n  command: make\nserial:\n  baud: fast\n", ".fwai/project.yaml"));
  EXPECT_NE(bad.find(".fwai/project.yaml:5: serial.baud"), std::string::npos) << bad;
  const std::string unknown =
      ErrorOf(ParseProjectYaml("name: x\nflashh: {command: y}\n", "p.yaml"));
  EXPECT_NE(unknown.find("p.yaml:2: flashh: unknown setting"), std::string::npos) << unknown;
}

// Found by the project_yaml and policy_yaml fuzz targets: a key that is not a
// name (a mapping or a list given with "? ") made yaml-cpp throw out of the
// parser. It is a clear error naming the file now.
TEST(ProjectYamlTest, AKeyThatIsNotANameIsRefusedNamingTheFile) {
  const std::vector<std::string> projects = {
      std::string("\n? build_system: mchandescriptiokeywoxds:bui"),
      "? {name: x}\n: y\n",
      "? [a, b]\n: y\n",
  };
  for (const auto& text : projects) {
    auto r = ParseProjectYaml(text, "p.yaml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message().rfind("p.yaml:", 0), 0u) << r.status();
  }
  const std::vector<std::string> policies = {
      std::string("policy:\n ? pro2tec/boot/**\", \"y:\n \n "),
      "policy:\n  ? {blocked_tools: x}\n  : y\n",
  };
  for (const auto& text : policies) {
    auto r = ParsePolicy(text, "policy.yaml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message().rfind("policy.yaml:", 0), 0u) << r.status();
  }
}

TEST(PolicyTest, AnEmptyEntryIsRefusedAndNeverHangsACheck) {
  // `!rm` is a YAML tag: the entry is an empty string (found by the policy fuzzer, which
  // hung in the command check searching for "" forever).
  for (const char* list : {"blocked_commands: [!rm, dd]", "blocked_commands: [\"\"]",
                           "protected_paths: [\"\"]", "blocked_tools: ['']"}) {
    auto p = ParsePolicy(absl::StrCat("policy:\n  network: false\n  ", list, "\n"), "policy.yaml");
    ASSERT_FALSE(p.ok()) << list;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_NE(p.status().message().find("policy.yaml:3"), std::string::npos) << p.status();
    EXPECT_NE(p.status().message().find("empty entry"), std::string::npos) << p.status();
  }
  PolicyRules rules;  // made some other way: the check still ends
  rules.blocked_commands = {"", "dd"};
  EXPECT_TRUE(CheckPolicy(rules, "command", "make all").allowed);
  EXPECT_FALSE(CheckPolicy(rules, "command", "dd if=/dev/zero").allowed);
}

TEST(PolicyTest, RulesDecideWithTheRuleNamedAndTheOrganisationOverrides) {
  auto proj = ParsePolicy(R"(
policy:
  protected_paths: ["src/boot/**", "*.ld"]
  allowed_paths: ["src/**", "docs/**", "*.ld"]
  blocked_tools: [bash]
  allowed_tools: [read_file, write_file, edit_file, grep, bash]
  blocked_commands: [rm, dd]
  change_budget: {max_files: 3}
  network: true
)",
                          "project.yaml");
  ASSERT_TRUE(proj.ok()) << proj.status();
  auto d = CheckPolicy(*proj, "write", "src/boot/startup.c");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "protected_paths: src/boot/**");
  EXPECT_FALSE(CheckPolicy(*proj, "write", "stm32.ld").allowed);  // deny wins over allow
  EXPECT_TRUE(CheckPolicy(*proj, "write", "src/drivers/uart.c").allowed);
  d = CheckPolicy(*proj, "write", "Makefile");
  EXPECT_FALSE(d.allowed);
  EXPECT_NE(d.rule.find("allowed_paths"), std::string::npos);
  EXPECT_FALSE(CheckPolicy(*proj, "tool", "bash").allowed);  // blocked beats allowed
  EXPECT_TRUE(CheckPolicy(*proj, "tool", "grep").allowed);
  EXPECT_FALSE(CheckPolicy(*proj, "tool", "gdb").allowed);
  d = CheckPolicy(*proj, "command", "rm -rf build");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rule, "blocked_commands: rm");
  EXPECT_TRUE(CheckPolicy(*proj, "command", "make format").allowed);  // whole words only
  EXPECT_TRUE(CheckPolicy(*proj, "command", "echo add").allowed);
  EXPECT_EQ(proj->max_files_per_turn, 3);

  auto org = ParsePolicy(
      "policy:\n  blocked_tools: [gdb]\n  allowed_tools: [read_file, grep]\n  network: false\n"
      "  change_budget: {max_files: 2}\n",
      "org.yaml");
  ASSERT_TRUE(org.ok());
  auto m = MergePolicy(*proj, *org, true);
  EXPECT_FALSE(m.network);
  EXPECT_EQ(m.max_files_per_turn, 2);
  EXPECT_TRUE(CheckPolicy(m, "tool", "grep").allowed);
  EXPECT_FALSE(CheckPolicy(m, "tool", "write_file").allowed);  // the intersection
  EXPECT_FALSE(CheckPolicy(m, "tool", "gdb").allowed);         // the union

  const std::string bad = ErrorOf(ParsePolicy("policy:\n  protected_path: [x]\n", "p.yaml"));
  EXPECT_NE(bad.find("p.yaml:2: policy.protected_path: unknown rule"), std::string::npos) << bad;
}

TEST(ProjectReinitTest, KeepsWhatWasSetAndUnmanagedSections) {
  const std::string old_yaml =
      "name: fw\nbuild_system: make\nbuild:\n  command: make -j4 app\nflash:\n  command: fwai "
      "flash\n  image: out/app.elf\n"
      "target: stm32f407vg\nserial:\n  baud: 921600\n  boot_pattern: 'app \\d+ up'\n"
      "policy:\n  protected_paths: [\"src/boot/**\"]\n  flash:\n    require_approval: false\n";
  auto old = ParseProjectYaml(old_yaml, "p.yaml");
  ASSERT_TRUE(old.ok()) << old.status();
  ProjectSettings detected;
  detected.name = "fw";
  detected.build_system = "make";
  detected.build_command = "make";
  detected.target = "stm32f100rb";
  detected.missing = {"flash_command"};
  KeepExistingSettings(*old, {"target"}, detected);
  EXPECT_EQ(detected.build_command, "make -j4 app");  // the person's, not the detected one
  EXPECT_EQ(detected.image, "out/app.elf");
  EXPECT_EQ(detected.boot_pattern, "app \\d+ up");
  EXPECT_EQ(detected.baud, 921600);
  EXPECT_EQ(detected.target, "stm32f100rb");  // given now: it wins
  EXPECT_TRUE(detected.missing.empty());
  const std::string text = ProjectYaml(detected) + UnmanagedSections(old_yaml);
  auto again = ParseProjectYaml(text, "new.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << text;
  EXPECT_EQ(again->boot_pattern, "app \\d+ up");
  auto pol = ParsePolicy(text, "new.yaml");
  ASSERT_TRUE(pol.ok()) << pol.status();
  EXPECT_EQ(pol->protected_paths, std::vector<std::string>{"src/boot/**"});
  EXPECT_FALSE(pol->flash_require_approval);
}

}  // namespace
}  // namespace fwai
