// minisign signatures (https://jedisct1.github.io/minisign/): Ed25519 over
// the BLAKE2b-512 of the file ("ED", what minisign writes by default), plus
// a global signature over the signature and its trusted comment. What this
// writes `minisign -Vm FILE -P KEY` verifies, and what minisign writes this
// verifies (legacy "Ed" signatures of the whole file too). Pure computation
// on bytes (libsodium).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fwai::minisign {

struct PublicKey {
  std::string key_id;  // 8 bytes, as stored
  std::string pk;      // 32 bytes
  // The id as minisign prints it (16 upper-case hex digits).
  std::string KeyIdHex() const;
  // The base64 line of a .pub file.
  std::string Base64() const;
};

struct SecretKey {
  std::string key_id;  // 8 bytes
  std::string sk;      // 64 bytes: seed and public key
};

// A .pub file's contents, or its base64 line alone.
[[nodiscard]] absl::StatusOr<PublicKey> ParsePublicKey(std::string_view text);
// A .key file's contents; `password` is asked for only when the key is
// encrypted (scrypt, as minisign -G without -W writes it).
[[nodiscard]] absl::StatusOr<SecretKey> ParseSecretKey(
    std::string_view text, const std::function<absl::StatusOr<std::string>()>& password);
// A new key pair (an unencrypted .key file's contents, and the .pub file's).
struct KeyPairFiles {
  std::string secret_file, public_file;
  PublicKey public_key;
};
[[nodiscard]] absl::StatusOr<KeyPairFiles> GenerateKeyPair();

// The contents of a .minisig file for `message`.
[[nodiscard]] absl::StatusOr<std::string> Sign(
    const SecretKey& key, std::string_view message, std::string_view trusted_comment,
    std::string_view untrusted_comment = "signature from fwai");

struct Verified {
  std::string key_id_hex;
  std::string trusted_comment;
  bool prehashed = false;
};
// The key id a .minisig names (to choose among trusted keys).
[[nodiscard]] absl::StatusOr<std::string> SignatureKeyIdHex(std::string_view sig_file);
// Checks both signatures. PERMISSION_DENIED when they do not verify or the
// key ids differ; INVALID_ARGUMENT for a malformed file.
[[nodiscard]] absl::StatusOr<Verified> Verify(std::string_view sig_file, std::string_view message,
                                              const PublicKey& key);

}  // namespace fwai::minisign
