// The `lab:` section of fwaid.yaml: this fwaid is a node of a lab of many
// bench hosts coordinated through etcd. A node with boards (a bench)
// registers them; one without (a front) sees every board of the lab.
#pragma once

#include <string>
#include <vector>

namespace fwai {

// The organizational unit (OU) of a lab node's certificate (`fwaid tls issue
// DIR --node NAME`): what tells a node from a person whose certificate the
// same CA signed.
inline constexpr char kLabNodeUnit[] = "fwai-lab-node";

struct LabConfig {
  std::vector<std::string> etcd;  // client endpoints as HOST:PORT (the scheme stripped)
  // https:// endpoints: etcd is reached over TLS with this node's client
  // certificate. Default: lab.ca, lab.cert, lab.key (which default to
  // tls.client_ca, tls.cert, tls.key). Plain http:// only on loopback.
  bool etcd_tls = false;
  std::string etcd_ca, etcd_cert, etcd_key;
  std::string node;       // this node's name in the lab (/fwai/nodes/NODE)
  std::string advertise;  // "tls:HOST:PORT" where other nodes reach this one
  int ttl_s = 10;         // a node that stops renewing leaves the registry after this
  // The lab's queue serves people (roles user, admin) before CI (role ci),
  // each band first come first served; false: one first-come first-served
  // queue for all.
  bool interactive_first = true;
  // This node's certificate for reaching other nodes (mutual TLS), and the
  // CA their certificates are checked against; default: tls.cert, tls.key
  // and tls.client_ca. `fwaid tls issue DIR --node NODE --host NAME` makes
  // one; a node's certificate must be for `node` (checked at start).
  std::string cert, key, ca;
  bool enabled() const { return !etcd.empty(); }
};

}  // namespace fwai
