#include "client/lib/reach.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"

namespace fwai {
namespace {

struct HostPort {
  std::string host, port;
};

// HOST:PORT or [V6]:PORT.
std::optional<HostPort> SplitTarget(const std::string& t) {
  if (!t.empty() && t[0] == '[') {
    const size_t close = t.find(']');
    if (close == std::string::npos || close + 1 >= t.size() || t[close + 1] != ':') return {};
    return HostPort{t.substr(1, close - 1), t.substr(close + 2)};
  }
  const size_t colon = t.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == t.size()) return {};
  return HostPort{t.substr(0, colon), t.substr(colon + 1)};
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// One attempt to connect to `ai` within `timeout_ms`: 0, or the errno
// (ETIMEDOUT when nothing answered in time).
int ConnectOne(const addrinfo& ai, int timeout_ms, Fd* out) {
  Fd fd(socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol));
  if (fd.get() < 0) return errno;
  if (connect(fd.get(), ai.ai_addr, ai.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd.get(), POLLOUT, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n == 0) return ETIMEDOUT;
    if (n < 0) return errno;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    if (err != 0) return err;
  }
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  out->reset(fd.release());
  return 0;
}

// A connected socket to `hp`, or why there is none ("" with `fd` set).
std::string ConnectTcp(const HostPort& hp, int timeout_ms, Fd* fd) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &res); rc != 0) {
    return absl::StrCat("the host name ", hp.host, " does not resolve (", gai_strerror(rc), ")");
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(res, freeaddrinfo);
  int last = 0;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    last = ConnectOne(*ai, timeout_ms, fd);
    if (last == 0) return "";
  }
  const std::string where = absl::StrCat(hp.host, ":", hp.port);
  if (last == ECONNREFUSED) {
    return absl::StrCat("nothing listens at ", where,
                        " (connection refused): is fwaid running there, with a listener on that "
                        "port?");
  }
  if (last == ETIMEDOUT) {
    return absl::StrCat(where, " did not answer within ", timeout_ms,
                        " ms (the host is down, or a firewall drops the connection)");
  }
  return absl::StrCat("cannot connect to ", where, ": ", std::strerror(last));
}

std::string OpenSslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    const char* reason = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += reason ? reason : buf;
  }
  return out;
}

// The TLS handshake gRPC makes, on `fd`: "" when it and the certificate's
// checks pass, else what failed and what to change.
std::string TlsProbe(int fd, const HostPort& hp, const std::string& ca_path) {
  const std::string where = absl::StrCat(hp.host, ":", hp.port);
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (!ctx) return "";
  const std::string ca_said = ca_path.empty()
                                  ? "the system's CAs (no --ca-cert or FWAI_CA_CERT was given)"
                                  : absl::StrCat("the CA in ", ca_path);
  if (!ca_path.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), ca_path.c_str(), nullptr) != 1) {
      return absl::StrCat("the CA file ", ca_path, " holds no PEM certificate (", OpenSslError(),
                          ")");
    }
  } else {
    SSL_CTX_set_default_verify_paths(ctx.get());
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), SSL_free);
  if (!ssl) return "";
  SSL_set_fd(ssl.get(), fd);
  in6_addr ip{};
  const bool is_ip = inet_pton(AF_INET, hp.host.c_str(), &ip) == 1 ||
                     inet_pton(AF_INET6, hp.host.c_str(), &ip) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl.get());
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(param, hp.host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), hp.host.c_str());
    X509_VERIFY_PARAM_set1_host(param, hp.host.c_str(), 0);
  }
  static const unsigned char kH2[] = {2, 'h', '2'};
  SSL_set_alpn_protos(ssl.get(), kH2, sizeof(kH2));
  ERR_clear_error();
  const int rc = SSL_connect(ssl.get());
  const long verify = SSL_get_verify_result(ssl.get());
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
    return absl::StrCat("fwaid's certificate at ", where, " is not issued for ", hp.host,
                        ": connect by a name it names (see `fwaid tls init --host`)");
  }
  if (verify != X509_V_OK) {
    return absl::StrCat("fwaid answered at ", where, ", but its certificate is not trusted by ",
                        ca_said, ": ", X509_verify_cert_error_string(verify),
                        ". Give the CA that issued fwaid's certificate with --ca-cert FILE or "
                        "FWAI_CA_CERT (in VS Code: the fwai.caFile setting)");
  }
  if (rc != 1) {
    const std::string why = OpenSslError();
    if (why.find("wrong version number") != std::string::npos ||
        why.find("packet length too long") != std::string::npos) {
      return absl::StrCat(where, " does not speak TLS (a tcp: listener? use tcp:", where,
                          " on the daemon's host)");
    }
    return absl::StrCat("the TLS handshake with ", where, " failed",
                        why.empty() ? " (the connection closed)" : ": " + why);
  }
  SSL_shutdown(ssl.get());
  return "";
}

}  // namespace

std::string WhyUnreachable(const DaemonAddress& addr, const Credentials& creds, int timeout_ms) {
  if (!addr.unix_path.empty()) return "";
  auto hp = SplitTarget(addr.grpc_target);
  if (!hp) return "";
  Fd fd;
  if (std::string why = ConnectTcp(*hp, timeout_ms, &fd); !why.empty()) return why;
  if (!addr.tls) return "";
  return TlsProbe(fd.get(), *hp, creds.ca_cert);
}

}  // namespace fwai
