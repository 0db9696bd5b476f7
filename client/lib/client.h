// Client library used by the fwai CLI: finding and connecting to fwaid
// (starting it when it is not running), and event rendering helpers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"

namespace google::protobuf {
class Message;
}

namespace fwai::v1 {
class ServerEvent;
}

namespace fwai {

struct DaemonAddress {
  std::string grpc_target;  // what grpc::CreateChannel takes
  std::string unix_path;    // set for unix sockets
  bool tls = false;         // tls:HOST:PORT
  bool is_default = false;  // no --daemon / FWAI_DAEMON / login was given
  bool from_login = false;  // the address of `fwai login`
};

// How a client proves who it is to a daemon over TCP. Tokens never come
// from the command line: FWAI_TOKEN, a token file, or the login profile.
struct Credentials {
  std::string ca_cert;      // PEM of the CA that signed the daemon's certificate (tls:)
  std::string client_cert;  // a client certificate and key (mTLS)
  std::string client_key;
  std::string token;
};

struct CredentialFlags {
  std::string ca_cert;  // --ca-cert (else FWAI_CA_CERT)
  std::string client_cert;
  std::string client_key;
  std::string token_file;  // --token-file (else FWAI_TOKEN)
};

// --daemon flag, else $FWAI_DAEMON, else the address `fwai login` stored,
// else the default local socket. Accepts unix:PATH, tcp:HOST:PORT (loopback),
// tls:HOST:PORT, HOST:PORT or an absolute socket path.
absl::StatusOr<DaemonAddress> ResolveDaemonAddress(const std::string& flag);

// Flags and environment first; what `fwai login` stored fills the rest when
// the address is the login's. Errors name the file that cannot be read.
absl::StatusOr<Credentials> ResolveCredentials(const DaemonAddress& addr,
                                               const CredentialFlags& flags);

// The profile `fwai login` keeps (~/.config/fwai/login.json, mode 0600).
struct LoginProfile {
  std::string daemon;
  Credentials credentials;
};
std::string LoginProfilePath();
absl::StatusOr<LoginProfile> LoadLogin();  // NOT_FOUND when there is none
[[nodiscard]] absl::Status SaveLogin(const LoginProfile& profile);
[[nodiscard]] absl::Status RemoveLogin();

// Connects within `timeout_ms`. For the default local socket, starts fwaid
// (found next to this executable, or on PATH) if nobody is listening.
// UNAVAILABLE says how to start or reach the daemon. Over TCP every call
// carries the token, and tls: checks the daemon's certificate.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToDaemon(const DaemonAddress& addr,
                                                               bool autostart, int timeout_ms,
                                                               const Credentials& creds = {});

// Directory of the running executable.
std::string SelfDir();

// Generic proto -> JSON with snake_case field names and numbers as numbers.
nlohmann::json ProtoToJson(const google::protobuf::Message& m);
// {"type": "<payload name>", "session_id", "seq", "time_us", "turn_id", ...payload fields}
nlohmann::json EventToJson(const fwai::v1::ServerEvent& ev);

}  // namespace fwai
