// api: one final class per proto service. Validates input, maps proto <->
// domain, absl::Status -> grpc::Status; nothing else.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

namespace grpc {
class Service;
class Status;
}  // namespace grpc

namespace fwai {

namespace lab {
class EtcdClient;
class LabLeases;
class LabStandIns;
}  // namespace lab

class SessionManager;
class TurnManager;
class KnowledgeBase;
class ToolCatalogStore;
class ThreadPool;
class HardwareBroker;
class EvidenceLog;
class SkillRunner;
class Boards;
class BoardLeases;
class Gate;
class RolloutManager;
class PluginStore;
class SvdCatalog;
struct DaemonConfig;
struct FirmwareReportDeps;
class Watches;
class Checkpoints;
class SessionShares;
struct ProviderSet;

// Who is calling: connections accepted on our unix sockets are registered
// with their peer credentials (SO_PEERCRED) and later looked up by the peer
// string gRPC reports ("fd:N"). Thread-safe.
class PeerRegistry {
 public:
  void Add(int fd, uint32_t uid);
  // "uid:N" for unix-socket callers, "tcp:<peer>" otherwise.
  std::string Identity(const std::string& grpc_peer) const;
  // The uid behind a peer, or -1.
  int64_t Uid(const std::string& grpc_peer) const;
  // A connection relayed from a socket systemd passed: gRPC sees the relay's
  // 127.0.0.1 address `inner`; `real` is the client's.
  void AddRelayed(const std::string& inner, const std::string& real);
  void RemoveRelayed(const std::string& inner);
  // The client's address for a gRPC peer string (the same unless relayed).
  std::string Real(const std::string& grpc_peer) const;

 private:
  mutable Mutex mu_;
  std::map<int, uint32_t> by_fd_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> relayed_ ABSL_GUARDED_BY(mu_);
};

struct ApiDeps {
  SessionManager* sessions = nullptr;
  TurnManager* turns = nullptr;
  SessionShares* shares = nullptr;  // who else may use a session (null: nobody)
  const DaemonConfig* config = nullptr;
  const ProviderSet* providers = nullptr;
  PeerRegistry* peers = nullptr;
  KnowledgeBase* knowledge = nullptr;  // may be null: Knowledge answers UNAVAILABLE
  ToolCatalogStore* catalog = nullptr;
  ThreadPool* pool = nullptr;          // runs work that must not block reactions
  ThreadPool* ingest_pool = nullptr;   // runs document ingest (null: `pool` does)
  HardwareBroker* hardware = nullptr;  // may be null: Hardware answers UNAVAILABLE
  // Every board, this node's and (in a lab) the other nodes': set with `hardware`.
  Boards* boards = nullptr;
  BoardLeases* leases = nullptr;       // who holds which board, listed and leased
  Watches* watches = nullptr;          // rules on boards' output (may be null: UNAVAILABLE)
  Checkpoints* checkpoints = nullptr;  // sessions' checkpoints (may be null: UNAVAILABLE)
  EvidenceLog* evidence = nullptr;     // may be null: Evidence answers UNAVAILABLE
  SkillRunner* skills = nullptr;       // may be null: Skills.Run answers UNAVAILABLE
  Gate* gate = nullptr;                // who calls, and whether the table lets them
  // Appends a record to the evidence log (may be null): every change, with
  // the verified principal and the peer.
  std::function<void(const nlohmann::json&)> audit;
  // Re-reads users and limits from the config file (SIGHUP, Daemon.ReloadConfig);
  // returns how many users it has.
  // Reloads fwaid.yaml for `principal` calling from `peer` (both in its record).
  std::function<absl::StatusOr<int>(const std::string& principal, const std::string& peer)>
      reload_config;
  const FirmwareReportDeps* firmware = nullptr;  // may be null: Firmware answers UNAVAILABLE
  const SvdCatalog* svd_catalog = nullptr;       // may be null: CheckRegisters answers UNAVAILABLE
  RolloutManager* rollouts = nullptr;            // may be null: Ota answers UNAVAILABLE
  PluginStore* plugins = nullptr;                // may be null: Plugins answers UNAVAILABLE
  std::function<void(const std::string&)> on_session_deleted;
  std::function<void()> request_shutdown;
  // A node of a lab (may be null): every board of the lab is listed, and
  // boards of other nodes are leased through etcd.
  lab::EtcdClient* lab_etcd = nullptr;
  lab::LabLeases* lab_leases = nullptr;
  lab::LabStandIns* lab_stand_ins = nullptr;  // a bench's leases for the other nodes' lab leases
  std::string lab_node;
  int64_t started_us = 0;
  uint32_t daemon_uid = 0;
  std::string version;
};

// All services the daemon serves, ready to register with a grpc::ServerBuilder.
std::vector<std::unique_ptr<grpc::Service>> MakeServices(const ApiDeps& deps);

std::unique_ptr<grpc::Service> MakeKnowledgeService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeToolCatalogService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeHardwareService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeEvidenceService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeProjectsService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeSkillsService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeAuthService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeFirmwareService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakeOtaService(const ApiDeps& deps);
// LabNode: a bench's boards worked on by the other nodes of its lab.
std::unique_ptr<grpc::Service> MakeLabNodeService(const ApiDeps& deps);
std::unique_ptr<grpc::Service> MakePluginsService(const ApiDeps& deps);

// A request's project root: required, an existing directory, canonical.
[[nodiscard]] absl::StatusOr<std::string> CanonicalProjectRoot(const std::string& root);

// The one place absl::Status becomes grpc::Status.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace fwai
