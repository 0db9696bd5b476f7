// Real etcd members (Debian's etcd-server) on loopback ports for the lab
// tests: each with its own data dir under a temp dir. As a lab runs it:
// clients over TLS with --client-cert-auth, a CA made by `fwaid tls init`
// (tls_dir()), and etcd's authentication on (deploy/lab-etcd-auth): each
// node an etcd user that writes only its own registry keys, the tests'
// own client etcd's root.
//
// etcd cannot listen on port 0 and report the port, so ports are picked by
// binding port 0 ourselves and closing the socket; a member that still finds
// its port taken (another process got it in between) makes the whole
// cluster start again on fresh ports, up to a few times.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/lab/etcd_client.h"

namespace fwai::testing {

class EtcdCluster {
 public:
  explicit EtcdCluster(int members = 3);
  ~EtcdCluster();  // kills every member

  // Starts every member and waits until the cluster has a leader and serves.
  bool Start();
  // Stops member i (SIGKILL) / starts it again on its ports and data.
  void StopMember(int i);
  bool StartMember(int i);
  // Waits until member i answers a linearizable read (it has a leader).
  bool WaitServing(int i, int timeout_s = 30);

  int size() const { return static_cast<int>(members_.size()); }
  // "127.0.0.1:PORT" of each member's client URL.
  std::vector<std::string> endpoints() const;
  std::string endpoint(int i) const;
  // "https://127.0.0.1:P1,https://..." for etcdctl --endpoints.
  std::string endpoints_csv() const;
  // A client as etcd's root (every key).
  lab::EtcdOptions Options() const;
  // The CA (ca.pem), etcd's server certificate and the root's; node and
  // person certificates are issued here too.
  const std::string& tls_dir() const { return tls_dir_; }
  // Node `node`: its certificate tls_dir()/NODE.pem, .key (a node's, for
  // 127.0.0.1) and its etcd user and role. False (the reason in `error`)
  // when either could not be made.
  bool AddNode(const std::string& node, std::string* error = nullptr);
  // The lines of a node's `lab:` section that reach this cluster as `node`
  // (etcd, etcd_ca, etcd_cert, etcd_key), after AddNode(node); through
  // `ports` (one per member, e.g. TcpProxy ports) instead when given.
  std::string LabEtcdYaml(const std::string& node, const std::vector<int>& ports = {});
  // etcdctl's environment as the holder of `cert_base` (tls_dir()/BASE.pem
  // and .key; "" for no client certificate at all).
  std::vector<std::string> CtlEnv(const std::string& cert_base = "root") const;
  pid_t pid(int i) const { return members_[i].pid; }
  const std::string& dir() const { return dir_; }
  std::string log(int i) const;

 private:
  struct Member {
    std::string name, data_dir, log;
    int client_port = 0, peer_port = 0;
    pid_t pid = -1;
  };
  bool Launch(Member& m, bool fresh);
  void KillAll();
  bool MakeTls();
  std::string initial_cluster_;
  std::string dir_, tls_dir_;
  std::vector<Member> members_;
};

// A free TCP port on 127.0.0.1 at the time of the call.
int PickFreePort();

// `n` free TCP ports on 127.0.0.1, all different: each is held bound until all are picked, so
// the kernel cannot hand the same one out twice.
std::vector<int> PickFreePorts(int n);

// Polls `cond` every 50 ms until it holds or `timeout` passes; its last answer.
template <typename F>
bool Eventually(F cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

}  // namespace fwai::testing
