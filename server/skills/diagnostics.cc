#include "server/skills/diagnostics.h"

#include <cctype>
#include <regex>

namespace fwai {

nlohmann::json Diagnostic::ToJson() const {
  nlohmann::json j = {{"kind", kind}, {"severity", severity}, {"message", message}};
  if (!file.empty()) j["file"] = file;
  if (line > 0) j["line"] = line;
  if (column > 0) j["column"] = column;
  if (!region.empty()) j["region"] = region;
  if (bytes > 0) j["bytes"] = bytes;
  if (!symbol.empty()) j["symbol"] = symbol;
  return j;
}

namespace {

// ld names itself by path: "/usr/bin/arm-none-eabi-ld", ".../bin/ld", "ld.lld", "collect2".
bool IsLinkerPrefix(std::string_view p) {
  std::string_view base = p.substr(p.rfind('/') == std::string_view::npos ? 0 : p.rfind('/') + 1);
  return base == "ld" || base.ends_with("-ld") || base == "ld.lld" || base == "ld.bfd" ||
         base == "ld.gold" || base == "collect2" || base == "lld";
}

}  // namespace

std::optional<Diagnostic> ParseDiagnosticLine(std::string_view raw) {
  std::string_view line = raw;
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back())))
    line.remove_suffix(1);
  if (line.empty() || line.size() > 8192) return std::nullopt;
  std::match_results<std::string_view::const_iterator> m;
  // ld: region `FLASH' overflowed by 1234 bytes
  static const std::regex kOverflow(
      R"(region [`'"]?([A-Za-z0-9_.]+)['"]? overflowed by (\d+) bytes?)");
  if (std::regex_search(line.begin(), line.end(), m, kOverflow)) {
    Diagnostic d;
    d.kind = "region_overflow";
    d.severity = "error";
    d.region = m[1].str();
    d.bytes = std::stoll(m[2].str());
    d.message = std::string(line.substr(line.find("region")));
    return d;
  }
  // ld: build/x.elf section `.text' will not fit in region `FLASH'
  static const std::regex kWillNotFit(
      R"(section [`'"]?([^'`" ]+)['"]? will not fit in region [`'"]?([A-Za-z0-9_.]+))");
  if (std::regex_search(line.begin(), line.end(), m, kWillNotFit)) {
    Diagnostic d;
    d.kind = "region_overflow";
    d.severity = "error";
    d.region = m[2].str();
    d.message = std::string(line.substr(line.find("section")));
    return d;
  }
  // file.c:(.text.main+0x10): undefined reference to `foo'
  static const std::regex kUndefined(
      R"(^(.*?):(?:\(([^)]*)\)|(\d+)):\s*undefined reference to [`'"]?([^'`"]+)['"]?)");
  if (std::regex_search(line.begin(), line.end(), m, kUndefined)) {
    Diagnostic d;
    d.kind = "linker";
    d.severity = "error";
    d.file = m[1].str();
    if (m[3].matched) d.line = std::stoi(m[3].str());
    d.symbol = m[4].str();
    d.message = "undefined reference to `" + d.symbol + "'";
    // ld prefixes the object with its own path ("ld: main.o: in function ...").
    if (auto colon = d.file.rfind(": "); colon != std::string::npos)
      d.file = d.file.substr(colon + 2);
    return d;
  }
  // file:line:col: severity: message  (gcc, clang; column optional)
  static const std::regex kCompiler(
      R"(^([^:\s][^:]*):(\d+):(?:(\d+):)?\s*(fatal error|error|warning|note):\s*(.*)$)");
  if (std::regex_match(line.begin(), line.end(), m, kCompiler)) {
    Diagnostic d;
    d.kind = "compiler";
    d.severity = m[4].str() == "fatal error" ? "error" : m[4].str();
    d.file = m[1].str();
    d.line = std::stoi(m[2].str());
    if (m[3].matched) d.column = std::stoi(m[3].str());
    d.message = m[5].str();
    return d;
  }
  // ld: cannot find -lfoo / collect2: error: ld returned 1 exit status / ld: warning: ...
  auto colon = line.find(": ");
  if (colon != std::string_view::npos && IsLinkerPrefix(line.substr(0, colon))) {
    std::string_view rest = line.substr(colon + 2);
    Diagnostic d;
    d.kind = "linker";
    d.severity = "error";
    if (rest.starts_with("warning: ")) {
      d.severity = "warning";
      rest.remove_prefix(9);
    } else if (rest.starts_with("error: ")) {
      rest.remove_prefix(7);
    } else if (rest.find("cannot find") == std::string_view::npos &&
               rest.find("multiple definition") == std::string_view::npos &&
               rest.find("cannot open") == std::string_view::npos &&
               rest.find("returned") == std::string_view::npos) {
      return std::nullopt;  // "in function ..." context lines and the like
    }
    d.message = std::string(rest);
    return d;
  }
  return std::nullopt;
}

std::vector<Diagnostic> ParseDiagnostics(std::string_view output) {
  std::vector<Diagnostic> out;
  size_t start = 0;
  while (start <= output.size()) {
    size_t nl = output.find('\n', start);
    if (nl == std::string_view::npos) nl = output.size();
    if (auto d = ParseDiagnosticLine(output.substr(start, nl - start)))
      out.push_back(std::move(*d));
    start = nl + 1;
  }
  return out;
}

}  // namespace fwai
