#include "tests/lab/etcd_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {

namespace {

// Binds a socket to an ephemeral port on 127.0.0.1; the port (0 on failure) and the socket.
int BindEphemeral(int* fd_out) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  *fd_out = fd;
  return port;
}

}  // namespace

int PickFreePort() {
  int fd = -1;
  const int port = BindEphemeral(&fd);
  close(fd);
  return port;
}

std::vector<int> PickFreePorts(int n) {
  std::vector<int> ports, fds;
  for (int i = 0; i < n; ++i) {
    int fd = -1;
    ports.push_back(BindEphemeral(&fd));
    fds.push_back(fd);
  }
  for (int fd : fds) close(fd);
  return ports;
}

EtcdCluster::EtcdCluster(int members) : members_(members) {
  dir_ = MakeTempDir("fwai-etcd-");
  tls_dir_ = dir_ + "/tls";
  for (int i = 0; i < members; ++i) {
    members_[i].name = "m" + std::to_string(i + 1);
    members_[i].data_dir = dir_ + "/" + members_[i].name;
    members_[i].log = dir_ + "/" + members_[i].name + ".log";
  }
}

EtcdCluster::~EtcdCluster() {
  KillAll();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void EtcdCluster::KillAll() {
  for (int i = 0; i < size(); ++i) StopMember(i);
}

std::string EtcdCluster::endpoint(int i) const {
  return "127.0.0.1:" + std::to_string(members_[i].client_port);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

std::string EtcdCluster::endpoints_csv() const {
  std::string out;
  for (int i = 0; i < size(); ++i) out += (i ? ",https://" : "https://") + endpoint(i);
  return out;
}

lab::EtcdOptions EtcdCluster::Options() const {
  lab::EtcdOptions o;
  for (const auto& e : endpoints()) o.endpoints.push_back("https://" + e);
  o.ca_file = tls_dir_ + "/ca.pem";
  o.cert_file = tls_dir_ + "/root.pem";
  o.key_file = tls_dir_ + "/root.key";
  return o;
}

std::vector<std::string> EtcdCluster::CtlEnv(const std::string& cert_base) const {
  std::vector<std::string> env = {"ETCDCTL_API=3", "ETCDCTL_ENDPOINTS=" + endpoints_csv(),
                                  "ETCDCTL_CACERT=" + tls_dir_ + "/ca.pem"};
  if (!cert_base.empty()) {
    env.push_back("ETCDCTL_CERT=" + tls_dir_ + "/" + cert_base + ".pem");
    env.push_back("ETCDCTL_KEY=" + tls_dir_ + "/" + cert_base + ".key");
  }
  return env;
}

namespace {

int Fwaid(const std::vector<std::string>& args, std::string* err) {
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwaid"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  return RunCommand(argv, &out, err);
}

}  // namespace

bool EtcdCluster::MakeTls() {
  if (std::filesystem::exists(tls_dir_ + "/root.pem")) return true;
  std::string err;
  return Fwaid({"tls", "init", tls_dir_, "--host", "127.0.0.1"}, &err) == 0 &&
         Fwaid({"tls", "issue", tls_dir_, "--user", "root"}, &err) == 0;
}

bool EtcdCluster::AddNode(const std::string& node, std::string* error) {
  std::string out, err;
  if (!std::filesystem::exists(tls_dir_ + "/" + node + ".pem") &&
      Fwaid({"tls", "issue", tls_dir_, "--node", node, "--host", "127.0.0.1"}, &err) != 0) {
    if (error) *error = "fwaid tls issue --node " + node + ": " + err;
    return false;
  }
  if (RunCommand({std::string(FWAI_DEPLOY_DIR) + "/lab-etcd-auth", "add-node", node}, &out, &err,
                 CtlEnv(), 30) != 0) {
    if (error) *error = "lab-etcd-auth add-node " + node + ": " + err;
    return false;
  }
  return true;
}

std::string EtcdCluster::LabEtcdYaml(const std::string& node, const std::vector<int>& ports) {
  std::string error;
  if (!AddNode(node, &error)) return "  # " + error + "\n";
  std::vector<std::string> via = endpoints();
  if (!ports.empty()) {
    via.clear();
    for (int p : ports) via.push_back("127.0.0.1:" + std::to_string(p));
  }
  std::string eps;
  for (const auto& e : via) eps += (eps.empty() ? "https://" : ", https://") + e;
  return "  etcd: [" + eps + "]\n  etcd_ca: " + tls_dir_ + "/ca.pem\n  etcd_cert: " + tls_dir_ +
         "/" + node + ".pem\n  etcd_key: " + tls_dir_ + "/" + node + ".key\n";
}

std::string EtcdCluster::log(int i) const {
  std::ifstream in(members_[i].log);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool EtcdCluster::Launch(Member& m, bool fresh) {
  const std::string client = "https://127.0.0.1:" + std::to_string(m.client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
  std::vector<std::string> argv = {"/usr/bin/etcd",
                                   "--name",
                                   m.name,
                                   "--data-dir",
                                   m.data_dir,
                                   "--listen-client-urls",
                                   client,
                                   "--advertise-client-urls",
                                   client,
                                   "--client-cert-auth",
                                   "--trusted-ca-file",
                                   tls_dir_ + "/ca.pem",
                                   "--cert-file",
                                   tls_dir_ + "/server.pem",
                                   "--key-file",
                                   tls_dir_ + "/server.key",
                                   "--listen-peer-urls",
                                   peer,
                                   "--initial-advertise-peer-urls",
                                   peer,
                                   "--initial-cluster",
                                   initial_cluster_,
                                   "--initial-cluster-state",
                                   fresh ? "new" : "existing",
                                   "--initial-cluster-token",
                                   dir_,
                                   "--logger",
                                   "zap",
                                   "--log-level",
                                   "warn"};
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(m.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  m.pid = pid;
  return pid > 0;
}

bool EtcdCluster::Start() {
  if (!MakeTls()) return false;
  for (int attempt = 0; attempt < 5; ++attempt) {
    KillAll();
    initial_cluster_.clear();
    const std::vector<int> ports = PickFreePorts(2 * size());
    for (size_t i = 0; i < members_.size(); ++i) {
      Member& m = members_[i];
      std::error_code ec;
      std::filesystem::remove_all(m.data_dir, ec);
      std::filesystem::remove(m.log, ec);
      m.client_port = ports[2 * i];
      m.peer_port = ports[2 * i + 1];
      initial_cluster_ += (initial_cluster_.empty() ? "" : ",") + m.name +
                          "=http://127.0.0.1:" + std::to_string(m.peer_port);
    }
    bool launched = true;
    for (auto& m : members_) launched = launched && Launch(m, true);
    if (!launched) return false;
    bool ok = true;
    for (int i = 0; i < size() && ok; ++i) ok = WaitServing(i);
    if (ok) {
      std::string out, err;
      return RunCommand({std::string(FWAI_DEPLOY_DIR) + "/lab-etcd-auth", "enable"}, &out, &err,
                        CtlEnv(), 30) == 0;
    }
    bool port_taken = false;
    for (int i = 0; i < size(); ++i)
      port_taken = port_taken || log(i).find("address already in use") != std::string::npos;
    if (!port_taken) return false;  // something else is wrong: the logs say what
  }
  return false;
}

void EtcdCluster::StopMember(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return;
  kill(m.pid, SIGKILL);
  waitpid(m.pid, nullptr, 0);
  m.pid = -1;
}

bool EtcdCluster::StartMember(int i) {
  // Its data dir holds its membership: "existing" is ignored then, as in production.
  return members_[i].pid <= 0 && Launch(members_[i], false);
}

bool EtcdCluster::WaitServing(int i, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    Member& m = members_[i];
    if (m.pid <= 0) return false;
    if (waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
      m.pid = -1;
      return false;  // it exited (a port taken, bad flags: see its log)
    }
    std::string out, err;
    // A linearizable read: answers only with a leader and a quorum.
    std::vector<std::string> env = CtlEnv();
    env[1] = "ETCDCTL_ENDPOINTS=https://" + endpoint(i);
    int rc = RunCommand({"/usr/bin/etcdctl", "--command-timeout=2s", "get", "/fwai-probe"}, &out,
                        &err, env, 10);
    if (rc == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace fwai::testing
