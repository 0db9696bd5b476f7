// The lab's registry in etcd: which nodes (fwaids) are up and which boards
// each one owns.
//
//   /fwai/nodes/NODE        {"node","advertise","pid","version","started_us"}
//   /fwai/boards/NODE/ID    {"id","node","kind","name","target","tags","health","health_reason"}
//
// A bench writes its keys under one etcd lease that it keeps alive: if it
// dies, etcd deletes them when the lease's TTL runs out.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/lab_config.h"

namespace fwai::lab {

class EtcdClient;

inline constexpr char kNodesPrefix[] = "/fwai/nodes/";
inline constexpr char kBoardsPrefix[] = "/fwai/boards/";

struct LabBoard {
  std::string id, node, kind, name, target, health, health_reason;
  std::vector<std::string> tags;                             // "key" or "key:value"
  std::vector<std::pair<std::string, std::string>> streams;  // (id, name), as DeviceInfo's
  bool operator==(const LabBoard&) const = default;
};

struct LabNode {
  std::string node, advertise, version;
  int64_t pid = 0;
  int64_t started_us = 0;
};

std::string BoardToJson(const LabBoard& b);
[[nodiscard]] absl::StatusOr<LabBoard> BoardFromJson(const std::string& text);

// Every board and node registered now (one consistent read each).
struct LabView {
  std::vector<LabNode> nodes;
  std::vector<LabBoard> boards;
  int64_t revision = 0;
};
[[nodiscard]] absl::StatusOr<LabView> ReadLab(EtcdClient& etcd);

// Keeps this node and its boards registered while it runs. etcd may be down
// at the start or go away later: the node serves its own boards meanwhile and
// (re)joins as soon as etcd answers.
class LabRegistrar {
 public:
  // `boards()` is this node's boards now; it is polled (about twice a
  // second) and on Poke(), and what changed is written.
  LabRegistrar(LabConfig config, EtcdClient& etcd, std::function<std::vector<LabBoard>()> boards,
               std::string version);
  ~LabRegistrar();  // Stop(true)

  void Start();
  // Before Start: where other nodes reach this one (tls:HOST:PORT).
  void SetAdvertise(std::string advertise);
  // `leave`: revoke the lease, so the node and its boards leave the lab at
  // once (a clean stop); otherwise they stay until the TTL runs out.
  void Stop(bool leave);
  // The boards changed: write them now.
  void Poke();

  struct State {
    bool joined = false;  // registered under a live lease
    int64_t lease = 0;
    std::string last_error;
  };
  State state() const;

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace fwai::lab
