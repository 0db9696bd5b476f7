#include "client/lib/client.h"

#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "fwai/v1/events.pb.h"

namespace fwai {

absl::StatusOr<DaemonAddress> ResolveDaemonAddress(const std::string& flag) {
  std::string a = flag;
  DaemonAddress out;
  if (a.empty()) {
    const char* env = std::getenv("FWAI_DAEMON");
    if (env && *env) a = env;
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
  } else if (a.find(':') != std::string::npos) {
    out.grpc_target = a;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("daemon address '", a, "': expected unix:PATH, tcp:HOST:PORT or HOST:PORT"));
  }
  if (!out.unix_path.empty()) out.grpc_target = "unix:" + out.unix_path;
  return out;
}

std::string SelfDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

namespace {

bool SocketAccepts(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
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

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToDaemon(const DaemonAddress& addr,
                                                               bool autostart, int timeout_ms) {
  if (!addr.unix_path.empty() && !SocketAccepts(addr.unix_path)) {
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
  auto channel = grpc::CreateCustomChannel(addr.grpc_target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(timeout_ms))) {
    return absl::UnavailableError(absl::StrCat("cannot reach fwaid at ", addr.grpc_target));
  }
  return channel;
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
      if (!payload.contains("parent_call_id")) payload["parent_call_id"] = origin.value("parent_call_id", "");
    }
    for (auto& [k, v] : payload.items()) j[k] = v;
  }
  return j;
}

}  // namespace fwai
