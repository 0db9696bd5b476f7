// Register truth: the SVD device model on ST's published STM32F100 SVD and on
// small SVDs that use what ST's file does not (dim arrays, clusters, register
// derivedFrom, bitRange), and the checker on the example firmware with single
// errors injected one at a time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_replace.h"
#include "server/firmware/check_registers.h"
#include "server/firmware/register_check.h"
#include "server/firmware/svd_model.h"
#include "tests/bench/register_eval.h"

namespace fwai {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const SvdDevice& Stm32f100() {
  static const SvdDevice* device = [] {
    const std::string path = std::string(FWAI_SOURCE_DIR) + "/data/svd/STM32F100.svd";
    auto d = ParseSvdDevice(ReadAll(path), "STM32F100.svd");
    EXPECT_TRUE(d.ok()) << d.status();
    return new SvdDevice(std::move(*d));
  }();
  return *device;
}

std::string Blinky() {
  return ReadAll(std::string(FWAI_SOURCE_DIR) + "/examples/stm32vl-blinky/src/main.c");
}

std::vector<RegisterFinding> Check(const std::string& text, const std::string& file = "main.c") {
  RegisterChecker checker(Stm32f100());
  checker.Check(file, text);
  return checker.findings();
}

std::string Describe(const std::vector<RegisterFinding>& findings) {
  std::string out;
  for (const auto& f : findings) out += f.ToJson().dump() + "\n";
  return out;
}

// The 1-based line of the first occurrence of `needle`.
int LineOf(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
}

TEST(SvdModel, ReadsStsStm32f100Svd) {
  const SvdDevice& d = Stm32f100();
  EXPECT_EQ(d.name, "STM32F100");
  const SvdPeripheral* rcc = d.Peripheral("RCC");
  ASSERT_NE(rcc, nullptr);
  EXPECT_EQ(rcc->base, 0x40021000u);
  const SvdRegister* apb2enr = rcc->Register("APB2ENR");
  ASSERT_NE(apb2enr, nullptr);
  EXPECT_EQ(apb2enr->offset, 0x18u);
  EXPECT_EQ(apb2enr->size, 32u);
  const SvdField* usart1en = apb2enr->Field("USART1EN");
  ASSERT_NE(usart1en, nullptr);
  EXPECT_EQ(usart1en->bit_offset, 14u);
  EXPECT_EQ(usart1en->bit_width, 1u);
  EXPECT_EQ(usart1en->path, "RCC/APB2ENR/USART1EN");
  // GPIOC is derived from GPIOA: its registers, at its own base.
  const SvdPeripheral* gpioc = d.Peripheral("GPIOC");
  ASSERT_NE(gpioc, nullptr);
  EXPECT_EQ(gpioc->derived_from, "GPIOA");
  EXPECT_EQ(gpioc->base, 0x40011000u);
  ASSERT_NE(gpioc->Register("ODR"), nullptr);
  EXPECT_EQ(gpioc->Register("ODR")->offset, 0xCu);
  EXPECT_EQ(d.PeripheralAt(0x4001100C), gpioc);
  EXPECT_EQ(gpioc->RegisterAt(0xC), gpioc->Register("ODR"));
  EXPECT_EQ(d.PeripheralAt(0x20000000), nullptr);
}

TEST(SvdModel, NumbersAsSvdWritesThem) {
  EXPECT_EQ(ParseSvdNumber("0x40021000"), 0x40021000u);
  EXPECT_EQ(ParseSvdNumber("0X1f"), 0x1Fu);
  EXPECT_EQ(ParseSvdNumber("#1x0"), 0b100u);
  EXPECT_EQ(ParseSvdNumber("0b101"), 5u);
  EXPECT_EQ(ParseSvdNumber(" 32 "), 32u);
  EXPECT_EQ(ParseSvdNumber("twelve"), std::nullopt);
  EXPECT_EQ(ParseSvdNumber(""), std::nullopt);
}

constexpr const char* kArraysSvd = R"(<?xml version="1.0"?>
<device schemaVersion="1.3">
  <name>TESTCHIP</name>
  <width>32</width><size>32</size><access>read-write</access><resetValue>0</resetValue>
  <peripherals>
    <peripheral>
      <name>DMA1</name><baseAddress>0x40020000</baseAddress>
      <addressBlock><offset>0</offset><size>0x400</size><usage>registers</usage></addressBlock>
      <registers>
        <register><name>ISR</name><addressOffset>0x0</addressOffset><access>read-only</access>
          <fields><field><name>GIF1</name><bitRange>[0:0]</bitRange></field></fields></register>
        <cluster>
          <dim>3</dim><dimIncrement>0x14</dimIncrement><name>CH[%s]</name><addressOffset>0x8</addressOffset>
          <register><name>CCR</name><addressOffset>0x0</addressOffset>
            <fields>
              <field><name>EN</name><bitOffset>0</bitOffset><bitWidth>1</bitWidth></field>
              <field><name>PL</name><lsb>12</lsb><msb>13</msb></field>
            </fields></register>
          <register><name>CNDTR</name><addressOffset>0x4</addressOffset>
            <fields><field><name>NDT</name><bitRange>[15:0]</bitRange></field></fields></register>
        </cluster>
        <register><dim>2</dim><dimIncrement>4</dimIncrement><dimIndex>A,B</dimIndex>
          <name>SEL%s</name><addressOffset>0x100</addressOffset>
          <fields><field><name>V</name><bitRange>[3:0]</bitRange><access>write-only</access></field></fields></register>
        <register derivedFrom="ISR"><name>ISR2</name><addressOffset>0x108</addressOffset></register>
      </registers>
    </peripheral>
    <peripheral derivedFrom="DMA1"><name>DMA2</name><baseAddress>0x40020400</baseAddress></peripheral>
  </peripherals>
</device>)";

TEST(SvdModel, ResolvesClustersDimArraysAndDerivedRegisters) {
  auto d = ParseSvdDevice(kArraysSvd, "test.svd");
  ASSERT_TRUE(d.ok()) << d.status();
  const SvdPeripheral* dma2 = d->Peripheral("DMA2");
  ASSERT_NE(dma2, nullptr);
  const SvdRegister* ccr2 = dma2->Register("CH[2].CCR");
  ASSERT_NE(ccr2, nullptr) << "registers of DMA2";
  EXPECT_EQ(ccr2->offset, 0x8u + 2 * 0x14u);
  ASSERT_NE(ccr2->Field("PL"), nullptr);
  EXPECT_EQ(ccr2->Field("PL")->bit_offset, 12u);
  EXPECT_EQ(ccr2->Field("PL")->bit_width, 2u);
  const SvdRegister* selb = dma2->Register("SELB");
  ASSERT_NE(selb, nullptr);
  EXPECT_EQ(selb->offset, 0x104u);
  EXPECT_FALSE(selb->Field("V")->Readable());
  const SvdRegister* isr2 = dma2->Register("ISR2");
  ASSERT_NE(isr2, nullptr);
  EXPECT_EQ(isr2->offset, 0x108u);
  EXPECT_FALSE(isr2->Writable());
  ASSERT_NE(isr2->Field("GIF1"), nullptr);
  EXPECT_EQ(dma2->Register("CH[0].CNDTR")->Field("NDT")->Mask(), 0xFFFFu);
}

TEST(SvdModel, MalformedOrTruncatedSvdIsAClearErrorNamingTheSourceAndLine) {
  auto bad = ParseSvdDevice(
      "<?xml version=\"1.0\"?>\n<device>\n<name>X</name>\n<peripherals><peripheral>\n</device>",
      "board.svd");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("board.svd"), std::string::npos)
      << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("board.svd:5:"), std::string::npos)
      << bad.status();
  const std::string whole = ReadAll(std::string(FWAI_SOURCE_DIR) + "/data/svd/STM32F100.svd");
  auto truncated =
      ParseSvdDevice(std::string_view(whole).substr(0, whole.size() / 2), "STM32F100.svd");
  EXPECT_FALSE(truncated.ok());
  auto not_svd = ParseSvdDevice("<html><body>hello</body></html>", "page.svd");
  ASSERT_FALSE(not_svd.ok());
  EXPECT_NE(std::string(not_svd.status().message()).find("page.svd"), std::string::npos);
}

TEST(RegisterCheck, TheExampleFirmwareIsClean) {
  RegisterChecker checker(Stm32f100());
  checker.Check("src/main.c", Blinky());
  EXPECT_TRUE(checker.findings().empty()) << Describe(checker.findings());
  EXPECT_GE(checker.stats().accesses, 10);
  const auto json = checker.ToJson();
  EXPECT_EQ(json["checked"]["errors"], 0);
  EXPECT_EQ(json["checked"]["device"], "STM32F100");
}

struct Injected {
  const char* kind;  // the finding's kind expected at the changed line
  const char* from;
  const char* to;
};

// Each error a firmware engineer fears, one at a time, in the example firmware.
const Injected kInjected[] = {
    {"wrong-register", "#define RCC_APB2ENR REG(0x40021018)",
     "#define RCC_APB2ENR REG(0x40021014)"},
    {"misaligned", "#define USART1_CR1 REG(0x4001380C)", "#define USART1_CR1 REG(0x4001380D)"},
    {"unknown-register", "#define USART1_BRR REG(0x40013808)",
     "#define USART1_BRR REG(0x4001381C)"},
    {"field-position", "#define RCC_APB2ENR_USART1EN (1u << 14)",
     "#define RCC_APB2ENR_USART1EN (1u << 13)"},
    {"field-position", "#define USART_CR1_UE (1u << 13)", "#define USART_CR1_UE (1u << 12)"},
    {"field-width", "#define USART_CR1_TE (1u << 3)", "#define USART_CR1_TE (3u << 3)"},
    {"reserved-bits", "  GPIOC_BSRR = on ? LED_BLUE : (LED_BLUE << 16);",
     "  GPIOC_ODR |= (1u << 20);"},
    {"read-only", "  USART1_BRR = CPU_HZ / 115200u;", "  USART1_SR |= USART_SR_TXE;"},
};

TEST(RegisterCheck, EachInjectedErrorIsFoundAtItsLine) {
  const std::string clean = Blinky();
  for (const Injected& inj : kInjected) {
    SCOPED_TRACE(inj.to);
    ASSERT_NE(clean.find(inj.from), std::string::npos) << inj.from;
    const std::string text = absl::StrReplaceAll(clean, {{inj.from, inj.to}});
    const int line = LineOf(text, inj.to);
    const auto findings = Check(text);
    bool found = false;
    for (const auto& f : findings) {
      EXPECT_EQ(f.line, line) << "a finding on a correct line:\n" << Describe(findings);
      found = found || (f.line == line && f.kind == inj.kind && f.severity == "error");
    }
    EXPECT_TRUE(found) << Describe(findings);
  }
}

TEST(RegisterCheck, AFindingCarriesItsProof) {
  const std::string text = absl::StrReplaceAll(
      Blinky(),
      {{"#define RCC_APB2ENR_USART1EN (1u << 14)", "#define RCC_APB2ENR_USART1EN (1u << 13)"}});
  const auto findings = Check(text, "src/main.c");
  ASSERT_EQ(findings.size(), 1u) << Describe(findings);
  const auto& f = findings[0];
  EXPECT_EQ(f.file, "src/main.c");
  EXPECT_EQ(f.symbol, "RCC_APB2ENR_USART1EN");
  EXPECT_NE(f.code_says.find("0x00002000"), std::string::npos) << f.code_says;
  EXPECT_NE(f.svd_says.find("RCC.APB2ENR.USART1EN"), std::string::npos) << f.svd_says;
  EXPECT_NE(f.svd_says.find("14"), std::string::npos) << f.svd_says;
  EXPECT_EQ(f.source, "STM32F100.svd: RCC/APB2ENR/USART1EN");
  EXPECT_NE(f.fix.find("0x00004000"), std::string::npos) << f.fix;
}

TEST(RegisterCheck, CmsisStructAccessIsCheckedByName) {
  const std::string ok =
      "void f(void) {\n"
      "  RCC->APB2ENR |= (1u << 14);\n"
      "  USART1->CR1 = (1u << 13) | (1u << 3);\n"
      "}\n";
  EXPECT_TRUE(Check(ok).empty()) << Describe(Check(ok));
  const auto unknown = Check("void f(void) { USART1->CR4 = 1; }\n");
  ASSERT_EQ(unknown.size(), 1u) << Describe(unknown);
  EXPECT_EQ(unknown[0].kind, "unknown-register");
  EXPECT_NE(unknown[0].svd_says.find("CR1"), std::string::npos);
  const auto reserved = Check("void f(void) {\n  RCC->APB2ENR |= (1u << 1);\n}\n");
  ASSERT_EQ(reserved.size(), 1u) << Describe(reserved);
  EXPECT_EQ(reserved[0].kind, "reserved-bits");
  EXPECT_EQ(reserved[0].line, 2);
}

TEST(RegisterCheck, BasesPlusOffsetsAndWriteOnlyReadsAreChecked) {
  const auto ok = Check(
      "#define USART1_BASE 0x40013800u\n"
      "#define USART1_BRR (*(volatile unsigned *)(USART1_BASE + 0x08))\n"
      "void f(void) { USART1_BRR = 208; }\n");
  EXPECT_TRUE(ok.empty()) << Describe(ok);
  const auto wrong = Check(
      "#define USART1_BASE 0x40013800u\n"
      "#define USART1_BRR (*(volatile unsigned *)(USART1_BASE + 0x0C))\n");
  ASSERT_EQ(wrong.size(), 1u) << Describe(wrong);
  EXPECT_EQ(wrong[0].kind, "wrong-register");
  EXPECT_EQ(wrong[0].line, 2);
  const auto base = Check("#define USART1_BASE 0x40013C00u\n");
  ASSERT_EQ(base.size(), 1u) << Describe(base);
  EXPECT_EQ(base[0].kind, "wrong-register");
  EXPECT_NE(base[0].svd_says.find("0x40013800"), std::string::npos);
  // A test of a write-only field reads an undefined value: a warning.
  const auto read = Check(
      "#define TIM2_EGR (*(volatile unsigned *)0x40000014)\n"
      "int f(void) { return TIM2_EGR & 1u; }\n");
  ASSERT_EQ(read.size(), 1u) << Describe(read);
  EXPECT_EQ(read[0].kind, "write-only");
  EXPECT_EQ(read[0].severity, "warning");
}

TEST(RegisterCheck, AMacroItCannotResolveIsNamedNotGuessed) {
  const auto findings = Check(
      "#define REG(a) (*(volatile unsigned *)(a))\n"
      "#define RCC_APB2ENR REG(0x40021018)\n"
      "void f(void) { RCC_APB2ENR |= SOME_VENDOR_BIT; }\n");
  ASSERT_EQ(findings.size(), 1u) << Describe(findings);
  EXPECT_EQ(findings[0].kind, "unresolved");
  EXPECT_EQ(findings[0].severity, "warning");
  EXPECT_EQ(findings[0].symbol, "SOME_VENDOR_BIT");
  EXPECT_EQ(findings[0].line, 3);
}

namespace fs = std::filesystem;

// A copy of an example project in a fresh directory.
class RegisterCheckProject : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("fwai-registers-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void CopyExample(const std::string& name) {
    fs::copy(std::string(FWAI_SOURCE_DIR) + "/examples/" + name, root_,
             fs::copy_options::recursive);
  }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel, std::ios::binary) << text;
  }
  absl::StatusOr<nlohmann::json> Run(RegisterCheckRequest req) {
    req.project_root = root_.string();
    return CheckRegisters(catalog_, LocalFileAccess(), req);
  }
  static std::string Kinds(const nlohmann::json& report) {
    std::string out;
    for (const auto& f : report["findings"])
      out += f["file"].get<std::string>() + ":" + std::to_string(f["line"].get<int>()) + " " +
             f["kind"].get<std::string>() + "\n";
    return out;
  }

  SvdCatalog catalog_{{std::string(FWAI_SOURCE_DIR) + "/data/svd"}};
  fs::path root_;
};

TEST_F(RegisterCheckProject, ShippedSvdsAreFoundByPart) {
  auto stm = catalog_.FindForPart("stm32f100rb");
  ASSERT_TRUE(stm.ok()) << stm.status();
  EXPECT_EQ(fs::path(*stm).filename(), "STM32F100.svd");
  auto lm = catalog_.FindForPart("LM3S6965");
  ASSERT_TRUE(lm.ok()) << lm.status();
  EXPECT_EQ(fs::path(*lm).filename(), "LM3S6965.svd");
  auto none = catalog_.FindForPart("nrf52840");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("STM32F100"), std::string::npos)
      << none.status();
}

TEST_F(RegisterCheckProject, BothExampleFirmwaresComeOutClean) {
  CopyExample("stm32vl-blinky");
  RegisterCheckRequest req;
  req.project_target = "stm32f100rb";
  auto r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["findings"].size(), 0u) << Kinds(*r);
  EXPECT_EQ((*r)["checked"]["files"], 4);  // src/main.c, src/startup.c, src/rtt.c, src/rtt.h
  EXPECT_EQ((*r)["checked"]["device"], "STM32F100");

  fs::remove_all(root_);
  fs::create_directories(root_);
  CopyExample("lm3s6965-hello");
  req.project_target = "lm3s6965";
  r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["findings"].size(), 0u) << Kinds(*r);
  EXPECT_EQ((*r)["checked"]["device"], "LM3S6965");
  EXPECT_GE((*r)["checked"]["accesses"].get<int>(), 2);
}

TEST_F(RegisterCheckProject, TheLm3s6965SvdCatchesAWrongUartRegister) {
  CopyExample("lm3s6965-hello");
  std::string text = ReadAll((root_ / "main.c").string());
  text = absl::StrReplaceAll(text, {{"0x4000C018u", "0x4000C024u"}});
  Write("main.c", text);
  RegisterCheckRequest req;
  req.target = "lm3s6965";
  auto r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)["findings"].size(), 1u) << Kinds(*r);
  EXPECT_EQ((*r)["findings"][0]["kind"], "wrong-register");
  EXPECT_EQ((*r)["findings"][0]["line"], 10);
  EXPECT_NE((*r)["findings"][0]["svd_says"].get<std::string>().find("0x4000C018"),
            std::string::npos);
}

TEST_F(RegisterCheckProject, EnumeratedValuesAreCheckedInMacrosAndWholeWrites) {
  Write("uart.c",
        "#define HWREG(x) (*((volatile unsigned *)(x)))\n"
        "#define TIMER0_TAMR_R HWREG(0x40030004)\n"
        "#define UART_LCRH_WLEN_8 0x00000060\n"
        "#define UART_LCRH_WLEN_7 0x00000060\n"
        "void f(void) {\n"
        "  TIMER0_TAMR_R = 2;\n"
        "  TIMER0_TAMR_R = 0;\n"
        "}\n");
  RegisterCheckRequest req;
  req.target = "lm3s6965";
  auto r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Kinds(*r), "uart.c:4 enum-value\nuart.c:7 enum-value\n");
  EXPECT_NE((*r)["findings"][0]["svd_says"].get<std::string>().find("UART_LCRH_WLEN_7 is 2"),
            std::string::npos)
      << r->dump(1);
  EXPECT_NE((*r)["findings"][1]["svd_says"].get<std::string>().find("TIMER_TAMR_TAMR_PERIOD = 2"),
            std::string::npos)
      << r->dump(1);
}

TEST_F(RegisterCheckProject, HeadersServeTheSourcesAfterThemAndBuildOutputIsLeftOut) {
  Write("src/main.c", "#include \"regs.h\"\nvoid f(void) {\n  RCC_APB2ENR |= (1u << 1);\n}\n");
  Write("src/regs.h",
        "#define REG(a) (*(volatile unsigned *)(a))\n#define RCC_APB2ENR REG(0x40021018)\n");
  Write("build/gen.c", "void g(void) { *(volatile unsigned *)0x40021019 = 1; }\n");
  RegisterCheckRequest req;
  req.target = "stm32f100";
  auto r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["checked"]["files"], 2);
  ASSERT_EQ((*r)["findings"].size(), 1u) << Kinds(*r);
  EXPECT_EQ((*r)["findings"][0]["file"], "src/main.c");
  EXPECT_EQ((*r)["findings"][0]["line"], 3);
  EXPECT_EQ((*r)["findings"][0]["kind"], "reserved-bits");
  // Only the lines an edit changed.
  req.only_lines = {{"src/main.c", {2}}};
  r = Run(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["findings"].size(), 0u);
  EXPECT_EQ((*r)["checked"]["errors"], 0);
}

TEST_F(RegisterCheckProject, BadInputIsNamedAndTheRestIsStillChecked) {
  CopyExample("stm32vl-blinky");
  Write("src/blob.c", std::string("\x7f"
                                  "ELF\0\0\1",
                                  7));
  Write("src/latin1.c", "// caf\xe9\nint x;\n");
  RegisterCheckRequest req;
  req.target = "stm32f100rb";
  req.paths = {"src", "../outside.c", "/etc/passwd", "src/missing.c"};
  auto r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["checked"]["files"], 4) << r->dump(1);  // the example's four sources
  std::map<std::string, std::string> why;
  for (const auto& s : (*r)["skipped"]) why[s["path"]] = s["why"];
  EXPECT_NE(why["src/blob.c"].find("binary"), std::string::npos) << r->dump(1);
  EXPECT_NE(why["src/latin1.c"].find("not UTF-8 (byte 6"), std::string::npos) << r->dump(1);
  EXPECT_NE(why["../outside.c"].find("outside the project"), std::string::npos) << r->dump(1);
  EXPECT_NE(why["/etc/passwd"].find("outside the project"), std::string::npos) << r->dump(1);
  EXPECT_NE(why["src/missing.c"].find("no such file"), std::string::npos) << r->dump(1);
}

TEST_F(RegisterCheckProject, AnSvdThatIsMalformedTruncatedOrHugeIsAClearError) {
  CopyExample("stm32vl-blinky");
  const std::string whole = ReadAll(std::string(FWAI_SOURCE_DIR) + "/data/svd/STM32F100.svd");
  Write("truncated.svd", whole.substr(0, whole.size() / 3));
  RegisterCheckRequest req;
  req.svd = "truncated.svd";
  auto r = Run(req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("truncated.svd:"), std::string::npos)
      << r.status();
  // 10 MB: a real SVD padded with peripherals nobody uses still parses.
  std::string huge = whole;
  const size_t end = huge.rfind("</peripherals>");
  ASSERT_NE(end, std::string::npos);
  std::string pad;
  for (int i = 0; pad.size() < 10u << 20; ++i) {
    pad += "<peripheral><name>PAD" + std::to_string(i) + "</name><baseAddress>" +
           std::to_string(0x60000000u + i * 0x400u) +
           "</baseAddress><registers><register><name>R</name><addressOffset>0</addressOffset>"
           "<fields><field><name>F</name><bitOffset>0</bitOffset><bitWidth>8</bitWidth></field></"
           "fields>"
           "</register></registers></peripheral>\n";
  }
  huge.insert(end, pad);
  Write("huge.svd", huge);
  req.svd = "huge.svd";
  r = Run(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)["findings"].size(), 0u) << Kinds(*r);
  // No device at all.
  req.svd.clear();
  auto none = Run(req);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(std::string(none.status().message()).find("--target PART"), std::string::npos)
      << none.status();
}

// The benchmark's corpus (docs/registers.md): correct code for several
// peripherals of both parts is clean, and each single-line error made in it
// is found at its line, with no finding anywhere else.
TEST(RegisterBenchCorpus, EveryKindIsFoundAndCorrectCodeIsClean) {
  const auto r =
      testing::EvaluateRegisterChecks(std::string(FWAI_SOURCE_DIR) + "/tests/bench/registers",
                                      std::string(FWAI_SOURCE_DIR) + "/data/svd");
  EXPECT_EQ(r.clean_files, 5);
  EXPECT_EQ(r.clean_findings, 0);
  for (const char* kind : {"wrong-register", "misaligned", "unknown-register", "field-position",
                           "field-width", "reserved-bits", "read-only"}) {
    ASSERT_TRUE(r.kinds.count(kind)) << kind;
    const auto& k = r.kinds.at(kind);
    EXPECT_GE(k.injected, 10) << kind;
    EXPECT_GE(k.found * 100, k.injected * 95) << kind;
    EXPECT_EQ(k.false_findings, 0) << kind;
  }
  for (const auto& m : r.misses) ADD_FAILURE() << "missed: " << m;
}

TEST(RegisterFindingsSarif, OneResultPerFindingAtItsLine) {
  RegisterChecker checker(Stm32f100());
  checker.Check("src/main.c",
                "#define REG(a) (*(volatile unsigned *)(a))\n#define USART1_CR1 REG(0x4001380D)\n");
  const auto sarif = RegisterFindingsSarif(checker.ToJson());
  EXPECT_EQ(sarif["version"], "2.1.0");
  ASSERT_EQ(sarif["runs"][0]["results"].size(), 1u) << sarif.dump(1);
  const auto& res = sarif["runs"][0]["results"][0];
  EXPECT_EQ(res["ruleId"], "misaligned");
  EXPECT_EQ(res["level"], "error");
  EXPECT_EQ(res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], "src/main.c");
  EXPECT_EQ(res["locations"][0]["physicalLocation"]["region"]["startLine"], 2);
}

}  // namespace
}  // namespace fwai
