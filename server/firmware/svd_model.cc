#include "server/firmware/svd_model.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/xml_tree.h"

namespace fwai {
namespace {

using Node = XmlNode;

absl::StatusOr<std::unique_ptr<Node>> ParseXml(std::string_view xml, const std::string& source) {
  auto root = ParseXmlTree(xml, source);
  if (!root.ok()) return root.status();
  if ((*root)->name != "device") {
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ": not a CMSIS-SVD file (its root element is <",
                                                   (*root)->name, ">, not <device>)"));
  }
  return root;
}

// What a register inherits from its device, peripheral and clusters.
struct Props {
  uint32_t size = 32;
  std::string access = "read-write";
  uint64_t reset = 0;
};

Props Inherit(const Node& n, Props p) {
  if (auto v = ParseSvdNumber(n.Get("size"))) p.size = static_cast<uint32_t>(*v);
  if (!n.Get("access").empty()) p.access = n.Get("access");
  if (auto v = ParseSvdNumber(n.Get("resetValue"))) p.reset = *v;
  return p;
}

// The index strings of a <dim> element: dimIndex ("0-3", "A-D", "a,b,c")
// or 0..dim-1.
std::vector<std::string> DimIndices(const Node& n, uint64_t dim) {
  const std::string index = n.Get("dimIndex");
  std::vector<std::string> out;
  if (!index.empty()) {
    const auto dash = index.find('-');
    if (dash != std::string::npos && index.find(',') == std::string::npos) {
      const std::string a = index.substr(0, dash), b = index.substr(dash + 1);
      int64_t from = 0, to = 0;
      if (absl::SimpleAtoi(a, &from) && absl::SimpleAtoi(b, &to)) {
        for (int64_t i = from; i <= to && out.size() < dim; ++i) out.push_back(std::to_string(i));
      } else if (a.size() == 1 && b.size() == 1) {
        for (char c = a[0]; c <= b[0] && out.size() < dim; ++c) out.push_back(std::string(1, c));
      }
    } else {
      for (auto s : absl::StrSplit(index, ',')) {
        out.push_back(std::string(absl::StripAsciiWhitespace(s)));
      }
    }
  }
  if (out.empty()) {
    for (uint64_t i = 0; i < dim; ++i) out.push_back(std::to_string(i));
  }
  out.resize(std::min<size_t>(out.size(), dim));
  return out;
}

// "CCR%s" -> CCR1, "CH[%s]" -> CH[1].
std::string DimName(const std::string& name, const std::string& index) {
  if (absl::StrContains(name, "[%s]"))
    return absl::StrReplaceAll(name, {{"[%s]", "[" + index + "]"}});
  return absl::StrReplaceAll(name, {{"%s", index}});
}

// Each element a <dim> makes: its name and its offset from the first.
struct Copy {
  std::string name;
  uint64_t delta = 0;
};

std::vector<Copy> Expand(const Node& n, const std::string& name) {
  const uint64_t dim = ParseSvdNumber(n.Get("dim")).value_or(0);
  if (dim == 0) return {{name, 0}};
  const uint64_t step = ParseSvdNumber(n.Get("dimIncrement")).value_or(0);
  std::vector<Copy> out;
  uint64_t i = 0;
  for (const auto& index : DimIndices(n, std::min<uint64_t>(dim, 4096))) {
    out.push_back({DimName(name, index), step * i++});
  }
  return out;
}

void ReadFields(const Node& reg, const Props& props, const std::string& path,
                std::vector<SvdField>& out) {
  const Node* fields = reg.Child("fields");
  if (!fields) return;
  std::map<std::string, SvdField> by_name;  // for a field's derivedFrom
  for (const Node* f : fields->Children("field")) {
    SvdField base;
    if (auto d = f->Attr("derivedFrom"); !d.empty() && by_name.count(d)) base = by_name[d];
    const std::string name = f->Get("name");
    uint64_t offset = base.bit_offset, width = base.bit_width;
    if (auto o = ParseSvdNumber(f->Get("bitOffset"))) {
      offset = *o;
      width = ParseSvdNumber(f->Get("bitWidth")).value_or(1);
    } else if (auto lsb = ParseSvdNumber(f->Get("lsb"))) {
      offset = *lsb;
      width = ParseSvdNumber(f->Get("msb")).value_or(*lsb) - *lsb + 1;
    } else if (const std::string range = f->Get("bitRange"); range.size() > 4) {
      // [msb:lsb]
      std::vector<std::string> parts = absl::StrSplit(range.substr(1, range.size() - 2), ':');
      uint64_t msb = 0, lsb2 = 0;
      if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &msb) &&
          absl::SimpleAtoi(parts[1], &lsb2) && msb >= lsb2) {
        offset = lsb2;
        width = msb - lsb2 + 1;
      }
    }
    std::string access = f->Get("access");
    if (access.empty()) access = base.access.empty() ? props.access : base.access;
    std::vector<SvdEnumValue> values = base.values;
    for (const Node* ev : f->Children("enumeratedValues")) {
      for (const Node* v : ev->Children("enumeratedValue")) {
        if (auto n = ParseSvdNumber(v->Get("value"))) values.push_back({v->Get("name"), *n});
      }
    }
    for (const auto& c : Expand(*f, name)) {
      SvdField field;
      field.name = c.name;
      field.bit_offset = static_cast<uint32_t>(offset + c.delta);
      field.bit_width = static_cast<uint32_t>(std::max<uint64_t>(1, width));
      field.access = access;
      field.values = values;
      field.path = absl::StrCat(path, "/", c.name);
      by_name[c.name] = field;
      out.push_back(std::move(field));
    }
  }
}

// Registers and clusters under `block` (a <registers> or a <cluster>),
// `offset` bytes from the peripheral's base, their names after `prefix`.
void ReadBlock(const Node& block, const Props& props, uint64_t offset, const std::string& prefix,
               const std::string& path, std::vector<SvdRegister>& out) {
  for (const auto& child : block.children) {
    const Node& n = *child;
    if (n.name == "register") {
      Props p = Inherit(n, props);
      const uint64_t at = offset + ParseSvdNumber(n.Get("addressOffset")).value_or(0);
      std::optional<SvdRegister> base;  // a copy: `out` grows below
      if (auto d = n.Attr("derivedFrom"); !d.empty()) {
        for (const auto& r : out) {
          if (r.name == prefix + d) base = r;
        }
      }
      for (const auto& c : Expand(n, n.Get("name"))) {
        SvdRegister r;
        if (base) r = *base;
        r.name = prefix + c.name;
        r.offset = at + c.delta;
        // A derived register keeps its base's size, access and reset value
        // unless it gives its own.
        const bool own = !base;
        if (own || !n.Get("size").empty()) r.size = p.size;
        if (own || !n.Get("access").empty()) r.access = p.access;
        if (own || !n.Get("resetValue").empty()) r.reset_value = p.reset;
        r.path = absl::StrCat(path, "/", c.name);
        std::vector<SvdField> fields;
        ReadFields(n, p, r.path, fields);
        if (!fields.empty() || !base) r.fields = std::move(fields);
        for (auto& f : r.fields) f.path = absl::StrCat(r.path, "/", f.name);
        out.push_back(std::move(r));
      }
    } else if (n.name == "cluster") {
      Props p = Inherit(n, props);
      const uint64_t at = offset + ParseSvdNumber(n.Get("addressOffset")).value_or(0);
      for (const auto& c : Expand(n, n.Get("name"))) {
        ReadBlock(n, p, at + c.delta, absl::StrCat(prefix, c.name, "."),
                  absl::StrCat(path, "/", c.name), out);
      }
    }
  }
}

}  // namespace

std::optional<uint64_t> ParseSvdNumber(std::string_view text) {
  std::string t(absl::StripAsciiWhitespace(std::string(text)));
  if (t.empty()) return std::nullopt;
  if (t[0] == '+') t = t.substr(1);
  uint64_t v = 0;
  auto digits = [&](std::string_view s, int base) -> std::optional<uint64_t> {
    if (s.empty()) return std::nullopt;
    uint64_t out = 0;
    for (char c : s) {
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (base == 2 && (c == 'x' || c == 'X')) d = 0;  // don't care
      if (d < 0 || d >= base) return std::nullopt;
      out = out * base + static_cast<uint64_t>(d);
    }
    return out;
  };
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) return digits(t.substr(2), 16);
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'b' || t[1] == 'B')) return digits(t.substr(2), 2);
  if (t[0] == '#') return digits(t.substr(1), 2);
  if (absl::SimpleAtoi(t, &v)) return v;
  return std::nullopt;
}

uint64_t SvdField::Mask() const {
  if (bit_width >= 64) return ~uint64_t{0};
  return ((uint64_t{1} << bit_width) - 1) << bit_offset;
}

uint64_t SvdRegister::FieldBits() const {
  if (fields.empty()) return size >= 64 ? ~uint64_t{0} : (uint64_t{1} << size) - 1;
  uint64_t bits = 0;
  for (const auto& f : fields) bits |= f.Mask();
  return bits;
}

const SvdField* SvdRegister::Field(std::string_view n) const {
  for (const auto& f : fields) {
    if (f.name == n) return &f;
  }
  return nullptr;
}

const SvdRegister* SvdPeripheral::Register(std::string_view n) const {
  for (const auto& r : registers) {
    if (r.name == n) return &r;
  }
  return nullptr;
}

const SvdRegister* SvdPeripheral::RegisterAt(uint64_t offset) const {
  for (const auto& r : registers) {
    if (offset >= r.offset && offset < r.offset + std::max<uint32_t>(1, r.size / 8)) return &r;
  }
  return nullptr;
}

uint64_t SvdPeripheral::End() const {
  uint64_t end = block_size;
  for (const auto& r : registers) end = std::max<uint64_t>(end, r.offset + r.size / 8);
  return end;
}

const SvdPeripheral* SvdDevice::Peripheral(std::string_view n) const {
  for (const auto& p : peripherals) {
    if (p.name == n) return &p;
  }
  return nullptr;
}

const SvdPeripheral* SvdDevice::PeripheralAt(uint64_t address) const {
  // Blocks may overlap (TI's FLASH_CTRL reaches into SYSCTL's): a peripheral
  // with a register at the address wins, else the nearest base below it.
  const SvdPeripheral* nearest = nullptr;
  for (const auto& p : peripherals) {
    if (address < p.base || address >= p.base + std::max<uint64_t>(1, p.End())) continue;
    if (p.RegisterAt(address - p.base)) return &p;
    if (!nearest || p.base > nearest->base) nearest = &p;
  }
  return nearest;
}

absl::StatusOr<SvdDevice> ParseSvdDevice(std::string_view xml, const std::string& source) {
  auto root = ParseXml(xml, source);
  if (!root.ok()) return root.status();
  const Node& device = **root;
  SvdDevice d;
  d.name = device.Get("name");
  d.source = source;
  if (auto w = ParseSvdNumber(device.Get("width"))) d.width = static_cast<uint32_t>(*w);
  const Props props = Inherit(device, Props{});
  const Node* peripherals = device.Child("peripherals");
  if (d.name.empty() || !peripherals) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": an SVD device needs <name> and <peripherals> (cut short?)"));
  }
  std::map<std::string, size_t> index;  // peripheral name -> position
  for (const Node* pn : peripherals->Children("peripheral")) {
    SvdPeripheral p;
    p.name = pn->Get("name");
    p.group = pn->Get("groupName");
    p.derived_from = pn->Attr("derivedFrom");
    p.base = ParseSvdNumber(pn->Get("baseAddress")).value_or(0);
    if (const Node* block = pn->Child("addressBlock")) {
      p.block_size = ParseSvdNumber(block->Get("offset")).value_or(0) +
                     ParseSvdNumber(block->Get("size")).value_or(0);
    }
    if (const Node* regs = pn->Child("registers")) {
      ReadBlock(*regs, Inherit(*pn, props), 0, "", p.name, p.registers);
    }
    index[p.name] = d.peripherals.size();
    d.peripherals.push_back(std::move(p));
  }
  // derivedFrom: the base's registers (re-pathed), its own kept over them;
  // chains resolved in order, a cycle left as it is.
  for (auto& p : d.peripherals) {
    std::set<std::string> seen = {p.name};
    std::string from = p.derived_from;
    while (!from.empty() && index.count(from) && seen.insert(from).second) {
      const SvdPeripheral& base = d.peripherals[index[from]];
      for (const auto& r : base.registers) {
        if (p.Register(r.name)) continue;
        SvdRegister copy = r;
        copy.path = absl::StrCat(p.name, r.path.substr(base.name.size()));
        for (auto& f : copy.fields) f.path = absl::StrCat(copy.path, "/", f.name);
        p.registers.push_back(std::move(copy));
      }
      if (p.block_size == 0) p.block_size = base.block_size;
      if (p.group.empty()) p.group = base.group;
      from = base.derived_from;
    }
    std::stable_sort(
        p.registers.begin(), p.registers.end(),
        [](const SvdRegister& a, const SvdRegister& b) { return a.offset < b.offset; });
  }
  return d;
}

}  // namespace fwai
