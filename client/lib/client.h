// Client library used by the fwai CLI: finding and connecting to fwaid
// (starting it when it is not running), and event rendering helpers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

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
  bool is_default = false;  // no --daemon / FWAI_DAEMON was given
};

// --daemon flag, else $FWAI_DAEMON, else the default local socket. Accepts
// unix:PATH, tcp:HOST:PORT, HOST:PORT or an absolute socket path.
absl::StatusOr<DaemonAddress> ResolveDaemonAddress(const std::string& flag);

// Connects within `timeout_ms`. For the default local socket, starts fwaid
// (found next to this executable, or on PATH) if nobody is listening.
// UNAVAILABLE says how to start or reach the daemon.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToDaemon(const DaemonAddress& addr,
                                                               bool autostart, int timeout_ms);

// Directory of the running executable.
std::string SelfDir();

// Generic proto -> JSON with snake_case field names and numbers as numbers.
nlohmann::json ProtoToJson(const google::protobuf::Message& m);
// {"type": "<payload name>", "session_id", "seq", "time_us", "turn_id", ...payload fields}
nlohmann::json EventToJson(const fwai::v1::ServerEvent& ev);

}  // namespace fwai
