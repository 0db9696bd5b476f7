// The shared-daemon sections of fwaid.yaml: TLS, the unix socket's access,
// users (how each is recognised, its role, the local account it acts as),
// and per-user limits.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fwai {

struct TlsConfig {
  std::string cert;           // server certificate chain (PEM), watched and reloaded
  std::string key;            // its private key
  std::string client_ca;      // optional: client certificates from this CA (mTLS)
  int reload_interval_s = 5;  // how often the files are checked for new certificates
  bool enabled() const { return !cert.empty(); }
};

struct UnixSocketConfig {
  int mode = 0600;    // of the socket file
  std::string group;  // group of the socket (and of its directory when fwaid makes it)
};

// Per principal. Over a limit a call gets RESOURCE_EXHAUSTED naming it.
struct LimitsConfig {
  int64_t sessions = 200;     // sessions owned
  int64_t running_turns = 4;  // turns running at once
  int64_t running_runs = 4;   // skill runs running at once
  int64_t leases = 4;         // board leases held
  int64_t lease_ttl_max_s = 86400;
  int64_t ingest_mb_per_hour = 2048;
  double requests_per_second = 50;  // sustained; bursts up to `burst`
  int64_t burst = 200;
};

struct UserConfig {
  std::string name;
  std::string role = "user";           // admin | user | ci
  std::string cert_subject;            // "CN=alice" (or the full subject) of an mTLS certificate
  std::string local_user;              // the local account its sessions act as ("" : none)
  std::optional<LimitsConfig> limits;  // overrides, merged over the global limits
};

struct SecurityConfig {
  TlsConfig tls;
  UnixSocketConfig unix_socket;
  std::map<std::string, UserConfig> users;
  LimitsConfig limits;
  // Roles that may add to and remove from the shared knowledge base.
  std::vector<std::string> knowledge_writers = {"admin", "user"};
};

// The limits of `user` (its own overrides over the global ones).
LimitsConfig LimitsFor(const SecurityConfig& c, const std::string& user);

}  // namespace fwai
