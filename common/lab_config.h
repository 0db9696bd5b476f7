// The `lab:` section of fwaid.yaml: this fwaid is a node of a lab of many
// bench hosts coordinated through etcd. A node with boards (a bench)
// registers them; one without (a front) sees every board of the lab.
#pragma once

#include <string>
#include <vector>

namespace fwai {

struct LabConfig {
  std::vector<std::string> etcd;  // client endpoints, "HOST:PORT" or "http://HOST:PORT"
  std::string node;               // this node's name in the lab (/fwai/nodes/NODE)
  std::string advertise;          // "tls:HOST:PORT" where other nodes reach this one
  int ttl_s = 10;
  // The lab's queue serves people (roles user, admin) before CI (role ci),
  // each band first come first served; false: one first-come first-served
  // queue for all.
  bool interactive_first = true;
  // This node's certificate for reaching other nodes (mutual TLS), and the
  // CA their certificates are checked against; default: tls.cert, tls.key
  // and tls.client_ca. `fwaid tls issue DIR --user NODE --host NAME` makes one.
  std::string cert, key, ca;                 // a node that stops renewing leaves the registry after this
  bool enabled() const { return !etcd.empty(); }
};

}  // namespace fwai
