#include "common/mcuboot.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"

namespace fwai::mcuboot {
namespace {

constexpr uint8_t kBootMagic[kMagicSize] = {0x77, 0xc2, 0x95, 0xf3, 0x60, 0xd2, 0xef, 0x7f,
                                            0x35, 0x52, 0x50, 0x0f, 0x2c, 0xb6, 0x79, 0x80};
constexpr uint8_t kErased = 0xff;
constexpr size_t kTlvHeader = 4;
constexpr size_t kMaxSectors = 128;
constexpr size_t kWriteSize = 8;

void Put16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>(v >> 8));
}
void Put32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t Get16(std::string_view b, size_t off) {
  return static_cast<uint16_t>(static_cast<uint8_t>(b[off]) |
                               (static_cast<uint8_t>(b[off + 1]) << 8));
}
uint32_t Get32(std::string_view b, size_t off) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[off + static_cast<size_t>(i)]);
  return v;
}

std::string Sha256(std::string_view data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return std::string(reinterpret_cast<char*>(out), sizeof out);
}

std::string Hex(std::string_view bytes) { return absl::BytesToHexString(AV(bytes)); }

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

// A private key if the PEM holds one, else a public key.
absl::StatusOr<Pkey> LoadKey(const std::string& pem, bool need_private) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  Pkey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key && !need_private) {
    BIO_reset(bio.get());
    key.reset(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  }
  if (!key) {
    return absl::InvalidArgumentError(
        need_private ? "not a PEM private key (make one with: openssl genpkey -algorithm ed25519)"
                     : "not a PEM key");
  }
  if (EVP_PKEY_id(key.get()) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(
        "the key is not an Ed25519 key (only Ed25519 signatures are supported)");
  }
  return key;
}

absl::StatusOr<std::string> PublicDer(EVP_PKEY* key) {
  unsigned char* der = nullptr;
  int n = i2d_PUBKEY(key, &der);
  if (n <= 0) return absl::InternalError("cannot encode the public key");
  std::string out(reinterpret_cast<char*>(der), static_cast<size_t>(n));
  OPENSSL_free(der);
  return out;
}

size_t MagicOff(size_t slot) { return slot - kMagicSize; }
size_t ImageOkOff(size_t slot) { return MagicOff(slot) - kMaxAlign; }
size_t CopyDoneOff(size_t slot) { return ImageOkOff(slot) - kMaxAlign; }
size_t SwapInfoOff(size_t slot) { return CopyDoneOff(slot) - kMaxAlign; }

Flag DecodeFlag(uint8_t v) {
  if (v == kErased) return Flag::kUnset;
  return v == 0x01 ? Flag::kSet : Flag::kBad;
}

void WriteFlag(std::string& slot, size_t off) {
  slot[off] = 0x01;
  for (size_t i = 1; i < kMaxAlign; ++i) slot[off + i] = static_cast<char>(kErased);
}

}  // namespace

size_t TrailerSize() { return kMaxSectors * 3 * kWriteSize + kMaxAlign * 4 + kMagicSize; }

absl::StatusOr<Version> Version::Parse(std::string_view text) {
  Version v;
  std::string_view core = text;
  std::string_view build;
  if (auto plus = text.find('+'); plus != std::string_view::npos) {
    core = text.substr(0, plus);
    build = text.substr(plus + 1);
  }
  std::vector<absl::string_view> parts = absl::StrSplit(AV(core), '.');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("version '", AV(text),
                     "': expected MAJOR.MINOR.REVISION[+BUILD] (major, minor 0..255, "
                     "revision 0..65535)"));
  };
  if (parts.empty() || parts.size() > 3) return bad();
  uint32_t n[3] = {0, 0, 0};
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!absl::SimpleAtoi(parts[i], &n[i])) return bad();
  }
  if (n[0] > 255 || n[1] > 255 || n[2] > 65535) return bad();
  uint32_t b = 0;
  if (!build.empty() && !absl::SimpleAtoi(AV(build), &b)) return bad();
  v.major = static_cast<uint8_t>(n[0]);
  v.minor = static_cast<uint8_t>(n[1]);
  v.revision = static_cast<uint16_t>(n[2]);
  v.build = b;
  return v;
}

std::string Version::ToString() const {
  std::string s = absl::StrCat(major, ".", minor, ".", revision);
  if (build != 0) absl::StrAppend(&s, "+", build);
  return s;
}

int Version::Compare(const Version& o) const {
  auto key = [](const Version& v) { return std::tuple(v.major, v.minor, v.revision, v.build); };
  if (key(*this) < key(o)) return -1;
  return key(*this) == key(o) ? 0 : 1;
}

absl::StatusOr<std::string> Package(std::string_view payload, const PackageOptions& o) {
  if (o.header_size < kHeaderSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("header size ", o.header_size, " is below the 32-byte header"));
  }
  if (payload.empty()) return absl::InvalidArgumentError("the firmware is empty");
  // Protected TLVs (hashed): the security counter, as imgtool's --security-counter.
  std::string prot;
  if (o.security_counter) {
    Put16(prot, kTlvSecCnt);
    Put16(prot, 4);
    Put32(prot, *o.security_counter);
  }
  std::string prot_area;
  if (!prot.empty()) {
    Put16(prot_area, kTlvProtInfoMagic);
    Put16(prot_area, static_cast<uint16_t>(prot.size() + 4));
    prot_area += prot;
  }
  std::string image;
  Put32(image, kImageMagic);
  Put32(image, 0);  // load address: executed in place
  Put16(image, static_cast<uint16_t>(o.header_size));
  Put16(image, static_cast<uint16_t>(prot_area.size()));
  Put32(image, static_cast<uint32_t>(payload.size()));
  Put32(image, 0);  // flags
  image.push_back(static_cast<char>(o.version.major));
  image.push_back(static_cast<char>(o.version.minor));
  Put16(image, o.version.revision);
  Put32(image, o.version.build);
  Put32(image, 0);  // _pad1
  image.resize(o.header_size, '\0');
  image.append(payload);
  image += prot_area;
  const std::string digest = Sha256(image);

  std::string tlvs;
  auto add = [&](uint16_t type, std::string_view value) {
    Put16(tlvs, type);
    Put16(tlvs, static_cast<uint16_t>(value.size()));
    tlvs.append(value);
  };
  add(kTlvSha256, digest);
  if (!o.key_pem.empty()) {
    auto key = LoadKey(o.key_pem, true);
    if (!key.ok()) return key.status();
    auto der = PublicDer(key->get());
    if (!der.ok()) return der.status();
    add(kTlvKeyHash, Sha256(*der));
    std::string sig(64, '\0');
    size_t len = sig.size();
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    bool ok =
        EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key->get()) == 1 &&
        EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                       reinterpret_cast<const unsigned char*>(digest.data()), digest.size()) == 1;
    EVP_MD_CTX_free(ctx);
    if (!ok || len != 64) return absl::InternalError("Ed25519 signing failed");
    add(kTlvEd25519, sig);
  }
  Put16(image, kTlvInfoMagic);
  Put16(image, static_cast<uint16_t>(tlvs.size() + 4));
  image += tlvs;

  if (o.slot_size > 0) {
    if (image.size() + TrailerSize() > o.slot_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the image (", image.size(), " bytes) and the slot trailer (", TrailerSize(),
                       " bytes) do not fit a slot of ", o.slot_size, " bytes"));
    }
    image.resize(o.slot_size, static_cast<char>(kErased));
    WriteMagic(image);
    if (o.confirm) WriteImageOk(image);
  }
  return image;
}

absl::StatusOr<ImageInfo> Parse(std::string_view b) {
  auto bad = [](size_t off, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a valid MCUboot image: offset 0x%x: %s", off, what));
  };
  if (b.size() < kHeaderSize)
    return bad(0, absl::StrCat("only ", b.size(), " bytes, shorter than the header"));
  if (Get32(b, 0) != kImageMagic) {
    return bad(0, absl::StrFormat("ih_magic is 0x%08x, expected 0x%08x", Get32(b, 0), kImageMagic));
  }
  ImageInfo info;
  info.load_addr = Get32(b, 4);
  info.header_size = Get16(b, 8);
  info.protected_tlv_size = Get16(b, 10);
  info.image_size = Get32(b, 12);
  info.flags = Get32(b, 16);
  info.version.major = static_cast<uint8_t>(b[20]);
  info.version.minor = static_cast<uint8_t>(b[21]);
  info.version.revision = Get16(b, 22);
  info.version.build = Get32(b, 24);
  if (info.header_size < kHeaderSize) return bad(8, "ih_hdr_size is smaller than the header");
  uint64_t off = uint64_t{info.header_size} + info.image_size;
  if (off + 4 > b.size()) return bad(12, "ih_img_size runs past the end of the file");
  auto read_area = [&](uint64_t at, uint16_t magic, bool prot) -> absl::StatusOr<uint64_t> {
    uint16_t total = Get16(b, at + 2);
    if (total < 4 || at + total > b.size())
      return bad(at + 2, "TLV area length runs past the end of the file");
    uint64_t p = at + 4;
    while (p < at + total) {
      if (p + kTlvHeader > at + total) return bad(p, "truncated TLV header");
      Tlv t;
      t.type = Get16(b, p);
      uint16_t len = Get16(b, p + 2);
      if (p + kTlvHeader + len > at + total)
        return bad(p, absl::StrFormat("TLV 0x%02x overruns its area", t.type));
      t.is_protected = prot;
      t.offset = static_cast<uint32_t>(p + kTlvHeader);
      t.value = std::string(b.substr(p + kTlvHeader, len));
      info.tlvs.push_back(std::move(t));
      p += kTlvHeader + len;
    }
    (void)magic;
    return at + total;
  };
  if (info.protected_tlv_size > 0) {
    if (Get16(b, off) != kTlvProtInfoMagic)
      return bad(off, "protected TLV area without its 0x6908 magic");
    if (Get16(b, off + 2) != info.protected_tlv_size) {
      return bad(off + 2, "protected TLV length differs from ih_protect_tlv_size");
    }
    auto end = read_area(off, kTlvProtInfoMagic, true);
    if (!end.ok()) return end.status();
    off = *end;
  }
  info.hashed_size = static_cast<uint32_t>(off);
  if (off + 4 > b.size() || Get16(b, off) != kTlvInfoMagic) {
    return bad(off, "no TLV area (magic 0x6907) after the image");
  }
  auto end = read_area(off, kTlvInfoMagic, false);
  if (!end.ok()) return end.status();
  info.end = static_cast<uint32_t>(*end);
  info.computed_sha256_hex = Hex(Sha256(b.substr(0, info.hashed_size)));
  for (const auto& t : info.tlvs) {
    if (t.type == kTlvSha256 && !t.is_protected) info.sha256_hex = Hex(t.value);
    if (t.type == kTlvKeyHash && !t.is_protected) info.key_hash_hex = Hex(t.value);
    if (t.type == kTlvEd25519 && !t.is_protected) info.has_signature = true;
    if (t.type == kTlvSecCnt && t.is_protected && t.value.size() == 4)
      info.security_counter = Get32(t.value, 0);
  }
  info.hash_ok = !info.sha256_hex.empty() && info.sha256_hex == info.computed_sha256_hex;
  // Padded to a slot: the rest is erased but for the trailer.
  if (b.size() >= info.end + TrailerSize()) {
    Trailer t = ReadTrailer(b);
    if (t.magic != Magic::kUnset || t.image_ok != Flag::kUnset) info.trailer = t;
  }
  return info;
}

absl::Status VerifySignature(std::string_view image, const ImageInfo& info,
                             const std::string& pem) {
  auto key = LoadKey(pem, false);
  if (!key.ok()) return key.status();
  if (!info.hash_ok) return absl::DataLossError("the image's SHA-256 does not match its contents");
  if (!info.has_signature)
    return absl::FailedPreconditionError("the image is not signed (no ED25519 TLV)");
  auto der = PublicDer(key->get());
  if (!der.ok()) return der.status();
  const std::string key_hash = Hex(Sha256(*der));
  if (!info.key_hash_hex.empty() && info.key_hash_hex != key_hash) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the image was signed by another key (key hash ", info.key_hash_hex.substr(0, 16),
        "…, this key ", key_hash.substr(0, 16), "…)"));
  }
  const std::string digest = Sha256(image.substr(0, info.hashed_size));
  for (const auto& t : info.tlvs) {
    if (t.type != kTlvEd25519 || t.is_protected) continue;
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    bool ok = EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, key->get()) == 1 &&
              EVP_DigestVerify(
                  ctx, reinterpret_cast<const unsigned char*>(t.value.data()), t.value.size(),
                  reinterpret_cast<const unsigned char*>(digest.data()), digest.size()) == 1;
    EVP_MD_CTX_free(ctx);
    if (ok) return absl::OkStatus();
  }
  return absl::PermissionDeniedError("the Ed25519 signature does not verify with this key");
}

Trailer ReadTrailer(std::string_view slot) {
  Trailer t;
  if (slot.size() < TrailerSize()) return t;
  std::string_view magic = slot.substr(MagicOff(slot.size()), kMagicSize);
  if (std::all_of(magic.begin(), magic.end(),
                  [](char c) { return static_cast<uint8_t>(c) == kErased; })) {
    t.magic = Magic::kUnset;
  } else {
    t.magic = std::memcmp(magic.data(), kBootMagic, kMagicSize) == 0 ? Magic::kGood : Magic::kBad;
  }
  t.image_ok = DecodeFlag(static_cast<uint8_t>(slot[ImageOkOff(slot.size())]));
  t.copy_done = DecodeFlag(static_cast<uint8_t>(slot[CopyDoneOff(slot.size())]));
  t.swap_info = static_cast<uint8_t>(slot[SwapInfoOff(slot.size())]);
  return t;
}

void WriteMagic(std::string& slot) {
  std::memcpy(slot.data() + MagicOff(slot.size()), kBootMagic, kMagicSize);
}
void WriteImageOk(std::string& slot) { WriteFlag(slot, ImageOkOff(slot.size())); }
void WriteCopyDone(std::string& slot) { WriteFlag(slot, CopyDoneOff(slot.size())); }
void EraseTrailer(std::string& slot) {
  std::fill(slot.end() - static_cast<std::ptrdiff_t>(TrailerSize()), slot.end(),
            static_cast<char>(kErased));
}

absl::StatusOr<std::string> KeyHashHex(const std::string& pem) {
  auto key = LoadKey(pem, false);
  if (!key.ok()) return key.status();
  auto der = PublicDer(key->get());
  if (!der.ok()) return der.status();
  return Hex(Sha256(*der));
}

absl::StatusOr<FlatBinary> ReadFirmware(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string data = ss.str();
  FlatBinary out;
  if (data.size() < 4 || data.compare(0, 4,
                                      "\x7f"
                                      "ELF") != 0) {
    if (data.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty file"));
    out.bytes = std::move(data);
    return out;
  }
  if (data.size() < 52 || data[4] != 1 || data[5] != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": only little-endian 32-bit ELF files are supported"));
  }
  const uint32_t phoff = Get32(data, 28);
  const uint16_t phentsize = Get16(data, 42);
  const uint16_t phnum = Get16(data, 44);
  if (phentsize < 32 || uint64_t{phoff} + uint64_t{phentsize} * phnum > data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": program headers run past the end of the file"));
  }
  struct Seg {
    uint32_t paddr, offset, filesz;
  };
  std::vector<Seg> segs;
  for (uint16_t i = 0; i < phnum; ++i) {
    size_t p = phoff + size_t{i} * phentsize;
    if (Get32(data, p) != 1) continue;  // PT_LOAD
    Seg s{Get32(data, p + 12), Get32(data, p + 4), Get32(data, p + 16)};
    if (s.filesz == 0) continue;
    if (uint64_t{s.offset} + s.filesz > data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": segment ", i, " runs past the end of the file"));
    }
    segs.push_back(s);
  }
  if (segs.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, ": no loadable segment with bytes"));
  uint32_t lo = segs[0].paddr, hi = 0;
  for (const auto& s : segs) {
    lo = std::min(lo, s.paddr);
    hi = std::max(hi, s.paddr + s.filesz);
  }
  if (hi - lo > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: loadable segments span 0x%x..0x%x, more than 64 MiB (RAM and flash mixed?)", path, lo,
        hi));
  }
  out.load_addr = lo;
  out.bytes.assign(hi - lo, static_cast<char>(kErased));
  for (const auto& s : segs)
    std::memcpy(out.bytes.data() + (s.paddr - lo), data.data() + s.offset, s.filesz);
  return out;
}

}  // namespace fwai::mcuboot
