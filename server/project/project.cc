#include "server/project/project.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "common/yaml.h"
#include "server/project/policy.h"

namespace fwai {

namespace fs = std::filesystem;

namespace {

std::string ReadText(const fs::path& p, size_t max = 1 << 20) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::string s;
  s.resize(max);
  in.read(s.data(), static_cast<std::streamsize>(max));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

std::string Search(const std::string& text, const std::string& re) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex(re))) return m[1];
  return "";
}

// A linker script or define naming the part: stm32f100rb.ld, STM32F401xE, nrf52840_xxaa.ld,
// lm3s6965.ld ...
std::string TargetFromFiles(const fs::path& root) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(
           root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() > 3) {
      it.disable_recursion_pending();
      continue;
    }
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec) && (name == "build" || name.starts_with("."))) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->path().extension() == ".ld") {
      std::string stem = absl::AsciiStrToLower(it->path().stem().string());
      static const std::regex kPart(
          R"(((stm32|nrf5|nrf91|atsam|samd|same5|lpc|mk|efm32|efr32|gd32|rp20|lm3s|lm4f|tm4c|msp432|mimxrt|atmega|ch32|apm32|at32|esp32)[a-z0-9_]*))");
      std::smatch m;
      if (std::regex_search(stem, m, kPart)) {
        std::string t = m[1];
        for (const char* suffix : {"_flash", "_ram", "_app", "_default"}) {
          if (t.size() > strlen(suffix) && t.ends_with(suffix)) t.resize(t.size() - strlen(suffix));
        }
        return t;
      }
    }
  }
  return "";
}

// The MCU on a board known by its Zephyr, PlatformIO or Arduino (FQBN) name.
std::string TargetOfBoard(std::string board) {
  board = absl::AsciiStrToLower(board);
  static const std::map<std::string, std::string> kBoards = {
      {"stm32vl_disco", "stm32f100rb"},
      {"stm32vldiscovery", "stm32f100rb"},
      {"nucleo_f401re", "stm32f401re"},
      {"nucleo_f411re", "stm32f411re"},
      {"nucleo_f446re", "stm32f446re"},
      {"nucleo_l476rg", "stm32l476rg"},
      {"nucleo_f103rb", "stm32f103rb"},
      {"bluepill_f103c8", "stm32f103c8"},
      {"stm32_min_dev_blue", "stm32f103c8"},
      {"disco_l475_iot1", "stm32l475vg"},
      {"nrf52840dk_nrf52840", "nrf52840"},
      {"nrf52840dk", "nrf52840"},
      {"nrf52dk_nrf52832", "nrf52832"},
      {"nrf5340dk_nrf5340_cpuapp", "nrf5340"},
      {"qemu_cortex_m3", "lm3s6965"},
      {"lm3s6965evb", "lm3s6965"},
      {"frdm_k64f", "mk64fn1m0vll12"},
      {"rpi_pico", "rp2040"},
      {"pico", "rp2040"},
      {"uno", "atmega328p"},
      {"esp32dev", "esp32"},
      {"arduino:avr:uno", "atmega328p"},
      {"arduino:avr:nano", "atmega328p"},
      {"arduino:avr:mega", "atmega2560"},
      {"arduino:avr:leonardo", "atmega32u4"},
      {"arduino:samd:mkrzero", "samd21g18a"},
      {"arduino:samd:arduino_zero_native", "samd21g18a"},
      {"arduino:mbed_nano:nano33ble", "nrf52840"},
      {"rp2040:rp2040:rpipico", "rp2040"}};
  auto it = kBoards.find(board);
  return it == kBoards.end() ? "" : it->second;
}

// Make's simple variable assignments (NAME = v, ?=, :=), for expanding paths.
std::map<std::string, std::string> MakeVars(const std::string& text) {
  std::map<std::string, std::string> vars;
  static const std::regex kAssign(R"(^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|::=|=)\s*(.*?)\s*$)");
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    std::string line(l);
    std::smatch m;
    if (!std::regex_match(line, m, kAssign)) continue;
    if (m[2] == "?=" && vars.count(m[1])) continue;
    vars[m[1]] = m[3];
  }
  return vars;
}

std::string ExpandMake(std::string s, const std::map<std::string, std::string>& vars) {
  static const std::regex kRef(R"(\$[({]([A-Za-z_][A-Za-z0-9_]*)[)}])");
  for (int round = 0; round < 8; ++round) {
    std::smatch m;
    if (!std::regex_search(s, m, kRef)) break;
    auto it = vars.find(m[1]);
    s.replace(m.position(0), m.length(0), it == vars.end() ? "" : it->second);
  }
  if (s.starts_with("./")) s.erase(0, 2);
  return s;
}

// The ELF a Makefile makes: a rule's target ending in .elf, else `-o X.elf`.
std::string ImageFromMakefile(const std::string& text) {
  const auto vars = MakeVars(text);
  static const std::regex kRule(R"(^([^\t#=:][^=:]*?\.elf)\s*:(?!=))");
  static const std::regex kOut(R"(-o\s+(\S+\.elf)\b)");
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    std::string line(l);
    std::smatch m;
    if (std::regex_search(line, m, kRule)) {
      std::string target = ExpandMake(std::string(absl::StripAsciiWhitespace(m[1].str())), vars);
      if (!target.empty() && target.find_first_of(" %$") == std::string::npos) return target;
    }
  }
  std::smatch m;
  if (std::regex_search(text, m, kOut)) {
    std::string out = ExpandMake(m[1], vars);
    if (out.find_first_of("%$") == std::string::npos) return out;
  }
  return "";
}

// The executable of a CMake project, under build/.
std::string ImageFromCmake(const std::string& text) {
  std::string name = Search(text, R"(add_executable\(\s*([A-Za-z0-9_.${}\-]+))");
  if (name.empty()) return "";
  if (name == "${PROJECT_NAME}" || name == "${CMAKE_PROJECT_NAME}")
    name = Search(text, R"(project\(\s*([A-Za-z0-9_.\-]+))");
  if (name.empty() || name.find('$') != std::string::npos) return "";
  const bool elf_suffix =
      name.ends_with(".elf") || text.find("CMAKE_EXECUTABLE_SUFFIX") != std::string::npos;
  return absl::StrCat("build/", name, elf_suffix && !name.ends_with(".elf") ? ".elf" : "");
}

// The newest ELF already built under a build directory.
std::string NewestBuiltElf(const fs::path& root) {
  std::error_code ec;
  std::string image;
  fs::file_time_type newest{};
  for (const char* dir : {"build", "out", "bin", "Debug", "Release", ".pio/build", "target"}) {
    fs::recursive_directory_iterator it(root / dir, fs::directory_options::skip_permission_denied,
                                        ec),
        end;
    for (; !ec && it != end; it.increment(ec)) {
      if (it.depth() > 3) it.disable_recursion_pending();
      if (it->path().extension() != ".elf" || !it->is_regular_file(ec)) continue;
      auto t = fs::last_write_time(it->path(), ec);
      if (!ec && (image.empty() || t > newest)) {
        newest = t;
        image = fs::relative(it->path(), root, ec).string();
      }
    }
    ec.clear();
  }
  return image;
}

}  // namespace

ProjectSettings DetectProject(const std::string& root_in) {
  ProjectSettings s;
  const fs::path root(root_in);
  std::error_code ec;
  s.name = root.filename().string();
  auto exists = [&](const char* f) { return fs::exists(root / f, ec); };
  if (exists("platformio.ini")) {
    s.build_system = "platformio";
    const std::string ini = ReadText(root / "platformio.ini");
    s.build_command = "pio run";
    s.flash_command = "pio run -t upload";
    s.board = Search(ini, R"(\n\s*board\s*=\s*([^\s]+))");
    std::string proto = Search(ini, R"(\n\s*upload_protocol\s*=\s*([^\s]+))");
    if (!proto.empty()) s.debug_interface = proto;
    std::string speed = Search(ini, R"(\n\s*monitor_speed\s*=\s*(\d+))");
    if (!speed.empty()) s.baud = std::stoi(speed);
    std::string port = Search(ini, R"(\n\s*(?:monitor|upload)_port\s*=\s*([^\s]+))");
    if (!port.empty()) s.serial_port = port;
    std::string env = Search(ini, R"(\[env:([^\]\s]+)\])");
    if (!env.empty()) s.image = absl::StrCat(".pio/build/", env, "/firmware.elf");
    s.target = TargetOfBoard(s.board);
  } else if (exists("west.yml") || exists("prj.conf")) {
    s.build_system = "zephyr";
    std::string board = Search(ReadText(root / "CMakeLists.txt"), R"(set\(\s*BOARD\s+([^\s\)]+))");
    s.board = board;
    s.build_command = absl::StrCat("west build -b ", board.empty() ? "<board>" : board);
    s.flash_command = "west flash";
    s.image = "build/zephyr/zephyr.elf";
    s.target = TargetOfBoard(board);
  } else if (exists("Cargo.toml")) {
    s.build_system = "cargo";
    s.build_command = "cargo build --release";
    const std::string cfg =
        ReadText(root / ".cargo" / "config.toml") + ReadText(root / ".cargo" / "config");
    std::string chip = Search(cfg, R"(--chip[ =]+\"?([A-Za-z0-9_]+))");
    if (!chip.empty()) s.target = absl::AsciiStrToLower(chip);
    std::string runner = Search(cfg, R"(runner\s*=\s*\"([^\"]+)\")");
    s.flash_command = !runner.empty() ? runner : "cargo flash --release";
    if (runner.find("probe-rs") != std::string::npos) s.debug_interface = "probe-rs";
    // target/<triple>/release/<package>
    std::string triple = Search(cfg, R"(\n\s*target\s*=\s*\"([^\"]+)\")");
    std::string package =
        Search(ReadText(root / "Cargo.toml"), R"(\[package\][^\[]*?\bname\s*=\s*\"([^\"]+)\")");
    if (!triple.empty() && !package.empty())
      s.image = absl::StrCat("target/", triple, "/release/", package);
  } else if (exists("CMakeLists.txt")) {
    s.build_system = "cmake";
    s.build_command = "cmake -S . -B build && cmake --build build";
    s.image = ImageFromCmake(ReadText(root / "CMakeLists.txt"));
  } else if (exists("Makefile") || exists("makefile") || exists("GNUmakefile")) {
    s.build_system = "make";
    s.build_command = "make";
    const std::string mk = ReadText(root / (exists("Makefile")   ? "Makefile"
                                            : exists("makefile") ? "makefile"
                                                                 : "GNUmakefile"));
    std::string flash = Search(mk, R"(\n(flash)\s*:)");
    if (!flash.empty()) s.flash_command = "make flash";
    if (mk.find("openocd") != std::string::npos) s.debug_interface = "openocd";
    if (mk.find("st-flash") != std::string::npos) s.debug_interface = "stlink";
    if (mk.find("JLink") != std::string::npos) s.debug_interface = "jlink";
    s.image = ImageFromMakefile(mk);
  } else {
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (e.path().extension() == ".ino") {
        // sketch.yaml (arduino-cli's project file) names the board and port.
        const std::string sketch = ReadText(root / "sketch.yaml");
        std::string fqbn = Search(sketch, R"(default_fqbn:\s*\"?([A-Za-z0-9_:.\-]+))");
        std::string port = Search(sketch, R"(default_port:\s*\"?([^\s\"]+))");
        s.build_system = "arduino";
        s.build_command = absl::StrCat("arduino-cli compile --fqbn ",
                                       fqbn.empty() ? "<fqbn>" : fqbn, " --output-dir build .");
        s.flash_command = absl::StrCat("arduino-cli upload -p ", port.empty() ? "<port>" : port,
                                       " --fqbn ", fqbn.empty() ? "<fqbn>" : fqbn, " .");
        s.board = fqbn;
        s.serial_port = port;
        s.target = TargetOfBoard(fqbn);
        s.image = absl::StrCat("build/", e.path().filename().string(), ".elf");
        break;
      }
    }
    if (s.build_system.empty()) s.build_system = "unknown";
  }
  if (s.target.empty()) s.target = TargetFromFiles(root);
  if (s.flash_command.empty() && !s.target.empty()) {
    s.flash_command = "fwai flash";  // the broker's own flashing (OpenOCD or the simulated board)
  }
  // The image: what the build files say it makes; else (or when that is not
  // there but another ELF was built) the newest ELF under a build directory.
  if (s.image.empty() || !fs::exists(root / s.image, ec)) {
    std::string built = NewestBuiltElf(root);
    if (!built.empty()) s.image = built;
  }
  if (s.build_command.empty()) s.missing.push_back("build_command");
  if (s.flash_command.empty()) s.missing.push_back("flash_command");
  if (s.target.empty()) s.missing.push_back("target");
  return s;
}

void ApplyEmbedderMd(const std::string& root, ProjectSettings& s) {
  const std::string text = ReadText(fs::path(root) / "EMBEDDER.md");
  if (text.empty()) return;
  for (const char* tag : {"OVERVIEW", "COMMANDS"}) {
    const std::string open = absl::StrCat("<", tag, ">"), close = absl::StrCat("</", tag, ">");
    size_t a = text.find(open), b = text.find(close);
    if (a == std::string::npos || b == std::string::npos || b < a) continue;
    for (absl::string_view line :
         absl::StrSplit(text.substr(a + open.size(), b - a - open.size()), '\n')) {
      size_t eq = line.find('=');
      if (eq == absl::string_view::npos) continue;
      std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)));
      std::string value(absl::StripAsciiWhitespace(line.substr(eq + 1)));
      static const std::map<std::string, std::string> kAlias = {
          {"build", "build_command"}, {"flash", "flash_command"},   {"mcu", "target"},
          {"target_mcu", "target"},   {"debug", "debug_interface"}, {"serial", "serial_port"},
          {"port", "serial_port"},    {"baudrate", "baud"}};
      auto it = kAlias.find(key);
      if (it != kAlias.end()) key = it->second;
      if (!value.empty() && SetProjectField(s, key, value).ok()) std::erase(s.missing, key);
    }
  }
}

std::string EmbedderMd(const ProjectSettings& s) {
  return absl::StrCat("# ", s.name, "\n\n<OVERVIEW>\nname = ", s.name, "\ntarget = ", s.target,
                      "\nboard = ", s.board, "\ndebug_interface = ", s.debug_interface,
                      "\nserial_port = ", s.serial_port, "\nbaud = ", s.baud,
                      "\n</OVERVIEW>\n\n<COMMANDS>\nbuild = ", s.build_command,
                      "\nflash = ", s.flash_command, "\n</COMMANDS>\n");
}

absl::Status SetProjectField(ProjectSettings& s, const std::string& key, const std::string& value) {
  if (key == "name")
    s.name = value;
  else if (key == "build_system")
    s.build_system = value;
  else if (key == "build_command")
    s.build_command = value;
  else if (key == "flash_command")
    s.flash_command = value;
  else if (key == "image")
    s.image = value;
  else if (key == "test_command")
    s.test_command = value;
  else if (key == "boot_pattern")
    s.boot_pattern = value;
  else if (key == "target")
    s.target = value;
  else if (key == "svd")
    s.svd = value;
  else if (key == "board")
    s.board = value;
  else if (key == "debug_interface")
    s.debug_interface = value;
  else if (key == "serial_port")
    s.serial_port = value;
  else if (key == "baud") {
    char* end = nullptr;
    long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end || v < 50 || v > 20000000)
      return absl::InvalidArgumentError("baud: expected a number 50..20000000");
    s.baud = static_cast<int>(v);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown project field '", key, "'"));
  }
  return absl::OkStatus();
}

void KeepExistingSettings(const ProjectSettings& existing, const std::set<std::string>& given,
                          ProjectSettings& s) {
  auto keep = [&](const char* key, const std::string& old, std::string& now) {
    if (!old.empty() && !given.count(key)) now = old;
  };
  keep("name", existing.name, s.name);
  keep("build_system", existing.build_system, s.build_system);
  keep("build_command", existing.build_command, s.build_command);
  keep("flash_command", existing.flash_command, s.flash_command);
  keep("image", existing.image, s.image);
  keep("test_command", existing.test_command, s.test_command);
  keep("target", existing.target, s.target);
  keep("svd", existing.svd, s.svd);
  keep("board", existing.board, s.board);
  keep("debug_interface", existing.debug_interface, s.debug_interface);
  keep("serial_port", existing.serial_port, s.serial_port);
  keep("boot_pattern", existing.boot_pattern, s.boot_pattern);
  if (!given.count("baud")) s.baud = existing.baud;
  std::erase_if(s.missing, [&](const std::string& m) {
    return (m == "build_command" && !s.build_command.empty()) ||
           (m == "flash_command" && !s.flash_command.empty()) ||
           (m == "target" && !s.target.empty());
  });
}

std::string UnmanagedSections(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception&) {
    return "";
  }
  if (!root.IsMap()) return "";
  std::string out;
  for (const char* key : {"policy", "mcp_servers", "skills", "template", "watch"}) {
    if (!root[key]) continue;
    YAML::Emitter e;
    e << YAML::BeginMap << YAML::Key << key << YAML::Value << root[key] << YAML::EndMap;
    out += std::string(e.c_str()) + "\n";
  }
  return out;
}

std::string ProjectYaml(const ProjectSettings& s) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << s.name;
  out << YAML::Key << "build_system" << YAML::Value << s.build_system;
  out << YAML::Key << "build" << YAML::Value << YAML::BeginMap << YAML::Key << "command"
      << YAML::Value << s.build_command << YAML::EndMap;
  out << YAML::Key << "flash" << YAML::Value << YAML::BeginMap << YAML::Key << "command"
      << YAML::Value << s.flash_command;
  if (!s.image.empty()) out << YAML::Key << "image" << YAML::Value << s.image;
  out << YAML::EndMap;
  if (!s.test_command.empty()) {
    out << YAML::Key << "test" << YAML::Value << YAML::BeginMap << YAML::Key << "command"
        << YAML::Value << s.test_command << YAML::EndMap;
  }
  out << YAML::Key << "target" << YAML::Value << s.target;
  if (!s.svd.empty()) out << YAML::Key << "svd" << YAML::Value << s.svd;
  if (!s.board.empty()) out << YAML::Key << "board" << YAML::Value << s.board;
  if (!s.debug_interface.empty())
    out << YAML::Key << "debug_interface" << YAML::Value << s.debug_interface;
  out << YAML::Key << "serial" << YAML::Value << YAML::BeginMap;
  if (!s.serial_port.empty()) out << YAML::Key << "port" << YAML::Value << s.serial_port;
  out << YAML::Key << "baud" << YAML::Value << s.baud;
  if (!s.boot_pattern.empty()) out << YAML::Key << "boot_pattern" << YAML::Value << s.boot_pattern;
  out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string("# fwai project settings (fwai init); see `fwai doctor`\n") + out.c_str() +
         "\n";
}

namespace {

// ParseProjectYaml without its guard against what yaml-cpp throws.
absl::StatusOr<ProjectSettings> ParseProjectSettings(const std::string& text,
                                                     const std::string& source) {
  ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(text, source));
  auto err = [&](const YAML::Node& n, const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", n.Mark().line + 1, ": ", field, ": ", what));
  };
  if (!root.IsMap())
    return absl::InvalidArgumentError(absl::StrCat(source, ":1: expected a mapping of settings"));
  static const std::set<std::string> kKeys = {"name",   "build_system", "build",  "flash",
                                              "target", "svd",          "board",  "debug_interface",
                                              "serial", "mcp_servers",  "policy", "skills",
                                              "test",   "template",     "watch"};
  ProjectSettings s;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (!kKeys.count(key)) return err(kv.first, key, "unknown setting");
  }
  auto str = [&](const char* key, std::string& out) -> absl::Status {
    if (!root[key]) return absl::OkStatus();
    if (!root[key].IsScalar()) return err(root[key], key, "expected a string");
    out = root[key].Scalar();
    return absl::OkStatus();
  };
  for (auto [k, f] :
       std::vector<std::pair<const char*, std::string*>>{{"name", &s.name},
                                                         {"build_system", &s.build_system},
                                                         {"target", &s.target},
                                                         {"svd", &s.svd},
                                                         {"board", &s.board},
                                                         {"debug_interface", &s.debug_interface}}) {
    if (auto st = str(k, *f); !st.ok()) return st;
  }
  for (auto [k, f] : std::vector<std::pair<const char*, std::string*>>{
           {"build", &s.build_command}, {"flash", &s.flash_command}, {"test", &s.test_command}}) {
    const auto& n = root[k];
    if (!n) continue;
    if (!n.IsMap() || !n["command"] || !n["command"].IsScalar())
      return err(n, absl::StrCat(k, ".command"), "expected a command string");
    for (const auto& kv : n) {
      const std::string sub = kv.first.Scalar();
      if (sub != "command" && !(std::string(k) == "flash" && sub == "image")) {
        return err(kv.first, absl::StrCat(k, ".", sub), "unknown setting");
      }
    }
    *f = n["command"].Scalar();
  }
  if (root["flash"] && root["flash"]["image"]) {
    if (!root["flash"]["image"].IsScalar())
      return err(root["flash"]["image"], "flash.image", "expected a path");
    s.image = root["flash"]["image"].Scalar();
  }
  if (const auto& n = root["watch"]) {
    ASSIGN_OR_RETURN(s.watch, ParseWatchRules(n, source));
  }
  if (const auto& n = root["serial"]) {
    if (!n.IsMap()) return err(n, "serial", "expected {port, baud}");
    for (const auto& kv : n) {
      const std::string sub = kv.first.Scalar();
      if (sub != "port" && sub != "baud" && sub != "boot_pattern")
        return err(kv.first, "serial." + sub, "unknown setting");
    }
    if (n["port"]) s.serial_port = n["port"].Scalar();
    if (n["boot_pattern"]) {
      s.boot_pattern = n["boot_pattern"].Scalar();
      try {
        std::regex check(s.boot_pattern);
      } catch (const std::regex_error&) {
        return err(n["boot_pattern"], "serial.boot_pattern", "not a valid regular expression");
      }
    }
    if (n["baud"]) {
      if (auto st = SetProjectField(s, "baud", n["baud"].Scalar()); !st.ok())
        return err(n["baud"], "serial.baud", "expected a number 50..20000000");
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<ProjectSettings> ParseProjectYaml(const std::string& text,
                                                 const std::string& source) {
  // A node of the wrong kind (a mapping as a key, say) throws when read.
  try {
    return ParseProjectSettings(text, source);
  } catch (const YAML::Exception& e) {
    return YamlStatus(source, e);
  }
}

void PruneRunDirs(const std::string& dir, size_t keep) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> runs;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory(ec) && e.path().filename().string().rfind("run-", 0) == 0) {
      runs.emplace_back(fs::last_write_time(e.path(), ec), e.path());
    }
  }
  if (runs.size() <= keep) return;
  std::sort(runs.begin(), runs.end());
  for (size_t i = 0; i + keep < runs.size(); ++i) fs::remove_all(runs[i].second, ec);
}

std::vector<DoctorCheck> DoctorChecks(const std::string& root) {
  std::vector<DoctorCheck> out;
  struct Tool {
    const char* name;
    std::vector<std::string> argv;
    const char* fix;
    bool required;
  };
  const std::vector<Tool> tools = {
      {"arm-none-eabi-gcc",
       {"arm-none-eabi-gcc", "--version"},
       "sudo apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi",
       true},
      {"gdb", {"gdb-multiarch", "--version"}, "sudo apt-get install gdb-multiarch", true},
      {"openocd", {"openocd", "--version"}, "sudo apt-get install openocd", false},
      {"qemu-system-arm",
       {"qemu-system-arm", "--version"},
       "sudo apt-get install qemu-system-arm",
       true},
      {"cmake", {"cmake", "--version"}, "sudo apt-get install cmake", false},
      {"make", {"make", "--version"}, "sudo apt-get install make", false},
      {"bubblewrap",
       {"bwrap", "--version"},
       "sudo apt-get install bubblewrap (commands then run sandboxed)",
       false},
  };
  for (const auto& t : tools) {
    DoctorCheck c;
    c.name = t.name;
    ProcessOptions po;
    po.timeout_ms = 10000;
    auto r = RunProcess(t.argv, po);
    if (!r.ok() || r->exit_code != 0) {
      c.ok = false;
      c.detail = !r.ok() ? "not found" : absl::StrCat("exited ", r->exit_code);
      c.fix = t.fix;
    } else {
      c.ok = true;
      std::string text = r->out.empty() ? r->err : r->out;
      c.detail = text.substr(0, text.find('\n'));
    }
    out.push_back(std::move(c));
  }
  DoctorCheck cfg;
  cfg.name = "project config";
  const fs::path path = fs::path(root) / ".fwai" / "project.yaml";
  std::error_code ec;
  if (root.empty()) {
    cfg.detail = "no project directory given";
    cfg.fix = "run fwai doctor inside a project";
  } else if (!fs::exists(path, ec)) {
    cfg.detail = absl::StrCat(path.string(), " does not exist");
    cfg.fix = "fwai init";
  } else {
    const std::string text = ReadText(path);
    auto p = ParseProjectYaml(text, path.string());
    // The sections other parts of fwaid read are checked here too.
    absl::Status more = absl::OkStatus();
    if (p.ok()) {
      if (auto pol = ParsePolicy(text, path.string()); !pol.ok())
        more = pol.status();
      else if (auto mcp = ParseMcpServers(text, path.string()); !mcp.ok())
        more = mcp.status();
    }
    cfg.ok = p.ok() && more.ok();
    cfg.detail = !p.ok()      ? std::string(p.status().message())
                 : !more.ok() ? std::string(more.message())
                              : absl::StrCat(path.string(), ": ", p->build_system, ", target ",
                                             p->target.empty() ? "?" : p->target);
    if (!p.ok()) cfg.fix = "fix the file, or run fwai init --force";
  }
  out.push_back(std::move(cfg));
  return out;
}

}  // namespace fwai
