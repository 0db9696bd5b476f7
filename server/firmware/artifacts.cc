#include "server/firmware/artifacts.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/firmware/elf_file.h"

namespace fwai {

namespace fs = std::filesystem;

absl::StatusOr<FileDigests> HashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  EVP_MD_CTX* c256 = EVP_MD_CTX_new();
  EVP_MD_CTX* c1 = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c256, EVP_sha256(), nullptr);
  EVP_DigestInit_ex(c1, EVP_sha1(), nullptr);
  FileDigests d;
  char buf[65536];
  while (in) {
    in.read(buf, sizeof buf);
    if (in.gcount() > 0) {
      EVP_DigestUpdate(c256, buf, static_cast<size_t>(in.gcount()));
      EVP_DigestUpdate(c1, buf, static_cast<size_t>(in.gcount()));
      d.bytes += static_cast<uint64_t>(in.gcount());
    }
  }
  auto hex = [](EVP_MD_CTX* c) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    std::string out;
    for (unsigned i = 0; i < len; ++i) absl::StrAppendFormat(&out, "%02x", md[i]);
    return out;
  };
  d.sha256 = hex(c256);
  d.sha1 = hex(c1);
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return d;
}

FileDigests HashBytes(std::string_view bytes) {
  FileDigests d;
  d.bytes = bytes.size();
  auto hex = [&](const EVP_MD* md) {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_Digest(bytes.data(), bytes.size(), out, &len, md, nullptr);
    std::string h;
    for (unsigned i = 0; i < len; ++i) absl::StrAppendFormat(&h, "%02x", out[i]);
    return h;
  };
  d.sha256 = hex(EVP_sha256());
  d.sha1 = hex(EVP_sha1());
  return d;
}

namespace {

int64_t MtimeNs(const fs::path& p) {
  struct stat st {};
  if (stat(p.c_str(), &st) != 0) return -1;
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}

std::string Rel(const fs::path& p, const std::string& root) {
  const fs::path rel = p.lexically_relative(root);
  return rel.empty() || rel.native().starts_with("..") ? p.string() : rel.string();
}

void AddWithSiblings(const fs::path& elf, const std::string& root, int64_t since_ns, bool fresh,
                     std::vector<BuildArtifact>& out) {
  const int64_t elf_time = MtimeNs(elf);
  std::vector<std::pair<fs::path, std::string>> files = {{elf, "elf"}};
  for (const auto& [ext, format] : {std::pair{".bin", "bin"}, std::pair{".hex", "hex"}}) {
    fs::path sibling = fs::path(elf).replace_extension(ext);
    std::error_code ec;
    // Made from this ELF: not older than it (a stale .bin from before is not this build's).
    if (fs::is_regular_file(sibling, ec) && MtimeNs(sibling) >= elf_time)
      files.push_back({sibling, format});
  }
  for (const auto& [p, format] : files) {
    auto d = HashFile(p.string());
    if (!d.ok()) continue;
    BuildArtifact a;
    a.abs_path = p.string();
    a.path = Rel(p, root);
    a.format = format;
    a.sha256 = d->sha256;
    a.bytes = d->bytes;
    a.fresh = fresh && MtimeNs(p) >= since_ns;
    out.push_back(std::move(a));
  }
}

}  // namespace

std::vector<BuildArtifact> FindBuildArtifacts(const std::string& root,
                                              const std::string& configured, int64_t since_ns) {
  std::vector<BuildArtifact> out;
  std::error_code ec;
  // File systems keep whole seconds on some mounts: a file of the build's first second counts.
  const int64_t since = since_ns - since_ns % 1000000000;
  if (!configured.empty()) {
    fs::path p =
        fs::path(configured).is_relative() ? fs::path(root) / configured : fs::path(configured);
    p = p.lexically_normal();
    if (fs::is_regular_file(p, ec)) {
      AddWithSiblings(p, root, since, true, out);
      return out;
    }
  }
  std::vector<std::pair<int64_t, fs::path>> elves;  // (mtime, path)
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  int visited = 0;
  for (; !ec && it != end && ++visited < 50000; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_directory(ec)) {
      if (it.depth() > 6 || name == ".git" || name == ".fwai" || name == "node_modules")
        it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    const std::string ext = it->path().extension().string();
    if (ext == ".o" || ext == ".a" || ext == ".bin" || ext == ".hex" || ext == ".su" ||
        ext == ".map" || ext == ".d")
      continue;
    const int64_t t = MtimeNs(it->path());
    if (t < 0 || !IsElfExecutable(it->path().string())) continue;
    elves.emplace_back(t, it->path());
  }
  std::sort(elves.begin(), elves.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [t, p] : elves) {
    if (t >= since) AddWithSiblings(p, root, since, true, out);
  }
  if (out.empty() && !elves.empty()) AddWithSiblings(elves.front().second, root, since, false, out);
  return out;
}

}  // namespace fwai
