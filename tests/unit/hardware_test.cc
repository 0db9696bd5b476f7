// Hardware pieces without a daemon: config, discovery over a fixture sysfs,
// the firmware guard on hand-made ELFs, GDB/MI parsing, fault bits, the
// serial hub on a real pty pair, and leases on a real RocksDB.
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/file.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/config.h"
#include "server/hardware/discovery.h"
#include "server/hardware/firmware_image.h"
#include "server/hardware/gdb_mi.h"
#include "server/hardware/gdb_policy.h"
#include "server/hardware/lease_manager.h"
#include "server/hardware/serial_hub.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "fwai-hw-XXXXXX").string();
  return mkdtemp(t.data());
}

void WriteFile(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// ---- config ----

TEST(HardwareConfigTest, BoardsParseWithDefaultsAndClearErrors) {
  auto c = ParseConfig(R"(
hardware:
  history_lines: 500
  boards:
    - id: sim
      kind: simulated
      machine: stm32vldiscovery
      tags: [sim, f1]
      rtt: {poll_ms: 2}
    - id: nucleo
      serial: /dev/serial/by-id/usb-STM-if02
      baud: 921600
      parity: even
      line_ending: crlf
      probe: 0671FF3833
      openocd_config: [interface/stlink.cfg, target/stm32f4x.cfg]
      flash_size: 512K
      flash_origin: 0x08000000
      ram_size: 128K
)",
                       "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->hardware.boards.size(), 2u);
  const auto& sim = c->hardware.boards[0];
  EXPECT_EQ(sim.target, "stm32f100rb");
  EXPECT_EQ(sim.flash_size, 128u * 1024);
  EXPECT_EQ(sim.ram_size, 8u * 1024);
  EXPECT_EQ(sim.rtt_poll_ms, 2);
  const auto& n = c->hardware.boards[1];
  EXPECT_EQ(n.kind, "physical");
  EXPECT_EQ(n.baud, 921600);
  EXPECT_EQ(n.line_ending, "\r\n");
  EXPECT_EQ(n.flash_size, 512u * 1024);
  EXPECT_EQ(n.openocd_config.size(), 2u);
  EXPECT_EQ(n.rtt_poll_ms, 10);
  EXPECT_EQ(c->hardware.history_lines, 500);
  auto off = ParseConfig(
      "hardware:\n  boards:\n    - {id: s, kind: simulated, machine: lm3s6965evb, rtt: off}\n",
      "o.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->hardware.boards[0].rtt_poll_ms, 0);
  for (const char* bad : {"rtt: {poll_ms: 0}", "rtt: {poll_ms: 5000}", "rtt: {every: 5}",
                          "rtt: sometimes", "semihosting: maybe"}) {
    auto r = ParseConfig(absl::StrCat("hardware:\n  boards:\n    - {id: s, kind: simulated, "
                                      "machine: lm3s6965evb, ",
                                      bad, "}\n"),
                         "r.yaml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad[0] == 'r' ? "hardware.boards[0].rtt"
                                                      : "hardware.boards[0].semihosting"),
              std::string::npos)
        << r.status();
  }
  auto physical = ParseConfig(
      "hardware:\n  boards:\n    - {id: p, serial: /dev/x, semihosting: true}\n", "s.yaml");
  ASSERT_FALSE(physical.ok());
  EXPECT_NE(physical.status().message().find("read on simulated boards"), std::string::npos)
      << physical.status();

  auto dup = ParseConfig(
      "hardware:\n  boards:\n    - {id: a, serial: /dev/x}\n    - {id: a, serial: /dev/y}\n",
      "d.yaml");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("d.yaml:4"), std::string::npos) << dup.status();
  EXPECT_NE(dup.status().message().find("already used"), std::string::npos);
  auto bad_machine = ParseConfig(
      "hardware:\n  boards:\n    - {id: s, kind: simulated, machine: pdp11}\n", "m.yaml");
  ASSERT_FALSE(bad_machine.ok());
  EXPECT_NE(bad_machine.status().message().find("stm32vldiscovery or lm3s6965evb"),
            std::string::npos);
  auto bad_parity = ParseConfig(
      "hardware:\n  boards:\n    - {id: p, serial: /dev/x, parity: sometimes}\n", "p.yaml");
  ASSERT_FALSE(bad_parity.ok());
  EXPECT_NE(bad_parity.status().message().find("hardware.boards[0].parity"), std::string::npos);
  auto nothing = ParseConfig("hardware:\n  boards:\n    - {id: q}\n", "q.yaml");
  ASSERT_FALSE(nothing.ok());
  EXPECT_NE(nothing.status().message().find("needs a serial port"), std::string::npos);
}

// ---- discovery ----

TEST(DiscoveryTest, FindsUsbSerialPortsAndProbesInAFixtureTree) {
  const fs::path root = TempDir();
  const fs::path sys = root / "sys", dev = root / "dev";
  // An FTDI adapter on ttyUSB0 and an ST-Link V2-1 with its VCP on ttyACM0.
  const fs::path ftdi = sys / "devices/pci0000:00/usb1/1-1";
  WriteFile(ftdi / "idVendor", "0403\n");
  WriteFile(ftdi / "idProduct", "6001\n");
  WriteFile(ftdi / "serial", "A50285BI\n");
  WriteFile(ftdi / "manufacturer", "FTDI\n");
  WriteFile(ftdi / "product", "FT232R USB UART\n");
  fs::create_directories(ftdi / "1-1:1.0/ttyUSB0");
  const fs::path stl = sys / "devices/pci0000:00/usb1/1-2";
  WriteFile(stl / "idVendor", "0483\n");
  WriteFile(stl / "idProduct", "374B\n");
  WriteFile(stl / "serial", "0671FF383133\n");
  WriteFile(stl / "manufacturer", "STMicroelectronics\n");
  WriteFile(stl / "product", "STM32 STLink\n");
  fs::create_directories(stl / "1-2:1.2/tty/ttyACM0");
  fs::create_directories(sys / "class/tty/ttyUSB0");
  fs::create_directory_symlink(ftdi / "1-1:1.0", sys / "class/tty/ttyUSB0/device");
  fs::create_directories(sys / "class/tty/ttyACM0");
  fs::create_directory_symlink(stl / "1-2:1.2", sys / "class/tty/ttyACM0/device");
  fs::create_directories(sys / "class/tty/tty0");  // a console: no device link
  fs::create_directories(sys / "bus/usb/devices");
  fs::create_directory_symlink(ftdi, sys / "bus/usb/devices/1-1");
  fs::create_directory_symlink(stl, sys / "bus/usb/devices/1-2");
  fs::create_directories(dev / "serial/by-id");
  fs::create_symlink("../../ttyUSB0",
                     dev / "serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0");

  auto found = DiscoverDevices(sys.string(), dev.string());
  ASSERT_EQ(found.size(), 3u);
  std::map<std::string, DiscoveredDevice> by_id;
  for (const auto& d : found) by_id[d.id] = d;
  ASSERT_TRUE(by_id.count("serial:ttyUSB0"));
  const auto& u = by_id["serial:ttyUSB0"];
  EXPECT_EQ(u.vid_pid, "0403:6001");
  EXPECT_EQ(u.serial_number, "A50285BI");
  EXPECT_EQ(u.manufacturer, "FTDI");
  EXPECT_EQ(u.path, (dev / "ttyUSB0").string());
  EXPECT_EQ(u.stable_path,
            (dev / "serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0").string());
  ASSERT_TRUE(by_id.count("serial:ttyACM0"));
  EXPECT_EQ(by_id["serial:ttyACM0"].vid_pid, "0483:374b");
  ASSERT_TRUE(by_id.count("probe:0671FF383133"));
  EXPECT_EQ(by_id["probe:0671FF383133"].name, "ST-Link V2-1");
  EXPECT_EQ(ProbeFamily("1366:0105"), "SEGGER J-Link");
  EXPECT_EQ(ProbeFamily("1d50:6018"), "Black Magic Probe");
  EXPECT_EQ(ProbeFamily("303a:1001"), "ESP USB-JTAG");
  EXPECT_EQ(ProbeFamily("1a86:8010"), "WCH-Link");
  EXPECT_EQ(ProbeFamily("0d28:0204"), "CMSIS-DAP (DAPLink)");
  EXPECT_EQ(ProbeFamily("0403:6001"), "");
}

// ---- firmware guard ----

// A minimal ELF32 with one PT_LOAD of `size` bytes at `addr` whose first word
// is `sp`.
std::string MakeElf(const std::string& dir, const std::string& name, uint16_t machine,
                    uint32_t addr, uint32_t size, uint32_t sp) {
  Elf32_Ehdr eh{};
  std::memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS32;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_ident[EI_VERSION] = EV_CURRENT;
  eh.e_type = ET_EXEC;
  eh.e_machine = machine;
  eh.e_version = EV_CURRENT;
  eh.e_entry = addr + 9;
  eh.e_phoff = sizeof(Elf32_Ehdr);
  eh.e_ehsize = sizeof(Elf32_Ehdr);
  eh.e_phentsize = sizeof(Elf32_Phdr);
  eh.e_phnum = 1;
  Elf32_Phdr ph{};
  ph.p_type = PT_LOAD;
  ph.p_offset = sizeof(Elf32_Ehdr) + sizeof(Elf32_Phdr);
  ph.p_vaddr = ph.p_paddr = addr;
  ph.p_filesz = ph.p_memsz = size;
  std::string data(sizeof eh + sizeof ph + size, '\0');
  std::memcpy(data.data(), &eh, sizeof eh);
  std::memcpy(data.data() + sizeof eh, &ph, sizeof ph);
  std::memcpy(data.data() + ph.p_offset, &sp, 4);
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << data;
  return path;
}

BoardConfig VlBoard() {
  BoardConfig b;
  b.id = "vl";
  b.machine = "stm32vldiscovery";
  ApplyBoardDefaults(b);
  return b;
}

TEST(FirmwareGuardTest, FitsTargetAndFreshnessRulesNameWhatIsWrong) {
  const std::string dir = TempDir();
  const BoardConfig b = VlBoard();
  auto good = ReadFirmwareImage(MakeElf(dir, "good.elf", EM_ARM, 0x08000000, 4096, 0x20002000));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(CheckImageFits(*good, b).ok());
  EXPECT_TRUE(CheckImageTarget(*good, b).ok());

  auto big = ReadFirmwareImage(MakeElf(dir, "big.elf", EM_ARM, 0x08000000, 200 * 1024, 0x20002000));
  ASSERT_TRUE(big.ok());
  auto s = CheckImageFits(*big, b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("flash guard (fits)"), std::string::npos) << s;

  auto f103 = ReadFirmwareImage(MakeElf(dir, "f103.elf", EM_ARM, 0x08000000, 4096, 0x20005000));
  ASSERT_TRUE(f103.ok());
  s = CheckImageTarget(*f103, b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("flash guard (target)"), std::string::npos);
  EXPECT_NE(s.message().find("0x20005000"), std::string::npos) << s;

  auto riscv = ReadFirmwareImage(MakeElf(dir, "rv.elf", EM_RISCV, 0x08000000, 1024, 0x20002000));
  ASSERT_TRUE(riscv.ok());
  s = CheckImageTarget(*riscv, b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("RISC-V"), std::string::npos) << s;

  WriteFile(dir + "/notelf.bin", "\x01\x02\x03 not an elf");
  auto notelf = ReadFirmwareImage(dir + "/notelf.bin");
  ASSERT_FALSE(notelf.ok());
  EXPECT_NE(notelf.status().message().find("not an ELF"), std::string::npos);
  EXPECT_EQ(ReadFirmwareImage(dir + "/missing.elf").status().code(), absl::StatusCode::kNotFound);

  // Freshness: a source edited after the image was built refuses it.
  const fs::path proj = TempDir();
  WriteFile(proj / "Makefile", "all:\n");
  WriteFile(proj / "src/main.c", "int main(void){return 0;}\n");
  fs::create_directories(proj / "build");
  std::string img_path =
      MakeElf((proj / "build").string(), "app.elf", EM_ARM, 0x08000000, 1024, 0x20002000);
  auto past = fs::file_time_type::clock::now() - std::chrono::hours(1);
  fs::last_write_time(proj / "Makefile", past);
  fs::last_write_time(proj / "src/main.c", past);
  EXPECT_EQ(FindProjectRoot(img_path), proj.string());
  auto img = ReadFirmwareImage(img_path);
  ASSERT_TRUE(img.ok());
  EXPECT_TRUE(CheckImageFresh(*img, proj.string()).ok());
  fs::last_write_time(proj / "src/main.c",
                      fs::file_time_type::clock::now() + std::chrono::seconds(5));
  s = CheckImageFresh(*img, proj.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("flash guard (fresh)"), std::string::npos);
  EXPECT_NE(s.message().find("src/main.c"), std::string::npos) << s;

  auto sha = FileSha256(img_path);
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(sha->size(), 64u);
}

// ---- GDB/MI and faults ----

TEST(GdbMiTest, ParsesResultsTuplesListsAndEscapes) {
  auto r = ParseMiResults(
      R"(stack=[frame={level="0",addr="0x08000122",func="fault_report",file="src/main.c",line="86"},frame={level="1",func="<signal handler called>"}],msg="a \"quoted\" word\n")");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*r)["stack"].is_array());
  ASSERT_EQ((*r)["stack"].size(), 2u);
  EXPECT_EQ((*r)["stack"][0]["func"], "fault_report");
  EXPECT_EQ((*r)["stack"][1]["func"], "<signal handler called>");
  EXPECT_EQ((*r)["msg"], "a \"quoted\" word\n");
  auto v = ParseMiResults(R"(value="{a = 1, b = 2}",register-values=[{number="0",value="0x0"}])");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["value"], "{a = 1, b = 2}");
  EXPECT_EQ((*v)["register-values"][0]["number"], "0");
  EXPECT_FALSE(ParseMiResults(R"(a="unterminated)").ok());
}

// A session reading `mi` as all that gdb prints before its output ends.
std::unique_ptr<GdbSession> MiTranscript(const std::string& mi) {
  int out[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(write(out[1], mi.data(), mi.size()), static_cast<ssize_t>(mi.size()));
  close(out[1]);
  return GdbSession::Attach(open("/dev/null", O_WRONLY | O_CLOEXEC), out[0]);
}

TEST(GdbMiTest, AGdbWhoseOutputEndedIsGoneAtOnce) {
  // It used to wait out the whole timeout (and 3 s more after an interrupt),
  // spinning on the closed pipe.
  auto gdb = MiTranscript("1^running\n*running,thread-id=\"all\"\n");
  auto run = gdb->Mi("-exec-continue", 2000);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->result_class, "running");
  auto stop = gdb->WaitStopped(2000);
  ASSERT_FALSE(stop.ok());
  EXPECT_EQ(stop.status().code(), absl::StatusCode::kUnavailable) << stop.status();
  auto next = gdb->Mi("-data-evaluate-expression 1", 2000);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable) << next.status();
  EXPECT_NE(next.status().message().find("gdb is gone"), std::string::npos) << next.status();
}

// GDB runs as fwaid: what reaches it may act on the target only. Each refused
// line is one a caller could use to run a program, read or write a host file
// or change GDB's settings as fwaid.
TEST(GdbPolicyTest, OnlyCommandsOnTheTargetReachGdb) {
  for (const char* ok : {"print counter",
                         "p/x $pc",
                         "x/4xw 0x20000000",
                         "bt",
                         "backtrace",
                         "info registers",
                         "info locals",
                         "break main",
                         "tbreak src/main.c:42",
                         "continue",
                         "step",
                         "next",
                         "finish",
                         "set var counter = 0",
                         "set variable led = 1",
                         "monitor reset halt",
                         "fault",
                         "decode fault",
                         "info fault",
                         "reset",
                         "frame 1",
                         "up",
                         "disassemble main",
                         "watch counter",
                         "delete 1"}) {
    EXPECT_EQ(RefuseGdbCommand(ok), std::nullopt) << ok;
  }
  for (const char* bad : {"python import os; os.system('id')",
                          "pi 1",
                          "py print(1)",
                          "pyth print(1)",
                          "guile 1",
                          "shell id",
                          "! id",
                          "| id",
                          "pipe print 1 | sh",
                          "source /etc/shadow",
                          "sou /etc/shadow",
                          "restore /etc/shadow binary 0x20000000",
                          "dump memory /tmp/x 0x20000000 0x20000100",
                          "append value /tmp/x 1",
                          "file /etc/shadow",
                          "symbol-file /root/secret.elf",
                          "core-file /tmp/core",
                          "cd /root",
                          "make",
                          "compile code 1",
                          "define x",
                          "eval \"shell id\"",
                          "set logging file /etc/cron.d/x",
                          "set logging on",
                          "set history filename /tmp/h",
                          "set auto-load on",
                          "set source open on",
                          "info proc",
                          "info os",
                          "info files",
                          "list main",
                          "print $_shell(\"id\")",
                          "call $_shell(\"id\")",
                          "print 1\npython import os",
                          "bt\r\nshell id",
                          "monitor dump_image /tmp/x 0 4",
                          "monitor shutdown",
                          "target remote 1.2.3.4:1",
                          "detach",
                          "quit",
                          "kill",
                          "load /etc/shadow",
                          "frame\x01"}) {
    auto why = RefuseGdbCommand(bad);
    ASSERT_TRUE(why.has_value()) << bad;
    EXPECT_NE(why->find("rule: debug commands act on the target only"), std::string::npos)
        << bad << ": " << *why;
  }
  EXPECT_NE(RefuseGdbCommand("python 1")->find("'python' is not allowed here"), std::string::npos);
}

TEST(FaultDecodeTest, MiFieldsOfTheWrongTypeAreReadAsMissing) {
  // Each of these threw out of the fault decoder (a tuple where a string
  // belongs, a frame level that is not a number, frames that are not tuples).
  auto tuple_value = DecodeFault(*MiTranscript("1^done,value={a=\"1\"}\n"));
  ASSERT_FALSE(tuple_value.ok());
  EXPECT_NE(tuple_value.status().message().find("not a number"), std::string::npos)
      << tuple_value.status();
  auto list_msg = DecodeFault(*MiTranscript("1^error,msg=[\"x\"]\n"));
  ASSERT_FALSE(list_msg.ok());
  EXPECT_NE(list_msg.status().message().find("$xpsr: error"), std::string::npos)
      << list_msg.status();
  const std::string regs =
      "1^done,value=\"0x3\"\n2^done,value=\"0x0\"\n3^done,value=\"0x0\"\n"
      "4^done,value=\"0x0\"\n5^done,value=\"0x0\"\n";
  for (
      const std::string stack :
      {R"(stack=[frame={level="0",func="HardFault_Handler"},frame={level="1",func="<signal handler called>"},)"
       R"(frame={level="x",func="f"}])",
       R"(stack=["a","<signal handler called>","c"])", R"(stack="none")"}) {
    auto f = DecodeFault(*MiTranscript(regs + "6^done," + stack + "\n"));
    ASSERT_TRUE(f.ok()) << stack << ": " << f.status();
    EXPECT_TRUE(f->in_fault);
    EXPECT_EQ(f->exception, "HardFault");
    EXPECT_EQ(f->location, "");
  }
}

TEST(FaultDecodeTest, CfsrAndHfsrBitsInPlainWords) {
  auto causes = DecodeFaultBits(0x00008200, 0x40000000, 0, 0x3ffffff0);
  std::string all;
  for (const auto& c : causes) all += c + "\n";
  EXPECT_NE(all.find("forced"), std::string::npos);
  EXPECT_NE(all.find("precise data bus error"), std::string::npos);
  EXPECT_NE(all.find("0x3ffffff0"), std::string::npos);
  auto div = DecodeFaultBits(1u << 25, 0, 0, 0);
  ASSERT_EQ(div.size(), 1u);
  EXPECT_NE(div[0].find("divide by zero"), std::string::npos);
  auto mm = DecodeFaultBits((1u << 1) | (1u << 7), 0, 0x20000100, 0);
  all.clear();
  for (const auto& c : mm) all += c + "\n";
  EXPECT_NE(all.find("data access violation"), std::string::npos);
  EXPECT_NE(all.find("0x20000100"), std::string::npos);
  EXPECT_TRUE(DecodeFaultBits(0, 0, 0, 0).empty());
}

// ---- serial hub on a pty pair ----

struct Pty {
  int master = -1;
  std::string slave;
  Pty() {
    int s = -1;
    char name[128];
    termios raw{};
    cfmakeraw(&raw);
    EXPECT_EQ(openpty(&master, &s, name, &raw, nullptr), 0);
    slave = name;
    close(s);  // the hub opens it by path, as it would a real port
  }
  ~Pty() {
    if (master >= 0) close(master);
  }
  void Send(const std::string& bytes) {
    ASSERT_EQ(write(master, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  std::string Receive(size_t n, int timeout_ms = 2000) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    fcntl(master, F_SETFL, O_NONBLOCK);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
      char buf[256];
      ssize_t r = read(master, buf, sizeof buf);
      if (r > 0) {
        out.append(buf, static_cast<size_t>(r));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return out;
  }
};

std::vector<std::string> ReadLines(SerialReader& r, size_t n, int timeout_ms = 3000) {
  std::vector<std::string> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    SerialLine l;
    auto next = r.Wait(l, 50);
    if (next == SerialReader::Next::kLine) out.push_back(l.text);
    if (next == SerialReader::Next::kEnded) break;
  }
  return out;
}

TEST(SerialHubTest, FansOutLinesInOrderToEveryReaderAndKeepsHistory) {
  Pty pty;
  SerialHub hub("t", 5);
  SerialSettings settings;
  settings.log_file = TempDir() + "/serial.log";
  ASSERT_TRUE(hub.Open(pty.slave, settings).ok());
  auto a = hub.Subscribe(false), b = hub.Subscribe(false), c = hub.Subscribe(false);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i) + "\r\n";
  pty.Send(text);
  for (auto* r : {a.get(), b.get(), c.get()}) {
    auto lines = ReadLines(*r, 200);
    ASSERT_EQ(lines.size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(lines[i], "line " + std::to_string(i));
  }
  // Every line also goes to the log file, with its time.
  {
    std::ifstream log(settings.log_file);
    std::string first;
    std::getline(log, first);
    EXPECT_NE(first.find(" line 0"), std::string::npos) << first;
  }
  // The ring keeps the last 5; a late reader can start from it.
  auto hist = hub.History(0);
  ASSERT_EQ(hist.size(), 5u);
  EXPECT_EQ(hist.back().text, "line 199");
  auto late = hub.Subscribe(true);
  auto replay = ReadLines(*late, 5);
  ASSERT_EQ(replay.size(), 5u);
  EXPECT_EQ(replay[0], "line 195");
  // A prompt without a newline still shows up.
  pty.Send("> ");
  auto prompt = ReadLines(*a, 1);
  ASSERT_EQ(prompt.size(), 1u);
  EXPECT_EQ(prompt[0], "> ");
}

TEST(SerialHubTest, WritesPatternWaitsAndEncodings) {
  Pty pty;
  SerialHub hub("t", 100);
  SerialSettings s;
  s.line_ending = "\r";
  s.startup_commands = {"echo off"};
  ASSERT_TRUE(hub.Open(pty.slave, s).ok());
  EXPECT_EQ(pty.Receive(9), "echo off\r");
  ASSERT_TRUE(hub.SendLine("ping").ok());
  EXPECT_EQ(pty.Receive(5), "ping\r");
  uint64_t since = hub.next_seq();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pty.Send("booting\nBOOT OK v1.2\n");
  });
  auto hit = hub.WaitFor(std::regex("BOOT (OK|FAIL)"), since, 3000);
  later.join();
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->text, "BOOT OK v1.2");
  EXPECT_FALSE(hub.WaitFor(std::regex("never"), hub.next_seq(), 200).has_value());

  EXPECT_EQ(DecodeSerialText("A\x01\xff", "ascii"), "A\\x01\\xff");
  EXPECT_EQ(DecodeSerialText("\x48\x69", "hex"), "48 69");
  EXPECT_EQ(DecodeSerialText("caf\xc3\xa9 \xff", "utf-8"), "caf\xc3\xa9 \xEF\xBF\xBD");
}

TEST(SerialHubTest, UnplugEndsReadersWithTheReason) {
  auto pty = std::make_unique<Pty>();
  SerialHub hub("t", 100);
  std::string failure;
  std::mutex mu;
  hub.SetOnFailure([&](const std::string& why) {
    std::lock_guard lock(mu);
    failure = why;
  });
  ASSERT_TRUE(hub.Open(pty->slave, SerialSettings{}).ok());
  auto r = hub.Subscribe(false);
  pty->Send("hello\n");
  ASSERT_EQ(ReadLines(*r, 1).size(), 1u);
  const std::string path = pty->slave;
  pty.reset();  // the other end goes away, like a board being unplugged
  auto rest = ReadLines(*r, 1, 3000);
  EXPECT_TRUE(r->ended());
  EXPECT_NE(r->end_reason().find(path), std::string::npos) << r->end_reason();
  EXPECT_FALSE(hub.is_open());
  std::lock_guard lock(mu);
  EXPECT_NE(failure.find("closed"), std::string::npos) << failure;
}

TEST(SerialHubTest, WritesRacingACloseEndAsNotOpenAndNeverWriteAClosedPort) {
  Pty pty;
  SerialHub hub("t", 10);
  ASSERT_TRUE(hub.Open(pty.slave, SerialSettings{}).ok());
  std::atomic<bool> draining{true};
  std::thread drain([&] {  // the board's side reads, so writes never block
    fcntl(pty.master, F_SETFL, O_NONBLOCK);
    char buf[4096];
    while (draining) {
      if (read(pty.master, buf, sizeof buf) <= 0) {
        pollfd p{pty.master, POLLIN, 0};
        poll(&p, 1, 5);
      }
    }
  });
  constexpr int kWriters = 4;
  std::atomic<int> written{0};
  std::vector<absl::Status> last(kWriters);
  std::vector<std::thread> writers;
  for (int i = 0; i < kWriters; ++i) {
    writers.emplace_back([&, i] {
      // Until the port is gone: a write after Close must fail as "not
      // open", not reach a descriptor Close has closed (or one reused since).
      while (true) {
        absl::Status st = hub.Write("0123456789abcdef");
        if (!st.ok()) {
          last[i] = st;
          return;
        }
        ++written;
      }
    });
  }
  while (written < kWriters * 20) std::this_thread::yield();
  hub.Close("unplugged in the test", true);
  for (auto& t : writers) t.join();
  draining = false;
  drain.join();
  for (int i = 0; i < kWriters; ++i) {
    EXPECT_EQ(last[i].code(), absl::StatusCode::kFailedPrecondition) << last[i];
    EXPECT_NE(last[i].message().find("not open"), std::string::npos) << last[i];
  }
}

// A hub without a port (an RTT channel): lines come from Feed, a partial
// one goes out on FlushFed, writes go to its writer, and one without a
// writer is read-only.
TEST(SerialHubTest, AFedHubDeliversFedLinesAndRoutesWritesToItsWriter) {
  SerialHub hub("sim-stm32vl", 10);
  std::vector<std::string> written;
  SerialSettings s;
  s.line_ending = "\n";
  ASSERT_TRUE(hub.OpenFed("rtt:0", s,
                          [&](std::string_view bytes) {
                            written.emplace_back(bytes);
                            return absl::OkStatus();
                          })
                  .ok());
  EXPECT_TRUE(hub.is_open());
  EXPECT_EQ(hub.path(), "rtt:0");
  auto reader = hub.Subscribe(false);
  hub.Feed("rtt: booted\r\nuart cmd: pi");
  EXPECT_EQ(ReadLines(*reader, 1), std::vector<std::string>{"rtt: booted"});
  hub.Feed("ng\npartial");
  EXPECT_EQ(ReadLines(*reader, 1), std::vector<std::string>{"uart cmd: ping"});
  hub.FlushFed();
  EXPECT_EQ(ReadLines(*reader, 1), std::vector<std::string>{"partial"});
  ASSERT_TRUE(hub.SendLine("ping").ok());
  EXPECT_EQ(written, std::vector<std::string>{"ping\n"});
  // Closed: nothing more is written or delivered.
  hub.Close("board stopped", false);
  EXPECT_FALSE(hub.SendLine("ping").ok());
  hub.Feed("late\n");
  EXPECT_EQ(hub.History(0).size(), 3u);

  SerialHub trace("sim-stm32vl", 10);
  ASSERT_TRUE(trace.OpenFed("rtt:1", s, nullptr).ok());
  auto ro = trace.Write("x");
  EXPECT_TRUE(absl::IsFailedPrecondition(ro)) << ro;
  EXPECT_NE(ro.message().find("rtt:1 is read-only"), std::string::npos) << ro;
  s.encoding = "ebcdic";
  auto bad = trace.OpenFed("rtt:1", s, nullptr);
  EXPECT_NE(bad.message().find("encoding 'ebcdic'"), std::string::npos) << bad;
}

TEST(SerialHubTest, OpenErrorsAreClear) {
  SerialHub hub("t", 10);
  auto missing = hub.Open("/dev/fwai-no-such-port", SerialSettings{});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("no such device"), std::string::npos) << missing;
  // Another program holding the port.
  Pty pty;
  int other = open(pty.slave.c_str(), O_RDWR | O_NOCTTY);
  ASSERT_GE(other, 0);
  ASSERT_EQ(flock(other, LOCK_EX | LOCK_NB), 0);
  auto busy = hub.Open(pty.slave, SerialSettings{});
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.message().find("in use by another program"), std::string::npos) << busy;
  close(other);
  EXPECT_TRUE(hub.Open(pty.slave, SerialSettings{}).ok());
  // Not a terminal.
  const std::string dir = TempDir();
  WriteFile(dir + "/plain", "x");
  SerialHub hub2("t2", 10);
  auto notty = hub2.Open(dir + "/plain", SerialSettings{});
  EXPECT_NE(notty.message().find("not a terminal"), std::string::npos) << notty;
  if (geteuid() != 0) {
    WriteFile(dir + "/locked", "");
    chmod((dir + "/locked").c_str(), 0);
    auto denied = hub2.Open(dir + "/locked", SerialSettings{});
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(denied.message().find("permission denied"), std::string::npos);
  }
}

// ---- leases ----

LeaseRecord Who(const std::string& holder, int64_t uid, const std::string& session = "") {
  LeaseRecord l;
  l.holder = holder;
  l.uid = uid;
  l.identity = "uid:" + std::to_string(uid);
  l.session_id = session;
  return l;
}

TEST(LeaseManagerTest, HeldNamesTheHolderWaitersGetItAndTtlExpires) {
  const std::string dir = TempDir();
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok());
  std::vector<std::string> ended;
  std::mutex mu;
  ManualClock clock;
  LeaseManager leases(
      **db,
      [&](const LeaseRecord& l, const std::string& why) {
        std::lock_guard lock(mu);
        ended.push_back(l.device_id + ": " + why);
      },
      &clock);
  ASSERT_TRUE(leases.Start().ok());
  auto ok = [](const std::string&) { return absl::OkStatus(); };
  LeaseRecord alice = Who("alice (uid 1000)", 1000);
  LeaseRecord bob = Who("bob (uid 1001)", 1001);
  auto a = leases.Acquire({"b1"}, alice, 60, 0, ok, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  auto held = leases.Acquire({"b1"}, bob, 60, 0, ok, nullptr);
  ASSERT_EQ(held.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(held.status().message().find("alice (uid 1000)"), std::string::npos) << held.status();
  EXPECT_NE(held.status().message().find("since"), std::string::npos);
  EXPECT_TRUE(leases.CheckHeld("b1", "uid:1000", "").ok());
  EXPECT_FALSE(leases.CheckHeld("b1", "uid:1001", "").ok());
  EXPECT_TRUE(leases.CheckHeld("b1", "", a->lease_id).ok());
  // Alice's lease id (listed to everyone) does not make bob its holder.
  EXPECT_FALSE(leases.CheckHeld("b1", "uid:1001", a->lease_id).ok());
  // Bob waits; he gets it as soon as alice releases (once he is queued).
  std::thread releaser([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (leases.Waiters().empty() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_FALSE(leases.Waiters().empty()) << "bob never queued";
    EXPECT_TRUE(leases.Release("", "b1", "uid:1000", false, false).ok());
  });
  auto waited = leases.Acquire({"b1"}, bob, 1, 5000, ok, nullptr);
  releaser.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->identity, "uid:1001");
  // Alice may not release bob's lease; an admin may, with force.
  EXPECT_EQ(leases.Release("", "b1", "uid:1000", false, false).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(leases.Release("", "b1", "uid:1000", true, false).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Bob's 1 s TTL runs out without renewal: not a moment before.
  clock.Advance(999000);
  EXPECT_EQ(leases.ExpireDue(), 0);
  EXPECT_TRUE(leases.Holder("b1").has_value());
  clock.Advance(2000);
  leases.ExpireDue();  // (or the sweeper, which runs on the same clock)
  EXPECT_FALSE(leases.Holder("b1").has_value());
  // The end callback runs just after the lease is dropped.
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard lock(mu);
      if (ended.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::lock_guard lock(mu);
  ASSERT_EQ(ended.size(), 2u);
  EXPECT_NE(ended[0].find("released by its holder"), std::string::npos);
  EXPECT_NE(ended[1].find("TTL ran out"), std::string::npos) << ended[1];
}

TEST(LeaseManagerTest, LeasesSurviveARestartAndExpiredOnesAreCleaned) {
  const std::string dir = TempDir();
  auto ok = [](const std::string&) { return absl::OkStatus(); };
  LeaseRecord who = Who("carol", 7, "s-1");
  std::string long_id;
  ManualClock clock;
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok());
    LeaseManager leases(**db, nullptr, &clock);
    ASSERT_TRUE(leases.Start().ok());
    auto l = leases.Acquire({"long"}, who, 3600, 0, ok, nullptr);
    ASSERT_TRUE(l.ok());
    long_id = l->lease_id;
    ASSERT_TRUE(leases.Acquire({"short"}, who, 1, 0, ok, nullptr).ok());
  }
  clock.Advance(1200000);  // fwaid down for 1.2 s
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok());
  LeaseManager leases(**db, nullptr, &clock);
  ASSERT_TRUE(leases.Start().ok());
  auto h = leases.Holder("long");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->lease_id, long_id);
  EXPECT_FALSE(leases.Holder("short").has_value());
  // Renewal by a stranger is refused; by the holder it extends.
  EXPECT_EQ(leases.Renew(long_id, "uid:8", false).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto r = leases.Renew(long_id, "uid:7", false);
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->expires_us, h->expires_us);
  // The session going away ends its leases.
  leases.ReleaseSession("s-1");
  EXPECT_FALSE(leases.Holder("long").has_value());
}

// Use (a serial line written, a flash, a debug command) extends a local
// lease by its TTL, as a renewal does. A lease that stands for one granted
// elsewhere (a bench's stand-in for a lab lease) lasts what its owner last
// confirmed, however busy: neither use nor Renew extends it, and it ends
// saying why it ran out.
TEST(LeaseManagerTest, UseExtendsALocalLeaseButNotOneHeldElsewhere) {
  const std::string dir = TempDir();
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok());
  std::vector<std::string> ended;
  std::mutex mu;
  ManualClock clock;
  LeaseManager leases(
      **db,
      [&](const LeaseRecord& l, const std::string& why) {
        std::lock_guard lock(mu);
        ended.push_back(l.device_id + ": " + why);
      },
      &clock);
  ASSERT_TRUE(leases.Start().ok());
  auto ok = [](const std::string&) { return absl::OkStatus(); };
  auto local = leases.Acquire({"b1"}, Who("alice", 1000), 60, 0, ok, nullptr);
  ASSERT_TRUE(local.ok()) << local.status();
  clock.Advance(5000);
  leases.Touch("b1", "uid:1000");
  auto touched = leases.Holder("b1");
  ASSERT_TRUE(touched.has_value());
  EXPECT_GT(touched->expires_us, local->expires_us) << "use no longer extends a local lease";
  EXPECT_FALSE(touched->held_elsewhere);
  leases.Touch("b1", "uid:1001");  // not the holder: nothing
  EXPECT_EQ(leases.Holder("b1")->expires_us, touched->expires_us);

  LeaseRecord lab = Who("lab stand-in", -1);
  lab.identity = "lab:lab-1";
  auto stand_in = leases.Acquire({"b2"}, lab, 60, 0, ok, nullptr);
  ASSERT_TRUE(stand_in.ok()) << stand_in.status();
  const int64_t until = clock.NowMicros() + 1500000;
  const std::string why = "lab lease lab-1 expired: its TTL ran out; etcd unreachable";
  ASSERT_TRUE(leases.SetExpiry(stand_in->lease_id, until, why).ok());
  leases.Touch("b2", "lab:lab-1");
  auto r = leases.Renew(stand_in->lease_id, "lab:lab-1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->expires_us, until);
  ASSERT_TRUE(leases.Holder("b2").has_value());
  EXPECT_EQ(leases.Holder("b2")->expires_us, until);
  EXPECT_TRUE(leases.Holder("b2")->held_elsewhere);
  // Kept busy, it still ends when it was set to, and not before.
  for (int i = 0; i < 14; ++i) {
    clock.Advance(100000);
    leases.Touch("b2", "lab:lab-1");
    leases.ExpireDue();
  }
  ASSERT_TRUE(leases.Holder("b2").has_value()) << "the stand-in ended before it was set to";
  clock.Advance(100000);
  leases.Touch("b2", "lab:lab-1");
  leases.ExpireDue();
  ASSERT_FALSE(leases.Holder("b2").has_value()) << "a busy stand-in outlived what was confirmed";
  EXPECT_GE(clock.NowMicros(), until);
  EXPECT_EQ(leases.SetExpiry(stand_in->lease_id, until, why).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(leases.Holder("b1").has_value());
  for (int i = 0; i < 250; ++i) {
    {
      std::lock_guard lock(mu);
      if (!ended.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::lock_guard lock(mu);
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0], "b2: " + why);
}

}  // namespace
}  // namespace fwai
