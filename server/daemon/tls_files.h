// TLS material for a shared fwaid, made with OpenSSL's library: a private CA
// and a server certificate for the daemon's host names (`fwaid tls init`),
// client certificates for people and nodes (`fwaid tls issue`), and the
// start-up check that configured files are usable. Keys are written mode 0600
// and never overwritten.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fwai {

// DIR/ca.pem, ca.key, server.pem, server.key. `hosts`: DNS names and IP
// addresses the server certificate is for (at least one).
[[nodiscard]] absl::Status TlsInit(const std::string& dir, const std::vector<std::string>& hosts,
                                   int days = 825);
// DIR/NAME.pem and NAME.key: a client certificate (CN=NAME) signed by
// DIR/ca.pem; with `hosts`, also a server certificate for them. `node`: a lab
// node's certificate (also OU=fwai-lab-node, kLabNodeUnit), which only ever
// identifies a node, never a person; a person's never identifies a node.
[[nodiscard]] absl::Status TlsIssue(const std::string& dir, const std::string& name,
                                    const std::vector<std::string>& hosts = {}, int days = 825,
                                    bool node = false);
// The certificate at `path` is a lab node's (made with --node) for `node`:
// else FAILED_PRECONDITION naming `what` (the setting), the file, whose it is
// and how to make the right one.
[[nodiscard]] absl::Status CheckNodeCertificate(const std::string& what, const std::string& path,
                                                const std::string& node);
// The certificate chain and key parse and belong together; the client CA, if
// given, parses. The message names the file and what is wrong with it.
[[nodiscard]] absl::Status CheckTlsFiles(const std::string& cert, const std::string& key,
                                         const std::string& client_ca);

}  // namespace fwai
