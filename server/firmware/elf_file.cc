#include "server/firmware/elf_file.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"

namespace fwai {

namespace fs = std::filesystem;

bool ElfSection::alloc() const { return (flags & SHF_ALLOC) != 0; }
bool ElfSection::has_contents() const { return type != SHT_NOBITS; }

std::string ElfSection::berkeley_class() const {
  if (!alloc()) return "";
  // binutils' size: code or read-only is text, else with contents data, else bss.
  if ((flags & SHF_EXECINSTR) != 0 || (flags & SHF_WRITE) == 0) return "text";
  return has_contents() ? "data" : "bss";
}

bool IsElfExecutable(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char h[18] = {};
  if (!in.read(h, sizeof h)) return false;
  if (h[0] != 0x7f || h[1] != 'E' || h[2] != 'L' || h[3] != 'F') return false;
  const bool little = h[EI_DATA] == ELFDATA2LSB;
  const unsigned type =
      little ? (static_cast<unsigned char>(h[16]) | static_cast<unsigned char>(h[17]) << 8)
             : (static_cast<unsigned char>(h[16]) << 8 | static_cast<unsigned char>(h[17]));
  return type == ET_EXEC;
}

namespace {

struct Closer {
  int fd = -1;
  Elf* elf = nullptr;
  Dwarf* dw = nullptr;
  ~Closer() {
    if (dw) dwarf_end(dw);
    if (elf) elf_end(elf);
    if (fd >= 0) close(fd);
  }
};

std::string Absolute(const std::string& name, const std::string& dir) {
  if (name.empty() || name[0] == '/' || dir.empty())
    return fs::path(name).lexically_normal().string();
  return (fs::path(dir) / name).lexically_normal().string();
}

// Declarations by address: functions (low_pc) and variables (DW_OP_addr).
void CollectDecls(Dwarf_Die* die, std::map<uint64_t, std::pair<std::string, int>>& out, int depth) {
  if (depth > 32) return;
  Dwarf_Die child;
  if (dwarf_child(die, &child) != 0) return;
  do {
    const int tag = dwarf_tag(&child);
    uint64_t addr = 0;
    bool have = false;
    if (tag == DW_TAG_subprogram) {
      Dwarf_Addr lo;
      if (dwarf_lowpc(&child, &lo) == 0) {
        addr = lo;
        have = true;
      }
    } else if (tag == DW_TAG_variable) {
      Dwarf_Attribute attr;
      Dwarf_Op* ops = nullptr;
      size_t nops = 0;
      if (dwarf_attr(&child, DW_AT_location, &attr) && dwarf_getlocation(&attr, &ops, &nops) == 0 &&
          nops == 1 && ops[0].atom == DW_OP_addr) {
        addr = ops[0].number;
        have = true;
      }
    }
    if (have) {
      const char* file = dwarf_decl_file(&child);
      int line = 0;
      if (file && dwarf_decl_line(&child, &line) == 0 && !out.count(addr)) out[addr] = {file, line};
    }
    if (tag == DW_TAG_subprogram || tag == DW_TAG_lexical_block || tag == DW_TAG_namespace ||
        tag == DW_TAG_class_type || tag == DW_TAG_structure_type) {
      CollectDecls(&child, out, depth + 1);
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

}  // namespace

namespace {

// Where an allocated section sits in flash: the load address of the program
// header that holds it (its address if none does).
uint64_t LoadAddress(const GElf_Shdr& sh, bool has_contents, const std::vector<GElf_Phdr>& phdrs) {
  for (const auto& ph : phdrs) {
    if (sh.sh_addr >= ph.p_vaddr && sh.sh_addr < ph.p_vaddr + std::max(ph.p_memsz, uint64_t{1}) &&
        (has_contents ? sh.sh_offset >= ph.p_offset && sh.sh_offset < ph.p_offset + ph.p_filesz + 1
                      : true)) {
      return ph.p_paddr + (sh.sh_addr - ph.p_vaddr);
    }
  }
  return sh.sh_addr;
}

std::vector<GElf_Phdr> LoadSegments(Elf* elf) {
  std::vector<GElf_Phdr> phdrs;
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) == 0) {
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD) phdrs.push_back(ph);
    }
  }
  return phdrs;
}

// The NUL-separated strings of a .comment section (compiler versions).
void ReadComments(Elf_Scn* scn, std::vector<std::string>& out) {
  Elf_Data* d = elf_getdata(scn, nullptr);
  if (!d || !d->d_buf) return;
  std::string text(static_cast<const char*>(d->d_buf), d->d_size);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\0', pos);
    if (end == std::string::npos) end = text.size();
    if (end > pos) out.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
}

// What reading the sections leaves for the symbol table.
struct SectionScan {
  std::vector<std::string> names;  // by section index
  Elf_Scn* symtab = nullptr;
  GElf_Shdr symtab_hdr{};
};

absl::StatusOr<SectionScan> ReadSections(Elf* elf, const std::string& path, ElfFile& f) {
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no section name table: ", elf_errmsg(-1)));
  }
  const std::vector<GElf_Phdr> phdrs = LoadSegments(elf);
  SectionScan scan;
  scan.names.push_back("");
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh))
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad section header"));
    const char* name = elf_strptr(elf, shstrndx, sh.sh_name);
    scan.names.push_back(name ? name : "");
    if (sh.sh_type == SHT_SYMTAB) {
      scan.symtab = scn;
      scan.symtab_hdr = sh;
    }
    if (sh.sh_type == SHT_NULL) continue;
    ElfSection s;
    s.name = name ? name : "";
    s.address = sh.sh_addr;
    s.load_address = sh.sh_addr;
    s.size = sh.sh_size;
    s.flags = sh.sh_flags;
    s.type = sh.sh_type;
    if (s.alloc()) s.load_address = LoadAddress(sh, s.has_contents(), phdrs);
    if (s.name == ".comment" && s.has_contents()) ReadComments(scn, f.comments);
    f.sections.push_back(std::move(s));
  }
  return scan;
}

// nm's letter for a symbol: by its section's kind ('?' when its section is
// not in the table), lower case when local, W/V when weak.
char NmType(Elf* elf, const GElf_Sym& sym, bool function, bool in_section) {
  const int bind = GELF_ST_BIND(sym.st_info);
  char type = '?';
  if (sym.st_shndx == SHN_ABS) {
    type = 'A';
  } else if (in_section) {
    GElf_Shdr sh;
    Elf_Scn* sec = elf_getscn(elf, sym.st_shndx);
    if (sec && gelf_getshdr(sec, &sh)) {
      if (sh.sh_flags & SHF_EXECINSTR)
        type = 'T';
      else if (sh.sh_type == SHT_NOBITS)
        type = 'B';
      else if (sh.sh_flags & SHF_WRITE)
        type = 'D';
      else if (sh.sh_flags & SHF_ALLOC)
        type = 'R';
      else
        type = 'N';
    }
  }
  if (bind == STB_WEAK) return function ? 'W' : 'V';
  if (bind == STB_LOCAL && type >= 'A' && type <= 'Z' && type != 'A')
    return static_cast<char>(type - 'A' + 'a');
  return type;
}

void ReadSymbols(Elf* elf, const SectionScan& scan, ElfFile& f) {
  if (!scan.symtab || scan.symtab_hdr.sh_entsize == 0) return;
  Elf_Data* d = elf_getdata(scan.symtab, nullptr);
  const size_t n = scan.symtab_hdr.sh_size / scan.symtab_hdr.sh_entsize;
  for (size_t i = 1; d && i < n; ++i) {
    GElf_Sym sym;
    if (!gelf_getsym(d, static_cast<int>(i), &sym)) break;
    const int type = GELF_ST_TYPE(sym.st_info);
    if (sym.st_shndx == SHN_UNDEF || sym.st_size == 0 || type == STT_SECTION || type == STT_FILE)
      continue;
    const char* name = elf_strptr(elf, scan.symtab_hdr.sh_link, sym.st_name);
    ElfSymbol s;
    s.name = name ? name : "";
    s.address = sym.st_value;
    s.size = sym.st_size;
    s.function = type == STT_FUNC;
    const bool in_section = sym.st_shndx != SHN_ABS && sym.st_shndx < scan.names.size();
    if (in_section) s.section = scan.names[sym.st_shndx];
    s.type = NmType(elf, sym, s.function, in_section);
    f.symbols.push_back(std::move(s));
  }
}

// One compile unit: its absolute name, producer and source files.
ElfCompileUnit ReadUnit(Dwarf_Die* cudie) {
  ElfCompileUnit u;
  Dwarf_Attribute attr;
  const char* comp_dir =
      dwarf_attr(cudie, DW_AT_comp_dir, &attr) ? dwarf_formstring(&attr) : nullptr;
  const char* name = dwarf_diename(cudie);
  const char* producer =
      dwarf_attr(cudie, DW_AT_producer, &attr) ? dwarf_formstring(&attr) : nullptr;
  u.name = Absolute(name ? name : "", comp_dir ? comp_dir : "");
  u.producer = producer ? producer : "";
  Dwarf_Files* files = nullptr;
  size_t nfiles = 0;
  if (dwarf_getsrcfiles(cudie, &files, &nfiles) == 0) {
    std::set<std::string> seen;
    for (size_t i = 0; i < nfiles; ++i) {
      const char* fname = dwarf_filesrc(files, i, nullptr, nullptr);
      if (!fname || !*fname || std::string(fname) == "<built-in>") continue;
      std::string abs = Absolute(fname, comp_dir ? comp_dir : "");
      if (seen.insert(abs).second) u.files.push_back(abs);
    }
  }
  return u;
}

// The compile units, and each symbol's declaring file:line.
void ReadDwarf(Dwarf* dw, ElfFile& f) {
  std::map<uint64_t, std::pair<std::string, int>> decls;
  Dwarf_CU* cu = nullptr;
  Dwarf_CU* next = nullptr;
  Dwarf_Half version = 0;
  uint8_t unit_type = 0;
  Dwarf_Die cudie, subdie;
  for (cu = nullptr; dwarf_get_units(dw, cu, &next, &version, &unit_type, &cudie, &subdie) == 0;
       cu = next) {
    if (dwarf_tag(&cudie) != DW_TAG_compile_unit) continue;
    f.units.push_back(ReadUnit(&cudie));
    CollectDecls(&cudie, decls, 0);
  }
  for (auto& s : f.symbols) {
    auto it =
        decls.find(s.function && f.machine == EM_ARM ? (s.address & ~uint64_t{1}) : s.address);
    if (it == decls.end()) continue;
    s.file = it->second.first;
    s.line = it->second.second;
  }
}

}  // namespace

absl::StatusOr<ElfFile> ReadElfFile(const std::string& path, bool dwarf) {
  if (elf_version(EV_CURRENT) == EV_NONE) return absl::InternalError("libelf: version mismatch");
  Closer c;
  c.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (c.fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  c.elf = elf_begin(c.fd, ELF_C_READ_MMAP, nullptr);
  if (!c.elf || elf_kind(c.elf) != ELF_K_ELF) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not an ELF file (give the .elf the linker wrote)"));
  }
  GElf_Ehdr eh;
  if (!gelf_getehdr(c.elf, &eh))
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad ELF header: ", elf_errmsg(-1)));
  ElfFile f;
  f.path = path;
  f.machine = eh.e_machine;
  f.executable = eh.e_type == ET_EXEC;
  auto scan = ReadSections(c.elf, path, f);
  if (!scan.ok()) return scan.status();
  ReadSymbols(c.elf, *scan, f);
  if (!dwarf) return f;
  c.dw = dwarf_begin_elf(c.elf, DWARF_C_READ, nullptr);
  if (!c.dw) return f;  // no debug information: no file:line
  ReadDwarf(c.dw, f);
  return f;
}

}  // namespace fwai
