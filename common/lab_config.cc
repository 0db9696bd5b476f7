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

}  // namespace

absl::Status ParseLabConfig(ConfigReader& r, const YAML::Node& n, LabConfig& out) {
  CFG_TRY(r.CheckKeys(n, "lab", {"etcd", "node", "advertise", "ttl_s", "interactive_first", "cert", "key", "ca"}));
  auto etcd = n["etcd"];
  if (!etcd) return r.Error(n, "lab.etcd", "required: the etcd cluster's client endpoints, e.g. [http://10.0.0.5:2379]");
  if (!etcd.IsSequence() || etcd.size() == 0) {
    return r.Error(etcd, "lab.etcd", "expected a list of endpoints such as http://HOST:2379");
  }
  for (const auto& item : etcd) {
    std::string e;
    CFG_TRY(r.String(item, "lab.etcd[]", e));
    if (e.rfind("https://", 0) == 0) {
      return r.Error(item, "lab.etcd[]", "TLS to etcd is not supported yet: use http:// on the lab's own network");
    }
    const std::string bare = e.rfind("http://", 0) == 0 ? e.substr(7) : e;
    if (!HostPort(bare)) return r.Error(item, "lab.etcd[]", absl::StrCat("expected http://HOST:PORT, got '", e, "'"));
    out.etcd.push_back(bare);
  }
  auto node = n["node"];
  if (!node) return r.Error(n, "lab.node", "required: this host's name in the lab (letters, digits, '-', '_', '.')");
  CFG_TRY(r.String(node, "lab.node", out.node));
  if (out.node.empty() || out.node.size() > 63 ||
      out.node.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") !=
          std::string::npos) {
    return r.Error(node, "lab.node", "expected 1-63 letters, digits, '-', '_' or '.'");
  }
  if (auto a = n["advertise"]) {
    CFG_TRY(r.String(a, "lab.advertise", out.advertise));
    if (out.advertise.rfind("tls:", 0) != 0 || !HostPort(out.advertise.substr(4), true)) {
      return r.Error(a, "lab.advertise",
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
  return absl::OkStatus();
}

}  // namespace fwai
