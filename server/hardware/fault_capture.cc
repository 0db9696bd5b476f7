#include "server/hardware/fault_capture.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "server/hardware/gdb_mi.h"

namespace fwai {

using json = nlohmann::json;

namespace {

// The core registers a capture keeps, in the GDB remote protocol's order of
// the m-profile description below (r0..pc are 0..15, xpsr is 25).
constexpr const char* kCoreRegisters[] = {"r0", "r1",  "r2",  "r3",  "r4", "r5", "r6", "r7",  "r8",
                                          "r9", "r10", "r11", "r12", "sp", "lr", "pc", "xpsr"};
constexpr const char* kSystemRegisters[] = {"msp",     "psp",       "primask",
                                            "basepri", "faultmask", "control"};

std::string Hex32(uint32_t v) { return absl::StrFormat("0x%08x", v); }

bool ParseHex32(const std::string& text, uint32_t* out) {
  std::string t = text.rfind("0x", 0) == 0 ? text.substr(2) : text;
  uint64_t v = 0;
  if (t.empty() || t.size() > 8 || !absl::SimpleHexAtoi(t, &v)) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// The target's registers by name, as gdb reads them.
absl::StatusOr<json> ReadRegisters(GdbSession& gdb) {
  auto names = gdb.Mi("-data-list-register-names");
  auto values = gdb.Mi("-data-list-register-values x");
  if (!names.ok()) return names.status();
  if (!values.ok()) return values.status();
  if (names->result_class != "done" || values->result_class != "done")
    return absl::InternalError(
        absl::StrCat("gdb could not read the registers: ", names->error, values->error));
  const json& n = names->results["register-names"];
  json out = json::object();
  for (const auto& v : values->results["register-values"]) {
    int number = -1;
    if (!absl::SimpleAtoi(MiString(v, "number"), &number) || !n.is_array() || number < 0 ||
        number >= static_cast<int>(n.size()) || !n[number].is_string())
      continue;
    uint32_t value = 0;
    if (ParseHex32(MiString(v, "value"), &value)) out[n[number].get<std::string>()] = Hex32(value);
  }
  for (const char* r : kCoreRegisters) {
    if (!out.contains(r)) return absl::InternalError(absl::StrCat("gdb did not give register ", r));
  }
  return out;
}

// `size` bytes at `address`, as gdb reads them from the target.
absl::StatusOr<std::string> ReadMemory(GdbSession& gdb, uint32_t address, uint32_t size) {
  auto r = gdb.Mi(absl::StrFormat("-data-read-memory-bytes 0x%08x %u", address, size), 30000);
  if (!r.ok()) return r.status();
  if (r->result_class != "done")
    return absl::InternalError(
        absl::StrCat("gdb could not read ", size, " bytes at ", Hex32(address), ": ", r->error));
  std::string bytes;
  for (const auto& block : r->results["memory"]) {
    std::string hex = MiString(block, "contents");
    bytes += absl::HexStringToBytes(hex);
  }
  if (bytes.size() != size)
    return absl::InternalError(
        absl::StrCat("gdb read ", bytes.size(), " of ", size, " bytes at ", Hex32(address)));
  return bytes;
}

json Region(const std::string& name, uint32_t address, const std::string& bytes) {
  return {{"name", name},
          {"address", Hex32(address)},
          {"size", bytes.size()},
          {"data", absl::Base64Escape(bytes)}};
}

}  // namespace

absl::StatusOr<json> CaptureFault(GdbSession& gdb, const CaptureSource& source) {
  if (source.ram_size == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("board ", source.board,
                     " has no ram_size in its configuration: fwai does not know "
                     "which RAM to capture"));
  }
  auto regs = ReadRegisters(gdb);
  if (!regs.ok()) return regs.status();
  auto ram = ReadMemory(gdb, source.ram_origin, source.ram_size);
  if (!ram.ok()) return ram.status();
  auto scb = ReadMemory(gdb, kScbAddress, kScbBytes);
  if (!scb.ok()) return scb.status();
  auto fault = DecodeFault(gdb);
  json capture = {
      {"format", kFaultCaptureFormat},
      {"version", kFaultCaptureVersion},
      {"board", source.board},
      {"target", source.target},
      {"machine", source.machine},
      {"time_us", NowMicros()},
      {"image", {{"path", source.image_path}, {"sha256", source.image_sha256}}},
      {"registers", *regs},
      {"regions", {Region("ram", source.ram_origin, *ram), Region("scb", kScbAddress, *scb)}},
      {"serial_before", source.serial_before},
      {"fault",
       fault.ok() ? fault->ToJson() : json{{"error", std::string(fault.status().message())}}}};
  return capture;
}

bool FaultCapture::Read(uint32_t address, uint32_t size, std::string* out) const {
  for (const auto& r : regions) {
    const uint64_t end = static_cast<uint64_t>(address) + size;
    if (address >= r.address && end <= r.address + static_cast<uint64_t>(r.bytes.size())) {
      *out = r.bytes.substr(address - r.address, size);
      return true;
    }
  }
  return false;
}

namespace {

absl::Status NotACapture(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, " is not a fault capture: ", why));
}

absl::StatusOr<CapturedRegion> ParseRegion(const json& r, const std::string& where, size_t i) {
  CapturedRegion out;
  const std::string at = absl::StrCat(where, ": regions[", i, "]");
  if (!r.is_object() || !r.contains("data") || !r["data"].is_string())
    return absl::InvalidArgumentError(absl::StrCat(at, ": no data"));
  out.name = r.value("name", "");
  if (!r.contains("address") || !r["address"].is_string() ||
      !ParseHex32(r["address"].get<std::string>(), &out.address))
    return absl::InvalidArgumentError(absl::StrCat(at, " (", out.name, "): no address"));
  if (!absl::Base64Unescape(r["data"].get<std::string>(), &out.bytes))
    return absl::InvalidArgumentError(
        absl::StrCat(at, " (", out.name, "): its data is not base64"));
  const size_t size = r.value("size", size_t{0});
  if (out.bytes.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        at, " (", out.name, ") is cut short: ", out.bytes.size(), " of ", size, " bytes"));
  }
  return out;
}

}  // namespace

absl::StatusOr<FaultCapture> ParseFaultCapture(std::string_view text, const std::string& where) {
  FaultCapture c;
  try {
    c.json = json::parse(text);
  } catch (const json::parse_error& e) {
    if (e.byte >= text.size())
      return NotACapture(where, absl::StrCat("it is cut short after ", text.size(), " bytes"));
    return NotACapture(where, absl::StrCat("it is not JSON (at byte ", e.byte, ")"));
  }
  if (!c.json.is_object() || c.json.value("format", "") != kFaultCaptureFormat) {
    return NotACapture(
        where, absl::StrCat("its format is '", c.json.is_object() ? c.json.value("format", "") : "",
                            "', not ", kFaultCaptureFormat));
  }
  if (c.json.value("version", 0) != kFaultCaptureVersion) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": version ", c.json.value("version", 0),
                                                   " of the capture format; this fwai reads ",
                                                   kFaultCaptureVersion));
  }
  c.board = c.json.value("board", "");
  const json image = c.json.value("image", json::object());
  c.image_sha256 = image.is_object() ? image.value("sha256", "") : "";
  c.image_path = image.is_object() ? image.value("path", "") : "";
  const json regs = c.json.value("registers", json::object());
  for (const char* name : kCoreRegisters) {
    uint32_t v = 0;
    if (!regs.is_object() || !regs.contains(name) || !regs[name].is_string() ||
        !ParseHex32(regs[name].get<std::string>(), &v))
      return absl::InvalidArgumentError(absl::StrCat(where, ": register ", name, " is missing"));
    c.registers.emplace_back(name, v);
  }
  const json regions = c.json.value("regions", json::array());
  if (!regions.is_array() || regions.empty())
    return absl::InvalidArgumentError(absl::StrCat(where, ": no memory regions"));
  for (size_t i = 0; i < regions.size(); ++i) {
    auto r = ParseRegion(regions[i], where, i);
    if (!r.ok()) return r.status();
    c.regions.push_back(*std::move(r));
  }
  return c;
}

// ---- The GDB remote protocol ----

namespace {

constexpr char kTargetXml[] =
    "<?xml version=\"1.0\"?><!DOCTYPE target SYSTEM \"gdb-target.dtd\"><target>"
    "<architecture>arm</architecture><feature name=\"org.gnu.gdb.arm.m-profile\">"
    "<reg name=\"r0\" bitsize=\"32\" regnum=\"0\"/><reg name=\"r1\" bitsize=\"32\"/>"
    "<reg name=\"r2\" bitsize=\"32\"/><reg name=\"r3\" bitsize=\"32\"/>"
    "<reg name=\"r4\" bitsize=\"32\"/><reg name=\"r5\" bitsize=\"32\"/>"
    "<reg name=\"r6\" bitsize=\"32\"/><reg name=\"r7\" bitsize=\"32\"/>"
    "<reg name=\"r8\" bitsize=\"32\"/><reg name=\"r9\" bitsize=\"32\"/>"
    "<reg name=\"r10\" bitsize=\"32\"/><reg name=\"r11\" bitsize=\"32\"/>"
    "<reg name=\"r12\" bitsize=\"32\"/><reg name=\"sp\" bitsize=\"32\" type=\"data_ptr\"/>"
    "<reg name=\"lr\" bitsize=\"32\"/><reg name=\"pc\" bitsize=\"32\" type=\"code_ptr\"/>"
    "<reg name=\"xpsr\" bitsize=\"32\" regnum=\"25\"/></feature></target>";

std::string LittleEndianHex(uint32_t v) {
  return absl::StrFormat("%02x%02x%02x%02x", v & 0xff, (v >> 8) & 0xff, (v >> 16) & 0xff,
                         (v >> 24) & 0xff);
}

// The answer to one packet; `*done` when the client is finished.
std::string Answer(const FaultCapture& c, const std::string& p, bool* no_ack, bool* done) {
  auto reg_by_number = [&c](uint32_t n) -> std::optional<uint32_t> {
    if (n <= 15) return c.registers[n].second;
    if (n == 25) return c.registers[16].second;
    return std::nullopt;
  };
  if (p.rfind("qSupported", 0) == 0) return "PacketSize=4000;qXfer:features:read+;QStartNoAckMode+";
  if (p == "QStartNoAckMode") {
    *no_ack = true;
    return "OK";
  }
  if (p.rfind("qXfer:features:read:target.xml:", 0) == 0) {
    std::vector<std::string> range = absl::StrSplit(p.substr(31), ',');
    uint64_t off = 0, len = 0;
    if (range.size() != 2 || !absl::SimpleHexAtoi(range[0], &off) ||
        !absl::SimpleHexAtoi(range[1], &len))
      return "E01";
    const std::string xml = kTargetXml;
    if (off >= xml.size()) return "l";
    const std::string part = xml.substr(off, len);
    return (off + part.size() >= xml.size() ? "l" : "m") + part;
  }
  if (p == "?" || p == "c" || p == "s" || p.rfind("vCont;", 0) == 0) return "S05";
  if (p == "g") {
    std::string out;
    for (const auto& [name, v] : c.registers) out += LittleEndianHex(v);
    return out;
  }
  if (p[0] == 'p') {
    uint64_t n = 0;
    auto v = absl::SimpleHexAtoi(p.substr(1), &n) ? reg_by_number(static_cast<uint32_t>(n))
                                                  : std::nullopt;
    return v ? LittleEndianHex(*v) : "E45";
  }
  if (p[0] == 'm') {
    std::vector<std::string> f = absl::StrSplit(p.substr(1), ',');
    uint64_t addr = 0, len = 0;
    std::string bytes;
    if (f.size() != 2 || !absl::SimpleHexAtoi(f[0], &addr) || !absl::SimpleHexAtoi(f[1], &len) ||
        addr > 0xffffffffull || len > 0x4000 ||
        !c.Read(static_cast<uint32_t>(addr), static_cast<uint32_t>(len), &bytes))
      return "E14";  // nothing captured there
    return absl::BytesToHexString(bytes);
  }
  if (p == "qAttached") return "1";
  if (p == "qC") return "QC1";
  if (p == "qfThreadInfo") return "m1";
  if (p == "qsThreadInfo") return "l";
  if (p[0] == 'H' || p.rfind("qSymbol", 0) == 0) return "OK";
  if (p[0] == 'T') return "OK";
  if (p[0] == 'D') {
    *done = true;
    return "OK";
  }
  if (p[0] == 'M' || p[0] == 'X' || p[0] == 'G' || p[0] == 'P') return "E01";  // read-only
  return "";                                                                   // not supported
}

bool WriteAll(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    ssize_t n = write(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

std::string Framed(const std::string& body) {
  unsigned sum = 0;
  for (unsigned char ch : body) sum += ch;
  return absl::StrFormat("$%s#%02x", body, sum & 0xff);
}

}  // namespace

int ServeCaptureOverRsp(const FaultCapture& capture, int in_fd, int out_fd) {
  std::string buf;
  bool no_ack = false, done = false;
  char chunk[4096];
  while (!done) {
    ssize_t n = read(in_fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    buf.append(chunk, static_cast<size_t>(n));
    while (!done) {
      size_t start = buf.find_first_of("$\x03");
      if (start == std::string::npos) {
        buf.clear();
        break;
      }
      if (buf[start] == '\x03') {  // an interrupt: the target is stopped already
        buf.erase(0, start + 1);
        if (!WriteAll(out_fd, Framed("S05"))) return 0;
        continue;
      }
      size_t hash = buf.find('#', start);
      if (hash == std::string::npos || hash + 2 >= buf.size()) break;  // wait for the rest
      std::string body = buf.substr(start + 1, hash - start - 1);
      buf.erase(0, hash + 3);
      if (!no_ack && !WriteAll(out_fd, "+")) return 0;
      if (body == "k") return 0;
      if (body.empty()) continue;
      if (!WriteAll(out_fd, Framed(Answer(capture, body, &no_ack, &done)))) return 0;
    }
  }
  return 0;
}

// ---- Decoding ----

absl::StatusOr<json> DecodeCapturedFault(GdbSession& gdb) {
  auto fault = DecodeFault(gdb);
  if (!fault.ok()) return fault.status();
  json frames = json::array();
  auto listed = gdb.Mi("-stack-list-frames 0 32");
  if (listed.ok() && listed->result_class == "done" && listed->results["stack"].is_array()) {
    for (const auto& f : listed->results["stack"]) {
      json frame = {{"level", MiString(f, "level")},
                    {"func", MiString(f, "func", "??")},
                    {"addr", MiString(f, "addr")}};
      if (f.contains("file")) {
        frame["file"] = MiString(f, "file");
        frame["line"] = MiString(f, "line");
      }
      json locals = json::array();
      if (frame["func"] != "<signal handler called>" &&
          gdb.Mi(absl::StrCat("-stack-select-frame ", MiString(f, "level"))).ok()) {
        auto vars = gdb.Mi("-stack-list-variables --all-values");
        if (vars.ok() && vars->result_class == "done" && vars->results["variables"].is_array()) {
          for (const auto& v : vars->results["variables"]) {
            locals.push_back({{"name", MiString(v, "name")},
                              {"value", MiString(v, "value", "<not saved>")},
                              {"arg", MiString(v, "arg") == "1"}});
          }
        }
      }
      frame["locals"] = locals;
      frames.push_back(frame);
    }
    (void)gdb.Mi("-stack-select-frame 0");
  }
  return json{{"fault", fault->ToJson()}, {"frames", frames}};
}

std::string FormatDecodedFault(const json& decoded, const FaultCapture& capture) {
  const json& f = decoded["fault"];
  std::string out = f.value("summary", "");
  if (f.value("in_fault", false)) {
    absl::StrAppend(&out, "\n  CFSR=", f.value("cfsr", ""), " HFSR=", f.value("hfsr", ""),
                    " MMFAR=", f.value("mmfar", ""), " BFAR=", f.value("bfar", ""));
    for (const auto& c : f.value("causes", json::array()))
      absl::StrAppend(&out, "\n  - ", c.get<std::string>());
  }
  out += "\nbacktrace:";
  for (const auto& fr : decoded["frames"]) {
    absl::StrAppend(&out, "\n  #", fr.value("level", ""), " ", fr.value("func", "??"));
    if (fr.contains("file"))
      absl::StrAppend(&out, " at ", fr.value("file", ""), ":", fr.value("line", ""));
    for (const auto& v : fr.value("locals", json::array())) {
      absl::StrAppend(&out, "\n      ", v.value("arg", false) ? "arg " : "", v.value("name", ""),
                      " = ", v.value("value", ""));
    }
  }
  const json serial = capture.json.value("serial_before", json::array());
  if (serial.is_array() && !serial.empty()) {
    out += "\nserial before the fault:";
    for (const auto& l : serial) absl::StrAppend(&out, "\n  ", l.value("text", ""));
  }
  absl::StrAppend(&out, "\ncaptured on ", capture.board, ", image sha256 ", capture.image_sha256);
  return out;
}

}  // namespace fwai
