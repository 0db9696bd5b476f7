#include "server/auth/token_store.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

constexpr char kPrefix[] = "token/";
constexpr char kAlphabet[] = "abcdefghijkmnpqrstuvwxyz23456789";  // no look-alikes

std::string RandomChars(size_t n) {
  std::string bytes(n, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n));
  std::string out;
  for (unsigned char b : bytes) out.push_back(kAlphabet[b % 32]);
  return out;
}

std::string Sha256(const std::string& s) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d);
  return std::string(reinterpret_cast<char*>(d), sizeof d);
}

std::string When(int64_t us) { return FormatUtc(us); }

}  // namespace

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Open(Storage& storage, const Clock* clock) {
  std::unique_ptr<TokenStore> store(
      new TokenStore(storage, clock != nullptr ? *clock : SystemClock()));
  std::string end = kPrefix;
  end.back() += 1;
  absl::Status bad;
  std::map<std::string, Record> records;
  RETURN_IF_ERROR(
      storage.Scan(Cf::kMeta, kPrefix, end, [&](std::string_view k, std::string_view v) {
        auto j = nlohmann::json::parse(v, nullptr, false);
        if (!j.is_object()) {
          bad = absl::DataLossError(absl::StrCat("stored token ", std::string(k), " is damaged"));
          return true;
        }
        Record r;
        r.info.id = j.value("id", "");
        r.info.user = j.value("user", "");
        if (!ParseRole(j.value("role", "user"), &r.info.role)) r.info.role = Role::kUser;
        r.info.created_us = j.value("created_us", int64_t{0});
        r.info.expires_us = j.value("expires_us", int64_t{0});
        r.info.revoked_us = j.value("revoked_us", int64_t{0});
        r.info.created_by = j.value("created_by", "");
        r.info.note = j.value("note", "");
        std::string hex = j.value("sha256", "");
        r.secret_sha256 = absl::HexStringToBytes(hex);
        if (r.info.id.empty() || r.secret_sha256.size() != SHA256_DIGEST_LENGTH) return true;
        records[r.info.id] = r;
        return true;
      }));
  {
    MutexLock lock(&store->mu_);
    store->records_ = std::move(records);
  }
  return store;
}

absl::Status TokenStore::Save(const Record& r) {
  nlohmann::json j = {{"id", r.info.id},
                      {"user", r.info.user},
                      {"role", RoleName(r.info.role)},
                      {"created_us", r.info.created_us},
                      {"expires_us", r.info.expires_us},
                      {"revoked_us", r.info.revoked_us},
                      {"created_by", r.info.created_by},
                      {"note", r.info.note},
                      {"sha256", absl::BytesToHexString(r.secret_sha256)}};
  return storage_.Put(Cf::kMeta, kPrefix + r.info.id, j.dump(), /*sync=*/true);
}

absl::StatusOr<NewToken> TokenStore::Create(const std::string& user, Role role, int64_t ttl_s,
                                            const std::string& created_by,
                                            const std::string& note) {
  if (user.empty() || user.size() > 64 || user.find_first_of(" :/\t\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        "user: a name of 1 to 64 characters without spaces, ':' or '/'");
  }
  if (ttl_s < 0) return absl::InvalidArgumentError("expires: must not be negative");
  Record r;
  r.info.id = "tk-" + RandomChars(10);
  r.info.user = user;
  r.info.role = role;
  r.info.created_us = clock_.NowMicros();
  r.info.expires_us = ttl_s > 0 ? r.info.created_us + ttl_s * 1000000 : 0;
  r.info.created_by = created_by;
  r.info.note = note;
  std::string secret(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()), 32) != 1) {
    return absl::InternalError("no randomness for a token");
  }
  std::string secret_text;
  absl::WebSafeBase64Escape(secret, &secret_text);
  r.secret_sha256 = Sha256(secret_text);
  RETURN_IF_ERROR(Save(r));
  {
    MutexLock lock(&mu_);
    records_[r.info.id] = r;
  }
  return NewToken{absl::StrCat("fwai_", r.info.id.substr(3), "_", secret_text), r.info};
}

absl::Status TokenStore::ValidLocked(const Record& r, int64_t now_us) {
  if (r.info.revoked_us > 0) {
    return absl::UnauthenticatedError(absl::StrCat("token ", r.info.id, " was revoked at ",
                                                   When(r.info.revoked_us),
                                                   "; ask an admin for a new one"));
  }
  if (r.info.expires_us > 0 && now_us >= r.info.expires_us) {
    return absl::UnauthenticatedError(absl::StrCat("token ", r.info.id, " expired at ",
                                                   When(r.info.expires_us),
                                                   "; ask an admin for a new one"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenInfo> TokenStore::Verify(const std::string& token) {
  // fwai_<10 id chars>_<43 base64url chars>
  if (!absl::StartsWith(token, "fwai_") || token.size() != 5 + 10 + 1 + 43 || token[15] != '_') {
    return absl::UnauthenticatedError(
        "the token is malformed (expected fwai_ and 54 more characters, as fwai token create "
        "prints it)");
  }
  const std::string id = "tk-" + token.substr(5, 10);
  const std::string digest = Sha256(token.substr(16));
  MutexLock lock(&mu_);
  auto it = records_.find(id);
  // Compared even for an unknown id, so the time taken says nothing.
  const std::string& want = it != records_.end() ? it->second.secret_sha256 : digest;
  const bool same = CRYPTO_memcmp(want.data(), digest.data(), digest.size()) == 0;
  if (it == records_.end() || !same) return absl::UnauthenticatedError("the token is not valid");
  RETURN_IF_ERROR(ValidLocked(it->second, clock_.NowMicros()));
  it->second.info.last_used_us = clock_.NowMicros();
  return it->second.info;
}

absl::StatusOr<TokenInfo> TokenStore::Valid(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = records_.find(id);
  if (it == records_.end())
    return absl::UnauthenticatedError(absl::StrCat("token ", id, " no longer exists"));
  RETURN_IF_ERROR(ValidLocked(it->second, clock_.NowMicros()));
  it->second.info.last_used_us = clock_.NowMicros();
  return it->second.info;
}

absl::Status TokenStore::Revoke(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = records_.find(id);
  if (it == records_.end())
    return absl::NotFoundError(absl::StrCat("no token ", id, " (fwai token ls lists them)"));
  if (it->second.info.revoked_us > 0) return absl::OkStatus();
  Record r = it->second;
  r.info.revoked_us = clock_.NowMicros();
  RETURN_IF_ERROR(Save(r));
  it->second = r;
  return absl::OkStatus();
}

std::vector<TokenInfo> TokenStore::List() {
  MutexLock lock(&mu_);
  std::vector<TokenInfo> out;
  for (const auto& [id, r] : records_) out.push_back(r.info);
  return out;
}

}  // namespace fwai
