// fwaid: the fwai daemon.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/codegen/service_type.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <grpcpp/server_posix.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "common/thread_priority.h"
#include "common/utf8.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/turn_manager.h"
#include "server/api/api.h"
#include "server/api/auth_processor.h"
#include "server/api/gate.h"
#include "server/auth/identities.h"
#include "server/auth/quotas.h"
#include "server/auth/token_store.h"
#include "server/boards/board_tools.h"
#include "server/boards/boards.h"
#include "server/boards/leases.h"
#include "server/boards/local_boards.h"
#include "server/boards/watches.h"
#include "server/catalog/tool_catalog.h"
#include "server/daemon/data_dir_lock.h"
#include "server/daemon/tls_files.h"
#include "server/evidence/evidence_log.h"
#include "server/firmware/register_tools.h"
#include "server/firmware/reports.h"
#include "server/hardware/broker.h"
#include "server/knowledge/document_search_tool.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/remote_rerankers.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/vector_index.h"
#include "server/lab/etcd_client.h"
#include "server/lab/lab_boards.h"
#include "server/lab/lab_leases.h"
#include "server/lab/registry.h"
#include "server/lab/stand_ins.h"
#include "server/llm/http_client.h"
#include "server/llm/provider.h"
#include "server/mcp/mcp_manager.h"
#include "server/mcp/project_mcp.h"
#include "server/ota/ota_tool.h"
#include "server/ota/rollout.h"
#include "server/plugins/plugin_store.h"
#include "server/project/secrets.h"
#include "server/session/checkpoints.h"
#include "server/session/session_manager.h"
#include "server/session/shares.h"
#include "server/skills/run_journal.h"
#include "server/skills/runner.h"
#include "server/skills/skill_tools.h"
#include "server/storage/storage.h"
#include "server/telemetry/telemetry.h"
#include "server/tools/tool.h"

#ifndef FWAI_VERSION
#define FWAI_VERSION "0.0.0"
#endif

namespace fwai {
namespace {

// A unix socket we accept on ourselves, so each connection's peer uid is
// known (SO_PEERCRED) before it is handed to gRPC.
class UnixListener {
 public:
  UnixListener(std::string path, UnixSocketConfig access)
      : path_(std::move(path)), access_(std::move(access)) {}
  // A listening socket passed by systemd (socket activation): its path, mode
  // and group are the .socket unit's; it is neither bound nor unlinked here,
  // nor shut down (systemd keeps it for the next start).
  UnixListener(int fd, std::string path) : path_(std::move(path)), fd_(fd), adopted_(true) {}
  ~UnixListener() { Stop(); }

  absl::Status Bind() {
    if (path_.size() >= sizeof(sockaddr_un::sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat("listen unix:", path_,
                                                     ": path is too long (max ",
                                                     sizeof(sockaddr_un::sun_path) - 1, " bytes)"));
    }
    std::filesystem::path dir = std::filesystem::path(path_).parent_path();
    gid_t group = static_cast<gid_t>(-1);
    if (!access_.group.empty()) {
      auto g = LookupGroup(access_.group);
      if (!g.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("unix_socket.group: ", g.status().message()));
      group = *g;
    }
    if (!dir.empty()) {
      std::error_code ec;
      if (!std::filesystem::exists(dir, ec)) {
        // A shared socket's directory lets its group through, nobody else.
        RETURN_IF_ERROR(MakeDirs(dir.string(), group == static_cast<gid_t>(-1) ? 0700 : 0710));
        if (group != static_cast<gid_t>(-1) &&
            chown(dir.c_str(), static_cast<uid_t>(-1), group) != 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("chown ", dir.string(), ": ", std::strerror(errno)));
        }
      }
    }
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    struct stat st;
    if (lstat(path_.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::FailedPreconditionError(
            absl::StrCat("listen unix:", path_, ": exists and is not a socket"));
      }
      int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      bool alive = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
      close(probe);
      if (alive) {
        return absl::AlreadyExistsError(
            absl::StrCat("listen unix:", path_,
                         ": another fwaid is already listening there (fwai daemon stop)"));
      }
      unlink(path_.c_str());  // stale socket of a daemon that died
    }
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    mode_t old = umask(0077);
    int rc = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    umask(old);
    if (rc != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen unix:", path_, ": ", std::strerror(errno)));
    }
    // Who may connect is the file's mode and group (the peer's uid says who it is).
    if (chmod(path_.c_str(), static_cast<mode_t>(access_.mode)) != 0 ||
        (group != static_cast<gid_t>(-1) &&
         chown(path_.c_str(), static_cast<uid_t>(-1), group) != 0)) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen unix:", path_, ": setting mode/group: ", std::strerror(errno)));
    }
    if (listen(fd_, 256) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("listen unix:", path_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  void Start(grpc::Server* server, PeerRegistry* peers) {
    // accept() after poll() must not block when the connection went away between.
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
    wake_ = eventfd(0, EFD_CLOEXEC);
    thread_ = std::thread([this, server, peers] {
      while (!stopping_) {
        pollfd p[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (stopping_) break;
        if (!(p[0].revents & POLLIN)) continue;
        int c = accept4(fd_, nullptr, nullptr,
                        SOCK_CLOEXEC | SOCK_NONBLOCK);  // gRPC needs non-blocking fds
        if (c < 0) {
          if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
          if (stopping_) break;
          if (errno == EMFILE || errno == ENFILE) {
            spdlog::error("accept on {}: {}; retrying", path_, std::strerror(errno));
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
          }
          spdlog::error("accept on {}: {}", path_, std::strerror(errno));
          break;
        }
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
          close(c);
          continue;
        }
        peers->Add(c, cred.uid);
        grpc::AddInsecureChannelFromFd(server, c);
      }
    });
  }

  void Stop() {
    if (fd_ < 0) return;
    stopping_ = true;
    if (wake_ >= 0) (void)!write(wake_, "\1\0\0\0\0\0\0\0", 8);
    if (thread_.joinable()) thread_.join();
    if (wake_ >= 0) close(wake_);
    wake_ = -1;
    close(fd_);
    fd_ = -1;
    if (!adopted_) unlink(path_.c_str());
  }

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  const UnixSocketConfig access_;
  int fd_ = -1;
  const bool adopted_ = false;
  int wake_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// A TCP listening socket passed by systemd. gRPC cannot take over a listening
// socket with TLS or local credentials, so each connection accepted here is
// relayed, byte for byte (TLS stays end to end), to a private gRPC port on
// 127.0.0.1 that has the same credentials as a TCP listener fwaid binds
// itself; the client's real address is registered for the audit records.
class TcpRelay {
 public:
  TcpRelay(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  ~TcpRelay() { Stop(); }

  void Start(int target_port, PeerRegistry* peers) {
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
    wake_ = eventfd(0, EFD_CLOEXEC);
    thread_ = std::thread([this, target_port, peers] {
      while (!stopping_) {
        pollfd p[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (stopping_) break;
        if (!(p[0].revents & POLLIN)) continue;
        sockaddr_storage from{};
        socklen_t from_len = sizeof(from);
        int c = accept4(fd_, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
        if (c < 0) {
          if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
          if (errno == EMFILE || errno == ENFILE) {
            spdlog::error("accept on {}: {}; retrying", address_, std::strerror(errno));
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
          }
          spdlog::error("accept on {}: {}", address_, std::strerror(errno));
          break;
        }
        int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(static_cast<uint16_t>(target_port));
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (up < 0 || connect(up, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
          spdlog::error("relay {}: connecting to 127.0.0.1:{}: {}", address_, target_port,
                        std::strerror(errno));
          if (up >= 0) close(up);
          close(c);
          continue;
        }
        // gRPC names the relayed connection by its 127.0.0.1 source port.
        sockaddr_in local{};
        socklen_t local_len = sizeof(local);
        getsockname(up, reinterpret_cast<sockaddr*>(&local), &local_len);
        const std::string inner = absl::StrCat("ipv4:127.0.0.1:", ntohs(local.sin_port));
        peers->AddRelayed(inner, PeerString(from));
        MutexLock lock(&mu_);
        active_.push_back({c, up});
        std::thread([this, c, up, inner, peers] {
          Pipe(c, up);
          peers->RemoveRelayed(inner);
          MutexLock lock(&mu_);
          std::erase_if(active_, [c](const std::pair<int, int>& x) { return x.first == c; });
          close(c);
          close(up);
          idle_.SignalAll();
        }).detach();
      }
    });
  }

  void Stop() {
    if (fd_ < 0) return;
    stopping_ = true;
    if (wake_ >= 0) (void)!write(wake_, "\1\0\0\0\0\0\0\0", 8);
    if (thread_.joinable()) thread_.join();
    {
      // Open connections end; their threads close them and are waited for.
      MutexLock lock(&mu_);
      for (auto [a, b] : active_) {
        shutdown(a, SHUT_RDWR);
        shutdown(b, SHUT_RDWR);
      }
      while (!active_.empty()) idle_.Wait(&mu_);
    }
    if (wake_ >= 0) close(wake_);
    wake_ = -1;
    close(fd_);  // systemd keeps its own copy for the next start
    fd_ = -1;
  }

  const std::string& address() const { return address_; }

 private:
  static std::string PeerString(const sockaddr_storage& a) {
    char host[INET6_ADDRSTRLEN] = {0};
    if (a.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
      return absl::StrCat("ipv4:", host, ":", ntohs(in->sin_port));
    }
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("ipv6:[", host, "]:", ntohs(in6->sin6_port));
  }

  // Copies both ways until either side closes.
  void Pipe(int a, int b) {
    char buf[65536];
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    while (true) {
      if (poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      bool done = false;
      for (int i = 0; i < 2 && !done; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = read(p[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          done = true;
          break;
        }
        for (ssize_t off = 0; off < n;) {
          ssize_t w = send(p[1 - i].fd, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
          if (w <= 0) {
            done = true;
            break;
          }
          off += w;
        }
      }
      if (done) break;
    }
  }

  int fd_ = -1;
  const std::string address_;
  int wake_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  Mutex mu_;
  CondVar idle_;
  // (client, relay) of each open connection
  std::vector<std::pair<int, int>> active_ ABSL_GUARDED_BY(mu_);
};

// The sockets systemd passed (LISTEN_FDS), sorted by kind; their addresses as
// unix:PATH / tcp:HOST:PORT. Marked close-on-exec so no child inherits them.
struct PassedSockets {
  std::vector<std::pair<int, std::string>> unix_fds, tcp_fds;
  bool any() const { return !unix_fds.empty() || !tcp_fds.empty(); }
};

absl::StatusOr<PassedSockets> TakePassedSockets() {
  PassedSockets out;
  const int n = sd_listen_fds(/*unset_environment=*/1);
  if (n < 0) return absl::FailedPreconditionError(absl::StrCat("LISTEN_FDS: ", std::strerror(-n)));
  for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; ++fd) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("passed fd ", fd, ": ", std::strerror(errno)));
    }
    if (sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) > 0) {
      const auto* un = reinterpret_cast<const sockaddr_un*>(&a);
      std::string path = len > offsetof(sockaddr_un, sun_path) ? std::string(un->sun_path) : "";
      if (path.empty())
        return absl::FailedPreconditionError(
            absl::StrCat("passed fd ", fd, ": an unnamed or abstract unix socket"));
      out.unix_fds.emplace_back(fd, path);
    } else if (sd_is_socket_inet(fd, AF_UNSPEC, SOCK_STREAM, 1, 0) > 0) {
      char host[INET6_ADDRSTRLEN] = {0};
      int port = 0;
      if (a.ss_family == AF_INET) {
        const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
        out.tcp_fds.emplace_back(fd, absl::StrCat(host, ":", port));
      } else {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        port = ntohs(in6->sin6_port);
        out.tcp_fds.emplace_back(fd, absl::StrCat("[", host, "]:", port));
      }
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          "passed fd ", fd,
          " is not a listening stream socket (ListenStream= in the .socket unit, Accept=no)"));
    }
  }
  return out;
}

// True when every address `host` names is a loopback one.
bool IsLoopbackHost(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  bool all = true;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all = all && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all = all && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    } else {
      all = false;
    }
  }
  freeaddrinfo(res);
  return all;
}

// Credentials of a TCP listener: TLS when configured (required off
// loopback), else gRPC local credentials on loopback. Either way every call
// needs a token or a client certificate, checked by the processor.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const std::string& listen,
                                                                        const SecurityConfig& sec,
                                                                        Gate& gate) {
  const bool want_tls = absl::StartsWith(listen, "tls:");
  const std::string addr = listen.substr(4);
  const std::string host = addr.substr(0, addr.rfind(':'));
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (sec.tls.enabled()) {
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        sec.tls.key, sec.tls.cert, sec.tls.client_ca,
        static_cast<unsigned>(sec.tls.reload_interval_s));
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_identity_key_cert_pairs();
    if (!sec.tls.client_ca.empty()) {
      options.watch_root_certs();
      // A client certificate is checked when given; a token may stand instead.
      options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    creds = grpc::experimental::TlsServerCredentials(options);
  } else if (want_tls) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen ", listen,
                     ": TLS needs tls: {cert: FILE, key: FILE} in fwaid.yaml "
                     "(fwaid tls init DIR --host NAME writes them)"));
  } else if (IsLoopbackHost(host)) {
    creds = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("listen ", listen, ": ", host,
                     " is not a loopback address, and fwaid serves other hosts only over TLS. Add "
                     "tls: {cert: FILE, key: FILE} "
                     "to fwaid.yaml (fwaid tls init DIR --host NAME writes a CA and a server "
                     "certificate), or listen on "
                     "127.0.0.1"));
  }
  creds->SetAuthMetadataProcessor(MakeAuthProcessor(gate));
  return creds;
}

// A node joins the lab only under the name its certificates give it: the
// one it calls other nodes with, and the one it reaches etcd with.
absl::Status CheckLabIdentity(const DaemonConfig& config) {
  const LabConfig& lab = config.lab;
  const bool own = !lab.cert.empty();
  const std::string cert = own ? lab.cert : config.security.tls.cert;
  if (!cert.empty()) {
    if (auto s = CheckNodeCertificate(
            own ? "lab.cert" : "tls.cert (the node's certificate: no lab.cert)", cert, lab.node);
        !s.ok()) {
      return s;
    }
  }
  if (lab.etcd_tls && lab.etcd_cert != cert)
    return CheckNodeCertificate("lab.etcd_cert", lab.etcd_cert, lab.node);
  return absl::OkStatus();
}

int TlsCommand(const std::string& action, const std::string& dir,
               const std::vector<std::string>& hosts, const std::string& user, int days = 825,
               bool node = false) {
  absl::Status s;
  if (action == "init") {
    s = TlsInit(dir, hosts);
    if (s.ok()) {
      std::printf("wrote %s/ca.pem, ca.key (keep it safe), server.pem, server.key for %s\n",
                  dir.c_str(), absl::StrJoin(hosts, ", ").c_str());
      std::printf("fwaid.yaml:\n  tls: {cert: %s/server.pem, key: %s/server.key}\n", dir.c_str(),
                  dir.c_str());
    }
  } else {
    s = TlsIssue(dir, user, hosts, days, node);
    if (s.ok()) {
      std::printf("wrote %s/%s.pem and %s/%s.key (mode 0600), signed by %s/ca.pem\n", dir.c_str(),
                  user.c_str(), dir.c_str(), user.c_str(), dir.c_str());
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "fwaid tls %s: %s\n", action.c_str(), std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

// What fwaid was asked on its command line.
struct Args {
  std::string config_path, data_dir, log_level;
  std::vector<std::string> listen;
};

// Parses the command line into `args`; runs `fwaid tls ...` and `--version`
// itself. The exit code when the process is done, nullopt to go on serving.
std::optional<int> ParseArgs(int argc, char** argv, Args& args) {
  CLI::App app{"fwaid — the fwai daemon"};
  bool version = false;
  app.add_option("--config", args.config_path,
                 "Config file (default: $XDG_CONFIG_HOME/fwai/fwaid.yaml if present)");
  app.add_option("--listen", args.listen, "unix:PATH or tcp:HOST:PORT (repeatable)");
  app.add_option("--data-dir", args.data_dir, "Data directory (default: $XDG_DATA_HOME/fwai)");
  app.add_option("--log-level", args.log_level, "trace|debug|info|warn|error|off");
  app.add_flag("--version", version, "Print the version");
  // fwaid tls init DIR --host NAME... | fwaid tls issue DIR (--user NAME | --node NAME) [--host
  // NAME...]
  auto* tls = app.add_subcommand("tls", "Make TLS material for a shared daemon");
  std::string tls_dir, tls_user;
  std::vector<std::string> tls_hosts;
  int tls_days = 825;
  auto* tls_init = tls->add_subcommand(
      "init", "A CA and a server certificate (ca.pem, ca.key, server.pem, server.key)");
  tls_init->add_option("dir", tls_dir, "Directory to write to")->required();
  tls_init
      ->add_option("--host", tls_hosts,
                   "A name or address clients reach the daemon by (repeatable)")
      ->required();
  auto* tls_issue =
      tls->add_subcommand("issue", "A client certificate NAME.pem/NAME.key signed by DIR/ca.pem");
  tls_issue->add_option("dir", tls_dir, "Directory holding ca.pem and ca.key")->required();
  std::string tls_node;
  auto* user_opt = tls_issue->add_option("--user", tls_user, "Who the certificate is for (its CN)");
  auto* node_opt = tls_issue->add_option("--node", tls_node,
                                         "A lab node's certificate, for node NAME (lab.node)");
  user_opt->excludes(node_opt);
  tls_issue->add_option("--host", tls_hosts,
                        "Also a server certificate for these names (a bench others reach)");
  tls_issue->add_option("--days", tls_days,
                        "Validity in days (default 825; negative: already expired, for tests)");
  tls->require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (tls_init->parsed()) return TlsCommand("init", tls_dir, tls_hosts, "");
  if (tls_issue->parsed()) {
    if (tls_user.empty() == tls_node.empty()) {
      std::fprintf(stderr, "fwaid tls issue: --user NAME (a person) or --node NAME (a lab node)\n");
      return 2;
    }
    return TlsCommand("issue", tls_dir, tls_hosts, tls_node.empty() ? tls_user : tls_node, tls_days,
                      !tls_node.empty());
  }
  if (version) {
    std::printf("fwaid %s\n", FWAI_VERSION);
    return 0;
  }
  return std::nullopt;
}

// The config fwaid serves with: the file (the default one if present), then
// the command line and systemd's sockets (`passed`) over it. The exit code
// when it cannot be had, said on stderr; nullopt otherwise.
std::optional<int> ResolveConfig(const Args& args, DaemonConfig& config, PassedSockets& passed) {
  std::string config_path = args.config_path;
  if (config_path.empty() && std::filesystem::exists(DefaultConfigPath())) {
    config_path = DefaultConfigPath();
  }
  if (!config_path.empty()) {
    auto c = LoadConfigFile(config_path);
    if (!c.ok()) {
      std::fprintf(stderr, "fwaid: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    config = *std::move(c);
  }
  for (const auto& l : args.listen) {
    if (!absl::StartsWith(l, "unix:") && !absl::StartsWith(l, "tcp:") &&
        !absl::StartsWith(l, "tls:")) {
      std::fprintf(stderr,
                   "fwaid: --listen %s: expected unix:PATH, tcp:HOST:PORT or tls:HOST:PORT\n",
                   l.c_str());
      return 2;
    }
  }
  if (config.security.tls.enabled()) {
    if (auto s = CheckTlsFiles(config.security.tls.cert, config.security.tls.key,
                               config.security.tls.client_ca);
        !s.ok()) {
      std::fprintf(stderr, "fwaid: config %s: %s\n", config.source.c_str(),
                   std::string(s.message()).c_str());
      return 1;
    }
  }
  // systemd socket activation: the passed sockets are served instead of
  // binding the configured listen addresses.
  auto taken = TakePassedSockets();
  if (!taken.ok()) {
    std::fprintf(stderr, "fwaid: socket activation: %s\n",
                 std::string(taken.status().message()).c_str());
    return 1;
  }
  passed = *std::move(taken);
  if (!args.listen.empty()) config.listen = args.listen;
  if (passed.any()) {
    config.listen.clear();
    for (const auto& [fd, path] : passed.unix_fds) config.listen.push_back("unix:" + path);
    for (const auto& [fd, addr] : passed.tcp_fds) {
      config.listen.push_back(absl::StrCat(config.security.tls.enabled() ? "tls:" : "tcp:", addr));
    }
  }
  if (config.listen.empty()) config.listen.push_back("unix:" + DefaultSocketPath());
  if (!args.data_dir.empty()) config.data_dir = args.data_dir;
  if (config.data_dir.empty()) config.data_dir = DefaultDataDir();
  if (!args.log_level.empty()) config.log_level = args.log_level;
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  ApplyProviderEnvironment(config);

  return std::nullopt;
}

// Session `session`'s project at `root` before a turn or a skill run
// (`what`), with its history then; a failure is logged, the work goes on.
void TakeCheckpoint(Checkpoints& cp, const std::string& session, const std::string& root,
                    const LocalAccount* account, const std::string& turn_id,
                    const std::string& what, const std::vector<HistoryEntry>& history) {
  auto c = cp.Take(session, root, account, turn_id, what, history.size(),
                   HistoryPrefixSha(history, history.size()));
  if (!c.ok()) spdlog::warn("checkpoint of session {}: {}", session, c.status().ToString());
}

// A flash is a session's when made in it, or under a lease bound to it.
void NoteSessionFlash(Checkpoints& cp, const BoardLeases& leases, const Caller& caller,
                      const std::string& board, const std::string& image,
                      const std::string& sha256) {
  std::string session = caller.session_id;
  if (session.empty()) {
    auto who = leases.Who();
    if (who.ok()) {
      for (const auto& l : who->first) {
        if (l.board == board && l.identity == caller.identity && !l.session_id.empty())
          session = l.session_id;
      }
    }
  }
  if (session.empty()) return;
  if (auto s =
          cp.NoteFlash(session, caller.account ? &*caller.account : nullptr, board, image, sha256);
      !s.ok()) {
    spdlog::warn("the image flashed onto {} in session {}: {}", board, session, s.ToString());
  }
}

// A watch's notice as an event in each session holding `board` through a
// lease bound to it; returns how many it reached.
int NotifySessionsHolding(const BoardLeases& leases, SessionManager& sessions,
                          const std::string& board, const std::string& rule,
                          const std::string& text) {
  auto who = leases.Who();
  if (!who.ok()) return 0;
  std::set<std::string> done;
  for (const auto& l : who->first) {
    if (l.board != board || l.session_id.empty() || !done.insert(l.session_id).second) continue;
    fwai::v1::ServerEvent ev;
    auto* n = ev.mutable_board_notice();
    n->set_board(board);
    n->set_rule(rule);
    n->set_text(text);
    if (auto s = sessions.Publish(l.session_id, std::move(ev)); !s.ok()) {
      spdlog::warn("notice to session {}: {}", l.session_id, s.status().ToString());
      done.erase(l.session_id);
    }
  }
  return static_cast<int>(done.size());
}

// Says why fwaid cannot go on ("fwaid: " and `what`) and gives `code`.
std::optional<int> Fail(const std::string& what, int code = 1) {
  std::fprintf(stderr, "fwaid: %s\n", what.c_str());
  return code;
}

// fwaid as it serves: every part, made in order by Start's steps (storage,
// knowledge, catalog, tools, plugins, MCP, hardware, lab, boards, evidence,
// sessions, skills, the gate, listeners), served until a signal by Serve
// and stopped in order by Stop. A step that fails says why on stderr and
// gives the exit code; the parts end in the reverse order of the members'
// declarations, which follow the steps.
class Daemon {
 public:
  Daemon(DaemonConfig config, PassedSockets passed)
      : config_(std::move(config)), passed_(std::move(passed)) {}
  ~Daemon() {
    // An early exit after the server started: its queue drained, its thread
    // joined.
    if (fd_cq_thread_.joinable()) {
      if (server_) server_->Shutdown(std::chrono::system_clock::now());
      fd_cq_->Shutdown();
      fd_cq_thread_.join();
    }
  }

  std::optional<int> Start() {
    for (auto step :
         {&Daemon::OpenStorage, &Daemon::OpenKnowledge, &Daemon::OpenCatalog,
          &Daemon::RegisterTools, &Daemon::StartPlugins, &Daemon::StartMcp, &Daemon::StartHardware,
          &Daemon::JoinLab, &Daemon::MakeBoards, &Daemon::OpenEvidence, &Daemon::StartSessions,
          &Daemon::StartSkills, &Daemon::OpenGate, &Daemon::Listen}) {
      if (auto failed = (this->*step)()) return failed;
    }
    return std::nullopt;
  }

  // Serves until SIGTERM or SIGINT (one of `sigs`); SIGHUP reloads the
  // config. Returns the signal.
  int Serve(const sigset_t& sigs) {
    int sig = 0;
    while (true) {
      if (sigwait(&sigs, &sig) != 0) continue;
      if (sig == SIGHUP) {
        // Users, limits and knowledge writers; certificates reload on their own.
        if (auto n = ReloadConfig("signal SIGHUP", ""); !n.ok())
          spdlog::error("config not reloaded: {}", n.status().ToString());
        continue;
      }
      return sig;
    }
  }

  int Stop(int sig);

 private:
  double MsSinceStart() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_time_)
        .count();
  }

  std::optional<int> OpenStorage();
  std::optional<int> OpenKnowledge();
  KnowledgeOptions KnowledgeOptionsOf(const KnowledgeConfig& kc);
  Provider* SearchProvider(const std::string& name);
  absl::StatusOr<std::unique_ptr<Reranker>> ModelReranker(const RerankerConfig& rc,
                                                          Reranker& builtin,
                                                          const std::string& field);
  std::optional<int> OpenCatalog();
  std::optional<int> RegisterTools();
  std::optional<int> StartPlugins();
  std::optional<int> StartMcp();
  std::optional<int> StartHardware();
  std::optional<int> JoinLab();
  std::optional<int> MakeBoards();
  std::optional<int> OpenEvidence();
  void UseEvidence();
  std::optional<int> StartSessions();
  std::optional<int> StartSkills();
  std::optional<int> OpenGate();
  absl::StatusOr<int> ReloadConfig(const std::string& principal, const std::string& peer);
  void FillApiDeps();
  std::optional<int> Listen();
  std::optional<int> AddListeners();
  std::optional<int> StartListeners();

  DaemonConfig config_;
  PassedSockets passed_;
  std::optional<DataDirLock> data_lock_;
  struct TelemetryFlush {
    bool started = false;
    ~TelemetryFlush() {
      if (started) telemetry::Shutdown();
    }
  } telemetry_flush_;
  std::chrono::steady_clock::time_point start_time_;
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<HttpClient> http_;
  ProviderSet providers_;
  // Knowledge: documents in RocksDB, derived indexes under data/index.
  std::unique_ptr<Embedder> embedder_;
  // Search-path model calls get their own provider instances: one attempt and
  // short timeouts, so an unreachable provider never stalls a search for long.
  std::vector<std::unique_ptr<Provider>> search_providers_;
  std::unique_ptr<Reranker> builtin_reranker_;
  std::unique_ptr<Reranker> remote_reranker_;  // null: the built-in one ranks
  std::unique_ptr<KnowledgeBase> knowledge_;
  std::unique_ptr<Reranker> tool_builtin_reranker_;
  std::unique_ptr<Reranker> tool_model_reranker_;
  std::unique_ptr<ToolCatalogStore> catalog_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<ThreadPool> ingest_pool_;
  // Whose personal collections a session's owner sees: decided by the
  // identities (made by OpenGate, before any session runs).
  Identities* identities_for_tools_ = nullptr;
  ToolRegistry tools_;
  std::unique_ptr<SvdCatalog> svd_catalog_;
  std::function<absl::StatusOr<uint64_t>(const nlohmann::json&)> evidence_sink_;
  std::unique_ptr<PluginStore> plugins_;
  std::vector<McpServerConfig> mcp_configs_;
  std::unique_ptr<McpManager> mcp_;
  std::unique_ptr<HardwareBroker> hardware_;
  std::unique_ptr<lab::EtcdClient> lab_etcd_;
  std::unique_ptr<lab::LabRegistrar> lab_registrar_;
  std::unique_ptr<lab::LabLeases> lab_leases_;
  LabConfig lab_config_;  // advertise port 0: filled in once the tls: listener has bound
  // Before boards_, sessions_ and turns_, whose hooks use it: outlives them.
  std::unique_ptr<Checkpoints> checkpoints_;
  std::unique_ptr<LocalBoards> local_boards_;
  std::unique_ptr<lab::LabBoards> lab_boards_;
  std::unique_ptr<Boards> boards_;
  std::unique_ptr<BoardLeases> board_leases_;
  std::unique_ptr<lab::LabStandIns> stand_ins_;
  std::unique_ptr<EvidenceLog> evidence_;
  std::shared_ptr<const SecretScanner> secrets_;
  std::function<absl::StatusOr<uint64_t>(nlohmann::json)> append_evidence_;
  std::function<void(const nlohmann::json&)> record_run_;
  std::function<nlohmann::json(const std::string&)> latest_build_;
  std::function<nlohmann::json(const std::string&)> record_of_run_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<TurnManager> turns_;
  std::unique_ptr<ProjectMcpServers> project_mcp_;
  std::unique_ptr<RunJournal> run_journal_;
  std::unique_ptr<SkillRunner> skills_;
  std::unique_ptr<Watches> watches_;  // after boards_ and turns_: destroyed before them
  std::unique_ptr<FirmwareReportDeps> firmware_deps_;
  std::unique_ptr<RolloutManager> rollouts_;
  PeerRegistry peers_;
  std::unique_ptr<TokenStore> tokens_;
  std::unique_ptr<SessionShares> shares_;
  std::unique_ptr<Identities> identities_;
  Quotas quotas_;
  std::function<void(const nlohmann::json&)> audit_;
  std::unique_ptr<Gate> gate_;
  Mutex config_mu_;  // reloads one at a time (it guards no data: config_ is not changed)
  ApiDeps deps_;
  grpc::ServerBuilder builder_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::vector<std::unique_ptr<UnixListener>> unix_listeners_;
  std::vector<std::pair<std::string, std::unique_ptr<int>>> tcp_ports_;
  // Passed TCP sockets: each relays to a private port with its credentials.
  std::vector<std::pair<std::unique_ptr<TcpRelay>, std::unique_ptr<int>>> relays_;
  std::unique_ptr<grpc::ServerCompletionQueue> fd_cq_;
  std::unique_ptr<grpc::Server> server_;
  std::thread fd_cq_thread_;
  std::string pid_file_;
};

std::optional<int> Daemon::OpenStorage() {
  if (auto s = MakeDirs(config_.data_dir, 0700); !s.ok())
    return Fail(absl::StrCat("data dir: ", s.message()));
  // A daemon still stopping on this data dir (or killed, its lock not yet
  // let go) is waited for; a serving one is not.
  auto data_lock = DataDirLock::Acquire(config_.data_dir, 60000, [](const std::string& why) {
    std::fprintf(stderr, "fwaid: %s\n", why.c_str());
  });
  if (!data_lock.ok()) return Fail(std::string(data_lock.status().message()));
  data_lock_.emplace(*std::move(data_lock));
  // OpenTelemetry export, when configured (headers are read now and never logged).
  if (auto s = telemetry::Start(config_.telemetry, FWAI_VERSION); !s.ok())
    return Fail(absl::StrCat("telemetry: ", s.message()));
  if (config_.telemetry.enabled) {
    spdlog::info("telemetry: OTLP/{} to {} as {}", config_.telemetry.protocol,
                 config_.telemetry.endpoint, config_.telemetry.service_name);
  }
  telemetry_flush_.started = true;
  start_time_ = std::chrono::steady_clock::now();
  auto storage = Storage::Open(config_.data_dir + "/db");
  if (!storage.ok()) return Fail(std::string(storage.status().message()));
  storage_ = *std::move(storage);
  spdlog::info("storage opened ({:.0f} ms after start)", MsSinceStart());
  http_ = MakeCurlHttpClient();
  for (const auto& [name, pc] : config_.providers) {
    providers_.providers[name] = MakeProvider(pc, config_.retry, *http_);
  }
  providers_.default_name = config_.default_provider;
  return std::nullopt;
}

Provider* Daemon::SearchProvider(const std::string& name) {
  Provider* p = providers_.Find(name);
  if (p == nullptr) return nullptr;
  ProviderConfig pc = p->config();
  pc.connect_timeout_s = 5;
  pc.idle_timeout_s = 20;
  search_providers_.push_back(MakeProvider(pc, RetryConfig{1, 0, 0}, *http_));
  return search_providers_.back().get();
}

// The value of an API key: the key itself, else the environment variable
// named, else empty.
std::string ApiKeyOf(const std::string& key, const std::string& env) {
  if (!key.empty()) return key;
  const char* v = env.empty() ? nullptr : std::getenv(env.c_str());
  return v != nullptr ? v : "";
}

// A rerank service or the chat provider, falling back to `builtin` when a
// call fails; null for kind builtin.
absl::StatusOr<std::unique_ptr<Reranker>> Daemon::ModelReranker(const RerankerConfig& rc,
                                                                Reranker& builtin,
                                                                const std::string& field) {
  if (rc.kind == "tei" || rc.kind == "cohere" || rc.kind == "jina") {
    HttpRerankerConfig hc;
    hc.style = rc.kind == "tei" ? "tei" : "cohere";
    hc.base_url = rc.base_url;
    hc.api_key = ApiKeyOf(rc.api_key, rc.api_key_env);
    hc.model = rc.model;
    return MakeHttpReranker(hc, *http_, builtin);
  }
  if (rc.kind == "llm") {
    Provider* p = SearchProvider(rc.provider);
    if (p == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": kind llm needs a configured provider (provider: ",
                       rc.provider.empty() ? "<default>" : rc.provider, ")"));
    }
    return MakeLlmReranker(*p, rc.model, builtin);
  }
  return std::unique_ptr<Reranker>();
}

KnowledgeOptions Daemon::KnowledgeOptionsOf(const KnowledgeConfig& kc) {
  KnowledgeOptions ko;
  ko.chunking = {kc.chunk_min_tokens, kc.chunk_target_tokens, kc.chunk_max_tokens,
                 kc.chunk_overlap_tokens};
  ko.max_document_bytes = kc.max_document_mb << 20;
  ko.bm25_k1 = static_cast<float>(kc.bm25_k1);
  ko.bm25_b = static_cast<float>(kc.bm25_b);
  ko.rrf_k = kc.rrf_k;
  ko.lexical_weight = kc.lexical_weight;
  ko.synonym_weight = kc.synonym_weight;
  ko.family_weight = kc.family_weight;
  ko.vector_weight = kc.vector_weight;
  ko.doc_weight = kc.doc_weight;
  ko.doc_text_weight = kc.doc_text_weight;
  ko.doc_text_b = kc.doc_text_b;
  ko.doc_text_candidates = kc.doc_text_candidates;
  ko.candidates = kc.candidates;
  ko.rerank_top = kc.rerank_top;
  ko.exact_below = static_cast<size_t>(kc.hnsw_above);
  ko.vector_index = kc.vector_index;
  ko.ivf_lists = kc.ivf_lists;
  ko.ivf_nprobe = kc.ivf_nprobe;
  ko.ivf_max_probe_share = kc.ivf_max_probe_share;
  // A model embedder keeps its approximate index; the built-in one's hashed
  // vectors keep theirs only where the sample shows the recall.
  ko.vector_min_recall = kc.vector_min_recall >= 0 ? kc.vector_min_recall
                         : kc.embedder == "openai" ? 0.0
                                                   : 0.9;
  ko.hnsw_m = kc.hnsw_m;
  ko.hnsw_ef_construction = kc.hnsw_ef_construction;
  ko.hnsw_ef_search = kc.hnsw_ef_search;
  Provider* rewrite_provider = nullptr;
  if ((kc.query_rewrite || kc.hyde) && (rewrite_provider = SearchProvider(""))) {
    if (kc.query_rewrite) ko.rewrite = MakeLlmQueryRewriter(*rewrite_provider, "");
    if (kc.hyde) ko.hyde = MakeLlmHypotheticalAnswer(*rewrite_provider, "");
  }
  ko.passage_tokens = kc.passage_tokens;
  ko.passage_pool = kc.passage_pool;
  if (kc.passage_coverage_weight >= 0) ko.passage_coverage_weight = kc.passage_coverage_weight;
  if (kc.passage_sentence_weight >= 0) ko.passage_sentence_weight = kc.passage_sentence_weight;
  if (kc.passage_forward >= 0) ko.passage_forward = kc.passage_forward > 0;
  if (kc.passage_within_doc >= 0) ko.passage_within_doc = kc.passage_within_doc;
  if (kc.window_enabled >= 0) ko.windows = kc.window_enabled > 0;
  if (kc.window_docs >= 0) ko.window_docs = kc.window_docs;
  if (kc.window_weight >= 0) ko.window_weight = kc.window_weight;
  if (kc.window_k >= 0) ko.window_k = kc.window_k;
  if (kc.window_identifiers >= 0) ko.window_identifiers = kc.window_identifiers > 0;
  ko.log.max_entries = kc.log_max_entries;
  ko.log.weight = kc.feedback_weight;
  ko.log.min_similarity = kc.feedback_min_similarity;
  return ko;
}

std::optional<int> Daemon::OpenKnowledge() {
  const KnowledgeConfig& kc = config_.knowledge;
  if (kc.embedder == "openai") {
    HttpEmbedderConfig ec;
    ec.base_url = kc.embed_base_url;
    ec.api_key = ApiKeyOf(kc.embed_api_key, kc.embed_api_key_env);
    ec.model = kc.embed_model;
    ec.dimension = kc.builtin_dimension == 256 ? 0 : kc.builtin_dimension;
    embedder_ = MakeHttpEmbedder(ec, *http_);
    if (ec.dimension == 0) {
      // Learn the dimension now so a collection never mixes dimensions.
      auto probe = embedder_->Embed({"dimension probe"}, true);
      if (!probe.ok()) return Fail(absl::StrCat("knowledge.embedder: ", probe.status().message()));
    }
  } else {
    embedder_ = MakeBuiltinEmbedder(kc.builtin_dimension);
  }
  RerankWeights kb_weights;
  for (const auto& [feature, v] : kc.reranker.weights) SetRerankWeight(kb_weights, feature, v);
  builtin_reranker_ = MakeBuiltinReranker(kb_weights);
  auto remote = ModelReranker(kc.reranker, *builtin_reranker_, "knowledge.reranker");
  if (!remote.ok()) return Fail(std::string(remote.status().message()));
  remote_reranker_ = *std::move(remote);
  KnowledgeOptions ko = KnowledgeOptionsOf(kc);
  Reranker& reranker = remote_reranker_ ? *remote_reranker_ : *builtin_reranker_;
  // A model reranker orders the passages; the built-in one the chunks before.
  if (remote_reranker_) ko.first_stage_reranker = builtin_reranker_.get();
  auto knowledge =
      KnowledgeBase::Open(*storage_, config_.data_dir + "/index", ko, *embedder_, reranker);
  if (!knowledge.ok()) return Fail(absl::StrCat("knowledge base: ", knowledge.status().message()));
  knowledge_ = *std::move(knowledge);
  spdlog::info("knowledge indexes {} ({:.0f} ms after start)", knowledge_->open_report(),
               MsSinceStart());
  return std::nullopt;
}

std::optional<int> Daemon::OpenCatalog() {
  const CatalogConfig& cc = config_.catalog;
  CatalogOptions co;
  co.coarse_slices = cc.coarse_slices;
  co.candidates = cc.candidates;
  co.grouping = cc.grouping;
  co.rrf_k = cc.rrf_k;
  co.vector_weight = cc.vector_weight;
  co.whole_weight = cc.whole_weight;
  co.synonym_weight = cc.synonym_weight;
  co.family_weight = cc.family_weight;
  co.namespace_boost = cc.namespace_boost;
  co.hyde_weight = cc.hyde_weight;
  if (Provider* p = cc.hyde ? SearchProvider("") : nullptr) {
    co.hyde = MakeLlmHypotheticalTool(*p, "");
  } else if (cc.hyde) {
    spdlog::warn("catalog.hyde: no provider is configured; tools are searched without a model");
  }
  RerankWeights tool_weights = ToolCatalogRerankWeights();
  for (const auto& [feature, v] : cc.reranker.weights) SetRerankWeight(tool_weights, feature, v);
  tool_builtin_reranker_ = MakeBuiltinReranker(tool_weights);
  auto model = ModelReranker(cc.reranker, *tool_builtin_reranker_, "catalog.reranker");
  if (!model.ok()) return Fail(std::string(model.status().message()));
  tool_model_reranker_ = *std::move(model);
  Reranker& tool_reranker = tool_model_reranker_ ? *tool_model_reranker_ : *tool_builtin_reranker_;
  auto catalog = ToolCatalogStore::Open(*storage_, co, *embedder_, tool_reranker);
  if (!catalog.ok()) return Fail(absl::StrCat("tool catalog: ", catalog.status().message()));
  catalog_ = *std::move(catalog);
  spdlog::info("tool catalog: {} tools ({:.0f} ms after start)", catalog_->size(), MsSinceStart());
  pool_ = std::make_unique<ThreadPool>(4);
  // Document ingest (extraction, chunking, embedding, index writes) on a
  // worker of its own at idle CPU priority: it takes only the CPU streaming
  // turns and requests leave, and one document at a time (the knowledge
  // base serializes its writers anyway).
  ingest_pool_ = std::make_unique<ThreadPool>(1, [] {
    NameThisThread("fwaid-ingest");
    if (auto s = SetThisThreadPriority(ThreadPriority::kIdle); !s.ok()) {
      spdlog::warn("ingest worker: {}; it runs at normal priority", std::string(s.message()));
    }
  });
  return std::nullopt;
}

// The agent's file, register and search tools.
std::optional<int> Daemon::RegisterTools() {
  RegisterFileTools(tools_);
  // Register code the agent writes is checked against the device's SVD.
  // (made in place: a catalog is not moved)
  svd_catalog_.reset(new SvdCatalog(MakeSvdCatalog(config_.data_dir)));
  spdlog::info("register checks: SVDs from {}", absl::StrJoin(svd_catalog_->dirs(), ", "));
  SvdCatalog* svd = svd_catalog_.get();
  RegisterWriteTools(tools_, WriteToolHooks{[svd](ToolContext& ctx, const std::string& rel,
                                                  const std::set<int>& lines) {
                       return RegisterNoteAfterWrite(*svd, ctx, rel, lines);
                     }});
  RegisterRegisterTools(tools_, svd);
  tools_.Register(MakeDocumentSearchTool(*knowledge_, [this](const std::string& owner,
                                                             const std::string& name) {
    return identities_for_tools_ != nullptr && identities_for_tools_->OwnerOwnsName(owner, name);
  }));
  tools_.Register(MakeDocumentFeedbackTool(*knowledge_));
  const KnowledgeConfig& kc = config_.knowledge;
  CodeSearchOptions cso;
  cso.web_context_url = kc.code_web_context_url;
  cso.web_context_api_key = ApiKeyOf("", kc.code_web_context_api_key_env);
  tools_.Register(MakeCodeSearchTool(*knowledge_, cso, http_.get()));
  return std::nullopt;
}

// Plugins: their sub-agent types, MCP servers and tool documents join at
// start; their skills and templates are read when used. Their installs and
// removals go to the evidence log (opened by OpenEvidence).
std::optional<int> Daemon::StartPlugins() {
  plugins_ = std::make_unique<PluginStore>(
      config_.data_dir + "/plugins", config_.plugins, http_.get(),
      [this](const nlohmann::json& rec) -> absl::StatusOr<uint64_t> {
        if (!evidence_sink_) return absl::UnavailableError("the evidence log is not open");
        return evidence_sink_(rec);
      });
  if (auto s = plugins_->Start(); !s.ok()) return Fail(absl::StrCat("plugins: ", s.message()));
  for (auto& [name, agent] : plugins_->Agents()) config_.subagents.emplace(name, agent);
  for (auto& [name, server] : plugins_->McpServers()) config_.mcp_servers.emplace(name, server);
  if (auto docs = plugins_->ToolDocuments(); !docs.empty()) {
    if (auto r = catalog_->Register(docs); !r.ok())
      spdlog::warn("plugins' tool documents: {}", r.status().ToString());
  }
  return std::nullopt;
}

// MCP servers: started now, supervised (restarted with backoff) afterwards;
// their tools join the agent's registry and the catalog.
std::optional<int> Daemon::StartMcp() {
  mcp_configs_ = McpServerConfigs(config_.mcp_servers);
  mcp_ = std::make_unique<McpManager>(mcp_configs_, http_.get());
  std::set<std::string> configured;
  for (const auto& c : mcp_configs_) configured.insert(c.name);
  auto mcp_doc = [](const McpToolInfo& info) {
    return nlohmann::json({{"name", info.qualified},
                           {"description", info.description},
                           {"inputSchema", info.input_schema},
                           {"source", "mcp:" + info.server}})
        .dump();
  };
  ToolCatalogStore* catalog = catalog_.get();
  auto sync = [catalog, configured](const std::map<std::string, std::vector<std::string>>& listed) {
    auto removed = SyncMcpTools(*catalog, configured, listed);
    if (!removed.ok()) {
      spdlog::warn("mcp tools not synced with the catalog: {}", removed.status().ToString());
    } else if (*removed > 0) {
      spdlog::info("catalog: {} tools of MCP servers that are gone or no longer list them removed",
                   *removed);
    }
  };
  // A server that comes up late (or back after a crash), or whose tool list
  // changed, adds its new tools; tools it no longer lists leave the catalog.
  mcp_->OnTools(
      [this, mcp_doc, sync](const std::string& server, const std::vector<McpToolInfo>& infos) {
        std::map<std::string, std::vector<std::string>> listed;
        for (const auto& info : infos) {
          listed[server].push_back(mcp_doc(info));
          tools_.Add(MakeMcpTool(*mcp_, info));
        }
        sync(listed);
      });
  std::map<std::string, std::vector<std::string>> listed;  // server -> its tool documents
  for (auto& info : mcp_configs_.empty() ? std::vector<McpToolInfo>{} : mcp_->Start()) {
    listed[info.server].push_back(mcp_doc(info));
    tools_.Register(MakeMcpTool(*mcp_, std::move(info)));
  }
  sync(listed);
  return std::nullopt;
}

// Hardware: boards from the config (or one simulated board), leases from
// the database. Sockets of simulators live in a short run directory.
std::optional<int> Daemon::StartHardware() {
  std::string run_dir = config_.data_dir + "/run";
  if (run_dir.size() > 60) run_dir = absl::StrCat("/tmp/fwai-", getuid(), "/run-", getpid());
  hardware_ = std::make_unique<HardwareBroker>(config_.hardware, *storage_, run_dir);
  if (config_.hardware.keep_serial_transcripts)
    hardware_->SetTranscriptDir(config_.data_dir + "/artifacts/serial");
  // The simulated boards' bootloader trusts the keys rollouts require.
  std::vector<std::string> ota_keys;
  for (const auto& path : config_.ota.keys) {
    std::ifstream in(path);
    std::stringstream pem;
    pem << in.rdbuf();
    if (!in) return Fail(absl::StrCat("ota.keys: ", path, " cannot be read"));
    ota_keys.push_back(pem.str());
  }
  hardware_->SetOtaOptions(config_.data_dir + "/ota", std::move(ota_keys));
  if (auto s = hardware_->Start(); !s.ok()) return Fail(absl::StrCat("hardware: ", s.message()));
  spdlog::info("hardware: {} devices ({:.0f} ms after start)", hardware_->List().size(),
               MsSinceStart());
  return std::nullopt;
}

// A node of a lab: its boards are registered in etcd while it runs. etcd
// need not be up yet; the node joins when it answers.
std::optional<int> Daemon::JoinLab() {
  lab_config_ = config_.lab;
  if (!config_.lab.enabled()) return std::nullopt;
  if (auto s = CheckLabIdentity(config_); !s.ok())
    return Fail(absl::StrCat("config ", config_.source, ": ", s.message()));
  lab::EtcdOptions etcd_options;
  etcd_options.endpoints = config_.lab.etcd;
  etcd_options.tls = config_.lab.etcd_tls;
  etcd_options.ca_file = config_.lab.etcd_ca;
  etcd_options.cert_file = config_.lab.etcd_cert;
  etcd_options.key_file = config_.lab.etcd_key;
  auto etcd = lab::EtcdClient::Connect(std::move(etcd_options));
  if (!etcd.ok()) {
    return Fail(absl::StrCat("config ", config_.source, ": lab.etcd: ", etcd.status().message()));
  }
  lab_etcd_ = *std::move(etcd);
  HardwareBroker* hardware = hardware_.get();
  lab_registrar_ = std::make_unique<lab::LabRegistrar>(
      lab_config_, *lab_etcd_,
      [hardware] {
        std::vector<lab::LabBoard> boards;
        for (const auto& d : hardware->List()) {
          lab::LabBoard b;
          b.id = d.id;
          b.kind = d.kind;
          b.name = d.name;
          b.target = d.target;
          b.health = d.health;
          b.health_reason = d.health_reason;
          b.tags = d.tags;
          b.streams = d.streams;
          boards.push_back(std::move(b));
        }
        return boards;
      },
      FWAI_VERSION);
  lab::LabLeasesOptions lab_options;
  lab_options.queue_ttl_s = config_.lab.ttl_s;
  lab_options.interactive_first = config_.lab.interactive_first;
  lab_leases_ = std::make_unique<lab::LabLeases>(*lab_etcd_, config_.lab.node, lab_options);
  lab_leases_->Start();
  spdlog::info("lab: node {} of the lab at {}", config_.lab.node,
               absl::StrJoin(config_.lab.etcd, ","));
  return std::nullopt;
}

// Every board, wherever it is: this node's, and in a lab the other nodes'
// through their benches. The API, skill runs and the agent's tools share it.
std::optional<int> Daemon::MakeBoards() {
  HardwareBroker* hardware = hardware_.get();
  local_boards_ = std::make_unique<LocalBoards>(*hardware);
  if (lab_leases_) {
    lab_boards_ = std::make_unique<lab::LabBoards>(
        config_, *lab_etcd_, *lab_leases_, config_.lab.node,
        [hardware](const std::string& sha) { return hardware->BuildRecordOf(sha); },
        [hardware](const Caller& caller, const std::string& root) {
          return hardware->CheckRegistersOf(caller, root);
        });
  }
  boards_ = std::make_unique<Boards>(*local_boards_, lab_boards_.get(), config_.lab.node);
  boards_->SetPolicyFile(config_.policy_file);
  board_leases_ = std::make_unique<BoardLeases>(*hardware, config_.hardware, lab_leases_.get(),
                                                lab_etcd_.get(), config_.lab.node);
  // A bench: the local leases standing for the lab leases other nodes hold.
  if (lab_leases_) {
    stand_ins_ = std::make_unique<lab::LabStandIns>(*hardware, *lab_leases_, *lab_etcd_,
                                                    config_.lab.node, config_.hardware.max_ttl_s);
  }
  RegisterHardwareTools(tools_, *boards_);
  return std::nullopt;
}

// Evidence: every agent turn and every flash leaves a signed, chained record.
// Secrets are redacted from tool output, evidence and run logs.
std::optional<int> Daemon::OpenEvidence() {
  auto evidence = EvidenceLog::Open(*storage_, config_.data_dir + "/keys/evidence.pem", 100);
  if (!evidence.ok()) return Fail(absl::StrCat("evidence log: ", evidence.status().message()));
  evidence_ = *std::move(evidence);
  auto scanner = SecretScanner::Make(config_.secret_patterns);
  if (!scanner.ok()) return Fail(std::string(scanner.status().message()));
  secrets_ = *scanner;
  EvidenceLog* evidence_log = evidence_.get();
  append_evidence_ = [evidence_log,
                      secrets = secrets_](nlohmann::json rec) -> absl::StatusOr<uint64_t> {
    secrets->RedactJson(rec);
    auto r = evidence_log->Append(std::move(rec));
    if (!r.ok()) return r.status();
    // On the span whose work this records.
    if (telemetry::Enabled()) telemetry::NoteEvidence(ToHex(r->leaf));
    return r->index;
  };
  evidence_sink_ = append_evidence_;
  record_run_ = [append = append_evidence_](const nlohmann::json& rec) {
    auto r = append(rec);
    if (!r.ok()) spdlog::error("evidence: {}", r.status().ToString());
  };
  latest_build_ = [evidence_log](const std::string& project_root) -> nlohmann::json {
    auto r = evidence_log->FindLatest(
        {"\"skill_run\"", "\"artifacts\""}, [&project_root](const nlohmann::json& j) {
          if (j.value("kind", "") != "skill_run" || j.value("project", "") != project_root)
            return false;
          for (const auto& a : j.value("artifacts", nlohmann::json::array())) {
            if (a.value("kind", "") == "build") return true;
          }
          return false;
        });
    return r.ok() ? *r : nlohmann::json();
  };
  record_of_run_ = [evidence_log](const std::string& run_id) -> nlohmann::json {
    auto r = evidence_log->Get(run_id);
    if (!r.ok()) return nullptr;
    return nlohmann::json::parse(r->bytes, nullptr, false);
  };
  UseEvidence();
  return std::nullopt;
}

// Build records by what they made and by project, for the flash guard, the
// memory diff of each build, the SBOM of each flash and the reports.
void Daemon::UseEvidence() {
  EvidenceLog* evidence_log = evidence_.get();
  auto build_record_of_image = [evidence_log](const std::string& sha256) -> nlohmann::json {
    if (sha256.size() != 64) return nullptr;
    auto r =
        evidence_log->FindLatest({"\"skill_run\"", sha256}, [&sha256](const nlohmann::json& j) {
          if (j.value("kind", "") != "skill_run") return false;
          for (const auto& a : j.value("artifacts", nlohmann::json::array())) {
            for (const auto& f : a.value("files", nlohmann::json::array())) {
              if (f.value("sha256", "") == sha256 && f.value("format", "") == "elf") return true;
            }
          }
          return false;
        });
    return r.ok() ? *r : nlohmann::json();
  };
  hardware_->SetRunRecorder(record_run_);
  boards_->SetRecorder(record_run_);
  hardware_->SetBuildRecordLookup(build_record_of_image);
  SvdCatalog* svd = svd_catalog_.get();
  hardware_->SetRegisterCheck(
      [svd](const Caller& caller, const std::string& root) -> absl::StatusOr<nlohmann::json> {
        if (!caller.account) {
          return absl::PermissionDeniedError(
              "the project is read as a local account, and this caller has none");
        }
        RegisterCheckRequest req;
        req.project_root = root;
        return CheckProjectRegisters(*svd, &*caller.account, std::move(req));
      });
  hardware_->SetSbomOptions(FWAI_VERSION, config_.toolchain_dpkg_admindir);
}

std::optional<int> Daemon::StartSessions() {
  sessions_ = std::make_unique<SessionManager>(*storage_, config_.subscribers);
  // Turns the last process left open end now, before any client can attach.
  if (auto n = sessions_->FinishInterruptedTurns("fwaid stopped while this turn was running (it "
                                                 "was killed or crashed); it was not resumed");
      !n.ok()) {
    return Fail(absl::StrCat("ending interrupted turns: ", n.status().message()));
  } else if (*n > 0) {
    spdlog::warn("{} turn(s) cut by the last stop ended as interrupted", *n);
  }
  ToolCatalogStore* catalog = catalog_.get();
  turns_ = std::make_unique<TurnManager>(
      *sessions_, config_, providers_, tools_, [catalog](const std::string& query, int k) {
        std::vector<std::string> names;
        auto hits = catalog->Search(std::string(Utf8Prefix(query, 4096)), std::clamp(k, 1, 100));
        if (hits.ok()) {
          for (const auto& h : *hits) names.push_back(h.tool.name);
        }
        return names;
      });
  turns_->SetRunRecorder(record_run_);
  turns_->SetSecretScanner(secrets_);
  // Passages the answer cites ([q12.3]) count as good for their searches.
  turns_->SetReplyObserver(
      [kb = knowledge_.get()](const std::string& session, const std::string&,
                              const std::string& text) { RecordCitations(*kb, session, text); });
  // Before each turn, the session's project (and the images its boards run)
  // as they are, so that it can be rewound; flashes are the session's when
  // made in it or under a lease bound to it.
  checkpoints_ = std::make_unique<Checkpoints>(
      *storage_, config_.data_dir + "/checkpoints",
      CheckpointLimits{static_cast<uint64_t>(config_.checkpoints.max_bytes),
                       static_cast<uint64_t>(config_.checkpoints.max_file_bytes)});
  turns_->SetCheckpointer([cp = checkpoints_.get()](const SessionInfo& s,
                                                    const LocalAccount* account,
                                                    const std::string& turn_id,
                                                    const std::vector<HistoryEntry>& history) {
    TakeCheckpoint(*cp, s.id, s.project_root, account, turn_id, "turn", history);
  });
  boards_->SetFlashObserver([cp = checkpoints_.get(), leases = board_leases_.get()](
                                const Caller& caller, const BoardRef& board,
                                const FlashOrder& order, const FlashResult& r) {
    NoteSessionFlash(*cp, *leases, caller, board.id, order.image, r.sha256);
  });
  // MCP servers a project declares run as the session's account (the
  // project's owner), never as fwaid; a session without one gets none.
  project_mcp_ = std::make_unique<ProjectMcpServers>(http_.get());
  turns_->SetProjectTools(
      [project_mcp = project_mcp_.get()](
          const SessionInfo& s,
          const LocalAccount* account) -> absl::StatusOr<TurnManager::ProjectToolSet> {
        if (s.project_root.empty() || account == nullptr) return TurnManager::ProjectToolSet{};
        auto set = project_mcp->ToolsFor(s.project_root, *account);
        if (!set.ok()) return set.status();
        return TurnManager::ProjectToolSet{set->owner, set->tools};
      });
  return std::nullopt;
}

// Skill runs (those cut by the last stop get their record now, marked
// interrupted), firmware reports and OTA rollouts.
std::optional<int> Daemon::StartSkills() {
  run_journal_ = std::make_unique<RunJournal>(*storage_);
  if (auto n = run_journal_->FinishInterrupted(append_evidence_); !n.ok()) {
    return Fail(absl::StrCat("recording interrupted skill runs: ", n.status().message()));
  } else if (*n > 0) {
    spdlog::warn("{} skill run(s) cut by the last stop recorded as interrupted", *n);
  }
  SkillDeps skill_deps;
  skill_deps.svd_catalog = svd_catalog_.get();
  skill_deps.boards = boards_.get();
  skill_deps.leases = board_leases_.get();
  skill_deps.journal = run_journal_.get();
  skill_deps.hardware = hardware_.get();
  skill_deps.providers = &providers_;
  skill_deps.sessions = sessions_.get();
  skill_deps.turns = turns_.get();
  skill_deps.append_evidence = append_evidence_;
  skill_deps.policy_file = config_.policy_file;
  skill_deps.secrets = secrets_;
  skill_deps.previous_build = latest_build_;
  skill_deps.dpkg_admindir = config_.toolchain_dpkg_admindir;
  skill_deps.version = FWAI_VERSION;
  skill_deps.plugin_skills = [plugins = plugins_.get()] { return plugins->SkillSets(); };
  skill_deps.checkpoint = [cp = checkpoints_.get(), sessions = sessions_.get()](
                              const Caller& caller, const std::string& root,
                              const std::string& what) {
    if (!sessions->Get(caller.session_id).ok()) return;  // not a session of this fwaid
    auto history = sessions->LoadHistory(caller.session_id);
    if (!history.ok()) return;
    TakeCheckpoint(*cp, caller.session_id, root, caller.account ? &*caller.account : nullptr, "",
                   what, *history);
  };
  skills_ = std::make_unique<SkillRunner>(skill_deps);
  // Watches on boards' output: a firing is a record, a notice in fwaid's
  // log, and (wake) a turn in a session of the rule's owner.
  Watches::Hooks watch_hooks;
  watch_hooks.record = record_run_;
  watch_hooks.notify = [leases = board_leases_.get(), sessions = sessions_.get()](
                           const std::string& board, const std::string& rule,
                           const std::string& text) {
    return NotifySessionsHolding(*leases, *sessions, board, rule, text);
  };
  watch_hooks.wake = [sessions = sessions_.get(), turns = turns_.get()](
                         const Caller& owner, const std::string& session,
                         const std::string& text) -> absl::Status {
    auto info = sessions->Get(session);
    if (!info.ok()) return info.status();
    if (info->owner != owner.identity) {
      return absl::PermissionDeniedError(
          absl::StrCat("session ", session, " is not ", owner.display, "'s"));
    }
    TurnRequest tr;
    tr.session_id = session;
    tr.text = text;
    tr.owner = owner.identity;
    tr.sender = "fwai watch";
    return turns->Start(std::move(tr));
  };
  watches_ = std::make_unique<Watches>(*boards_, std::move(watch_hooks), &SystemClock());
  RegisterSkillTools(tools_, *skills_);
  firmware_deps_ = std::make_unique<FirmwareReportDeps>(FirmwareReportDeps{
      latest_build_, record_of_run_, config_.toolchain_dpkg_admindir, FWAI_VERSION});
  RegisterFirmwareTools(tools_, *firmware_deps_);
  rollouts_ = std::make_unique<RolloutManager>(*boards_, *board_leases_, skills_.get(), *storage_,
                                               append_evidence_, config_.ota);
  if (auto s = rollouts_->Start(); !s.ok()) return Fail(std::string(s.message()));
  RegisterOtaTools(tools_, *rollouts_);
  return std::nullopt;
}

// Who may call: unix peers by uid, tokens and certificates over TCP.
std::optional<int> Daemon::OpenGate() {
  auto tokens = TokenStore::Open(*storage_);
  if (!tokens.ok()) return Fail(absl::StrCat("tokens: ", tokens.status().message()));
  tokens_ = *std::move(tokens);
  auto shares = SessionShares::Open(*storage_);
  if (!shares.ok()) return Fail(absl::StrCat("session shares: ", shares.status().message()));
  shares_ = *std::move(shares);
  identities_ = std::make_unique<Identities>(config_.security, *tokens_, getuid());
  identities_for_tools_ = identities_.get();
  // A node of a lab serves other nodes' certificates (LabNode calls only).
  identities_->AcceptLabNodes(config_.lab.enabled());
  audit_ = [append = append_evidence_](const nlohmann::json& rec) {
    auto r = append(rec);
    if (!r.ok()) spdlog::error("evidence (audit): {}", r.status().ToString());
  };
  if (auto missing = RpcsWithoutRules(); !missing.empty()) {
    // Every RPC must have an access rule: one without would be refused to all.
    return Fail(absl::StrCat("internal error: no access rule for ", absl::StrJoin(missing, ", ")),
                70);
  }
  if (auto missing = SessionActionsWithoutRules(); !missing.empty()) {
    // Likewise every session RPC and Chat message (one without: owners only).
    return Fail(absl::StrCat("internal error: no session rule for ", absl::StrJoin(missing, ", ")),
                70);
  }
  gate_ = std::make_unique<Gate>(*identities_, quotas_, peers_, audit_);
  return std::nullopt;
}

absl::StatusOr<int> Daemon::ReloadConfig(const std::string& principal, const std::string& peer) {
  const std::string by = peer.empty() ? principal : absl::StrCat(principal, " (", peer, ")");
  MutexLock lock(&config_mu_);
  if (config_.source.empty())
    return absl::FailedPreconditionError("fwaid was started without a config file");
  auto fresh = LoadConfigFile(config_.source);
  if (!fresh.ok()) {
    audit_({{"kind", "config_reload"},
            {"ok", false},
            {"error", std::string(fresh.status().message())},
            {"by", by},
            {"principal", principal},
            {"peer", peer}});
    return fresh.status();
  }
  identities_->Reload(fresh->security);
  gate_->Invalidate();
  audit_({{"kind", "config_reload"},
          {"ok", true},
          {"file", config_.source},
          {"users", fresh->security.users.size()},
          {"by", by},
          {"principal", principal},
          {"peer", peer}});
  spdlog::info("config reloaded from {} by {}: {} users", config_.source, by,
               fresh->security.users.size());
  return static_cast<int>(fresh->security.users.size());
}

void Daemon::FillApiDeps() {
  ApiDeps& deps = deps_;
  deps.gate = gate_.get();
  deps.audit = audit_;
  deps.reload_config = [this](const std::string& principal, const std::string& peer) {
    return ReloadConfig(principal, peer);
  };
  deps.sessions = sessions_.get();
  deps.turns = turns_.get();
  deps.shares = shares_.get();
  deps.config = &config_;
  deps.providers = &providers_;
  deps.peers = &peers_;
  deps.knowledge = knowledge_.get();
  deps.catalog = catalog_.get();
  deps.pool = pool_.get();
  deps.ingest_pool = ingest_pool_.get();
  deps.hardware = hardware_.get();
  deps.boards = boards_.get();
  deps.leases = board_leases_.get();
  deps.watches = watches_.get();
  deps.evidence = evidence_.get();
  deps.skills = skills_.get();
  deps.firmware = firmware_deps_.get();
  deps.svd_catalog = svd_catalog_.get();
  deps.rollouts = rollouts_.get();
  deps.plugins = plugins_.get();
  deps.checkpoints = checkpoints_.get();
  deps.on_session_deleted = [hardware = hardware_.get(), cp = checkpoints_.get(),
                             shares = shares_.get()](const std::string& id) {
    hardware->SessionEnded(id);
    if (auto s = shares->DeleteSession(id); !s.ok())
      spdlog::warn("shares of session {}: {}", id, s.ToString());
    if (auto s = cp->DropSession(id); !s.ok())
      spdlog::warn("checkpoints of session {}: {}", id, s.ToString());
  };
  deps.request_shutdown = [] { kill(getpid(), SIGTERM); };
  deps.lab_etcd = lab_etcd_.get();
  deps.lab_leases = lab_leases_.get();
  deps.lab_stand_ins = stand_ins_.get();
  deps.lab_node = config_.lab.node;
  deps.started_us = NowMicros();
  deps.daemon_uid = getuid();
  deps.version = FWAI_VERSION;
}

// The gRPC server with every service, on the listen addresses (or the
// sockets systemd passed).
std::optional<int> Daemon::Listen() {
  FillApiDeps();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  builder_.SetMaxReceiveMessageSize(64 << 20);
  services_ = MakeServices(deps_);
  for (auto& s : services_) builder_.RegisterService(s.get());
  {
    // Every PERMISSION_DENIED is an evidence record, whichever rule refused it.
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(gate_->RefusalRecorder());
    builder_.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  if (auto failed = AddListeners()) return failed;
  // Connections handed over by fd are driven by the pollsets of the server's
  // completion queues; this one exists (and is polled) for them.
  fd_cq_ = builder_.AddCompletionQueue(true);
  server_ = builder_.BuildAndStart();
  if (!server_) return Fail("cannot start the gRPC server (is a TCP port in use?)");
  return StartListeners();
}

std::optional<int> Daemon::AddListeners() {
  for (const auto& [fd, path] : passed_.unix_fds)
    unix_listeners_.push_back(std::make_unique<UnixListener>(fd, path));
  for (const auto& [fd, addr] : passed_.tcp_fds) {
    const std::string l = absl::StrCat(config_.security.tls.enabled() ? "tls:" : "tcp:", addr);
    auto creds = TcpCredentials(l, config_.security, *gate_);
    if (!creds.ok()) return Fail(absl::StrCat(creds.status().message(), " (passed by systemd)"));
    auto port = std::make_unique<int>(0);
    builder_.AddListeningPort("127.0.0.1:0", *creds, port.get());
    relays_.emplace_back(std::make_unique<TcpRelay>(fd, l), std::move(port));
  }
  for (const auto& l : passed_.any() ? std::vector<std::string>{} : config_.listen) {
    if (absl::StartsWith(l, "unix:")) {
      auto ul = std::make_unique<UnixListener>(l.substr(5), config_.security.unix_socket);
      if (auto s = ul->Bind(); !s.ok()) return Fail(std::string(s.message()));
      unix_listeners_.push_back(std::move(ul));
    } else {
      auto creds = TcpCredentials(l, config_.security, *gate_);
      if (!creds.ok()) return Fail(std::string(creds.status().message()));
      auto port = std::make_unique<int>(0);
      builder_.AddListeningPort(l.substr(4), *creds, port.get());
      tcp_ports_.emplace_back(l, std::move(port));
    }
  }
  return std::nullopt;
}

// The bound ports said on stdout (and a lab's advertised address filled
// in), the lab joined, the relays and unix listeners started.
std::optional<int> Daemon::StartListeners() {
  for (auto& [listen_addr, port] : tcp_ports_) {
    if (*port == 0) return Fail(absl::StrCat("listen ", listen_addr, ": cannot bind"));
    const std::string addr = listen_addr.substr(4);
    std::string host = addr.substr(0, addr.rfind(':'));
    std::printf("fwaid: listening on %s:%s:%d\n", config_.security.tls.enabled() ? "tls" : "tcp",
                host.c_str(), *port);
    std::fflush(stdout);
    if (lab_registrar_ && absl::StartsWith(listen_addr, "tls:") &&
        absl::EndsWith(config_.lab.advertise, ":0")) {
      const std::string& a = config_.lab.advertise;
      lab_registrar_->SetAdvertise(absl::StrCat(a.substr(0, a.size() - 1), *port));
    }
  }
  if (lab_registrar_) lab_registrar_->Start();  // joins the lab now that it serves
  fd_cq_thread_ = std::thread([cq = fd_cq_.get()] {
    void* tag;
    bool ok;
    while (cq->Next(&tag, &ok)) {
    }
  });
  for (auto& [relay, port] : relays_) {
    if (*port == 0) {
      return Fail(absl::StrCat(relay->address(), ": cannot bind its relay port on 127.0.0.1"));
    }
    relay->Start(*port, &peers_);
    std::printf("fwaid: listening on %s (socket from systemd)\n", relay->address().c_str());
  }
  for (auto& ul : unix_listeners_) {
    ul->Start(server_.get(), &peers_);
    std::printf("fwaid: listening on unix:%s%s\n", ul->path().c_str(),
                passed_.any() ? " (socket from systemd)" : "");
    if (pid_file_.empty() && !passed_.any()) {
      pid_file_ = ul->path() + ".pid";
      std::ofstream(pid_file_) << getpid() << "\n";
    }
  }
  std::printf("fwaid: ready (pid %d, data %s, providers: %s)\n", getpid(), config_.data_dir.c_str(),
              providers_.providers.empty() ? "none" : providers_.default_name.c_str());
  std::fflush(stdout);
  spdlog::info("fwaid {} started; data dir {}", FWAI_VERSION, config_.data_dir);
  sd_notify(0, "READY=1");  // Type=notify units (no-op otherwise)
  return std::nullopt;
}

// Stops in order: listeners, turns, sessions, the lab, hardware, the
// server, pools, MCP; then the indexes and the WAL are saved. 0 if all of
// it ended cleanly.
int Daemon::Stop(int sig) {
  spdlog::info("signal {}: shutting down", sig);
  audit_({{"kind", "daemon_stop"}, {"signal", sig}});
  data_lock_->MarkStopping();
  sd_notify(0, "STOPPING=1");
  for (auto& ul : unix_listeners_) ul->Stop();
  for (auto& [relay, port] : relays_) relay->Stop();
  turns_->Shutdown();
  sessions_->CloseAll(
      absl::UnavailableError("fwaid is shutting down; reconnect after it restarts"));
  if (lab_registrar_) lab_registrar_->Stop(true);  // this node's boards leave the lab now
  hardware_->Shutdown();  // serial readers get end-of-stream, simulators stop
  spdlog::info("turns stopped; closing the server");
  // Turns are finished and every stream has been told to close; connections
  // adopted by fd are not drained by gRPC itself, so the grace is short.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  server_->Wait();
  spdlog::info("server closed");
  fd_cq_->Shutdown();
  fd_cq_thread_.join();
  pool_->Shutdown();
  ingest_pool_->Shutdown();
  mcp_->Stop();
  if (auto s = knowledge_->SaveIndexes(); !s.ok())
    spdlog::error("saving knowledge indexes: {}", s.ToString());
  if (auto s = storage_->SyncWal(); !s.ok()) {
    spdlog::error("final sync failed: {}", s.ToString());
    return 1;
  }
  if (!pid_file_.empty()) unlink(pid_file_.c_str());
  telemetry::Shutdown();  // the last spans and metrics go to the collector
  spdlog::info("stopped cleanly");
  return 0;
}

int Main(int argc, char** argv) {
  // Signals are taken synchronously by the main thread; block them before any
  // other thread exists so every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Args args;
  if (auto done = ParseArgs(argc, argv, args)) return *done;
  RunBlasOnCallingThreads();
  auto logger = spdlog::stderr_color_mt("fwaid");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  DaemonConfig config;
  PassedSockets passed;
  if (auto failed = ResolveConfig(args, config, passed)) return *failed;
  Daemon daemon(std::move(config), std::move(passed));
  if (auto failed = daemon.Start()) return *failed;
  return daemon.Stop(daemon.Serve(sigs));
}

}  // namespace
}  // namespace fwai

int main(int argc, char** argv) { return fwai::Main(argc, argv); }
