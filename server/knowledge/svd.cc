// CMSIS-SVD extraction.
#include <cstdlib>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/strings.h"
#include "common/xml_tree.h"
#include "server/knowledge/extract.h"

namespace fwai {
namespace {

using Node = XmlNode;

uint64_t Num(const std::string& s, uint64_t fallback = 0) {
  if (s.empty()) return fallback;
  std::string t = s;
  if (t.size() > 1 && (t[0] == '#')) return std::strtoull(t.c_str() + 1, nullptr, 2);
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'b' || t[1] == 'B'))
    return std::strtoull(t.c_str() + 2, nullptr, 2);
  return std::strtoull(t.c_str(), nullptr, 0);
}

std::string Hex(uint64_t v, int width = 8) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%0*llX", width, static_cast<unsigned long long>(v));
  return buf;
}

std::string Clean(const std::string& s) {
  std::string out;
  bool sp = false;
  for (char c : s) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      sp = true;
    } else {
      if (sp && !out.empty()) out.push_back(' ');
      sp = false;
      out.push_back(c);
    }
  }
  return out;
}

struct Defaults {
  uint64_t size = 32;
  std::string access;
  uint64_t reset = 0;
  bool has_reset = false;
};

Defaults Inherit(const Node& n, Defaults d) {
  if (!n.Get("size").empty()) d.size = Num(n.Get("size"), d.size);
  if (!n.Get("access").empty()) d.access = n.Get("access");
  if (!n.Get("resetValue").empty()) {
    d.reset = Num(n.Get("resetValue"));
    d.has_reset = true;
  }
  return d;
}

struct Context {
  const std::string device;
  std::vector<PreChunk>* out;
};

void EmitRegister(const Context& ctx, const std::string& periph, uint64_t base, uint64_t offset,
                  const Node& reg, const Defaults& inherited, const std::string& prefix,
                  std::vector<std::string>* map) {
  Defaults d = Inherit(reg, inherited);
  std::string rname = reg.Get("name");
  // dim arrays: "CCR%s" with dim 4 -> CCR0..CCR3 are summarised in one chunk.
  std::string dim = reg.Get("dim");
  std::string dim_note;
  if (!dim.empty()) {
    dim_note = absl::StrCat(" (array of ", Num(dim), ", stride ",
                            Hex(Num(reg.Get("dimIncrement")), 1), ")");
    std::string idx = reg.Get("dimIndex");
    size_t at = rname.find("%s");
    if (at != std::string::npos) rname.replace(at, 2, idx.empty() ? "[n]" : "[" + idx + "]");
  }
  const std::string full = prefix + rname;
  const uint64_t off = offset + Num(reg.Get("addressOffset"));
  const uint64_t addr = base + off;
  map->push_back(absl::StrCat(full, " @ ", Hex(addr), " (offset ", Hex(off, 2), ")"));
  std::string t =
      absl::StrCat("Register ", periph, "_", full, " (", periph, ".", full, ")", dim_note);
  std::string desc = Clean(reg.Get("description"));
  if (!desc.empty()) absl::StrAppend(&t, " — ", desc);
  absl::StrAppend(&t, "\nAddress: ", Hex(addr), " (", periph, " base ", Hex(base), " + offset ",
                  Hex(off, 2), ")");
  absl::StrAppend(&t, "\nSize: ", d.size, " bits");
  if (!d.access.empty()) absl::StrAppend(&t, ", access: ", d.access);
  if (d.has_reset)
    absl::StrAppend(&t, ", reset value: ", Hex(d.reset, static_cast<int>((d.size + 3) / 4)));
  if (const Node* fields = reg.Child("fields")) {
    absl::StrAppend(&t, "\nFields:");
    for (const auto& f : fields->children) {
      if (f->name != "field") continue;
      uint64_t lsb = 0, msb = 0;
      if (!f->Get("bitRange").empty()) {  // [msb:lsb]
        std::string r = f->Get("bitRange");
        msb = std::strtoull(r.c_str() + 1, nullptr, 10);
        size_t colon = r.find(':');
        lsb = colon == std::string::npos ? msb : std::strtoull(r.c_str() + colon + 1, nullptr, 10);
      } else if (!f->Get("lsb").empty()) {
        lsb = Num(f->Get("lsb"));
        msb = Num(f->Get("msb"));
      } else {
        lsb = Num(f->Get("bitOffset"));
        msb = lsb + Num(f->Get("bitWidth"), 1) - 1;
      }
      std::string bits =
          msb == lsb ? absl::StrCat("[", lsb, "]") : absl::StrCat("[", msb, ":", lsb, "]");
      absl::StrAppend(&t, "\n  ", f->Get("name"), " ", bits);
      std::string fd = Clean(f->Get("description"));
      if (!fd.empty()) absl::StrAppend(&t, " — ", fd);
      if (!f->Get("access").empty()) absl::StrAppend(&t, " (", f->Get("access"), ")");
      if (const Node* ev = f->Child("enumeratedValues")) {
        for (const auto& v : ev->children) {
          if (v->name != "enumeratedValue") continue;
          absl::StrAppend(&t, "\n      ", v->Get("value"), " = ", v->Get("name"));
          std::string vd = Clean(v->Get("description"));
          if (!vd.empty()) absl::StrAppend(&t, ": ", vd);
        }
      }
    }
  }
  ctx.out->push_back({{ctx.device, periph, full}, t, "register"});
}

void EmitRegisters(const Context& ctx, const std::string& periph, uint64_t base, uint64_t offset,
                   const Node& regs, const Defaults& d, const std::string& prefix,
                   std::vector<std::string>* map) {
  for (const auto& c : regs.children) {
    if (c->name == "register") {
      EmitRegister(ctx, periph, base, offset, *c, d, prefix, map);
    } else if (c->name == "cluster") {
      std::string cname = c->Get("name");
      size_t at = cname.find("%s");
      if (at != std::string::npos) cname.replace(at, 2, "[n]");
      EmitRegisters(ctx, periph, base, offset + Num(c->Get("addressOffset")), *c, Inherit(*c, d),
                    prefix + cname + "_", map);
    }
  }
}

}  // namespace

absl::StatusOr<ExtractedDoc> ExtractSvd(std::string_view name, std::string_view xml) {
  auto root = ParseXmlTree(xml, std::string(name));
  if (!root.ok()) {
    // "name:line: not well-formed XML (why)" -> "... SVD XML ...".
    return absl::InvalidArgumentError(
        absl::StrReplaceAll(root.status().message(), {{"XML (", "SVD XML ("}}));
  }
  if ((*root)->name != "device") {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(name), ": not a CMSIS-SVD file (no <device> root)"));
  }
  const Node& dev = **root;
  ExtractedDoc doc;
  doc.format = DocFormat::kSvd;
  const std::string device = dev.Get("name");
  doc.title = absl::StrCat(device, " — ", Clean(dev.Get("description")));
  const Node* periphs = dev.Child("peripherals");
  if (!periphs)
    return absl::InvalidArgumentError(absl::StrCat(AV(name), ": SVD has no <peripherals>"));
  std::map<std::string, const Node*> by_name;
  for (const auto& c : periphs->children) {
    if (c->name == "peripheral") by_name[c->Get("name")] = c.get();
  }
  Context ctx{device, &doc.prechunks};
  Defaults dev_defaults = Inherit(dev, Defaults{});
  for (const auto& c : periphs->children) {
    if (c->name != "peripheral") continue;
    const Node& per = *c;
    const std::string pname = per.Get("name");
    const uint64_t base = Num(per.Get("baseAddress"));
    const Node* src = &per;
    std::string derived;
    auto it = per.attrs.find("derivedFrom");
    if (it != per.attrs.end()) {
      derived = it->second;
      auto jt = by_name.find(derived);
      if (jt != by_name.end()) src = jt->second;
    }
    std::string desc = Clean(per.Get("description"));
    if (desc.empty() && src != &per) desc = Clean(src->Get("description"));
    std::string group = per.Get("groupName").empty() ? src->Get("groupName") : per.Get("groupName");
    std::vector<std::string> map;
    const size_t first_reg = doc.prechunks.size();
    if (const Node* regs =
            per.Child("registers") ? per.Child("registers") : src->Child("registers")) {
      EmitRegisters(ctx, pname, base, 0, *regs, Inherit(per, Inherit(*src, dev_defaults)), "",
                    &map);
    }
    std::string t = absl::StrCat("Peripheral ", pname);
    if (!group.empty()) absl::StrAppend(&t, " (group ", group, ")");
    if (!desc.empty()) absl::StrAppend(&t, " — ", desc);
    absl::StrAppend(&t, "\nDevice: ", device, "\nBase address: ", Hex(base));
    if (!derived.empty()) absl::StrAppend(&t, "\nDerived from: ", derived);
    for (const auto& irq : per.children) {
      if (irq->name == "interrupt") {
        absl::StrAppend(&t, "\nInterrupt: ", irq->Get("name"), " (IRQ ", irq->Get("value"), ")");
        std::string id = Clean(irq->Get("description"));
        if (!id.empty()) absl::StrAppend(&t, " — ", id);
      }
    }
    if (!map.empty()) {
      absl::StrAppend(&t, "\nRegisters:");
      for (const auto& m : map) absl::StrAppend(&t, "\n  ", m);
    }
    doc.prechunks.insert(doc.prechunks.begin() + first_reg,
                         PreChunk{{device, pname}, t, "register"});
  }
  if (doc.prechunks.empty())
    return absl::InvalidArgumentError(absl::StrCat(AV(name), ": SVD has no peripherals"));
  // A page with the device summary keeps the document's text searchable as a whole.
  doc.pages.push_back({0, doc.title});
  return doc;
}

}  // namespace fwai
