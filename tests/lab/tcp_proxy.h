// A TCP proxy on loopback for the lab's partition tests: a node reaches etcd
// through it, and the test cuts that node off (and heals it) without root,
// namespaces or firewall rules, leaving every other node's path alone.
//
// Cut() is a partition as a network makes one: bytes stop flowing both ways
// on every connection, and new connections are accepted but never answered,
// so callers see timeouts, not refusals. Heal() drops the connections that
// were cut (their ends see a reset and connect again) and lets new ones
// through. Thread-safe; one thread moves the bytes.
#pragma once

#include <mutex>
#include <thread>
#include <vector>

namespace fwai::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 (a free port) and forwards to 127.0.0.1:target_port.
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  void Cut();
  void Heal();

 private:
  struct Pair {
    int client = -1, server = -1;  // server -1: accepted while cut, never forwarded
  };
  void Run();
  void Wake();

  const int target_port_;
  int listen_fd_ = -1, port_ = 0;
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  bool cut_ = false;         // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  int generation_ = 0;       // guarded by mu_; changes with Cut and Heal
  std::vector<Pair> pairs_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace fwai::testing
