#include "server/hardware/firmware_image.h"

#include <elf.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fwai {

namespace fs = std::filesystem;

std::string ElfMachineName(int machine) {
  switch (machine) {
    case EM_ARM:
      return "ARM";
    case EM_386:
      return "x86";
    case EM_X86_64:
      return "x86-64";
    case EM_AARCH64:
      return "AArch64";
    case EM_RISCV:
      return "RISC-V";
    case 94:
      return "Xtensa";
    case EM_AVR:
      return "AVR";
    default:
      return absl::StrCat("machine ", machine);
  }
}

absl::StatusOr<FirmwareImage> ReadFirmwareImage(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("image ", path, ": not found or not readable"));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto img = ParseFirmwareImage(data, path);
  if (!img.ok()) return img.status();
  struct stat st {};
  if (stat(path.c_str(), &st) == 0)
    img->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return img;
}

absl::StatusOr<FirmwareImage> ParseFirmwareImage(std::string_view data, const std::string& path) {
  FirmwareImage img;
  img.path = path;
  if (data.size() < sizeof(Elf32_Ehdr) || data.compare(0, 4, ELFMAG) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image ", path, ": not an ELF file; give the .elf (the .bin and .hex are made from it)"));
  }
  if (data[EI_CLASS] != ELFCLASS32 || data[EI_DATA] != ELFDATA2LSB) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", path, ": not a 32-bit little-endian ELF (not a Cortex-M image)"));
  }
  Elf32_Ehdr eh;
  std::memcpy(&eh, data.data(), sizeof eh);
  img.machine = eh.e_machine;
  img.entry = eh.e_entry;
  if (eh.e_phoff == 0 || eh.e_phnum == 0 ||
      eh.e_phoff + uint64_t{eh.e_phnum} * sizeof(Elf32_Phdr) > data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", path, ": ELF has no program headers (not linked?)"));
  }
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf32_Phdr ph;
    std::memcpy(&ph, data.data() + eh.e_phoff + i * sizeof(Elf32_Phdr), sizeof ph);
    if (ph.p_type != PT_LOAD || ph.p_filesz == 0) continue;
    if (uint64_t{ph.p_offset} + ph.p_filesz > data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("image ", path, ": truncated ELF (segment ", i, " past the end)"));
    }
    img.segments.push_back({ph.p_paddr, ph.p_vaddr, ph.p_filesz, ph.p_memsz});
    img.bytes += ph.p_filesz;
  }
  if (img.segments.empty())
    return absl::InvalidArgumentError(absl::StrCat("image ", path, ": ELF has nothing to load"));
  // The vector table starts the lowest-addressed segment: word 0 is the
  // initial stack pointer.
  const ElfSegment* low = &img.segments[0];
  for (const auto& s : img.segments) {
    if (s.paddr < low->paddr) low = &s;
  }
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf32_Phdr ph;
    std::memcpy(&ph, data.data() + eh.e_phoff + i * sizeof(Elf32_Phdr), sizeof ph);
    if (ph.p_type == PT_LOAD && ph.p_paddr == low->paddr && ph.p_filesz >= 8) {
      std::memcpy(&img.initial_sp, data.data() + ph.p_offset, 4);
      img.has_vectors = true;
      break;
    }
  }
  return img;
}

absl::Status CheckImageFits(const FirmwareImage& img, const BoardConfig& b) {
  if (b.flash_size == 0) return absl::OkStatus();  // unknown map: nothing to check against
  const uint64_t lo = b.flash_origin, hi = b.flash_origin + b.flash_size;
  uint64_t used = 0;
  for (const auto& s : img.segments) {
    if (s.paddr < lo || s.paddr + s.filesz > hi) {
      return absl::FailedPreconditionError(
          absl::StrFormat("flash guard (fits): %s loads %u bytes at 0x%08x..0x%08x, outside %s's "
                          "flash 0x%08x..0x%08x",
                          img.path, s.filesz, s.paddr, s.paddr + s.filesz, b.id, lo, hi));
    }
    used += s.filesz;
  }
  if (used > b.flash_size) {
    return absl::FailedPreconditionError(
        absl::StrFormat("flash guard (fits): %s needs %u bytes of flash, %s has %u", img.path, used,
                        b.id, b.flash_size));
  }
  return absl::OkStatus();
}

absl::Status CheckImageTarget(const FirmwareImage& img, const BoardConfig& b) {
  if (img.machine != EM_ARM) {
    return absl::FailedPreconditionError(absl::StrCat(
        "flash guard (target): ", img.path, " is built for ", ElfMachineName(img.machine),
        ", board ", b.id, " (", b.target.empty() ? "?" : b.target, ") is an ARM Cortex-M"));
  }
  if (b.ram_size != 0 && img.has_vectors) {
    const uint64_t lo = b.ram_origin, hi = b.ram_origin + b.ram_size;
    if (img.initial_sp < lo || img.initial_sp > hi) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "flash guard (target): %s starts its stack at 0x%08x, outside %s's RAM 0x%08x..0x%08x "
          "(%s); "
          "it was linked for another part",
          img.path, img.initial_sp, b.id, lo, hi, b.target.empty() ? "?" : b.target));
    }
  }
  if (b.flash_size != 0 && (img.entry & ~1ull) != 0 &&
      ((img.entry & ~1ull) < b.flash_origin ||
       (img.entry & ~1ull) >= b.flash_origin + b.flash_size)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "flash guard (target): %s's entry point 0x%08x is outside %s's flash 0x%08x..0x%08x",
        img.path, img.entry, b.id, b.flash_origin, b.flash_origin + b.flash_size));
  }
  return absl::OkStatus();
}

std::string FindProjectRoot(const std::string& image_path) {
  std::error_code ec;
  fs::path dir = fs::absolute(image_path, ec).parent_path();
  for (int i = 0; i < 4 && !dir.empty(); ++i) {
    for (const char* marker : {"Makefile", "CMakeLists.txt", ".fwai", "platformio.ini"}) {
      if (fs::exists(dir / marker, ec)) return dir.string();
    }
    if (dir == dir.root_path()) break;
    dir = dir.parent_path();
  }
  return "";
}

absl::Status CheckImageFresh(const FirmwareImage& img, const std::string& root) {
  if (root.empty()) return absl::OkStatus();
  static const std::set<std::string> kSources = {".c", ".h", ".cc", ".cpp", ".hpp",
                                                 ".s", ".S", ".ld", ".rs",  ".ino"};
  static const std::set<std::string> kBuildFiles = {"Makefile", "CMakeLists.txt", "platformio.ini"};
  std::error_code ec;
  fs::path image_dir = fs::absolute(img.path, ec).parent_path();
  int64_t newest = 0;
  std::string newest_path;
  auto it =
      fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
  int visited = 0;
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (++visited > 20000) break;
    const auto& p = it->path();
    const std::string name = p.filename().string();
    if (it->is_directory(ec)) {
      if (name.starts_with(".") || name == "build" || name.starts_with("build-") ||
          name == "node_modules" || fs::equivalent(p, image_dir, ec)) {
        it.disable_recursion_pending();
      }
      continue;
    }
    if (!kSources.count(p.extension().string()) && !kBuildFiles.count(name)) continue;
    struct stat st {};
    if (stat(p.c_str(), &st) != 0) continue;
    int64_t m = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    if (m > newest) {
      newest = m;
      newest_path = p.string();
    }
  }
  if (newest > img.mtime_ns) {
    return absl::FailedPreconditionError(absl::StrCat("flash guard (fresh): ", newest_path,
                                                      " changed after ", img.path,
                                                      " was built; rebuild before flashing"));
  }
  return absl::OkStatus();
}

std::string BytesSha256Hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

absl::StatusOr<std::pair<std::string, int64_t>> FdSha256(int fd) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  char buf[65536];
  int64_t total = 0;
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      EVP_MD_CTX_free(ctx);
      return absl::InternalError(absl::StrCat("reading: ", std::strerror(errno)));
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx, buf, static_cast<size_t>(n));
    total += n;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return std::make_pair(hex, total);
}

absl::StatusOr<std::string> FileSha256(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  auto sha = FdSha256(fd);
  close(fd);
  if (!sha.ok()) return absl::InternalError(absl::StrCat(path, ": ", sha.status().message()));
  return sha->first;
}

}  // namespace fwai
