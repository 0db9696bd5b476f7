// Why a daemon address over TCP gives no gRPC connection, in words that say
// what to change. Run only after a connection failed: it connects once more
// on its own (a TCP connect, and for tls: a TLS handshake checked as gRPC
// checks it — the CA given, else the system's CAs, and the host name) and
// names the first thing that failed:
//   - the host name does not resolve;
//   - nothing listens at HOST:PORT (refused), or no answer in time;
//   - tls: the daemon's certificate is not trusted by the CA used (which
//     file, or the system's CAs) and the flag that names another;
//   - tls: the certificate is for another host;
//   - tls: the handshake failed otherwise (its reason).
// Returns "" when the probe finds nothing wrong (or the address is a unix
// socket). Thread-compatible; blocks up to about `timeout_ms` twice.
#pragma once

#include <string>

#include "client/lib/client.h"

namespace fwai {

std::string WhyUnreachable(const DaemonAddress& addr, const Credentials& creds, int timeout_ms);

}  // namespace fwai
