#include "client/lib/client.h"

#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/lib/reach.h"
#include "common/paths.h"
#include "fwai/v1/events.pb.h"

namespace fwai {

namespace {

std::string ReadText(const std::string& path, absl::Status* error, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot be read"));
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string LoginProfilePath() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg && *xdg ? xdg : std::string(home ? home : "/tmp") + "/.config";
  return base + "/fwai/login.json";
}

absl::StatusOr<LoginProfile> LoadLogin() {
  std::ifstream in(LoginProfilePath());
  if (!in) return absl::NotFoundError("not logged in");
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (!j.is_object())
    return absl::DataLossError(
        absl::StrCat(LoginProfilePath(), ": not valid JSON; run fwai login again"));
  LoginProfile p;
  p.daemon = j.value("daemon", "");
  p.credentials.ca_cert = j.value("ca_cert", "");
  p.credentials.client_cert = j.value("client_cert", "");
  p.credentials.client_key = j.value("client_key", "");
  p.credentials.token = j.value("token", "");
  return p;
}

absl::Status SaveLogin(const LoginProfile& p) {
  const std::filesystem::path path = LoginProfilePath();
  if (auto s = MakeDirs(path.parent_path().string(), 0700); !s.ok()) return s;
  nlohmann::json j = {{"daemon", p.daemon},
                      {"ca_cert", p.credentials.ca_cert},
                      {"client_cert", p.credentials.client_cert},
                      {"client_key", p.credentials.client_key},
                      {"token", p.credentials.token}};
  const std::string tmp = path.string() + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  const std::string text = j.dump(2) + "\n";
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  fchmod(fd, 0600);
  close(fd);
  if (!written || rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  }
  return absl::OkStatus();
}

absl::Status RemoveLogin() {
  std::error_code ec;
  std::filesystem::remove(LoginProfilePath(), ec);
  return absl::OkStatus();
}

absl::StatusOr<DaemonAddress> ResolveDaemonAddress(const std::string& flag) {
  std::string a = flag;
  DaemonAddress out;
  if (a.empty()) {
    const char* env = std::getenv("FWAI_DAEMON");
    if (env && *env) a = env;
  }
  if (a.empty()) {
    if (auto login = LoadLogin(); login.ok() && !login->daemon.empty()) {
      a = login->daemon;
      out.from_login = true;
    }
  }
  if (a.empty()) {
    out.unix_path = DefaultSocketPath();
    out.grpc_target = "unix:" + out.unix_path;
    out.is_default = true;
    return out;
  }
  if (absl::StartsWith(a, "unix:")) {
    out.unix_path = a.substr(5);
  } else if (absl::StartsWith(a, "/")) {
    out.unix_path = a;
  } else if (absl::StartsWith(a, "tcp:")) {
    out.grpc_target = a.substr(4);
  } else if (absl::StartsWith(a, "tls:")) {
    out.grpc_target = a.substr(4);
    out.tls = true;
  } else if (a.find(':') != std::string::npos) {
    out.grpc_target = a;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "daemon address '", a, "': expected unix:PATH, tcp:HOST:PORT, tls:HOST:PORT or HOST:PORT"));
  }
  if (!out.unix_path.empty()) out.grpc_target = "unix:" + out.unix_path;
  return out;
}

absl::StatusOr<Credentials> ResolveCredentials(const DaemonAddress& addr,
                                               const CredentialFlags& flags) {
  Credentials c;
  if (addr.from_login) {
    auto login = LoadLogin();
    if (login.ok()) c = login->credentials;
  }
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (!flags.ca_cert.empty()) {
    c.ca_cert = flags.ca_cert;
  } else if (!env("FWAI_CA_CERT").empty()) {
    c.ca_cert = env("FWAI_CA_CERT");
  }
  if (!flags.client_cert.empty()) c.client_cert = flags.client_cert;
  if (!flags.client_key.empty()) c.client_key = flags.client_key;
  if (c.client_cert.empty() != c.client_key.empty()) {
    return absl::InvalidArgumentError("--client-cert and --client-key go together");
  }
  // --token-file, else FWAI_TOKEN: a flag given on the command line wins
  // over the environment, as --ca-cert does over FWAI_CA_CERT.
  if (!flags.token_file.empty()) {
    absl::Status err;
    std::string t = ReadText(flags.token_file, &err, "--token-file");
    if (!err.ok()) return err;
    c.token = std::string(absl::StripAsciiWhitespace(t));
    if (c.token.empty())
      return absl::InvalidArgumentError(absl::StrCat("--token-file ", flags.token_file, ": empty"));
  } else if (!env("FWAI_TOKEN").empty()) {
    c.token = env("FWAI_TOKEN");
  }
  return c;
}

std::string SelfDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

namespace {

// Whether a connection to `path` is accepted; else the errno of the attempt
// in `error` (when given).
bool SocketAccepts(const std::string& path, int* error = nullptr) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  if (!ok && error) *error = errno;
  close(fd);
  return ok;
}

std::string FindFwaid() {
  std::string local = SelfDir() + "/fwaid";
  if (access(local.c_str(), X_OK) == 0) return local;
  return "fwaid";  // execvp searches PATH
}

// Starts fwaid detached from this process (its own session, output to a log
// file next to the socket). Returns once it was spawned, not once it is ready.
absl::Status SpawnDaemon(const std::string& socket_path) {
  const std::string dir = std::filesystem::path(socket_path).parent_path().string();
  if (auto s = MakeDirs(dir, 0700); !s.ok()) return s;
  const std::string log = dir + "/fwaid.log";
  const std::string bin = FindFwaid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    setsid();
    if (fork() != 0) _exit(0);
    int in = open("/dev/null", O_RDONLY);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (in >= 0) dup2(in, 0);
    if (out >= 0) {
      dup2(out, 1);
      dup2(out, 2);
    }
    // Nothing of the caller's (pipes, sockets) may stay open in the daemon.
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    std::string listen = "unix:" + socket_path;
    execlp(bin.c_str(), bin.c_str(), "--listen", listen.c_str(), static_cast<char*>(nullptr));
    std::fprintf(stderr, "fwai: cannot run %s: %s\n", bin.c_str(), std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return absl::OkStatus();
}

}  // namespace

namespace {

// Puts "authorization: Bearer <token>" on every call of a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", value_});
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : value_("Bearer " + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(value_);
  }

 private:
  const std::string value_;
};

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const DaemonAddress& addr, const Credentials& c) {
  if (!addr.unix_path.empty()) return grpc::InsecureChannelCredentials();
  if (addr.tls) {
    grpc::SslCredentialsOptions o;
    absl::Status err;
    if (!c.ca_cert.empty()) o.pem_root_certs = ReadText(c.ca_cert, &err, "--ca-cert");
    if (!c.client_cert.empty()) o.pem_cert_chain = ReadText(c.client_cert, &err, "--client-cert");
    if (!c.client_key.empty()) o.pem_private_key = ReadText(c.client_key, &err, "--client-key");
    if (!err.ok()) return err;
    return grpc::SslCredentials(o);
  }
  // tcp: is loopback only: fwaid serves other hosts over TLS alone.
  return grpc::experimental::LocalCredentials(LOCAL_TCP);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToDaemon(const DaemonAddress& addr,
                                                               bool autostart, int timeout_ms,
                                                               const Credentials& creds) {
  int refused = 0;
  if (!addr.unix_path.empty() && !SocketAccepts(addr.unix_path, &refused)) {
    if (refused == EACCES || refused == EPERM) {
      // fwaid runs; the socket's mode and group keep this user out.
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot connect to unix:", addr.unix_path,
          ": permission denied (the socket's mode and group decide who may connect, see ls -l ",
          addr.unix_path, "; an admin adds you to its group)"));
    }
    if (!(autostart && addr.is_default)) {
      return absl::UnavailableError(absl::StrCat(
          "fwaid is not running at unix:", addr.unix_path,
          addr.is_default ? "" : " (start it with: fwaid --listen unix:" + addr.unix_path + ")"));
    }
    if (auto s = SpawnDaemon(addr.unix_path); !s.ok()) return s;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (!SocketAccepts(addr.unix_path)) {
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::UnavailableError(absl::StrCat(
            "started fwaid but it is not answering on ", addr.unix_path, "; see ",
            std::filesystem::path(addr.unix_path).parent_path().string(), "/fwaid.log"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel_creds = ChannelCredentialsFor(addr, creds);
  if (!channel_creds.ok()) return channel_creds.status();
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (addr.unix_path.empty() && !creds.token.empty()) {
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(creds.token));
  }
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      addr.grpc_target, *channel_creds, args, std::move(interceptors));
  // Why, when a probe of our own can tell (what to change, not gRPC's words).
  auto unreachable = [&](const std::string& why) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach fwaid at ", addr.grpc_target, why.empty() ? "" : ": ", why));
  };
  const int probe_ms = std::clamp(timeout_ms, 500, 3000);
  const auto start = std::chrono::system_clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  // Not connected within a second: a daemon over TCP that the probe finds
  // wrong (nothing listens, a certificate not trusted) is said at once
  // instead of after the whole timeout; otherwise wait the rest.
  if (channel->WaitForConnected(std::min(deadline, start + std::chrono::seconds(1)))) {
    return channel;
  }
  if (std::string why = WhyUnreachable(addr, creds, probe_ms); !why.empty()) {
    return unreachable(why);
  }
  if (channel->WaitForConnected(deadline)) return channel;
  return unreachable(WhyUnreachable(addr, creds, probe_ms));
}

namespace {
using google::protobuf::FieldDescriptor;

nlohmann::json FieldValue(const google::protobuf::Message& m, const FieldDescriptor* f, int index) {
  const auto* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return rep ? r->GetRepeatedEnum(m, f, index)->name() : r->GetEnum(m, f)->name();
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) {
        // Bytes are shown as text when valid UTF-8 is not guaranteed: escape.
        nlohmann::json j = nlohmann::json::binary({s.begin(), s.end()});
        return j;
      }
      return s;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}
}  // namespace

nlohmann::json ProtoToJson(const google::protobuf::Message& m) {
  nlohmann::json j = nlohmann::json::object();
  const auto* d = m.GetDescriptor();
  const auto* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      nlohmann::json obj = nlohmann::json::object();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const auto& entry = r->GetRepeatedMessage(m, f, k);
        auto ej = ProtoToJson(entry);
        obj[ej["key"].is_string() ? ej["key"].get<std::string>() : ej["key"].dump()] = ej["value"];
      }
      j[f->name()] = obj;
    } else if (f->is_repeated()) {
      nlohmann::json arr = nlohmann::json::array();
      for (int k = 0; k < r->FieldSize(m, f); ++k) arr.push_back(FieldValue(m, f, k));
      j[f->name()] = arr;
    } else if (f->containing_oneof() && !r->HasField(m, f)) {
      continue;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(m, f)) {
      continue;
    } else {
      j[f->name()] = FieldValue(m, f, 0);
    }
  }
  return j;
}

nlohmann::json EventToJson(const fwai::v1::ServerEvent& ev) {
  nlohmann::json j = nlohmann::json::object();
  const auto* d = ev.GetDescriptor();
  const auto* r = ev.GetReflection();
  const auto* oneof = d->FindOneofByName("payload");
  const FieldDescriptor* f = r->GetOneofFieldDescriptor(ev, oneof);
  j["type"] = f ? f->name() : "unknown";
  j["session_id"] = ev.session_id();
  j["seq"] = ev.seq();
  j["time_us"] = ev.time_us();
  if (!ev.turn_id().empty()) j["turn_id"] = ev.turn_id();
  if (f) {
    auto payload = ProtoToJson(r->GetMessage(ev, f));
    if (payload.contains("origin")) {
      auto origin = payload["origin"];
      payload.erase("origin");
      if (!payload.contains("agent")) payload["agent"] = origin.value("agent", "main");
      if (!payload.contains("parent_call_id"))
        payload["parent_call_id"] = origin.value("parent_call_id", "");
    }
    for (auto& [k, v] : payload.items()) j[k] = v;
  }
  return j;
}

}  // namespace fwai
