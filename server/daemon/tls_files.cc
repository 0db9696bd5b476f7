#include "server/daemon/tls_files.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/lab_config.h"
#include "common/paths.h"

namespace fwai {
namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;
using Bio = std::unique_ptr<BIO, Free>;

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

absl::StatusOr<Key> NewKey() {
  std::unique_ptr<EVP_PKEY_CTX, Free> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nullptr));
  EVP_PKEY* raw = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_ec_paramgen_curve_nid(ctx.get(), NID_X9_62_prime256v1) <= 0 ||
      EVP_PKEY_keygen(ctx.get(), &raw) <= 0) {
    return absl::InternalError("generating a key: " + OpenSslError());
  }
  return Key(raw);
}

absl::Status AddExt(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr)
    return absl::InternalError(absl::StrCat("certificate extension ", value, ": ", OpenSslError()));
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return absl::OkStatus();
}

// A certificate for `cn`, signed by `issuer_key` (self-signed when issuer is null).
absl::StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer,
                              EVP_PKEY* issuer_key, int days, bool ca,
                              const std::vector<std::string>& hosts, bool server, bool client,
                              const std::string& unit = "") {
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  // Negative days: a certificate that expired already (for testing a server).
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), days < 0 ? (days - 1) * 86400L : -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  if (!unit.empty()) {
    X509_NAME_add_entry_by_txt(name, "OU", MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(unit.c_str()), -1, -1, 0);
  }
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer ? issuer : cert.get();
  if (ca) {
    if (auto s = AddExt(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
        !s.ok())
      return s;
    if (auto s = AddExt(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign"); !s.ok())
      return s;
  } else {
    if (auto s = AddExt(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE"); !s.ok())
      return s;
    if (auto s =
            AddExt(cert.get(), signer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
        !s.ok())
      return s;
    std::vector<std::string> eku;
    if (server) eku.push_back("serverAuth");
    if (client) eku.push_back("clientAuth");
    if (auto s = AddExt(cert.get(), signer, NID_ext_key_usage, absl::StrJoin(eku, ",")); !s.ok())
      return s;
  }
  if (!hosts.empty()) {
    std::vector<std::string> san;
    for (const auto& h : hosts) {
      unsigned char buf[16];
      const bool ip =
          inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1;
      san.push_back(absl::StrCat(ip ? "IP:" : "DNS:", h));
    }
    if (auto s = AddExt(cert.get(), signer, NID_subject_alt_name, absl::StrJoin(san, ",")); !s.ok())
      return s;
  }
  if (auto s = AddExt(cert.get(), signer, NID_subject_key_identifier, "hash"); !s.ok()) return s;
  if (!ca && issuer) {
    if (auto s = AddExt(cert.get(), signer, NID_authority_key_identifier, "keyid:always"); !s.ok())
      return s;
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) <= 0) {
    return absl::InternalError("signing a certificate: " + OpenSslError());
  }
  return cert;
}

// Writes a new file (never over an existing one) with `mode`.
absl::Status WriteNew(const std::string& path, mode_t mode, const std::function<int(BIO*)>& write) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        path, ": ", errno == EEXIST ? "exists (not overwritten)" : std::strerror(errno)));
  }
  FILE* f = fdopen(fd, "w");
  Bio bio(BIO_new_fp(f, BIO_CLOSE));
  if (!bio || write(bio.get()) != 1)
    return absl::InternalError(absl::StrCat("writing ", path, ": ", OpenSslError()));
  return absl::OkStatus();
}

absl::Status WriteKeyAndCert(const std::string& dir, const std::string& base, EVP_PKEY* key,
                             X509* cert) {
  const std::string key_path = dir + "/" + base + ".key", cert_path = dir + "/" + base + ".pem";
  std::error_code ec;
  if (std::filesystem::exists(key_path, ec) || std::filesystem::exists(cert_path, ec)) {
    return absl::AlreadyExistsError(absl::StrCat(base, ".key or ", base, ".pem already exists in ",
                                                 dir, "; remove them first to make new ones"));
  }
  if (auto s = WriteNew(key_path, 0600,
                        [&](BIO* b) {
                          return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr,
                                                          nullptr);
                        });
      !s.ok()) {
    return s;
  }
  return WriteNew(cert_path, 0644, [&](BIO* b) { return PEM_write_bio_X509(b, cert); });
}

absl::StatusOr<Key> ReadKey(const std::string& path) {
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  EVP_PKEY* k = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (!k)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PEM private key (", OpenSslError(), ")"));
  return Key(k);
}

absl::StatusOr<Cert> ReadCert(const std::string& path) {
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (!c)
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PEM certificate (", OpenSslError(), ")"));
  return Cert(c);
}

}  // namespace

absl::Status TlsInit(const std::string& dir, const std::vector<std::string>& hosts, int days) {
  if (hosts.empty())
    return absl::InvalidArgumentError(
        "--host: at least one name or address the daemon is reached by");
  if (auto s = MakeDirs(dir, 0700); !s.ok()) return s;
  auto ca_key = NewKey();
  if (!ca_key.ok()) return ca_key.status();
  auto ca =
      MakeCert(ca_key->get(), "fwai lab CA", nullptr, nullptr, days * 4, true, {}, false, false);
  if (!ca.ok()) return ca.status();
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = MakeCert(key->get(), hosts.front(), ca->get(), ca_key->get(), days, false, hosts,
                       true, false);
  if (!cert.ok()) return cert.status();
  if (auto s = WriteKeyAndCert(dir, "ca", ca_key->get(), ca->get()); !s.ok()) return s;
  return WriteKeyAndCert(dir, "server", key->get(), cert->get());
}

absl::Status TlsIssue(const std::string& dir, const std::string& name,
                      const std::vector<std::string>& hosts, int days, bool node) {
  const char* flag = node ? "--node" : "--user";
  // Characters that would need escaping in a subject are refused, so a name
  // can never read as another attribute (",OU=...").
  if (name.empty() || name.find_first_of("/ \t,+=\\\"<>;#") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": a name without '/', spaces or any of , + = \\ \" < > ; #"));
  }
  if (name == "ca" || name == "server")
    return absl::InvalidArgumentError(absl::StrCat(flag, ": 'ca' and 'server' are taken"));
  auto ca_key = ReadKey(dir + "/ca.key");
  if (!ca_key.ok()) return ca_key.status();
  auto ca = ReadCert(dir + "/ca.pem");
  if (!ca.ok()) return ca.status();
  auto key = NewKey();
  if (!key.ok()) return key.status();
  auto cert = MakeCert(key->get(), name, ca->get(), ca_key->get(), days, false, hosts,
                       !hosts.empty(), true, node ? kLabNodeUnit : "");
  if (!cert.ok()) return cert.status();
  return WriteKeyAndCert(dir, name, key->get(), cert->get());
}

absl::Status CheckNodeCertificate(const std::string& what, const std::string& path,
                                  const std::string& node) {
  auto cert = ReadCert(path);
  if (!cert.ok())
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", cert.status().message()));
  auto entry = [&](int nid) -> std::string {
    X509_NAME* name = X509_get_subject_name(cert->get());
    const int at = X509_NAME_get_index_by_NID(name, nid, -1);
    if (at < 0) return "";
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at));
    unsigned char* utf8 = nullptr;
    const int n = ASN1_STRING_to_UTF8(&utf8, data);
    if (n < 0) return "";
    std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
    OPENSSL_free(utf8);
    return out;
  };
  const std::string cn = entry(NID_commonName), unit = entry(NID_organizationalUnitName);
  const std::string fix =
      absl::StrCat("make this node's with: fwaid tls issue DIR --node ", node, " --host NAME");
  if (unit != kLabNodeUnit) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", path, " (CN=", cn, ") is not a lab node's certificate; ", fix));
  }
  if (cn != node) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", path, " is node ", cn, "'s certificate, but lab.node is ", node,
                     ": a node joins the lab only under the name its certificate gives it; ", fix));
  }
  return absl::OkStatus();
}

absl::Status CheckTlsFiles(const std::string& cert_path, const std::string& key_path,
                           const std::string& client_ca) {
  auto cert = ReadCert(cert_path);
  if (!cert.ok())
    return absl::InvalidArgumentError(absl::StrCat("tls.cert: ", cert.status().message()));
  auto key = ReadKey(key_path);
  if (!key.ok())
    return absl::InvalidArgumentError(absl::StrCat("tls.key: ", key.status().message()));
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("tls.key: ", key_path, " is not the key of ", cert_path));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert->get())) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tls.cert: ", cert_path, " has expired"));
  }
  if (!client_ca.empty()) {
    auto ca = ReadCert(client_ca);
    if (!ca.ok())
      return absl::InvalidArgumentError(absl::StrCat("tls.client_ca: ", ca.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace fwai
