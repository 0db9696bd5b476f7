#include "common/minisign.h"

#include <sodium.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"

namespace fwai::minisign {
namespace {

constexpr char kSigAlg[] = "Ed";
constexpr char kSigAlgHashed[] = "ED";
constexpr char kKdfAlg[] = "Sc";
constexpr char kChkAlg[] = "B2";
constexpr char kUntrusted[] = "untrusted comment: ";
constexpr char kTrusted[] = "trusted comment: ";
constexpr size_t kKeyIdBytes = 8;

absl::Status Init() {
  if (sodium_init() < 0) return absl::InternalError("libsodium could not be initialised");
  return absl::OkStatus();
}

// Non-empty lines, whitespace trimmed.
std::vector<std::string> Lines(std::string_view text) {
  std::vector<std::string> out;
  for (absl::string_view l : absl::StrSplit(AV(text), '\n')) {
    std::string s(absl::StripAsciiWhitespace(l));
    if (!s.empty()) out.push_back(s);
  }
  return out;
}

absl::StatusOr<std::string> Unbase64(std::string_view what, const std::string& line) {
  std::string out;
  if (!absl::Base64Unescape(line, &out))
    return absl::InvalidArgumentError(absl::StrCat(AV(what), ": not base64"));
  return out;
}

std::string Blake2b(std::string_view data, size_t out_len) {
  std::string out(out_len, '\0');
  crypto_generichash(reinterpret_cast<unsigned char*>(out.data()), out_len,
                     reinterpret_cast<const unsigned char*>(data.data()), data.size(), nullptr, 0);
  return out;
}

std::string KeyIdHexOf(std::string_view id) {
  uint64_t v = 0;
  for (size_t i = 0; i < kKeyIdBytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(id[i])) << (8 * i);
  return absl::StrFormat("%016X", v);
}

uint64_t Le64(std::string_view b) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
  return v;
}

std::string SignDetached(std::string_view sk, std::string_view message) {
  std::string sig(crypto_sign_BYTES, '\0');
  crypto_sign_detached(reinterpret_cast<unsigned char*>(sig.data()), nullptr,
                       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
                       reinterpret_cast<const unsigned char*>(sk.data()));
  return sig;
}

bool VerifyDetached(std::string_view sig, std::string_view message, std::string_view pk) {
  return crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(sig.data()),
                                     reinterpret_cast<const unsigned char*>(message.data()),
                                     message.size(),
                                     reinterpret_cast<const unsigned char*>(pk.data())) == 0;
}

}  // namespace

std::string PublicKey::KeyIdHex() const { return KeyIdHexOf(key_id); }

std::string PublicKey::Base64() const {
  return absl::Base64Escape(absl::StrCat(kSigAlg, key_id, pk));
}

absl::StatusOr<PublicKey> ParsePublicKey(std::string_view text) {
  if (auto s = Init(); !s.ok()) return s;
  std::string b64;
  for (const auto& l : Lines(text)) {
    if (!absl::StartsWith(l, kUntrusted)) {
      b64 = l;
      break;
    }
  }
  if (b64.empty()) return absl::InvalidArgumentError("minisign public key: no key line");
  auto raw = Unbase64("minisign public key", b64);
  if (!raw.ok()) return raw.status();
  if (raw->size() != 2 + kKeyIdBytes + crypto_sign_PUBLICKEYBYTES ||
      raw->compare(0, 2, kSigAlg) != 0) {
    return absl::InvalidArgumentError(
        "minisign public key: expected an Ed25519 key (42 bytes starting with 'Ed')");
  }
  PublicKey k;
  k.key_id = raw->substr(2, kKeyIdBytes);
  k.pk = raw->substr(2 + kKeyIdBytes);
  return k;
}

absl::StatusOr<SecretKey> ParseSecretKey(
    std::string_view text, const std::function<absl::StatusOr<std::string>()>& password) {
  if (auto s = Init(); !s.ok()) return s;
  std::string b64;
  for (const auto& l : Lines(text)) {
    if (!absl::StartsWith(l, kUntrusted)) {
      b64 = l;
      break;
    }
  }
  auto raw = Unbase64("minisign secret key", b64);
  if (!raw.ok()) return raw.status();
  // sig_alg[2] kdf_alg[2] chk_alg[2] salt[32] opslimit[8] memlimit[8] keynum_sk{id[8] sk[64]
  // chk[32]}
  constexpr size_t kSalt = crypto_pwhash_scryptsalsa208sha256_SALTBYTES;
  constexpr size_t kKeynumSk = kKeyIdBytes + crypto_sign_SECRETKEYBYTES + crypto_generichash_BYTES;
  constexpr size_t kSize = 6 + kSalt + 16 + kKeynumSk;
  if (raw->size() != kSize || raw->compare(0, 2, kSigAlg) != 0 ||
      raw->compare(4, 2, kChkAlg) != 0) {
    return absl::InvalidArgumentError("minisign secret key: not an Ed25519 minisign key");
  }
  std::string keynum_sk = raw->substr(6 + kSalt + 16);
  const bool encrypted = raw->compare(2, 2, kKdfAlg) == 0;
  if (encrypted) {
    if (!password)
      return absl::FailedPreconditionError(
          "minisign secret key: encrypted, and no password was given");
    auto pwd = password();
    if (!pwd.ok()) return pwd.status();
    std::string stream(kKeynumSk, '\0');
    const std::string salt = raw->substr(6, kSalt);
    if (crypto_pwhash_scryptsalsa208sha256(
            reinterpret_cast<unsigned char*>(stream.data()), stream.size(), pwd->data(),
            pwd->size(), reinterpret_cast<const unsigned char*>(salt.data()),
            Le64(std::string_view(*raw).substr(6 + kSalt, 8)),
            static_cast<size_t>(Le64(std::string_view(*raw).substr(6 + kSalt + 8, 8)))) != 0) {
      return absl::ResourceExhaustedError(
          "minisign secret key: the key derivation ran out of memory");
    }
    for (size_t i = 0; i < kKeynumSk; ++i) keynum_sk[i] ^= stream[i];
    sodium_memzero(stream.data(), stream.size());
  } else if (raw->compare(2, 2, std::string("\0\0", 2)) != 0) {
    return absl::InvalidArgumentError("minisign secret key: unknown key derivation");
  }
  SecretKey k;
  k.key_id = keynum_sk.substr(0, kKeyIdBytes);
  k.sk = keynum_sk.substr(kKeyIdBytes, crypto_sign_SECRETKEYBYTES);
  const std::string chk = keynum_sk.substr(kKeyIdBytes + crypto_sign_SECRETKEYBYTES);
  // minisign 0.11 leaves the checksum of an unencrypted (-W) key zero.
  const bool unchecked = !encrypted && chk == std::string(crypto_generichash_BYTES, '\0');
  if (!unchecked &&
      Blake2b(absl::StrCat(kSigAlg, k.key_id, k.sk), crypto_generichash_BYTES) != chk) {
    return absl::PermissionDeniedError(encrypted ? "minisign secret key: wrong password"
                                                 : "minisign secret key: checksum mismatch");
  }
  return k;
}

absl::StatusOr<KeyPairFiles> GenerateKeyPair() {
  if (auto s = Init(); !s.ok()) return s;
  SecretKey sk;
  sk.key_id.resize(kKeyIdBytes);
  randombytes_buf(sk.key_id.data(), kKeyIdBytes);
  std::string pk(crypto_sign_PUBLICKEYBYTES, '\0');
  sk.sk.resize(crypto_sign_SECRETKEYBYTES);
  crypto_sign_keypair(reinterpret_cast<unsigned char*>(pk.data()),
                      reinterpret_cast<unsigned char*>(sk.sk.data()));
  const std::string chk =
      Blake2b(absl::StrCat(kSigAlg, sk.key_id, sk.sk), crypto_generichash_BYTES);
  std::string raw = absl::StrCat(
      kSigAlg, std::string("\0\0", 2), kChkAlg,
      std::string(crypto_pwhash_scryptsalsa208sha256_SALTBYTES + 16, '\0'), sk.key_id, sk.sk, chk);
  KeyPairFiles out;
  out.public_key.key_id = sk.key_id;
  out.public_key.pk = pk;
  out.secret_file = absl::StrCat(kUntrusted, "minisign secret key (unencrypted)\n",
                                 absl::Base64Escape(raw), "\n");
  out.public_file = absl::StrCat(kUntrusted, "minisign public key ", out.public_key.KeyIdHex(),
                                 "\n", out.public_key.Base64(), "\n");
  sodium_memzero(raw.data(), raw.size());
  return out;
}

absl::StatusOr<std::string> Sign(const SecretKey& key, std::string_view message,
                                 std::string_view trusted_comment,
                                 std::string_view untrusted_comment) {
  if (auto s = Init(); !s.ok()) return s;
  if (absl::StrContains(AV(trusted_comment), "\n") ||
      absl::StrContains(AV(untrusted_comment), "\n")) {
    return absl::InvalidArgumentError("comments are one line");
  }
  const std::string sig = SignDetached(key.sk, Blake2b(message, crypto_generichash_BYTES_MAX));
  const std::string global = SignDetached(key.sk, absl::StrCat(sig, AV(trusted_comment)));
  return absl::StrCat(kUntrusted, AV(untrusted_comment), "\n",
                      absl::Base64Escape(absl::StrCat(kSigAlgHashed, key.key_id, sig)), "\n",
                      kTrusted, AV(trusted_comment), "\n", absl::Base64Escape(global), "\n");
}

namespace {

struct ParsedSig {
  std::string alg, key_id, sig, trusted_comment, global;
};

absl::StatusOr<ParsedSig> ParseSig(std::string_view text) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(AV(text), '\n')) {
    std::string s(l);
    if (!s.empty() && s.back() == '\r') s.pop_back();
    lines.push_back(s);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.size() != 4 || !absl::StartsWith(lines[0], kUntrusted) ||
      !absl::StartsWith(lines[2], kTrusted)) {
    return absl::InvalidArgumentError(
        "minisign signature: expected 4 lines (untrusted comment, signature, trusted comment, "
        "global signature)");
  }
  auto raw = Unbase64("minisign signature", std::string(absl::StripAsciiWhitespace(lines[1])));
  if (!raw.ok()) return raw.status();
  if (raw->size() != 2 + kKeyIdBytes + crypto_sign_BYTES) {
    return absl::InvalidArgumentError(
        "minisign signature: the signature line has the wrong length");
  }
  ParsedSig p;
  p.alg = raw->substr(0, 2);
  if (p.alg != kSigAlg && p.alg != kSigAlgHashed)
    return absl::InvalidArgumentError("minisign signature: unknown algorithm");
  p.key_id = raw->substr(2, kKeyIdBytes);
  p.sig = raw->substr(2 + kKeyIdBytes);
  p.trusted_comment = std::string(absl::StripAsciiWhitespace(lines[2].substr(sizeof kTrusted - 1)));
  auto global =
      Unbase64("minisign global signature", std::string(absl::StripAsciiWhitespace(lines[3])));
  if (!global.ok()) return global.status();
  if (global->size() != crypto_sign_BYTES)
    return absl::InvalidArgumentError("minisign signature: bad global signature length");
  p.global = *global;
  return p;
}

}  // namespace

absl::StatusOr<std::string> SignatureKeyIdHex(std::string_view sig_file) {
  auto p = ParseSig(sig_file);
  if (!p.ok()) return p.status();
  return KeyIdHexOf(p->key_id);
}

absl::StatusOr<Verified> Verify(std::string_view sig_file, std::string_view message,
                                const PublicKey& key) {
  if (auto s = Init(); !s.ok()) return s;
  auto p = ParseSig(sig_file);
  if (!p.ok()) return p.status();
  if (p->key_id != key.key_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("signed with key ", KeyIdHexOf(p->key_id), ", not with key ", key.KeyIdHex()));
  }
  const bool prehashed = p->alg == kSigAlgHashed;
  const std::string signed_bytes =
      prehashed ? Blake2b(message, crypto_generichash_BYTES_MAX) : std::string(message);
  if (!VerifyDetached(p->sig, signed_bytes, key.pk)) {
    return absl::PermissionDeniedError(
        "the signature does not match the file (it was changed after signing)");
  }
  if (!VerifyDetached(p->global, absl::StrCat(p->sig, p->trusted_comment), key.pk)) {
    return absl::PermissionDeniedError("the trusted comment was changed after signing");
  }
  return Verified{key.KeyIdHex(), p->trusted_comment, prehashed};
}

}  // namespace fwai::minisign
