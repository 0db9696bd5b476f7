#include "server/firmware/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/firmware/elf_file.h"
#include "server/firmware/linker_map.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string ReadText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string KindOf(const std::string& name, const std::string& attrs) {
  const std::string n = absl::AsciiStrToLower(name);
  if (absl::StrContains(n, "flash") || absl::StrContains(n, "rom")) return "flash";
  if (absl::StrContains(n, "ram")) return "ram";
  if (absl::StrContains(attrs, "w")) return "ram";
  if (absl::StrContains(attrs, "x") || absl::StrContains(attrs, "r")) return "flash";
  return "other";
}

// A number in a linker script: 0x.., decimal, with K or M; sums and differences.
bool EvalLdNumber(std::string expr, uint64_t* out) {
  expr.erase(std::remove_if(expr.begin(), expr.end(),
                            [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
             expr.end());
  uint64_t total = 0;
  int sign = 1;
  size_t i = 0;
  if (expr.empty()) return false;
  while (i < expr.size()) {
    size_t j = i;
    while (j < expr.size() && expr[j] != '+' && expr[j] != '-') ++j;
    std::string term = expr.substr(i, j - i);
    uint64_t mult = 1;
    if (!term.empty() && (term.back() == 'K' || term.back() == 'k'))
      mult = 1024, term.pop_back();
    else if (!term.empty() && (term.back() == 'M' || term.back() == 'm'))
      mult = 1024 * 1024, term.pop_back();
    uint64_t v = 0;
    if (absl::StartsWithIgnoreCase(term, "0x")) {
      if (!absl::SimpleHexAtoi(term.substr(2), &v)) return false;
    } else if (!absl::SimpleAtoi(term, &v)) {
      return false;
    }
    total = sign > 0 ? total + v * mult : total - v * mult;
    if (j < expr.size()) sign = expr[j] == '+' ? 1 : -1;
    i = j + 1;
  }
  *out = total;
  return true;
}

const MemoryRegion* RegionAt(const std::vector<MemoryRegion>& regions, uint64_t addr) {
  for (const auto& r : regions) {
    if (r.name == "*default*") continue;
    if (addr >= r.origin && addr < r.origin + r.length) return &r;
  }
  return nullptr;
}

std::string Rel(const std::string& path, const std::string& root) {
  if (root.empty() || path.empty()) return path;
  std::error_code ec;
  const fs::path rel = fs::path(path).lexically_relative(root);
  if (rel.empty() || rel.native().starts_with("..")) return path;
  return rel.string();
}

// Stack use per function from the .su files GCC writes with -fstack-usage.
std::map<std::string, json> StackUsage(const std::vector<fs::path>& dirs,
                                       const std::set<std::string>& functions,
                                       const std::string& root, std::string* source) {
  std::map<std::string, json> out;
  std::set<std::string> seen_dirs;
  int files = 0;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (dir.empty() || !seen_dirs.insert(fs::weakly_canonical(dir, ec).string()).second) continue;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec),
        end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->is_directory(ec) &&
          (it.depth() > 4 || name == ".git" || name == ".fwai" || name == "node_modules")) {
        it.disable_recursion_pending();
        continue;
      }
      if (it->path().extension() != ".su" || !it->is_regular_file(ec)) continue;
      ++files;
      for (absl::string_view line : absl::StrSplit(ReadText(it->path()), '\n')) {
        // src/main.c:57:13:uart_putc<TAB>8<TAB>static
        std::vector<absl::string_view> cols = absl::StrSplit(line, '\t');
        if (cols.size() < 3) continue;
        std::vector<absl::string_view> loc = absl::StrSplit(cols[0], ':');
        if (loc.size() < 4) continue;
        std::string fn(loc.back());
        uint64_t bytes = 0;
        int ln = 0;
        if (!absl::SimpleAtoi(cols[1], &bytes) || !absl::SimpleAtoi(loc[1], &ln)) continue;
        if (!functions.count(fn)) continue;  // not linked in
        std::string file(loc[0]);
        if (!file.empty() && file[0] != '/')
          file = Rel((fs::path(root) / file).lexically_normal().string(), root);
        auto& e = out[fn];
        if (e.is_null() || e["bytes"].get<uint64_t>() < bytes) {
          e = {{"function", fn},
               {"file", Rel(file, root)},
               {"line", ln},
               {"bytes", bytes},
               {"qualifiers", std::string(absl::StripAsciiWhitespace(cols[2]))}};
        }
      }
    }
  }
  if (files > 0) *source = absl::StrCat(files, " .su files (-fstack-usage)");
  return out;
}

double Pct(uint64_t used, uint64_t length) {
  return length == 0
             ? 0
             : std::round(static_cast<double>(used) * 1000.0 / static_cast<double>(length)) / 10.0;
}

std::string Bytes(int64_t n) {
  std::string digits = absl::StrCat(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

std::string Signed(int64_t n) { return n > 0 ? "+" + Bytes(n) : Bytes(n); }

}  // namespace

std::vector<MemoryRegion> ParseLinkerScriptMemory(const std::string& text_in) {
  std::vector<MemoryRegion> out;
  // Comments out, then the MEMORY { ... } block.
  std::string text = std::regex_replace(text_in, std::regex(R"(/\*[\s\S]*?\*/)"), " ");
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(R"(\bMEMORY\s*\{([^}]*)\})"))) return out;
  const std::string block = m[1];
  static const std::regex kRegion(
      R"(([A-Za-z_][A-Za-z0-9_]*)\s*(?:\(\s*([!A-Za-z]*)\s*\))?\s*:\s*(?:ORIGIN|org|o)\s*=\s*([^,]+?)\s*,\s*(?:LENGTH|len|l)\s*=\s*([^\n;]+?)\s*(?:\n|;|$))");
  for (auto it = std::sregex_iterator(block.begin(), block.end(), kRegion);
       it != std::sregex_iterator(); ++it) {
    MemoryRegion r;
    r.name = (*it)[1];
    r.attributes = (*it)[2];
    if (!EvalLdNumber((*it)[3], &r.origin) || !EvalLdNumber((*it)[4], &r.length)) continue;
    r.kind = KindOf(r.name, r.attributes);
    out.push_back(r);
  }
  return out;
}

std::vector<MemoryRegion> ParseMapMemory(const std::string& text) {
  std::vector<MemoryRegion> out;
  size_t pos = text.find("Memory Configuration");
  if (pos == std::string::npos) return out;
  std::istringstream in(text.substr(pos));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "Linker script and memory map")) break;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (f.size() < 3 || f[0] == "Name" || f[0] == "*default*") continue;
    MemoryRegion r;
    r.name = f[0];
    if (!absl::StartsWith(f[1], "0x") || !absl::SimpleHexAtoi(f[1].substr(2), &r.origin)) continue;
    if (!absl::StartsWith(f[2], "0x") || !absl::SimpleHexAtoi(f[2].substr(2), &r.length)) continue;
    r.attributes = f.size() > 3 ? f[3] : "";
    r.kind = KindOf(r.name, r.attributes);
    out.push_back(r);
  }
  return out;
}

absl::StatusOr<json> AnalyzeMemory(const std::string& image, const MemoryOptions& o) {
  auto elf = ReadElfFile(image, true);
  if (!elf.ok()) return elf.status();
  return AnalyzeMemory(*elf, image, o);
}

absl::StatusOr<json> AnalyzeMemory(const ElfFile& image_elf, const std::string& image,
                                   const MemoryOptions& o) {
  const ElfFile* elf = &image_elf;
  if (!elf->executable)
    return absl::InvalidArgumentError(
        absl::StrCat(image, ": not a linked executable (an object file?)"));
  // Regions: the linker's own map, else the project's linker script, else the board.
  std::vector<MemoryRegion> regions;
  std::string regions_source;
  const std::string map = FindLinkerMap(image);
  if (!map.empty()) {
    regions = ParseMapMemory(ReadText(map));
    if (!regions.empty()) regions_source = Rel(map, o.project_root);
  }
  std::error_code ec;
  if (regions.empty() && !o.project_root.empty()) {
    std::vector<fs::path> scripts;
    fs::recursive_directory_iterator it(o.project_root,
                                        fs::directory_options::skip_permission_denied, ec),
        end;
    for (; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (it->is_directory(ec) &&
          (it.depth() > 3 || name.starts_with(".") || name == "build" || name == "node_modules")) {
        it.disable_recursion_pending();
        continue;
      }
      if ((it->path().extension() == ".ld" || it->path().extension() == ".lds") &&
          it->is_regular_file(ec)) {
        scripts.push_back(it->path());
      }
    }
    std::sort(scripts.begin(), scripts.end());
    size_t best_hits = 0;
    for (const auto& s : scripts) {
      auto r = ParseLinkerScriptMemory(ReadText(s));
      size_t hits = 0;
      for (const auto& sec : elf->sections)
        hits += sec.alloc() && sec.size > 0 && RegionAt(r, sec.address) ? 1 : 0;
      if (!r.empty() && hits > best_hits) {
        best_hits = hits;
        regions = r;
        regions_source = Rel(s.string(), o.project_root);
      }
    }
  }
  if (regions.empty() && !o.board_regions.empty()) {
    regions = o.board_regions;
    regions_source = absl::StrCat("board ", o.board);
  }
  std::map<std::string, uint64_t> region_end;  // region -> highest address used
  json sections = json::array();
  uint64_t text = 0, data = 0, bss = 0;
  for (const auto& s : elf->sections) {
    const std::string cls = s.berkeley_class();
    if (cls.empty()) continue;
    (cls == "text" ? text : cls == "data" ? data : bss) += s.size;
    if (s.size == 0) continue;
    const MemoryRegion* r = RegionAt(regions, s.address);
    const MemoryRegion* lr = s.has_contents() && s.load_address != s.address
                                 ? RegionAt(regions, s.load_address)
                                 : nullptr;
    if (r) region_end[r->name] = std::max(region_end[r->name], s.address + s.size);
    if (lr) region_end[lr->name] = std::max(region_end[lr->name], s.load_address + s.size);
    json j = {{"name", s.name},
              {"address", s.address},
              {"size", s.size},
              {"type", cls},
              {"region", r ? r->name : ""}};
    if (s.has_contents() && s.load_address != s.address) {
      j["load_address"] = s.load_address;
      j["load_region"] = lr ? lr->name : "";
    }
    sections.push_back(std::move(j));
  }
  json regions_out = json::array();
  for (const auto& r : regions) {
    const uint64_t used = region_end.count(r.name) ? region_end[r.name] - r.origin : 0;
    regions_out.push_back({{"name", r.name},
                           {"origin", r.origin},
                           {"length", r.length},
                           {"used", used},
                           {"free", r.length > used ? r.length - used : 0},
                           {"percent", Pct(used, r.length)},
                           {"kind", r.kind},
                           {"attributes", r.attributes}});
  }
  // Symbols, largest first (ties by name, for stable output).
  std::vector<const ElfSymbol*> syms;
  std::set<std::string> functions;
  for (const auto& s : elf->symbols) {
    syms.push_back(&s);
    if (s.function) functions.insert(s.name);
  }
  std::stable_sort(syms.begin(), syms.end(), [](const ElfSymbol* a, const ElfSymbol* b) {
    return a->size != b->size ? a->size > b->size : a->name < b->name;
  });
  json symbols = json::array();
  for (size_t i = 0; i < syms.size() && i < o.max_symbols; ++i) {
    const ElfSymbol& s = *syms[i];
    const uint64_t addr = s.function && elf->machine == 40 ? s.address & ~uint64_t{1} : s.address;
    const MemoryRegion* r = RegionAt(regions, addr);
    json j = {{"name", s.name},       {"address", addr},
              {"size", s.size},       {"type", std::string(1, s.type)},
              {"section", s.section}, {"region", r ? r->name : ""}};
    if (!s.file.empty()) {
      j["file"] = Rel(s.file, o.project_root);
      j["line"] = s.line;
    }
    symbols.push_back(std::move(j));
  }
  std::string stack_source;
  std::vector<fs::path> su_dirs = {fs::path(image).parent_path()};
  if (!o.project_root.empty()) su_dirs.push_back(o.project_root);
  auto stack_map = StackUsage(su_dirs, functions, o.project_root, &stack_source);
  std::vector<json> stack;
  for (auto& [fn, j] : stack_map) stack.push_back(std::move(j));
  std::stable_sort(stack.begin(), stack.end(), [](const json& a, const json& b) {
    return a["bytes"].get<uint64_t>() != b["bytes"].get<uint64_t>()
               ? a["bytes"].get<uint64_t>() > b["bytes"].get<uint64_t>()
               : a["function"].get<std::string>() < b["function"].get<std::string>();
  });
  return json{
      {"image", Rel(fs::absolute(image, ec).lexically_normal().string(), o.project_root)},
      {"regions_source", regions_source},
      {"totals", {{"text", text}, {"data", data}, {"bss", bss}, {"dec", text + data + bss}}},
      {"regions", regions_out},
      {"sections", sections},
      {"symbols", symbols},
      {"symbols_total", syms.size()},
      {"stack", stack},
      {"stack_source", stack_source}};
}

json DiffMemory(const json& before, const json& after) {
  json out = {{"regions", json::array()}, {"sections", json::array()}};
  auto by_name = [](const json& list, const char* key = "name") {
    std::map<std::string, json> m;
    if (list.is_array()) {
      for (const auto& x : list) m[x.value(key, "")] = x;
    }
    return m;
  };
  auto num = [](const json& j, const char* k) -> int64_t {
    return j.is_object() && j.contains(k) ? j[k].get<int64_t>() : 0;
  };
  auto rb = by_name(before.value("regions", json::array())),
       ra = by_name(after.value("regions", json::array()));
  for (const auto& [name, r] : ra) {
    const int64_t was = rb.count(name) ? num(rb[name], "used") : 0;
    out["regions"].push_back({{"name", name},
                              {"before", was},
                              {"after", num(r, "used")},
                              {"delta", num(r, "used") - was}});
  }
  auto sb = by_name(before.value("sections", json::array())),
       sa = by_name(after.value("sections", json::array()));
  std::set<std::string> names;
  for (const auto& [n, _] : sb) names.insert(n);
  for (const auto& [n, _] : sa) names.insert(n);
  for (const auto& n : names) {
    const int64_t was = sb.count(n) ? num(sb[n], "size") : 0,
                  now = sa.count(n) ? num(sa[n], "size") : 0;
    if (was != now || !sb.count(n) || !sa.count(n)) {
      out["sections"].push_back({{"name", n},
                                 {"before", was},
                                 {"after", now},
                                 {"delta", now - was},
                                 {"change", !sb.count(n)   ? "added"
                                            : !sa.count(n) ? "removed"
                                                           : "resized"}});
    }
  }
  // Symbols: a capped list is complete only down to its smallest size.
  auto key = [](const json& s) { return s.value("name", "") + "@" + s.value("file", ""); };
  std::map<std::string, json> yb, ya;
  for (const auto& s : before.value("symbols", json::array())) yb[key(s)] = s;
  for (const auto& s : after.value("symbols", json::array())) ya[key(s)] = s;
  auto floor_of = [&](const json& r, const std::map<std::string, json>& m) -> int64_t {
    if (r.value("symbols_total", 0) <= static_cast<int64_t>(m.size())) return 0;
    int64_t f = INT64_MAX;
    for (const auto& [_, s] : m) f = std::min(f, num(s, "size"));
    return f;
  };
  const int64_t floor_before = floor_of(before, yb), floor_after = floor_of(after, ya);
  json added = json::array(), removed = json::array(), grown = json::array(),
       shrunk = json::array();
  for (const auto& [k, s] : ya) {
    auto it = yb.find(k);
    if (it == yb.end()) {
      if (num(s, "size") > floor_before)
        added.push_back({{"name", s["name"]}, {"size", s["size"]}, {"file", s.value("file", "")}});
    } else if (num(s, "size") != num(it->second, "size")) {
      json d = {{"name", s["name"]},
                {"before", it->second["size"]},
                {"after", s["size"]},
                {"delta", num(s, "size") - num(it->second, "size")}};
      (d["delta"].get<int64_t>() > 0 ? grown : shrunk).push_back(d);
    }
  }
  for (const auto& [k, s] : yb) {
    if (!ya.count(k) && num(s, "size") > floor_after)
      removed.push_back({{"name", s["name"]}, {"size", s["size"]}});
  }
  auto by_delta = [](json& list, const char* field) {
    std::sort(list.begin(), list.end(), [field](const json& a, const json& b) {
      return std::abs(a[field].get<int64_t>()) > std::abs(b[field].get<int64_t>());
    });
  };
  by_delta(added, "size");
  by_delta(removed, "size");
  by_delta(grown, "delta");
  by_delta(shrunk, "delta");
  out["symbols"] = {{"added", added}, {"removed", removed}, {"grown", grown}, {"shrunk", shrunk}};
  const json tb = before.value("totals", json::object()),
             ta = after.value("totals", json::object());
  out["totals"] = {{"text", num(ta, "text") - num(tb, "text")},
                   {"data", num(ta, "data") - num(tb, "data")},
                   {"bss", num(ta, "bss") - num(tb, "bss")}};
  return out;
}

absl::Status CheckMemoryBudget(const json& report, const json& diff, const MemoryBudget& b) {
  for (const auto& r : report.value("regions", json::array())) {
    const std::string kind = r.value("kind", "");
    const double limit = kind == "flash" ? b.flash_max_pct : kind == "ram" ? b.ram_max_pct : 0;
    const double length = static_cast<double>(r.value("length", uint64_t{0}));
    const double pct =
        length > 0 ? static_cast<double>(r.value("used", uint64_t{0})) * 100.0 / length : 0;
    if (limit > 0 && pct > limit) {
      return absl::FailedPreconditionError(absl::StrCat(
          "flash guard (memory): ", r.value("name", ""), " is ",
          pct < 1 ? absl::StrFormat("%.2f", pct) : absl::StrFormat("%.1f", pct), "% used (",
          Bytes(r.value("used", int64_t{0})), " of ", Bytes(r.value("length", int64_t{0})),
          " bytes), over the budget memory.", kind == "flash" ? "flash_max_pct " : "ram_max_pct ",
          absl::StrFormat("%g", limit)));
    }
  }
  if (b.max_growth_bytes > 0 && diff.is_object()) {
    for (const auto& r : diff.value("regions", json::array())) {
      if (r.value("delta", int64_t{0}) > b.max_growth_bytes) {
        return absl::FailedPreconditionError(absl::StrCat(
            "flash guard (memory): ", r.value("name", ""), " grew by ",
            Bytes(r.value("delta", int64_t{0})), " bytes since the previous build",
            diff.contains("against") ? absl::StrCat(" (", diff["against"].value("run_id", ""), ")")
                                     : "",
            ", over the budget memory.max_growth_bytes ", b.max_growth_bytes));
      }
    }
  }
  return absl::OkStatus();
}

std::string MemorySummaryText(const json& r, const json& diff, size_t top) {
  std::string out;
  const json t = r.value("totals", json::object());
  absl::StrAppend(&out, r.value("image", ""), ": text ", Bytes(t.value("text", int64_t{0})),
                  ", data ", Bytes(t.value("data", int64_t{0})), ", bss ",
                  Bytes(t.value("bss", int64_t{0})),
                  r.value("regions_source", "").empty()
                      ? " (no memory map: no linker map, script or board)"
                      : absl::StrCat(" (regions from ", r.value("regions_source", ""), ")"),
                  "\n");
  std::map<std::string, int64_t> region_delta;
  if (diff.is_object()) {
    for (const auto& d : diff.value("regions", json::array()))
      region_delta[d.value("name", "")] = d.value("delta", int64_t{0});
  }
  for (const auto& g : r.value("regions", json::array())) {
    const std::string name = g.value("name", "");
    absl::StrAppend(
        &out,
        absl::StrFormat("  %-10s 0x%08x  %s of %s bytes used (%.1f%%), %s free", name,
                        g.value("origin", uint64_t{0}), Bytes(g.value("used", int64_t{0})),
                        Bytes(g.value("length", int64_t{0})), g.value("percent", 0.0),
                        Bytes(g.value("free", int64_t{0}))),
        region_delta.count(name)
            ? absl::StrCat("  ", Signed(region_delta[name]), " since the previous build")
            : "",
        "\n");
  }
  out += "  sections:";
  for (const auto& s : r.value("sections", json::array())) {
    absl::StrAppend(&out, " ", s.value("name", ""), " ", Bytes(s.value("size", int64_t{0})));
  }
  out += "\n";
  const json syms = r.value("symbols", json::array());
  if (!syms.empty() && top > 0) {
    absl::StrAppend(&out, "  largest symbols (of ", r.value("symbols_total", 0), "):\n");
    for (size_t i = 0; i < syms.size() && i < top; ++i) {
      const json& s = syms[i];
      absl::StrAppend(&out,
                      absl::StrFormat("    %8s  %s  %s", Bytes(s.value("size", int64_t{0})),
                                      s.value("type", "?"), s.value("name", "")),
                      s.contains("file")
                          ? absl::StrCat("  ", s.value("file", ""), ":", s.value("line", 0))
                          : "",
                      "\n");
    }
  }
  const json stack = r.value("stack", json::array());
  if (!stack.empty() && top > 0) {
    out += "  stack use (-fstack-usage):\n";
    for (size_t i = 0; i < stack.size() && i < top; ++i) {
      const json& s = stack[i];
      absl::StrAppend(&out,
                      absl::StrFormat("    %8s  %s  %s:%d %s", Bytes(s.value("bytes", int64_t{0})),
                                      s.value("function", ""), s.value("file", ""),
                                      s.value("line", 0), s.value("qualifiers", "")),
                      "\n");
    }
  }
  if (diff.is_object()) {
    const json sy = diff.value("symbols", json::object());
    size_t shown = 0;
    for (const char* kind : {"added", "grown", "removed", "shrunk"}) {
      for (const auto& s : sy.value(kind, json::array())) {
        if (shown++ == 0) {
          absl::StrAppend(&out, "  since the previous build",
                          diff.contains("against")
                              ? absl::StrCat(" (", diff["against"].value("run_id", ""), ")")
                              : "",
                          ":\n");
        }
        if (shown > top * 2) break;
        absl::StrAppend(&out, "    ", kind, " ", s.value("name", ""), " ",
                        s.contains("delta") ? Signed(s.value("delta", int64_t{0}))
                                            : Bytes(s.value("size", int64_t{0})),
                        "\n");
      }
    }
    if (shown == 0) {
      const json tt = diff.value("totals", json::object());
      if (tt.value("text", 0) == 0 && tt.value("data", 0) == 0 && tt.value("bss", 0) == 0)
        out += "  no change since the previous build\n";
    }
  }
  return out;
}

}  // namespace fwai
