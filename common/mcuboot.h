// MCUboot images: what `imgtool sign` writes and MCUboot's bootutil reads.
//
//   header (32 bytes, padded to hdr_size) | payload | protected TLVs | TLVs
//   [padding to the slot | trailer: swap_size, swap_info, copy_done, image_ok, magic]
//
// Little-endian, MCUboot's default BOOT_MAX_ALIGN of 8. The SHA-256 TLV (0x10)
// covers header + payload + protected TLVs; the Ed25519 TLV (0x24) signs that
// digest (not the image: MCUboot's non-"pure" mode); KEYHASH (0x01) is the
// SHA-256 of the key's DER SubjectPublicKeyInfo, as imgtool writes it.
// Everything here is pure computation on bytes; no I/O but the key and ELF
// readers that take a path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fwai::mcuboot {

inline constexpr uint32_t kImageMagic = 0x96f3b83d;
inline constexpr uint16_t kTlvInfoMagic = 0x6907;
inline constexpr uint16_t kTlvProtInfoMagic = 0x6908;
inline constexpr uint16_t kTlvKeyHash = 0x01;
inline constexpr uint16_t kTlvSha256 = 0x10;
inline constexpr uint16_t kTlvEd25519 = 0x24;
inline constexpr uint16_t kTlvSecCnt = 0x50;
inline constexpr uint32_t kMaxAlign = 8;
inline constexpr size_t kHeaderSize = 32;
inline constexpr size_t kMagicSize = 16;
// The trailer bytes every swap-mode slot reserves at its end (imgtool's
// _trailer_size with 128 sectors and write size 8, no encryption).
size_t TrailerSize();

struct Version {
  uint8_t major = 0;
  uint8_t minor = 0;
  uint16_t revision = 0;
  uint32_t build = 0;
  // "1.2.3" or "1.2.3+4".
  [[nodiscard]] static absl::StatusOr<Version> Parse(std::string_view text);
  std::string ToString() const;
  // <0, 0, >0 as major, minor, revision, build compare.
  int Compare(const Version& other) const;
};

struct PackageOptions {
  Version version;
  uint32_t header_size = 0x200;
  std::string key_pem;                       // Ed25519 private key (PKCS#8 PEM); empty: hash only
  std::optional<uint32_t> security_counter;  // a protected SEC_CNT TLV
  uint32_t slot_size = 0;                    // >0: padded to the slot with a trailer (magic)
  bool confirm = false;                      // with slot_size: image_ok set (imgtool --confirm)
};

// Builds an image around `payload` (the firmware as it sits in the slot after
// the header: a flat binary).
[[nodiscard]] absl::StatusOr<std::string> Package(std::string_view payload,
                                                  const PackageOptions& options);

struct Tlv {
  uint16_t type = 0;
  bool is_protected = false;
  uint32_t offset = 0;  // of the value in the image
  std::string value;
};

enum class Flag { kUnset, kSet, kBad };
enum class Magic { kUnset, kGood, kBad };

struct Trailer {
  Magic magic = Magic::kUnset;
  Flag image_ok = Flag::kUnset;
  Flag copy_done = Flag::kUnset;
  uint8_t swap_info = 0xff;
};

struct ImageInfo {
  uint32_t load_addr = 0;
  uint16_t header_size = 0;
  uint16_t protected_tlv_size = 0;
  uint32_t image_size = 0;  // payload bytes
  uint32_t flags = 0;
  Version version;
  std::vector<Tlv> tlvs;
  uint32_t hashed_size = 0;  // header + payload + protected TLVs
  uint32_t end = 0;          // first byte after the TLV area
  std::string sha256_hex;    // the SHA-256 TLV's value ("" if none)
  std::string computed_sha256_hex;
  bool hash_ok = false;
  std::string key_hash_hex;  // the KEYHASH TLV's value ("" if none)
  bool has_signature = false;
  std::optional<uint32_t> security_counter;
  std::optional<Trailer> trailer;  // when the image is padded to a slot
};

// Parses and checks the structure and the hash. A malformed image is an
// INVALID_ARGUMENT naming the offset and the field; a wrong hash is reported
// in `hash_ok`, not as an error.
[[nodiscard]] absl::StatusOr<ImageInfo> Parse(std::string_view image);

// Checks the Ed25519 signature against `public_key_pem` (a public or private
// key). OK when the key hash matches and the signature verifies over the
// digest; otherwise the reason (no signature, other key, bad signature).
[[nodiscard]] absl::Status VerifySignature(std::string_view image, const ImageInfo& info,
                                           const std::string& public_key_pem);

// The trailer of a slot's bytes (the last TrailerSize() bytes).
Trailer ReadTrailer(std::string_view slot);
// Writes the trailer fields of a slot in place (what bootutil writes).
void WriteMagic(std::string& slot);
void WriteImageOk(std::string& slot);
void WriteCopyDone(std::string& slot);
void EraseTrailer(std::string& slot);

// The SHA-256 of the key's DER SubjectPublicKeyInfo (the KEYHASH value).
[[nodiscard]] absl::StatusOr<std::string> KeyHashHex(const std::string& key_pem);

// A firmware file as the flat binary the slot holds: an ELF's loadable
// segments by load address (gaps 0xff) or a .bin as it is. `load_addr` is the
// lowest load address (0 for a .bin).
struct FlatBinary {
  std::string bytes;
  uint64_t load_addr = 0;
};
[[nodiscard]] absl::StatusOr<FlatBinary> ReadFirmware(const std::string& path);

}  // namespace fwai::mcuboot
