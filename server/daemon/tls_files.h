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
[[nodiscard]] absl::Status TlsInit(const std::string& dir, const std::vector<std::string>& hosts, int days = 825);
// DIR/NAME.pem and NAME.key: a client certificate (CN=NAME) signed by
// DIR/ca.pem; with `hosts`, also a server certificate for them (a node of a
// lab, which both serves and calls).
[[nodiscard]] absl::Status TlsIssue(const std::string& dir, const std::string& name,
                                    const std::vector<std::string>& hosts = {}, int days = 825);
// The certificate chain and key parse and belong together; the client CA, if
// given, parses. The message names the file and what is wrong with it.
[[nodiscard]] absl::Status CheckTlsFiles(const std::string& cert, const std::string& key, const std::string& client_ca);

}  // namespace fwai
