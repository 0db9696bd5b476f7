#include "common/security_config.h"

#include <sys/stat.h>

#include "common/config_reader.h"

namespace fwai {
namespace {

const std::set<std::string> kRoles = {"admin", "user", "ci"};

absl::Status ParseLimits(ConfigReader& r, const YAML::Node& n, const std::string& field,
                         LimitsConfig& l) {
  CFG_TRY(r.CheckKeys(n, field,
                      {"sessions", "running_turns", "running_runs", "leases", "lease_ttl_max_s",
                       "ingest_mb_per_hour", "requests_per_second", "burst"}));
  struct IntField {
    const char* key;
    int64_t lo, hi;
    int64_t* out;
  };
  for (const IntField& f : {IntField{"sessions", 0, 1000000, &l.sessions},
                            IntField{"running_turns", 0, 10000, &l.running_turns},
                            IntField{"running_runs", 0, 10000, &l.running_runs},
                            IntField{"leases", 0, 10000, &l.leases},
                            IntField{"lease_ttl_max_s", 1, 365 * 86400, &l.lease_ttl_max_s},
                            IntField{"ingest_mb_per_hour", 0, 1 << 30, &l.ingest_mb_per_hour},
                            IntField{"burst", 1, 1000000, &l.burst}}) {
    if (n[f.key]) CFG_TRY(r.Int(n[f.key], field + "." + f.key, f.lo, f.hi, *f.out));
  }
  if (n["requests_per_second"]) {
    CFG_TRY(r.Double(n["requests_per_second"], field + ".requests_per_second", 0.01, 1e6,
                     l.requests_per_second));
  }
  return absl::OkStatus();
}

}  // namespace

LimitsConfig LimitsFor(const SecurityConfig& c, const std::string& user) {
  auto it = c.users.find(user);
  return it != c.users.end() && it->second.limits ? *it->second.limits : c.limits;
}

absl::Status ParseSecurityConfig(ConfigReader& r, const YAML::Node& root, SecurityConfig& out) {
  if (auto n = root["tls"]) {
    CFG_TRY(r.CheckKeys(n, "tls", {"cert", "key", "client_ca", "reload_interval_s"}));
    if (n["reload_interval_s"])
      CFG_TRY(r.Int(n["reload_interval_s"], "tls.reload_interval_s", 1, 3600,
                    out.tls.reload_interval_s));
    if (n["cert"]) CFG_TRY(r.String(n["cert"], "tls.cert", out.tls.cert));
    if (n["key"]) CFG_TRY(r.String(n["key"], "tls.key", out.tls.key));
    if (n["client_ca"]) CFG_TRY(r.String(n["client_ca"], "tls.client_ca", out.tls.client_ca));
    if (out.tls.cert.empty() != out.tls.key.empty()) {
      return r.Error(n, "tls",
                     "cert and key go together (fwaid tls init DIR --host NAME writes both)");
    }
    if (!out.tls.client_ca.empty() && out.tls.cert.empty()) {
      return r.Error(n, "tls.client_ca",
                     "needs tls.cert and tls.key: client certificates are checked over TLS");
    }
    for (const auto& [field, path] : {std::pair<const char*, std::string>{"cert", out.tls.cert},
                                      {"key", out.tls.key},
                                      {"client_ca", out.tls.client_ca}}) {
      struct stat st {};
      if (!path.empty() && stat(path.c_str(), &st) != 0) {
        return r.Error(n[field], absl::StrCat("tls.", field),
                       absl::StrCat("cannot read '", path, "'"));
      }
    }
  }
  if (auto n = root["unix_socket"]) {
    CFG_TRY(r.CheckKeys(n, "unix_socket", {"mode", "group"}));
    if (auto m = n["mode"]) {
      std::string s;
      CFG_TRY(r.String(m, "unix_socket.mode", s));
      char* end = nullptr;
      long v = std::strtol(s.c_str(), &end, 8);
      if (s.empty() || *end != '\0' || v < 0 || v > 0777 || (v & 0600) != 0600) {
        return r.Error(m, "unix_socket.mode",
                       "expected an octal mode such as \"0660\" that gives the owner rw");
      }
      if (v & 0007)
        return r.Error(m, "unix_socket.mode",
                       "must not give others access; share the socket through a group");
      out.unix_socket.mode = static_cast<int>(v);
    }
    if (n["group"]) CFG_TRY(r.String(n["group"], "unix_socket.group", out.unix_socket.group));
  }
  if (auto n = root["limits"]) CFG_TRY(ParseLimits(r, n, "limits", out.limits));
  if (auto n = root["knowledge_writers"]) {
    if (!n.IsSequence())
      return r.Error(n, "knowledge_writers", "expected a list of roles (admin, user, ci)");
    out.knowledge_writers.clear();
    for (const auto& item : n) {
      std::string role;
      CFG_TRY(r.String(item, "knowledge_writers[]", role));
      if (!kRoles.count(role))
        return r.Error(item, "knowledge_writers[]", "expected admin, user or ci");
      out.knowledge_writers.push_back(role);
    }
  }
  if (auto n = root["users"]) {
    if (!n.IsMap())
      return r.Error(n, "users",
                     "expected a mapping of user name to {role, cert_subject, local_user}");
    std::map<std::string, std::string> subjects;
    for (const auto& kv : n) {
      UserConfig u;
      u.name = kv.first.as<std::string>();
      const std::string f = "users." + u.name;
      if (u.name.empty() || u.name.find_first_of(" :/") != std::string::npos) {
        return r.Error(kv.first, f, "a user name has no spaces, ':' or '/'");
      }
      if (kv.second.IsNull()) {
        out.users[u.name] = u;
        continue;
      }
      CFG_TRY(r.CheckKeys(kv.second, f, {"role", "cert_subject", "local_user", "limits"}));
      if (auto v = kv.second["role"]) {
        CFG_TRY(r.String(v, f + ".role", u.role));
        if (!kRoles.count(u.role)) return r.Error(v, f + ".role", "expected admin, user or ci");
      }
      if (auto v = kv.second["cert_subject"]) {
        CFG_TRY(r.String(v, f + ".cert_subject", u.cert_subject));
        auto [it, fresh] = subjects.emplace(u.cert_subject, u.name);
        if (!fresh) return r.Error(v, f + ".cert_subject", "already maps to user " + it->second);
      }
      if (auto v = kv.second["local_user"]) CFG_TRY(r.String(v, f + ".local_user", u.local_user));
      if (auto v = kv.second["limits"]) {
        LimitsConfig l = out.limits;
        CFG_TRY(ParseLimits(r, v, f + ".limits", l));
        u.limits = l;
      }
      out.users[u.name] = u;
    }
  }
  return absl::OkStatus();
}

}  // namespace fwai
