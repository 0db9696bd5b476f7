#include "tests/lab/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace fwai::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Writes all of `n` bytes (the peer is on loopback: it drains quickly).
bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void Close(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = Loopback(0);
  socklen_t len = sizeof(a);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(listen_fd_, 64) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error("tcp proxy: cannot listen on loopback");
  }
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { Run(); });
}

TcpProxy::~TcpProxy() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  for (auto& p : pairs_) {
    Close(p.client);
    Close(p.server);
  }
  Close(listen_fd_);
  Close(wake_[0]);
  Close(wake_[1]);
}

void TcpProxy::Wake() { (void)!write(wake_[1], "x", 1); }

void TcpProxy::Cut() {
  {
    std::lock_guard lock(mu_);
    cut_ = true;
    ++generation_;
  }
  Wake();
}

void TcpProxy::Heal() {
  {
    std::lock_guard lock(mu_);
    cut_ = false;
    ++generation_;
    // What was cut is dropped: a reset, and its client connects again.
    for (auto& p : pairs_) {
      linger l{1, 0};
      setsockopt(p.client, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      Close(p.client);
      Close(p.server);
    }
    pairs_.clear();
  }
  Wake();
}

void TcpProxy::Run() {
  char buf[64 * 1024];
  while (true) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    std::vector<size_t> owner;  // fds[i + 2] belongs to pairs_[owner[i]]
    int generation = 0;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      generation = generation_;
      if (!cut_) {
        for (size_t i = 0; i < pairs_.size(); ++i) {
          if (pairs_[i].server < 0) continue;
          fds.push_back({pairs_[i].client, POLLIN, 0});
          fds.push_back({pairs_[i].server, POLLIN, 0});
          owner.push_back(i);
          owner.push_back(i);
        }
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[0].revents) {
      while (read(wake_[0], buf, sizeof(buf)) > 0) {
      }
      continue;  // the state changed: poll what is now to be polled
    }
    std::lock_guard lock(mu_);
    if (generation != generation_) continue;  // cut or healed since the poll began
    if (fds[1].revents & POLLIN) {
      const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        Pair p{c, -1};
        if (!cut_) {
          p.server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in t = Loopback(target_port_);
          if (connect(p.server, reinterpret_cast<sockaddr*>(&t), sizeof(t)) != 0) {
            Close(p.server);
            Close(p.client);  // the target is down: so is the path
          }
        }
        if (p.client >= 0) pairs_.push_back(p);
      }
    }
    if (cut_) continue;
    std::vector<bool> dead(pairs_.size(), false);
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Pair& p = pairs_[owner[i - 2]];
      const int from = fds[i].fd;
      const int to = from == p.client ? p.server : p.client;
      const ssize_t n = read(from, buf, sizeof(buf));
      if (n <= 0 || !WriteAll(to, buf, static_cast<size_t>(n))) dead[owner[i - 2]] = true;
    }
    for (size_t i = pairs_.size(); i-- > 0;) {
      if (i < dead.size() && dead[i]) {
        Close(pairs_[i].client);
        Close(pairs_[i].server);
        pairs_.erase(pairs_.begin() + static_cast<long>(i));
      }
    }
  }
}

}  // namespace fwai::testing
