// Fault captures read back whole or refused, and served to gdb as a halted
// target over the GDB remote protocol.

#include "server/hardware/fault_capture.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace fwai {
namespace {

using json = nlohmann::json;

json Capture() {
  json regs = json::object();
  const char* names[] = {"r0", "r1",  "r2",  "r3",  "r4", "r5", "r6", "r7",  "r8",
                         "r9", "r10", "r11", "r12", "sp", "lr", "pc", "xpsr"};
  for (int i = 0; i < 17; ++i) regs[names[i]] = absl::StrFormat("0x%08x", 0x11110000u + i);
  regs["pc"] = "0x080003ac";
  regs["xpsr"] = "0x21000003";
  return {{"format", "fwai-fault-capture"},
          {"version", 1},
          {"board", "sim-1"},
          {"image", {{"path", "/x.elf"}, {"sha256", std::string(64, 'a')}}},
          {"registers", regs},
          {"regions",
           {{{"name", "ram"},
             {"address", "0x20000000"},
             {"size", 8},
             {"data", absl::Base64Escape(std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8))}}}}};
}

TEST(FaultCaptureTest, AFileCutShortOrOfAnotherKindIsRefusedSayingSo) {
  const std::string text = Capture().dump();
  ASSERT_TRUE(ParseFaultCapture(text, "f.fwcap").ok());
  auto cut = ParseFaultCapture(text.substr(0, text.size() - 10), "f.fwcap");
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().message(), "f.fwcap is not a fault capture: it is cut short after " +
                                        std::to_string(text.size() - 10) + " bytes");
  auto elf = ParseFaultCapture(
      "\x7f"
      "ELF\x01\x01",
      "a.elf");
  ASSERT_FALSE(elf.ok());
  EXPECT_NE(elf.status().message().find("a.elf is not a fault capture: it is not JSON"),
            std::string::npos);
  json other = Capture();
  other["format"] = "core";
  EXPECT_NE(ParseFaultCapture(other.dump(), "c").status().message().find("its format is 'core'"),
            std::string::npos);
  json later = Capture();
  later["version"] = 2;
  EXPECT_NE(ParseFaultCapture(later.dump(), "c").status().message().find("version 2"),
            std::string::npos);
  json short_region = Capture();
  short_region["regions"][0]["size"] = 4096;
  EXPECT_NE(ParseFaultCapture(short_region.dump(), "c")
                .status()
                .message()
                .find("regions[0] (ram) is cut short: 8 of 4096 bytes"),
            std::string::npos);
  json no_pc = Capture();
  no_pc["registers"].erase("pc");
  EXPECT_NE(ParseFaultCapture(no_pc.dump(), "c").status().message().find("register pc"),
            std::string::npos);
}

// One packet to the server and its answer.
class Rsp {
 public:
  explicit Rsp(const FaultCapture& c) {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
    server_ = std::thread([this, &c] { ServeCaptureOverRsp(c, fds_[1], fds_[1]); });
  }
  ~Rsp() {
    shutdown(fds_[0], SHUT_RDWR);
    server_.join();
    close(fds_[0]);
    close(fds_[1]);
  }
  std::string Ask(const std::string& body) {
    unsigned sum = 0;
    for (unsigned char ch : body) sum += ch;
    const std::string pkt = absl::StrFormat("$%s#%02x", body, sum & 0xff);
    EXPECT_EQ(write(fds_[0], pkt.data(), pkt.size()), static_cast<ssize_t>(pkt.size()));
    std::string got;
    char c;
    while (read(fds_[0], &c, 1) == 1) {
      got += c;
      const auto hash = got.find('#');
      if (hash != std::string::npos && got.size() == hash + 3) break;
    }
    const auto dollar = got.find('$');
    EXPECT_NE(dollar, std::string::npos) << got;
    EXPECT_EQ(got.substr(0, dollar), ack_ ? "+" : "") << got;
    const std::string answer = got.substr(dollar + 1, got.find('#') - dollar - 1);
    unsigned back = 0;
    for (unsigned char ch : answer) back += ch;
    EXPECT_EQ(got.substr(got.find('#') + 1), absl::StrFormat("%02x", back & 0xff));
    if (body == "QStartNoAckMode") ack_ = false;
    return answer;
  }

 private:
  int fds_[2] = {-1, -1};
  bool ack_ = true;
  std::thread server_;
};

TEST(FaultCaptureTest, ItIsServedAsAHaltedTargetThatReadsOnlyWhatWasCaptured) {
  auto c = ParseFaultCapture(Capture().dump(), "c");
  ASSERT_TRUE(c.ok()) << c.status();
  Rsp rsp(*c);
  EXPECT_NE(rsp.Ask("qSupported:multiprocess+").find("qXfer:features:read+"), std::string::npos);
  const std::string xml = rsp.Ask("qXfer:features:read:target.xml:0,fff");
  EXPECT_EQ(xml[0], 'l');
  EXPECT_NE(xml.find("org.gnu.gdb.arm.m-profile"), std::string::npos);
  EXPECT_EQ(rsp.Ask("qXfer:features:read:target.xml:10,5")[0], 'm');
  EXPECT_EQ(rsp.Ask("?"), "S05");
  const std::string g = rsp.Ask("g");
  ASSERT_EQ(g.size(), 17u * 8);
  EXPECT_EQ(g.substr(0, 8), "00001111");       // r0 = 0x11110000, little-endian
  EXPECT_EQ(g.substr(15 * 8, 8), "ac030008");  // pc
  EXPECT_EQ(g.substr(16 * 8, 8), "03000021");  // xpsr
  EXPECT_EQ(rsp.Ask("p19"), "03000021");       // xpsr is register 25
  EXPECT_EQ(rsp.Ask("p1a"), "E45");
  EXPECT_EQ(rsp.Ask("m20000002,4"), "03040506");
  EXPECT_EQ(rsp.Ask("m20000006,4"), "E14");  // runs past what was captured
  EXPECT_EQ(rsp.Ask("m8000000,4"), "E14");
  EXPECT_EQ(rsp.Ask("M20000000,1:ff"), "E01");  // it is read-only
  EXPECT_EQ(rsp.Ask("m20000000,1"), "01");
  EXPECT_EQ(rsp.Ask("QStartNoAckMode"), "OK");
  EXPECT_EQ(rsp.Ask("qAttached"), "1");
  EXPECT_EQ(rsp.Ask("vMustReplyEmpty"), "");
  EXPECT_EQ(rsp.Ask("D"), "OK");
}

}  // namespace
}  // namespace fwai
