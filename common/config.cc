#include "common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_reader.h"
#include "common/status_macros.h"
#include "common/yaml.h"

namespace fwai {
namespace {

// Optional number fields of one mapping: `key` is checked as `prefix.key`
// and must lie within lo..hi.
struct NumberField {
  const char* key;
  double lo, hi;
  double* out;
};

absl::Status Numbers(ConfigReader& r, const YAML::Node& n, const std::string& prefix,
                     std::initializer_list<NumberField> fields) {
  for (const auto& f : fields) {
    if (n[f.key]) CFG_TRY(r.Double(n[f.key], prefix + "." + f.key, f.lo, f.hi, *f.out));
  }
  return absl::OkStatus();
}

absl::Status ParseTelemetry(ConfigReader& r, const YAML::Node& n, TelemetryConfig& t) {
  CFG_TRY(r.CheckKeys(n, "telemetry",
                      {"endpoint", "protocol", "service_name", "ca_file", "headers",
                       "metrics_interval_ms", "span_batch_delay_ms", "capture_content"}));
  t.enabled = true;
  if (!n["endpoint"])
    return r.Error(n, "telemetry.endpoint", "missing (e.g. http://localhost:4317)");
  CFG_TRY(r.String(n["endpoint"], "telemetry.endpoint", t.endpoint));
  if (!absl::StartsWith(t.endpoint, "http://") && !absl::StartsWith(t.endpoint, "https://")) {
    return r.Error(
        n["endpoint"], "telemetry.endpoint",
        absl::StrCat("expected http://HOST:PORT or https://HOST:PORT, got '", t.endpoint, "'"));
  }
  if (n["protocol"]) {
    CFG_TRY(r.String(n["protocol"], "telemetry.protocol", t.protocol));
    if (t.protocol != "grpc") {
      return r.Error(n["protocol"], "telemetry.protocol",
                     absl::StrCat("expected grpc (OTLP over gRPC), got '", t.protocol, "'"));
    }
  }
  if (n["service_name"])
    CFG_TRY(r.String(n["service_name"], "telemetry.service_name", t.service_name));
  if (n["ca_file"]) CFG_TRY(r.String(n["ca_file"], "telemetry.ca_file", t.ca_file));
  if (auto h = n["headers"]) {
    if (!h.IsMap())
      return r.Error(h, "telemetry.headers",
                     "expected a mapping of header name to {env: VAR} or {file: PATH}");
    for (const auto& kv : h) {
      TelemetryHeader th;
      th.name = kv.first.as<std::string>();
      const std::string f = "telemetry.headers." + th.name;
      const int line = kv.first.Mark().line >= 0 ? kv.first.Mark().line + 1 : 0;
      th.where = absl::StrCat("config ", r.source(), ":", line, ": ", f);
      if (!kv.second.IsMap()) {
        return r.Error(kv.second, f,
                       "expected {env: VARIABLE} or {file: PATH}: header values are never written "
                       "in the config");
      }
      CFG_TRY(r.CheckKeys(kv.second, f, {"env", "file"}));
      if (kv.second["env"]) CFG_TRY(r.String(kv.second["env"], f + ".env", th.env));
      if (kv.second["file"]) CFG_TRY(r.String(kv.second["file"], f + ".file", th.file));
      if (th.env.empty() == th.file.empty())
        return r.Error(kv.second, f, "expected exactly one of env or file");
      t.headers.push_back(std::move(th));
    }
  }
  if (n["metrics_interval_ms"])
    CFG_TRY(r.Int(n["metrics_interval_ms"], "telemetry.metrics_interval_ms", 100, 3600000,
                  t.metrics_interval_ms));
  if (n["span_batch_delay_ms"])
    CFG_TRY(r.Int(n["span_batch_delay_ms"], "telemetry.span_batch_delay_ms", 10, 600000,
                  t.span_batch_delay_ms));
  if (auto c = n["capture_content"]) {
    if (!c.IsScalar() || (c.Scalar() != "true" && c.Scalar() != "false")) {
      return r.Error(c, "telemetry.capture_content", "expected true or false");
    }
    t.capture_content = c.Scalar() == "true";
  }
  return absl::OkStatus();
}

absl::Status ParseProvider(ConfigReader& r, const std::string& name, const YAML::Node& n,
                           ProviderConfig& p) {
  const std::string f = "providers." + name;
  CFG_TRY(r.CheckKeys(n, f,
                      {"kind", "api_key", "api_key_env", "base_url", "model", "max_tokens",
                       "temperature", "context_window"}));
  p.name = name;
  if (n["kind"]) {
    CFG_TRY(r.String(n["kind"], f + ".kind", p.kind));
  } else if (name == "anthropic" || name == "openai" || name == "gemini" || name == "ollama") {
    p.kind = name;
  } else {
    return r.Error(n, f + ".kind", "missing; expected anthropic, openai, gemini or ollama");
  }
  if (p.kind != "anthropic" && p.kind != "openai" && p.kind != "gemini" && p.kind != "ollama") {
    return r.Error(
        n["kind"], f + ".kind",
        absl::StrCat("expected anthropic, openai, gemini or ollama, got '", p.kind, "'"));
  }
  if (n["api_key"]) CFG_TRY(r.String(n["api_key"], f + ".api_key", p.api_key));
  if (n["api_key_env"]) {
    CFG_TRY(r.String(n["api_key_env"], f + ".api_key_env", p.api_key_env));
  } else {
    p.api_key_env = p.kind == "anthropic" ? "ANTHROPIC_API_KEY"
                    : p.kind == "gemini"  ? "GEMINI_API_KEY"
                    : p.kind == "ollama"  ? ""
                                          : "OPENAI_API_KEY";
  }
  if (n["base_url"]) {
    CFG_TRY(r.String(n["base_url"], f + ".base_url", p.base_url));
    if (!absl::StartsWith(p.base_url, "http://") && !absl::StartsWith(p.base_url, "https://")) {
      return r.Error(n["base_url"], f + ".base_url",
                     absl::StrCat("expected an http:// or https:// URL, got '", p.base_url, "'"));
    }
  }
  if (n["model"]) CFG_TRY(r.String(n["model"], f + ".model", p.model));
  if (p.model.empty()) {
    p.model = p.kind == "anthropic" ? "claude-sonnet-4-5"
              : p.kind == "gemini"  ? "gemini-2.5-flash"
              : p.kind == "ollama"  ? "llama3.1"
                                    : "gpt-4o";
  }
  if (n["max_tokens"]) CFG_TRY(r.Int(n["max_tokens"], f + ".max_tokens", 1, 1000000, p.max_tokens));
  if (n["temperature"]) {
    CFG_TRY(r.Double(n["temperature"], f + ".temperature", 0, 2, p.temperature));
  }
  if (n["context_window"]) {
    CFG_TRY(r.Int(n["context_window"], f + ".context_window", 1024, 100000000, p.context_window));
  }
  return absl::OkStatus();
}

// Sizes like 131072, 0x20000, 128K or 1M.
bool ParseSize(const std::string& s, uint64_t& out) {
  if (s.empty()) return false;
  std::string num = s;
  uint64_t mult = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(num.back())));
  if (last == 'K' || last == 'M') {
    mult = last == 'K' ? 1024 : 1024 * 1024;
    num.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(num.c_str(), &end, 0);
  if (num.empty() || *end != '\0' || errno != 0) return false;
  out = v * mult;
  return true;
}

// A board's serial port settings (hardware.boards[i].serial, baud ...).
absl::Status ParseBoardSerial(ConfigReader& r, const YAML::Node& n, const std::string& f,
                              BoardConfig& b) {
  if (n["serial"]) CFG_TRY(r.String(n["serial"], f + ".serial", b.serial));
  if (n["baud"]) CFG_TRY(r.Int(n["baud"], f + ".baud", 50, 20000000, b.baud));
  if (n["data_bits"]) CFG_TRY(r.Int(n["data_bits"], f + ".data_bits", 5, 8, b.data_bits));
  if (n["parity"]) CFG_TRY(r.String(n["parity"], f + ".parity", b.parity));
  if (b.parity != "none" && b.parity != "odd" && b.parity != "even") {
    return r.Error(n["parity"], f + ".parity", "expected none, odd or even");
  }
  if (n["stop_bits"]) CFG_TRY(r.String(n["stop_bits"], f + ".stop_bits", b.stop_bits));
  if (b.stop_bits != "1" && b.stop_bits != "1.5" && b.stop_bits != "2") {
    return r.Error(n["stop_bits"], f + ".stop_bits", "expected 1, 1.5 or 2");
  }
  if (n["flow_control"]) {
    CFG_TRY(r.String(n["flow_control"], f + ".flow_control", b.flow_control));
  }
  if (b.flow_control != "none" && b.flow_control != "software" && b.flow_control != "hardware") {
    return r.Error(n["flow_control"], f + ".flow_control", "expected none, software or hardware");
  }
  if (n["line_ending"]) CFG_TRY(r.String(n["line_ending"], f + ".line_ending", b.line_ending));
  if (b.line_ending == "lf" || b.line_ending == "LF") b.line_ending = "\n";
  if (b.line_ending == "cr" || b.line_ending == "CR") b.line_ending = "\r";
  if (b.line_ending == "crlf" || b.line_ending == "CRLF") b.line_ending = "\r\n";
  if (b.line_ending != "\n" && b.line_ending != "\r" && b.line_ending != "\r\n" &&
      b.line_ending != "") {
    return r.Error(n["line_ending"], f + ".line_ending",
                   "expected lf, cr, crlf or an empty string");
  }
  if (n["encoding"]) CFG_TRY(r.String(n["encoding"], f + ".encoding", b.encoding));
  if (b.encoding != "ascii" && b.encoding != "utf-8" && b.encoding != "hex") {
    return r.Error(n["encoding"], f + ".encoding", "expected ascii, utf-8 or hex");
  }
  return absl::OkStatus();
}

// `rtt: off`, or `rtt: {poll_ms: N}` (1..1000): how a board's RTT is read;
// `semihosting: true` (simulated boards).
absl::Status ParseBoardTrace(ConfigReader& r, const YAML::Node& n, const std::string& f,
                             BoardConfig& b) {
  if (const YAML::Node& s = n["semihosting"]) {
    if (!s.IsScalar() || (s.Scalar() != "true" && s.Scalar() != "false")) {
      return r.Error(s, f + ".semihosting", "expected true or false");
    }
    b.semihosting = s.Scalar() == "true";
  }
  const YAML::Node& v = n["rtt"];
  if (!v) return absl::OkStatus();
  if (v.IsScalar() && (v.Scalar() == "off" || v.Scalar() == "false")) {
    b.rtt_poll_ms = 0;
    return absl::OkStatus();
  }
  if (!v.IsMap()) return r.Error(v, f + ".rtt", "expected off or {poll_ms: N}");
  CFG_TRY(r.CheckKeys(v, f + ".rtt", {"poll_ms"}));
  if (v["poll_ms"]) CFG_TRY(r.Int(v["poll_ms"], f + ".rtt.poll_ms", 1, 1000, b.rtt_poll_ms));
  return absl::OkStatus();
}

absl::Status ParseBoard(ConfigReader& r, const YAML::Node& n, size_t index, HardwareConfig& hw,
                        BoardConfig& b) {
  const std::string f = absl::StrCat("hardware.boards[", index, "]");
  CFG_TRY(r.CheckKeys(n, f,
                      {"id",
                       "kind",
                       "tags",
                       "maintenance",
                       "serial",
                       "baud",
                       "data_bits",
                       "parity",
                       "stop_bits",
                       "flow_control",
                       "line_ending",
                       "encoding",
                       "startup_commands",
                       "log_file",
                       "probe",
                       "openocd_config",
                       "flash_command",
                       "power_on",
                       "power_off",
                       "self_test",
                       "target",
                       "flash_origin",
                       "flash_size",
                       "ram_origin",
                       "ram_size",
                       "machine",
                       "image",
                       "qemu",
                       "gdb",
                       "boot_pattern",
                       "boot_timeout_s",
                       "rtt",
                       "semihosting",
                       "ota_slot_size",
                       "ota_upload",
                       "ota_reset",
                       "ota_confirm"}));
  if (!n["id"]) return r.Error(n, f + ".id", "missing; every board needs an id");
  CFG_TRY(r.String(n["id"], f + ".id", b.id));
  for (const auto& other : hw.boards) {
    if (other.id == b.id)
      return r.Error(n["id"], f + ".id", "'" + b.id + "' is already used by another board");
  }
  if (n["kind"]) CFG_TRY(r.String(n["kind"], f + ".kind", b.kind));
  if (b.kind != "physical" && b.kind != "simulated") {
    return r.Error(n["kind"], f + ".kind", "expected physical or simulated, got '" + b.kind + "'");
  }
  auto strings = [&](const char* key, std::vector<std::string>& out) -> absl::Status {
    const auto& v = n[key];
    if (!v) return absl::OkStatus();
    if (v.IsScalar()) {
      out.push_back(v.Scalar());
      return absl::OkStatus();
    }
    if (!v.IsSequence()) return r.Error(v, f + "." + key, "expected a list of strings");
    for (const auto& item : v) {
      std::string s;
      CFG_TRY(r.String(item, f + "." + key + "[]", s));
      out.push_back(s);
    }
    return absl::OkStatus();
  };
  auto str = [&](const char* key, std::string& out) -> absl::Status {
    if (n[key]) return r.String(n[key], f + "." + key, out);
    return absl::OkStatus();
  };
  auto size = [&](const char* key, uint64_t& out) -> absl::Status {
    if (!n[key]) return absl::OkStatus();
    if (!n[key].IsScalar() || !ParseSize(n[key].Scalar(), out)) {
      return r.Error(n[key], f + "." + key, "expected a size or address (131072, 0x20000, 128K)");
    }
    return absl::OkStatus();
  };
  CFG_TRY(strings("tags", b.tags));
  if (n["maintenance"]) {
    if (!n["maintenance"].IsScalar() ||
        (n["maintenance"].Scalar() != "true" && n["maintenance"].Scalar() != "false")) {
      return r.Error(n["maintenance"], f + ".maintenance", "expected true or false");
    }
    b.maintenance = n["maintenance"].Scalar() == "true";
  }
  CFG_TRY(ParseBoardSerial(r, n, f, b));
  CFG_TRY(ParseBoardTrace(r, n, f, b));
  CFG_TRY(strings("startup_commands", b.startup_commands));
  CFG_TRY(str("log_file", b.log_file));
  CFG_TRY(str("probe", b.probe));
  CFG_TRY(strings("openocd_config", b.openocd_config));
  CFG_TRY(str("flash_command", b.flash_command));
  CFG_TRY(str("power_on", b.power_on));
  CFG_TRY(str("power_off", b.power_off));
  CFG_TRY(str("self_test", b.self_test));
  CFG_TRY(str("target", b.target));
  CFG_TRY(size("flash_origin", b.flash_origin));
  CFG_TRY(size("flash_size", b.flash_size));
  CFG_TRY(size("ram_origin", b.ram_origin));
  CFG_TRY(size("ram_size", b.ram_size));
  CFG_TRY(str("machine", b.machine));
  CFG_TRY(str("image", b.image));
  CFG_TRY(str("qemu", b.qemu));
  CFG_TRY(str("gdb", b.gdb));
  CFG_TRY(str("boot_pattern", b.boot_pattern));
  if (n["boot_timeout_s"])
    CFG_TRY(r.Int(n["boot_timeout_s"], f + ".boot_timeout_s", 1, 600, b.boot_timeout_s));
  CFG_TRY(size("ota_slot_size", b.ota_slot_size));
  CFG_TRY(str("ota_upload", b.ota_upload));
  CFG_TRY(str("ota_reset", b.ota_reset));
  CFG_TRY(str("ota_confirm", b.ota_confirm));
  if (b.kind == "simulated") {
    if (b.machine.empty())
      return r.Error(n, f + ".machine",
                     "a simulated board needs machine: stm32vldiscovery or lm3s6965evb");
    if (b.machine != "stm32vldiscovery" && b.machine != "lm3s6965evb") {
      return r.Error(n["machine"], f + ".machine",
                     "expected stm32vldiscovery or lm3s6965evb, got '" + b.machine + "'");
    }
  } else if (b.serial.empty() && b.probe.empty()) {
    return r.Error(n, f, "a physical board needs a serial port (serial:) or a probe (probe:)");
  } else if (b.semihosting) {
    return r.Error(n["semihosting"], f + ".semihosting",
                   "semihosting is read on simulated boards; a physical board's goes to its probe");
  }
  ApplyBoardDefaults(b);
  return absl::OkStatus();
}
// `weights: {coverage: 0.3, lexical: 0.8}` for a built-in reranker.
absl::Status ParseRerankWeights(ConfigReader& r, const YAML::Node& n, const std::string& field,
                                std::map<std::string, double>& out) {
  static const std::set<std::string> kFeatures = {"identifier", "coverage", "proximity", "context",
                                                  "vector",     "lexical",  "fused",     "doc",
                                                  "doc_text",   "named"};
  CFG_TRY(r.CheckKeys(n, field, kFeatures));
  for (const auto& kv : n) {
    const std::string name = kv.first.as<std::string>();
    double v = 0;
    CFG_TRY(r.Double(kv.second, field + "." + name, 0, 100, v));
    out[name] = v;
  }
  return absl::OkStatus();
}

// `reranker: {kind, base_url, api_key, api_key_env, model, provider, weights}`.
absl::Status ParseReranker(ConfigReader& r, const YAML::Node& rr, const std::string& field,
                           RerankerConfig& out) {
  CFG_TRY(r.CheckKeys(
      rr, field, {"kind", "base_url", "api_key", "api_key_env", "model", "provider", "weights"}));
  if (rr["weights"]) CFG_TRY(ParseRerankWeights(r, rr["weights"], field + ".weights", out.weights));
  if (rr["kind"]) CFG_TRY(r.String(rr["kind"], field + ".kind", out.kind));
  static const std::set<std::string> kKinds = {"builtin", "tei", "cohere", "jina", "llm"};
  if (!kKinds.count(out.kind))
    return r.Error(rr["kind"], field + ".kind", "expected builtin, tei, cohere, jina or llm");
  if (rr["base_url"]) CFG_TRY(r.String(rr["base_url"], field + ".base_url", out.base_url));
  if (rr["api_key"]) CFG_TRY(r.String(rr["api_key"], field + ".api_key", out.api_key));
  if (rr["api_key_env"])
    CFG_TRY(r.String(rr["api_key_env"], field + ".api_key_env", out.api_key_env));
  if (rr["model"]) CFG_TRY(r.String(rr["model"], field + ".model", out.model));
  if (rr["provider"]) CFG_TRY(r.String(rr["provider"], field + ".provider", out.provider));
  if ((out.kind == "tei" || out.kind == "cohere" || out.kind == "jina") && out.base_url.empty()) {
    return r.Error(rr, field + ".base_url", "required for kind " + out.kind);
  }
  return absl::OkStatus();
}

absl::Status ParseMcpServersNode(ConfigReader& r, const YAML::Node& n,
                                 std::map<std::string, McpServerEntry>& out) {
  if (!n.IsMap())
    return r.Error(n, "mcp_servers", "expected a mapping of server name to {command, env}");
  for (const auto& kv : n) {
    const std::string name = kv.first.as<std::string>();
    const std::string f = "mcp_servers." + name;
    CFG_TRY(r.CheckKeys(kv.second, f, {"command", "env", "url", "headers"}));
    McpServerEntry e;
    if (kv.second["url"]) {
      CFG_TRY(r.String(kv.second["url"], f + ".url", e.url));
      if (e.url.rfind("http://", 0) != 0 && e.url.rfind("https://", 0) != 0) {
        return r.Error(kv.second["url"], f + ".url", "expected an http:// or https:// URL");
      }
      if (const auto& hs = kv.second["headers"]) {
        if (!hs.IsMap())
          return r.Error(hs, f + ".headers", "expected a mapping of header to value");
        for (const auto& h : hs)
          e.headers.push_back(h.first.as<std::string>() + ": " + h.second.as<std::string>());
      }
    } else {
      const auto& cmd = kv.second["command"];
      if (!cmd || !cmd.IsSequence() || cmd.size() == 0) {
        return r.Error(
            cmd ? cmd : kv.second, f + ".command",
            "expected a non-empty list (program and arguments), or url: for streamable HTTP");
      }
      for (const auto& a : cmd) {
        std::string s;
        CFG_TRY(r.String(a, f + ".command[]", s));
        e.command.push_back(s);
      }
    }
    if (const auto& env = kv.second["env"]) {
      if (!env.IsMap()) return r.Error(env, f + ".env", "expected a mapping of variable to value");
      for (const auto& ev : env) e.env[ev.first.as<std::string>()] = ev.second.as<std::string>();
    }
    out[name] = e;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, McpServerEntry>> ParseMcpServers(const std::string& yaml_text,
                                                                      const std::string& source) {
  std::map<std::string, McpServerEntry> out;
  try {
    YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsMap() || !root["mcp_servers"]) return out;
    ConfigReader r(source);
    CFG_TRY(ParseMcpServersNode(r, root["mcp_servers"], out));
  } catch (const YAML::Exception& e) {
    return YamlStatus(source, e);
  }
  return out;
}

namespace {

absl::Status BoolField(ConfigReader& r, const YAML::Node& v, const std::string& field, bool& out) {
  if (!v.IsScalar() || (v.Scalar() != "true" && v.Scalar() != "false"))
    return r.Error(v, field, "expected true or false");
  out = v.Scalar() == "true";
  return absl::OkStatus();
}

absl::Status StringList(ConfigReader& r, const YAML::Node& v, const std::string& field,
                        std::vector<std::string>& out) {
  if (!v.IsSequence()) return r.Error(v, field, "expected a list of strings");
  for (const auto& item : v) {
    std::string s;
    CFG_TRY(r.String(item, field + "[]", s));
    out.push_back(s);
  }
  return absl::OkStatus();
}

// `lab:`.
absl::Status ParseLabSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(ParseLabConfig(r, n, c.lab));
  // etcd over TLS: this node's certificate unless others are named.
  LabConfig& l = c.lab;
  const TlsConfig& t = c.security.tls;
  if (l.etcd_tls) {
    if (l.etcd_ca.empty()) l.etcd_ca = l.ca.empty() ? t.client_ca : l.ca;
    if (l.etcd_cert.empty()) l.etcd_cert = l.cert.empty() ? t.cert : l.cert;
    if (l.etcd_key.empty()) l.etcd_key = l.key.empty() ? t.key : l.key;
    if (l.etcd_ca.empty() || l.etcd_cert.empty() || l.etcd_key.empty()) {
      return r.Error(
          n["etcd"], "lab.etcd",
          "https:// needs the CA etcd's certificate is checked against and this node's client "
          "certificate: set lab.etcd_ca, lab.etcd_cert and lab.etcd_key (or lab.ca, lab.cert, "
          "lab.key; fwaid tls issue DIR --node NODE makes one)");
    }
  }
  return absl::OkStatus();
}

// `toolchain:`.
absl::Status ParseToolchainSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "toolchain", {"dpkg_admindir"}));
  if (auto d = n["dpkg_admindir"])
    CFG_TRY(r.String(d, "toolchain.dpkg_admindir", c.toolchain_dpkg_admindir));
  return absl::OkStatus();
}

// `secrets:`.
absl::Status ParseSecretsSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "secrets", {"patterns"}));
  if (auto p = n["patterns"]) {
    if (!p.IsSequence())
      return r.Error(p, "secrets.patterns", "expected a list of regexes (name=regex or regex)");
    for (const auto& item : p) {
      std::string pat;
      CFG_TRY(r.String(item, "secrets.patterns[]", pat));
      // "name=regex" when what precedes '=' is a plain name.
      const auto eq = pat.find('=');
      const bool named = eq != std::string::npos && eq > 0 &&
                         std::all_of(pat.begin(), pat.begin() + eq, [](char ch) {
                           return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
                         });
      try {
        std::regex check(named ? pat.substr(eq + 1) : pat);
      } catch (const std::regex_error&) {
        return r.Error(item, "secrets.patterns[]", "not a valid regular expression");
      }
      c.secret_patterns.push_back(pat);
    }
  }
  return absl::OkStatus();
}

// `listen:`.
absl::Status ParseListenSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  if (n.IsScalar()) {
    c.listen.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (const auto& item : n) {
      std::string s;
      CFG_TRY(r.String(item, "listen[]", s));
      c.listen.push_back(s);
    }
  } else {
    return r.Error(n, "listen", "expected an address or a list of addresses");
  }
  for (size_t i = 0; i < c.listen.size(); ++i) {
    const auto& a = c.listen[i];
    if (!absl::StartsWith(a, "unix:") && !absl::StartsWith(a, "tcp:") &&
        !absl::StartsWith(a, "tls:")) {
      return r.Error(
          n.IsSequence() ? n[i] : n, "listen",
          absl::StrCat("expected unix:PATH, tcp:HOST:PORT or tls:HOST:PORT, got '", a, "'"));
    }
  }
  return absl::OkStatus();
}

// `log_level:`.
absl::Status ParseLogLevelSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.String(n, "log_level", c.log_level));
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
  if (!kLevels.count(c.log_level)) {
    return r.Error(n, "log_level", "expected one of trace, debug, info, warn, error, off");
  }
  return absl::OkStatus();
}

// `providers:`.
absl::Status ParseProvidersSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  if (!n.IsMap()) return r.Error(n, "providers", "expected a mapping of provider name to settings");
  for (const auto& kv : n) {
    const std::string name = kv.first.as<std::string>();
    ProviderConfig p;
    CFG_TRY(ParseProvider(r, name, kv.second, p));
    c.providers[name] = p;
  }
  return absl::OkStatus();
}

// `default_provider:`.
absl::Status ParseDefaultProviderSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.String(n, "default_provider", c.default_provider));
  if (!c.providers.count(c.default_provider) && c.default_provider != "anthropic" &&
      c.default_provider != "openai") {
    return r.Error(
        n, "default_provider",
        absl::StrCat("'", c.default_provider, "' is not a provider defined under providers:"));
  }
  return absl::OkStatus();
}

// `agent:`.
absl::Status ParseCheckpointsSection(ConfigReader& r, const YAML::Node& n, CheckpointsConfig& c) {
  CFG_TRY(r.CheckKeys(n, "checkpoints", {"max_bytes", "max_file_bytes"}));
  if (n["max_bytes"])
    CFG_TRY(r.Int(n["max_bytes"], "checkpoints.max_bytes", 1 << 20, int64_t{1} << 40, c.max_bytes));
  if (n["max_file_bytes"]) {
    CFG_TRY(r.Int(n["max_file_bytes"], "checkpoints.max_file_bytes", 1, int64_t{1} << 32,
                  c.max_file_bytes));
  }
  return absl::OkStatus();
}

absl::Status ParseAgentSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "agent",
                      {"max_iterations", "max_message_bytes", "tool_threshold", "tools_top_k",
                       "subagents", "prices", "context_windows", "turn_threads", "turn_starts"}));
  if (auto pr = n["prices"]) {
    if (!pr.IsMap())
      return r.Error(
          pr, "agent.prices",
          "expected a mapping of model prefix to {input, output} USD per million tokens");
    for (const auto& kv : pr) {
      const std::string f = "agent.prices." + kv.first.as<std::string>();
      CFG_TRY(r.CheckKeys(kv.second, f, {"input", "output"}));
      double in = 0, out = 0;
      if (kv.second["input"]) CFG_TRY(r.Double(kv.second["input"], f + ".input", 0, 100000, in));
      if (kv.second["output"])
        CFG_TRY(r.Double(kv.second["output"], f + ".output", 0, 100000, out));
      c.prices[kv.first.as<std::string>()] = {in, out};
    }
  }
  if (auto cw = n["context_windows"]) {
    if (!cw.IsMap())
      return r.Error(cw, "agent.context_windows", "expected a mapping of model prefix to tokens");
    for (const auto& kv : cw) {
      int64_t tokens = 0;
      CFG_TRY(r.Int(kv.second, "agent.context_windows." + kv.first.as<std::string>(), 1024,
                    int64_t{1} << 32, tokens));
      c.context_windows[kv.first.as<std::string>()] = tokens;
    }
  }
  if (auto sa = n["subagents"]) {
    if (!sa.IsMap())
      return r.Error(sa, "agent.subagents", "expected a mapping of type name to settings");
    for (const auto& kv : sa) {
      const std::string name = kv.first.as<std::string>();
      const std::string f = "agent.subagents." + name;
      const auto& e = kv.second;
      CFG_TRY(r.CheckKeys(e, f,
                          {"description", "provider", "model", "timeout_s", "max_tokens",
                           "max_tool_calls", "temperature", "tools", "read_only", "prompt"}));
      SubagentConfig s;
      s.name = name;
      if (e["description"]) CFG_TRY(r.String(e["description"], f + ".description", s.description));
      if (e["provider"]) CFG_TRY(r.String(e["provider"], f + ".provider", s.provider));
      if (e["model"]) CFG_TRY(r.String(e["model"], f + ".model", s.model));
      if (e["prompt"]) CFG_TRY(r.String(e["prompt"], f + ".prompt", s.prompt));
      if (e["timeout_s"]) CFG_TRY(r.Int(e["timeout_s"], f + ".timeout_s", 1, 86400, s.timeout_s));
      if (e["max_tokens"])
        CFG_TRY(r.Int(e["max_tokens"], f + ".max_tokens", 1, 1000000, s.max_tokens));
      if (e["max_tool_calls"])
        CFG_TRY(r.Int(e["max_tool_calls"], f + ".max_tool_calls", 0, 10000, s.max_tool_calls));
      if (e["temperature"])
        CFG_TRY(r.Double(e["temperature"], f + ".temperature", 0, 2, s.temperature));
      if (e["read_only"]) {
        if (!e["read_only"].IsScalar() ||
            (e["read_only"].Scalar() != "true" && e["read_only"].Scalar() != "false")) {
          return r.Error(e["read_only"], f + ".read_only", "expected true or false");
        }
        s.read_only = e["read_only"].Scalar() == "true";
      }
      if (const auto& tl = e["tools"]) {
        if (!tl.IsSequence()) return r.Error(tl, f + ".tools", "expected a list of tool names");
        for (const auto& t : tl) {
          std::string x;
          CFG_TRY(r.String(t, f + ".tools[]", x));
          s.tools.push_back(x);
        }
      }
      c.subagents[name] = s;
    }
  }
  if (n["tool_threshold"])
    CFG_TRY(r.Int(n["tool_threshold"], "agent.tool_threshold", 1, 100000, c.tool_threshold));
  if (n["tools_top_k"])
    CFG_TRY(r.Int(n["tools_top_k"], "agent.tools_top_k", 1, 100, c.tools_top_k));
  if (n["max_iterations"]) {
    CFG_TRY(r.Int(n["max_iterations"], "agent.max_iterations", 1, 1000, c.max_iterations));
  }
  if (n["max_message_bytes"]) {
    CFG_TRY(
        r.Int(n["max_message_bytes"], "agent.max_message_bytes", 1, 64 << 20, c.max_message_bytes));
  }
  if (n["turn_threads"])
    CFG_TRY(r.Int(n["turn_threads"], "agent.turn_threads", 0, 1000, c.turn_threads));
  if (n["turn_starts"])
    CFG_TRY(r.Int(n["turn_starts"], "agent.turn_starts", 0, 1000, c.turn_starts));
  return absl::OkStatus();
}

// `http:`.
absl::Status ParseHttpSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "http", {"connect_timeout_s", "idle_timeout_s"}));
  if (n["connect_timeout_s"]) {
    CFG_TRY(
        r.Int(n["connect_timeout_s"], "http.connect_timeout_s", 1, 600, c.http_connect_timeout_s));
  }
  if (n["idle_timeout_s"]) {
    CFG_TRY(r.Int(n["idle_timeout_s"], "http.idle_timeout_s", 1, 3600, c.http_idle_timeout_s));
  }
  return absl::OkStatus();
}

// `retry:`.
absl::Status ParseRetrySection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "retry", {"max_attempts", "initial_backoff_ms", "max_backoff_ms"}));
  if (n["max_attempts"]) {
    CFG_TRY(r.Int(n["max_attempts"], "retry.max_attempts", 1, 20, c.retry.max_attempts));
  }
  if (n["initial_backoff_ms"]) {
    CFG_TRY(r.Int(n["initial_backoff_ms"], "retry.initial_backoff_ms", 0, 600000,
                  c.retry.initial_backoff_ms));
  }
  if (n["max_backoff_ms"]) {
    CFG_TRY(r.Int(n["max_backoff_ms"], "retry.max_backoff_ms", 0, 600000, c.retry.max_backoff_ms));
  }
  return absl::OkStatus();
}

// `subscribers:`.
absl::Status ParseSubscribersSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "subscribers", {"high_water", "max_queue", "batch_window_us"}));
  if (n["high_water"]) {
    CFG_TRY(r.Int(n["high_water"], "subscribers.high_water", 1, 1000000, c.subscribers.high_water));
  }
  if (n["max_queue"]) {
    CFG_TRY(r.Int(n["max_queue"], "subscribers.max_queue", 2, 10000000, c.subscribers.max_queue));
  }
  if (n["batch_window_us"]) {
    CFG_TRY(r.Int(n["batch_window_us"], "subscribers.batch_window_us", 0, 100000,
                  c.subscribers.batch_window_us));
  }
  if (c.subscribers.max_queue <= c.subscribers.high_water) {
    return r.Error(n, "subscribers.max_queue", "must be greater than subscribers.high_water");
  }
  return absl::OkStatus();
}

// `tools:`.
absl::Status ParseToolsSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(
      n, "tools",
      {"read_file_max_bytes", "grep_max_results", "glob_max_results", "list_dir_max_entries"}));
  if (n["read_file_max_bytes"]) {
    CFG_TRY(r.Int(n["read_file_max_bytes"], "tools.read_file_max_bytes", 1, 64 << 20,
                  c.tools.read_file_max_bytes));
  }
  if (n["grep_max_results"]) {
    CFG_TRY(r.Int(n["grep_max_results"], "tools.grep_max_results", 1, 100000,
                  c.tools.grep_max_results));
  }
  if (n["glob_max_results"]) {
    CFG_TRY(r.Int(n["glob_max_results"], "tools.glob_max_results", 1, 100000,
                  c.tools.glob_max_results));
  }
  if (n["list_dir_max_entries"]) {
    CFG_TRY(r.Int(n["list_dir_max_entries"], "tools.list_dir_max_entries", 1, 100000,
                  c.tools.list_dir_max_entries));
  }
  return absl::OkStatus();
}

// `hardware:`.
absl::Status ParseHardwareSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(
      n, "hardware",
      {"sysfs_root", "dev_root", "history_lines", "default_ttl_s", "max_ttl_s",
       "default_simulated_board", "keep_serial_transcripts", "quarantine_after", "boards"}));
  auto& h = c.hardware;
  if (n["sysfs_root"]) CFG_TRY(r.String(n["sysfs_root"], "hardware.sysfs_root", h.sysfs_root));
  if (n["dev_root"]) CFG_TRY(r.String(n["dev_root"], "hardware.dev_root", h.dev_root));
  if (n["history_lines"])
    CFG_TRY(r.Int(n["history_lines"], "hardware.history_lines", 10, 10000000, h.history_lines));
  if (n["max_ttl_s"])
    CFG_TRY(r.Int(n["max_ttl_s"], "hardware.max_ttl_s", 1, 30 * 86400, h.max_ttl_s));
  if (n["default_ttl_s"])
    CFG_TRY(r.Int(n["default_ttl_s"], "hardware.default_ttl_s", 1, h.max_ttl_s, h.default_ttl_s));
  if (auto d = n["default_simulated_board"]) {
    if (!d.IsScalar() || (d.Scalar() != "true" && d.Scalar() != "false")) {
      return r.Error(d, "hardware.default_simulated_board", "expected true or false");
    }
    h.default_simulated_board = d.Scalar() == "true";
  }
  if (auto k = n["keep_serial_transcripts"]) {
    if (!k.IsScalar() || (k.Scalar() != "true" && k.Scalar() != "false")) {
      return r.Error(k, "hardware.keep_serial_transcripts", "expected true or false");
    }
    h.keep_serial_transcripts = k.Scalar() == "true";
  }
  if (n["quarantine_after"]) {
    CFG_TRY(r.Int(n["quarantine_after"], "hardware.quarantine_after", 0, 1000, h.quarantine_after));
  }
  if (auto bs = n["boards"]) {
    if (!bs.IsSequence()) return r.Error(bs, "hardware.boards", "expected a list of boards");
    for (size_t i = 0; i < bs.size(); ++i) {
      BoardConfig b;
      CFG_TRY(ParseBoard(r, bs[i], i, h, b));
      h.boards.push_back(std::move(b));
    }
  }
  return absl::OkStatus();
}

// `ota:`.
absl::Status ParseOtaSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "ota", {"keys", "max_failure_rate", "health_timeout_s"}));
  if (n["keys"]) CFG_TRY(StringList(r, n["keys"], "ota.keys", c.ota.keys));
  if (n["max_failure_rate"])
    CFG_TRY(r.Double(n["max_failure_rate"], "ota.max_failure_rate", 0, 1, c.ota.max_failure_rate));
  if (n["health_timeout_s"])
    CFG_TRY(r.Int(n["health_timeout_s"], "ota.health_timeout_s", 1, 3600, c.ota.health_timeout_s));
  return absl::OkStatus();
}

// `plugins:`.
absl::Status ParsePluginsSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "plugins",
                      {"trusted_keys", "allow_unsigned", "allow_tampered", "marketplaces"}));
  if (n["trusted_keys"])
    CFG_TRY(StringList(r, n["trusted_keys"], "plugins.trusted_keys", c.plugins.trusted_keys));
  if (n["allow_unsigned"])
    CFG_TRY(BoolField(r, n["allow_unsigned"], "plugins.allow_unsigned", c.plugins.allow_unsigned));
  if (n["allow_tampered"])
    CFG_TRY(BoolField(r, n["allow_tampered"], "plugins.allow_tampered", c.plugins.allow_tampered));
  if (n["marketplaces"])
    CFG_TRY(StringList(r, n["marketplaces"], "plugins.marketplaces", c.plugins.marketplaces));
  return absl::OkStatus();
}

// `catalog:`.
absl::Status ParseCatalogSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(r.CheckKeys(n, "catalog",
                      {"coarse_slices", "candidates", "grouping", "rrf_k", "vector_weight",
                       "whole_weight", "synonym_weight", "family_weight", "namespace_boost",
                       "reranker", "rerank_weights", "hyde", "hyde_weight"}));
  auto& k = c.catalog;
  if (n["hyde"]) CFG_TRY(BoolField(r, n["hyde"], "catalog.hyde", k.hyde));
  if (n["coarse_slices"])
    CFG_TRY(r.Int(n["coarse_slices"], "catalog.coarse_slices", 1, 10000, k.coarse_slices));
  if (n["candidates"]) CFG_TRY(r.Int(n["candidates"], "catalog.candidates", 1, 1000, k.candidates));
  if (n["grouping"]) {
    CFG_TRY(r.String(n["grouping"], "catalog.grouping", k.grouping));
    if (k.grouping != "sum" && k.grouping != "rrf")
      return r.Error(n["grouping"], "catalog.grouping", "expected sum or rrf");
  }
  CFG_TRY(Numbers(r, n, "catalog",
                  {{"rrf_k", 0, 10000, &k.rrf_k},
                   {"vector_weight", 0, 100, &k.vector_weight},
                   {"whole_weight", 0, 100, &k.whole_weight},
                   {"synonym_weight", 0, 1, &k.synonym_weight},
                   {"family_weight", 0, 1, &k.family_weight},
                   {"namespace_boost", 0, 10, &k.namespace_boost},
                   {"hyde_weight", 0, 1, &k.hyde_weight}}));
  if (n["reranker"]) CFG_TRY(ParseReranker(r, n["reranker"], "catalog.reranker", k.reranker));
  if (n["rerank_weights"])
    CFG_TRY(
        ParseRerankWeights(r, n["rerank_weights"], "catalog.rerank_weights", k.reranker.weights));
  return absl::OkStatus();
}

// `knowledge:`.
// `knowledge.embedder:`.
absl::Status ParseKnowledgeEmbedder(ConfigReader& r, const YAML::Node& e, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(e, "knowledge.embedder",
                      {"kind", "dimension", "base_url", "api_key", "api_key_env", "model"}));
  if (e["kind"]) CFG_TRY(r.String(e["kind"], "knowledge.embedder.kind", k.embedder));
  if (k.embedder != "builtin" && k.embedder != "openai") {
    return r.Error(e["kind"], "knowledge.embedder.kind", "expected builtin or openai");
  }
  if (e["dimension"])
    CFG_TRY(r.Int(e["dimension"], "knowledge.embedder.dimension", 16, 4096, k.builtin_dimension));
  if (e["base_url"])
    CFG_TRY(r.String(e["base_url"], "knowledge.embedder.base_url", k.embed_base_url));
  if (e["api_key"]) CFG_TRY(r.String(e["api_key"], "knowledge.embedder.api_key", k.embed_api_key));
  if (e["api_key_env"])
    CFG_TRY(r.String(e["api_key_env"], "knowledge.embedder.api_key_env", k.embed_api_key_env));
  if (e["model"]) CFG_TRY(r.String(e["model"], "knowledge.embedder.model", k.embed_model));
  if (k.embedder == "openai" && (k.embed_base_url.empty() || k.embed_model.empty())) {
    return r.Error(e, "knowledge.embedder", "kind openai needs base_url and model");
  }
  return absl::OkStatus();
}

// `knowledge.chunk:`.
absl::Status ParseKnowledgeChunk(ConfigReader& r, const YAML::Node& ch, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(ch, "knowledge.chunk",
                      {"min_tokens", "target_tokens", "max_tokens", "overlap_tokens"}));
  if (ch["min_tokens"])
    CFG_TRY(r.Int(ch["min_tokens"], "knowledge.chunk.min_tokens", 1, 100000, k.chunk_min_tokens));
  if (ch["target_tokens"])
    CFG_TRY(r.Int(ch["target_tokens"], "knowledge.chunk.target_tokens", 8, 100000,
                  k.chunk_target_tokens));
  if (ch["max_tokens"])
    CFG_TRY(r.Int(ch["max_tokens"], "knowledge.chunk.max_tokens", 16, 100000, k.chunk_max_tokens));
  if (ch["overlap_tokens"])
    CFG_TRY(r.Int(ch["overlap_tokens"], "knowledge.chunk.overlap_tokens", 0, 10000,
                  k.chunk_overlap_tokens));
  if (!(k.chunk_min_tokens <= k.chunk_target_tokens &&
        k.chunk_target_tokens <= k.chunk_max_tokens)) {
    return r.Error(ch, "knowledge.chunk", "expected min_tokens <= target_tokens <= max_tokens");
  }
  return absl::OkStatus();
}

// `knowledge.bm25:`.
absl::Status ParseKnowledgeBm25(ConfigReader& r, const YAML::Node& b, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(b, "knowledge.bm25", {"k1", "b"}));
  if (b["k1"]) CFG_TRY(r.Double(b["k1"], "knowledge.bm25.k1", 0, 10, k.bm25_k1));
  if (b["b"]) CFG_TRY(r.Double(b["b"], "knowledge.bm25.b", 0, 1, k.bm25_b));
  return absl::OkStatus();
}

// `knowledge.fusion:`.
absl::Status ParseKnowledgeFusion(ConfigReader& r, const YAML::Node& f, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(f, "knowledge.fusion",
                      {"k", "lexical_weight", "vector_weight", "synonym_weight", "family_weight",
                       "doc_weight", "doc_text_weight", "doc_text_b", "doc_text_candidates"}));
  CFG_TRY(Numbers(r, f, "knowledge.fusion",
                  {{"k", 0, 10000, &k.rrf_k},
                   {"lexical_weight", 0, 100, &k.lexical_weight},
                   {"vector_weight", 0, 100, &k.vector_weight},
                   {"synonym_weight", 0, 1, &k.synonym_weight},
                   {"family_weight", 0, 1, &k.family_weight},
                   {"doc_weight", 0, 100, &k.doc_weight},
                   {"doc_text_weight", 0, 100, &k.doc_text_weight},
                   {"doc_text_b", 0, 1, &k.doc_text_b}}));
  if (f["doc_text_candidates"])
    CFG_TRY(r.Int(f["doc_text_candidates"], "knowledge.fusion.doc_text_candidates", 0, 1000,
                  k.doc_text_candidates));
  return absl::OkStatus();
}

// `knowledge.query_rewrite:`.
absl::Status ParseKnowledgeQueryRewrite(ConfigReader& r, const YAML::Node& qr, KnowledgeConfig& k) {
  if (!qr.IsScalar() || (qr.Scalar() != "true" && qr.Scalar() != "false")) {
    return r.Error(qr, "knowledge.query_rewrite", "expected true or false");
  }
  k.query_rewrite = qr.Scalar() == "true";
  return absl::OkStatus();
}

// `knowledge.hyde:`.
absl::Status ParseKnowledgeHyde(ConfigReader& r, const YAML::Node& hy, KnowledgeConfig& k) {
  if (!hy.IsScalar() || (hy.Scalar() != "true" && hy.Scalar() != "false")) {
    return r.Error(hy, "knowledge.hyde", "expected true or false");
  }
  k.hyde = hy.Scalar() == "true";
  return absl::OkStatus();
}

// `knowledge.passages:`.
absl::Status ParseKnowledgePassages(ConfigReader& r, const YAML::Node& p, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(
      p, "knowledge.passages",
      {"tokens", "pool", "coverage_weight", "sentence_weight", "forward", "within_doc_weight"}));
  if (auto fw = p["forward"]) {
    if (!fw.IsScalar() || (fw.Scalar() != "true" && fw.Scalar() != "false")) {
      return r.Error(fw, "knowledge.passages.forward", "expected true or false");
    }
    k.passage_forward = fw.Scalar() == "true" ? 1 : 0;
  }
  if (p["tokens"])
    CFG_TRY(r.Int(p["tokens"], "knowledge.passages.tokens", 1, 512, k.passage_tokens));
  if (p["pool"]) CFG_TRY(r.Int(p["pool"], "knowledge.passages.pool", 1, 1000, k.passage_pool));
  CFG_TRY(Numbers(r, p, "knowledge.passages",
                  {{"coverage_weight", 0, 100, &k.passage_coverage_weight},
                   {"sentence_weight", 0, 100, &k.passage_sentence_weight},
                   {"within_doc_weight", 0, 1, &k.passage_within_doc}}));
  return absl::OkStatus();
}

// `knowledge.windows:`.
absl::Status ParseKnowledgeWindows(ConfigReader& r, const YAML::Node& wn, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(wn, "knowledge.windows", {"enabled", "docs", "weight", "k", "identifiers"}));
  for (const auto& [key, out] : {std::pair<const char*, int*>{"enabled", &k.window_enabled},
                                 {"identifiers", &k.window_identifiers}}) {
    if (auto b = wn[key]) {
      if (!b.IsScalar() || (b.Scalar() != "true" && b.Scalar() != "false")) {
        return r.Error(b, std::string("knowledge.windows.") + key, "expected true or false");
      }
      *out = b.Scalar() == "true" ? 1 : 0;
    }
  }
  if (wn["docs"]) CFG_TRY(r.Int(wn["docs"], "knowledge.windows.docs", 1, 20, k.window_docs));
  CFG_TRY(Numbers(r, wn, "knowledge.windows",
                  {{"weight", 0, 10, &k.window_weight}, {"k", 0, 1000, &k.window_k}}));
  return absl::OkStatus();
}

// `knowledge.log:`.
absl::Status ParseKnowledgeLog(ConfigReader& r, const YAML::Node& lg, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(lg, "knowledge.log",
                      {"max_entries", "feedback_weight", "feedback_min_similarity"}));
  if (lg["max_entries"])
    CFG_TRY(r.Int(lg["max_entries"], "knowledge.log.max_entries", 1, int64_t{1} << 40,
                  k.log_max_entries));
  CFG_TRY(Numbers(r, lg, "knowledge.log",
                  {{"feedback_weight", 0, 1, &k.feedback_weight},
                   {"feedback_min_similarity", 0, 1, &k.feedback_min_similarity}}));
  return absl::OkStatus();
}

// `knowledge.code_search:`.
absl::Status ParseKnowledgeCodeSearch(ConfigReader& r, const YAML::Node& cs, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(cs, "knowledge.code_search", {"web_context_url", "api_key_env"}));
  if (cs["web_context_url"])
    CFG_TRY(r.String(cs["web_context_url"], "knowledge.code_search.web_context_url",
                     k.code_web_context_url));
  if (cs["api_key_env"])
    CFG_TRY(r.String(cs["api_key_env"], "knowledge.code_search.api_key_env",
                     k.code_web_context_api_key_env));
  return absl::OkStatus();
}

// `knowledge.hnsw:`.
absl::Status ParseKnowledgeHnsw(ConfigReader& r, const YAML::Node& h, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(h, "knowledge.hnsw", {"m", "ef_construction", "ef_search"}));
  if (h["m"]) CFG_TRY(r.Int(h["m"], "knowledge.hnsw.m", 4, 128, k.hnsw_m));
  if (h["ef_construction"])
    CFG_TRY(r.Int(h["ef_construction"], "knowledge.hnsw.ef_construction", 8, 2048,
                  k.hnsw_ef_construction));
  if (h["ef_search"])
    CFG_TRY(r.Int(h["ef_search"], "knowledge.hnsw.ef_search", 0, 4096, k.hnsw_ef_search));
  return absl::OkStatus();
}

// `knowledge.ivf:`.
absl::Status ParseKnowledgeIvf(ConfigReader& r, const YAML::Node& iv, KnowledgeConfig& k) {
  CFG_TRY(r.CheckKeys(iv, "knowledge.ivf", {"lists", "nprobe", "max_probe_share"}));
  if (iv["lists"]) CFG_TRY(r.Int(iv["lists"], "knowledge.ivf.lists", 0, 1 << 20, k.ivf_lists));
  if (iv["nprobe"]) CFG_TRY(r.Int(iv["nprobe"], "knowledge.ivf.nprobe", 0, 1 << 20, k.ivf_nprobe));
  if (iv["max_probe_share"]) {
    CFG_TRY(r.Double(iv["max_probe_share"], "knowledge.ivf.max_probe_share", 0.0, 1.0,
                     k.ivf_max_probe_share));
  }
  return absl::OkStatus();
}

absl::Status ParseKnowledgeSection(ConfigReader& r, const YAML::Node& n, DaemonConfig& c) {
  CFG_TRY(
      r.CheckKeys(n, "knowledge",
                  {"embedder", "chunk", "bm25", "fusion", "candidates", "rerank_top", "hnsw_above",
                   "max_document_mb", "reranker", "query_rewrite", "hyde", "hnsw", "code_search",
                   "passages", "log", "vector_index", "ivf", "windows", "vector_min_recall"}));
  auto& k = c.knowledge;
  if (auto e = n["embedder"]) CFG_TRY(ParseKnowledgeEmbedder(r, e, k));
  if (auto ch = n["chunk"]) CFG_TRY(ParseKnowledgeChunk(r, ch, k));
  if (auto b = n["bm25"]) CFG_TRY(ParseKnowledgeBm25(r, b, k));
  if (auto f = n["fusion"]) CFG_TRY(ParseKnowledgeFusion(r, f, k));
  if (n["reranker"]) CFG_TRY(ParseReranker(r, n["reranker"], "knowledge.reranker", k.reranker));
  if (auto qr = n["query_rewrite"]) CFG_TRY(ParseKnowledgeQueryRewrite(r, qr, k));
  if (auto hy = n["hyde"]) CFG_TRY(ParseKnowledgeHyde(r, hy, k));
  if (auto p = n["passages"]) CFG_TRY(ParseKnowledgePassages(r, p, k));
  if (auto wn = n["windows"]) CFG_TRY(ParseKnowledgeWindows(r, wn, k));
  if (auto lg = n["log"]) CFG_TRY(ParseKnowledgeLog(r, lg, k));
  if (n["candidates"])
    CFG_TRY(r.Int(n["candidates"], "knowledge.candidates", 10, 10000, k.candidates));
  if (n["rerank_top"])
    CFG_TRY(r.Int(n["rerank_top"], "knowledge.rerank_top", 1, 1000, k.rerank_top));
  if (n["hnsw_above"])
    CFG_TRY(r.Int(n["hnsw_above"], "knowledge.hnsw_above", 1, int64_t{1} << 40, k.hnsw_above));
  if (auto cs = n["code_search"]) CFG_TRY(ParseKnowledgeCodeSearch(r, cs, k));
  if (auto h = n["hnsw"]) CFG_TRY(ParseKnowledgeHnsw(r, h, k));
  if (n["max_document_mb"])
    CFG_TRY(r.Int(n["max_document_mb"], "knowledge.max_document_mb", 1, 4096, k.max_document_mb));
  if (n["vector_min_recall"]) {
    CFG_TRY(r.Double(n["vector_min_recall"], "knowledge.vector_min_recall", 0.0, 1.0,
                     k.vector_min_recall));
  }
  if (n["vector_index"]) {
    CFG_TRY(r.String(n["vector_index"], "knowledge.vector_index", k.vector_index));
    if (k.vector_index != "ivf" && k.vector_index != "hnsw") {
      return r.Error(n["vector_index"], "knowledge.vector_index", "expected ivf or hnsw");
    }
  }
  if (auto iv = n["ivf"]) CFG_TRY(ParseKnowledgeIvf(r, iv, k));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text, const std::string& source) {
  DaemonConfig c;
  c.source = source;
  ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml_text, "config " + source));
  if (root.IsNull()) return c;  // empty file: all defaults
  ConfigReader r(source);
  try {
    CFG_TRY(r.CheckKeys(root, "",
                        {"listen",
                         "data_dir",
                         "default_provider",
                         "providers",
                         "agent",
                         "http",
                         "retry",
                         "subscribers",
                         "tools",
                         "knowledge",
                         "catalog",
                         "mcp_servers",
                         "ota",
                         "plugins",
                         "telemetry",
                         "hardware",
                         "checkpoints",
                         "policy_file",
                         "secrets",
                         "toolchain",
                         "log_level",
                         "tls",
                         "unix_socket",
                         "users",
                         "limits",
                         "knowledge_writers",
                         "lab"}));
    CFG_TRY(ParseSecurityConfig(r, root, c.security));
    if (auto n = root["lab"]) CFG_TRY(ParseLabSection(r, n, c));
    if (auto n = root["policy_file"]) CFG_TRY(r.String(n, "policy_file", c.policy_file));
    if (auto n = root["toolchain"]) CFG_TRY(ParseToolchainSection(r, n, c));
    if (auto n = root["secrets"]) CFG_TRY(ParseSecretsSection(r, n, c));
    if (auto n = root["listen"]) CFG_TRY(ParseListenSection(r, n, c));
    if (auto n = root["data_dir"]) CFG_TRY(r.String(n, "data_dir", c.data_dir));
    if (auto n = root["log_level"]) CFG_TRY(ParseLogLevelSection(r, n, c));
    if (auto n = root["providers"]) CFG_TRY(ParseProvidersSection(r, n, c));
    if (auto n = root["default_provider"]) CFG_TRY(ParseDefaultProviderSection(r, n, c));
    if (auto n = root["agent"]) CFG_TRY(ParseAgentSection(r, n, c));
    if (auto n = root["http"]) CFG_TRY(ParseHttpSection(r, n, c));
    if (auto n = root["retry"]) CFG_TRY(ParseRetrySection(r, n, c));
    if (auto n = root["subscribers"]) CFG_TRY(ParseSubscribersSection(r, n, c));
    if (auto n = root["tools"]) CFG_TRY(ParseToolsSection(r, n, c));
    if (auto n = root["mcp_servers"]) CFG_TRY(ParseMcpServersNode(r, n, c.mcp_servers));
    if (auto n = root["hardware"]) CFG_TRY(ParseHardwareSection(r, n, c));
    if (auto n = root["ota"]) CFG_TRY(ParseOtaSection(r, n, c));
    if (auto n = root["checkpoints"]) CFG_TRY(ParseCheckpointsSection(r, n, c.checkpoints));
    if (auto n = root["telemetry"]) CFG_TRY(ParseTelemetry(r, n, c.telemetry));
    if (auto n = root["plugins"]) CFG_TRY(ParsePluginsSection(r, n, c));
    if (auto n = root["catalog"]) CFG_TRY(ParseCatalogSection(r, n, c));
    if (auto n = root["knowledge"]) CFG_TRY(ParseKnowledgeSection(r, n, c));
  } catch (const YAML::Exception& e) {
    return YamlStatus("config " + source, e);
  }
  return c;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config ", path, ": cannot open file"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), path);
}

namespace {
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
}  // namespace

void ApplyProviderEnvironment(DaemonConfig& c) {
  struct Known {
    const char* kind;
    const char* key_env;
    const char* url_env;
  };
  for (const Known& k : {Known{"anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"},
                         Known{"openai", "OPENAI_API_KEY", "OPENAI_BASE_URL"},
                         Known{"gemini", "GEMINI_API_KEY", "GEMINI_BASE_URL"}}) {
    auto it = c.providers.find(k.kind);
    if (it == c.providers.end() && !Env(k.key_env).empty()) {
      ProviderConfig p;
      p.name = k.kind;
      p.kind = k.kind;
      p.api_key_env = k.key_env;
      p.model = p.kind == std::string("anthropic") ? "claude-sonnet-4-5"
                : p.kind == std::string("gemini")  ? "gemini-2.5-flash"
                                                   : "gpt-4o";
      it = c.providers.emplace(k.kind, p).first;
    }
    if (it != c.providers.end() && it->second.base_url.empty()) {
      it->second.base_url = Env(k.url_env);
    }
  }
  for (auto& [name, p] : c.providers) {
    p.connect_timeout_s = c.http_connect_timeout_s;
    p.idle_timeout_s = c.http_idle_timeout_s;
    if (p.base_url.empty()) {
      p.base_url = p.kind == "anthropic" ? "https://api.anthropic.com"
                   : p.kind == "gemini"  ? "https://generativelanguage.googleapis.com"
                   : p.kind == "ollama"
                       ? (Env("OLLAMA_HOST").empty() ? "http://127.0.0.1:11434"
                                                     : (Env("OLLAMA_HOST").rfind("http", 0) == 0
                                                            ? Env("OLLAMA_HOST")
                                                            : "http://" + Env("OLLAMA_HOST")))
                       : "https://api.openai.com/v1";
    }
    while (!p.base_url.empty() && p.base_url.back() == '/') p.base_url.pop_back();
  }
  if (c.default_provider.empty() && !c.providers.empty()) {
    // Prefer a provider whose key is present.
    for (const auto& [name, p] : c.providers) {
      if (!ResolveApiKey(p).empty()) {
        c.default_provider = name;
        break;
      }
    }
    if (c.default_provider.empty()) c.default_provider = c.providers.begin()->first;
  }
}

std::string ResolveApiKey(const ProviderConfig& p) {
  if (!p.api_key.empty()) return p.api_key;
  if (!p.api_key_env.empty()) return Env(p.api_key_env.c_str());
  return "";
}

}  // namespace fwai

namespace fwai {

bool ApplyBoardDefaults(BoardConfig& b) {
  struct Known {
    const char* machine;
    const char* target;
    uint64_t flash_origin, flash_size, ram_origin, ram_size;
  };
  static const Known kKnown[] = {
      {"stm32vldiscovery", "stm32f100rb", 0x08000000, 128 * 1024, 0x20000000, 8 * 1024},
      {"lm3s6965evb", "lm3s6965", 0x00000000, 256 * 1024, 0x20000000, 64 * 1024},
  };
  for (const Known& k : kKnown) {
    if (b.machine == k.machine || (b.machine.empty() && b.target == k.target)) {
      if (b.target.empty()) b.target = k.target;
      if (b.flash_size == 0) {
        b.flash_origin = k.flash_origin;
        b.flash_size = k.flash_size;
      }
      if (b.ram_size == 0) {
        b.ram_origin = k.ram_origin;
        b.ram_size = k.ram_size;
      }
      if (b.ota_slot_size == 0) b.ota_slot_size = b.flash_size / 2;
      return true;
    }
  }
  if (b.ota_slot_size == 0) b.ota_slot_size = b.flash_size / 2;
  return b.flash_size != 0;
}

}  // namespace fwai
