#include "common/lab_config.h"

#include "common/config_reader.h"

namespace fwai {
namespace {

// "HOST:PORT" with a port in 1..65535; `what` names the form in errors.
bool HostPort(const std::string& s, bool zero_ok = false) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= s.size()) return false;
  const std::string port = s.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5) return false;
  const int p = std::stoi(port);
  return (p >= 1 || (zero_ok && p == 0)) && p <= 65535;
}

// A loopback address written as one (no name is looked up): 127.0.0.0/8,
// ::1, localhost.
bool LoopbackHost(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

absl::Status ParseLabConfig(ConfigReader& r, const YAML::Node& n, LabConfig& out) {
  CFG_TRY(r.CheckKeys(n, "lab",
                      {"etcd", "node", "advertise", "ttl_s", "interactive_first", "cert", "key",
                       "ca", "etcd_ca", "etcd_cert", "etcd_key"}));
  auto etcd = n["etcd"];
  if (!etcd)
    return r.Error(n, "lab.etcd",
                   "required: the etcd cluster's client endpoints, e.g. [https://10.0.0.5:2379]");
  if (!etcd.IsSequence() || etcd.size() == 0) {
    return r.Error(etcd, "lab.etcd", "expected a list of endpoints such as https://HOST:2379");
  }
  for (size_t i = 0; i < etcd.size(); ++i) {
    const auto& item = etcd[i];
    std::string e;
    CFG_TRY(r.String(item, "lab.etcd[]", e));
    const bool tls = e.rfind("https://", 0) == 0;
    if (i > 0 && tls != out.etcd_tls) {
      return r.Error(item, "lab.etcd[]",
                     "every endpoint of one cluster is https:// or every one is http://");
    }
    out.etcd_tls = tls;
    const std::string bare = tls ? e.substr(8) : e.rfind("http://", 0) == 0 ? e.substr(7) : e;
    if (!HostPort(bare))
      return r.Error(item, "lab.etcd[]", absl::StrCat("expected https://HOST:PORT, got '", e, "'"));
    if (!tls && !LoopbackHost(bare)) {
      return r.Error(
          item, "lab.etcd[]",
          absl::StrCat(
              "plain http:// to etcd at ", bare,
              " is refused off loopback: anyone who reaches it could steal, forge or erase the "
              "lab's leases. Run etcd with TLS and --client-cert-auth and use https:// with "
              "lab.etcd_ca, lab.etcd_cert, lab.etcd_key (docs: the lab's etcd)"));
    }
    out.etcd.push_back(bare);
  }
  auto node = n["node"];
  if (!node)
    return r.Error(n, "lab.node",
                   "required: this host's name in the lab (letters, digits, '-', '_', '.')");
  CFG_TRY(r.String(node, "lab.node", out.node));
  if (out.node.empty() || out.node.size() > 63 ||
      out.node.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") !=
          std::string::npos) {
    return r.Error(node, "lab.node", "expected 1-63 letters, digits, '-', '_' or '.'");
  }
  if (auto a = n["advertise"]) {
    CFG_TRY(r.String(a, "lab.advertise", out.advertise));
    if (out.advertise.rfind("tls:", 0) != 0 || !HostPort(out.advertise.substr(4), true)) {
      return r.Error(
          a, "lab.advertise",
          "expected tls:HOST:PORT (nodes of a lab talk to each other over mutual TLS only; "
          "port 0: the port fwaid's tls: listener bound)");
    }
  }
  if (auto t = n["ttl_s"]) CFG_TRY(r.Int(t, "lab.ttl_s", 2, 300, out.ttl_s));
  if (auto v = n["interactive_first"]) {
    if (!v.IsScalar() || (v.Scalar() != "true" && v.Scalar() != "false")) {
      return r.Error(v, "lab.interactive_first",
                     "expected true (people before CI in the lab's queue) or false (one "
                     "first-come first-served queue)");
    }
    out.interactive_first = v.Scalar() == "true";
  }
  if (auto v = n["cert"]) CFG_TRY(r.String(v, "lab.cert", out.cert));
  if (auto v = n["key"]) CFG_TRY(r.String(v, "lab.key", out.key));
  if (auto v = n["ca"]) CFG_TRY(r.String(v, "lab.ca", out.ca));
  if (auto v = n["etcd_ca"]) CFG_TRY(r.String(v, "lab.etcd_ca", out.etcd_ca));
  if (auto v = n["etcd_cert"]) CFG_TRY(r.String(v, "lab.etcd_cert", out.etcd_cert));
  if (auto v = n["etcd_key"]) CFG_TRY(r.String(v, "lab.etcd_key", out.etcd_key));
  if (!out.etcd_tls && (!out.etcd_ca.empty() || !out.etcd_cert.empty() || !out.etcd_key.empty())) {
    return r.Error(
        etcd, "lab.etcd",
        "lab.etcd_ca/etcd_cert/etcd_key are set but the endpoints are http://: use https://");
  }
  return absl::OkStatus();
}

}  // namespace fwai
