#include "tests/bench/register_eval.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/firmware/check_registers.h"
#include "server/firmware/register_check.h"

namespace fwai::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Mutant {
  std::string kind;
  int line = 0;  // 1-based
  std::string text;
};

// The field a macro name stands for (ST: PERIPH_REG_FIELD with a peripheral
// or group name; TI: the field's own name), or null.
const SvdField* FieldOfName(const SvdDevice& d, const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '_');
  for (const auto& p : d.peripherals) {
    for (size_t k = 1; k + 1 < parts.size(); ++k) {
      const std::string periph =
          absl::StrJoin(parts.begin(), parts.begin() + static_cast<long>(k), "_");
      if (periph != p.name && periph != p.group) continue;
      const SvdRegister* r = p.Register(parts[k]);
      if (!r) continue;
      const std::string rest =
          absl::StrJoin(parts.begin() + static_cast<long>(k) + 1, parts.end(), "_");
      if (const SvdField* f = r->Field(rest)) return f;
      if (const SvdField* f = r->Field(name)) return f;
    }
  }
  return nullptr;
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%08X", v); }

// Every single-line error the benchmark makes in `text`.
std::vector<Mutant> Mutants(const SvdDevice& d, const std::string& text) {
  static const std::regex kAddress(R"(^#define (\w+) (\w*REG)\(0x([0-9A-Fa-f]+)u?\)\s*$)");
  static const std::regex kShiftField(R"(^#define (\w+) \((\d+)u << (\d+)\)\s*$)");
  static const std::regex kHexField(R"(^#define (\w+) 0x([0-9A-Fa-f]{8})\s*$)");
  static const std::regex kPos(R"(^#define (\w+)_Pos (\d+)\s*$)");
  static const std::regex kWrite(R"(^(\s*)(\w+) (\|?=) .*;\s*$)");
  std::map<std::string, const SvdRegister*> reg_of_macro;
  std::vector<Mutant> out;
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  auto mutate = [&](size_t i, const std::string& kind, const std::string& line) {
    std::vector<std::string> copy = lines;
    copy[i] = line;
    out.push_back({kind, static_cast<int>(i) + 1, absl::StrJoin(copy, "\n")});
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    const std::string& l = lines[i];
    if (std::regex_match(l, m, kAddress)) {
      const uint64_t a = std::stoull(m[3].str(), nullptr, 16);
      const SvdPeripheral* p = d.PeripheralAt(a);
      const SvdRegister* r = p ? p->RegisterAt(a - p->base) : nullptr;
      if (!r) continue;
      reg_of_macro[m[1].str()] = r;
      auto at = [&](uint64_t addr) {
        return absl::StrCat("#define ", m[1].str(), " ", m[2].str(), "(", Hex(addr), ")");
      };
      mutate(i, "misaligned", at(a + 2));
      for (const auto& other : p->registers) {
        if (other.offset != r->offset) {
          mutate(i, "wrong-register", at(p->base + other.offset));
          break;
        }
      }
      for (uint64_t off = 0; off < p->End(); off += 4) {
        if (!p->RegisterAt(off)) {
          mutate(i, "unknown-register", at(p->base + off));
          break;
        }
      }
    } else if (std::regex_match(l, m, kShiftField) && FieldOfName(d, m[1].str())) {
      const std::string k = m[2].str(), n = m[3].str();
      const int pos = std::stoi(n);
      mutate(i, "field-position",
             absl::StrCat("#define ", m[1].str(), " (", k, "u << ", pos + 1, ")"));
      mutate(i, "field-width",
             absl::StrCat("#define ", m[1].str(), " (", std::stoul(k) * 2 + 1, "u << ", n, ")"));
    } else if (std::regex_match(l, m, kHexField)) {
      const SvdField* f = FieldOfName(d, m[1].str());
      const uint64_t v = std::stoull(m[2].str(), nullptr, 16);
      if (!f || v != f->Mask()) continue;
      mutate(i, "field-position", absl::StrCat("#define ", m[1].str(), " ", Hex(v << 1)));
      mutate(i, "field-width", absl::StrCat("#define ", m[1].str(), " ", Hex(v | (v << 1))));
    } else if (std::regex_match(l, m, kPos) && FieldOfName(d, m[1].str())) {
      mutate(i, "field-position",
             absl::StrCat("#define ", m[1].str(), "_Pos ", std::stoi(m[2].str()) + 1));
    } else if (std::regex_match(l, m, kWrite) && reg_of_macro.count(m[2].str())) {
      const SvdRegister& r = *reg_of_macro[m[2].str()];
      const uint64_t width = r.size >= 64 ? ~uint64_t{0} : (uint64_t{1} << r.size) - 1;
      const uint64_t reserved = width & ~r.FieldBits();
      if (reserved) {
        mutate(
            i, "reserved-bits",
            absl::StrCat(m[1].str(), m[2].str(), " |= (1u << ", __builtin_ctzll(reserved), ");"));
      }
      // The write sent to a register of the file with a read-only field,
      // setting that field (SPI1_SR |= TXE).
      bool done = false;
      for (const auto& [macro, reg] : reg_of_macro) {
        for (const auto& f : reg->fields) {
          if (done || (f.Writable() && reg->Writable())) continue;
          mutate(i, "read-only", absl::StrCat(m[1].str(), macro, " |= ", Hex(f.Mask()), "u;"));
          done = true;
        }
      }
    }
  }
  return out;
}

}  // namespace

RegisterEvalResult EvaluateRegisterChecks(const std::string& corpus, const std::string& svd_dir) {
  RegisterEvalResult result;
  SvdCatalog catalog({svd_dir});
  std::vector<fs::path> parts;
  for (const auto& e : fs::directory_iterator(corpus)) {
    if (e.is_directory()) parts.push_back(e.path());
  }
  std::sort(parts.begin(), parts.end());
  for (const auto& part : parts) {
    auto svd = catalog.FindForPart(part.filename().string());
    if (!svd.ok()) continue;
    auto device = catalog.Load(LocalFileAccess(), *svd);
    if (!device.ok()) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(part)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      const std::string text = ReadAll(file);
      const std::string name = (part.filename() / file.filename()).string();
      RegisterChecker clean(**device);
      clean.Check(name, text);
      ++result.clean_files;
      result.clean_lines += clean.stats().lines;
      result.clean_findings += static_cast<int>(clean.findings().size());
      for (const Mutant& m : Mutants(**device, text)) {
        RegisterChecker checker(**device);
        checker.Check(name, m.text);
        RegisterEvalKind& k = result.kinds[m.kind];
        ++k.injected;
        bool found = false;
        for (const auto& f : checker.findings()) {
          if (f.line == m.line && f.severity == "error") found = true;
          if (f.line != m.line) ++k.false_findings;
        }
        if (found) {
          ++k.found;
        } else {
          const std::vector<std::string> lines = absl::StrSplit(m.text, '\n');
          result.misses.push_back(
              absl::StrCat(name, ":", m.line, " ", m.kind, ": ", lines[m.line - 1]));
        }
      }
    }
  }
  return result;
}

}  // namespace fwai::testing
