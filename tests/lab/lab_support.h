// Helpers shared by the lab tests that run real fwaid processes: node
// certificates from `fwaid tls`, reading a file, and a serial round trip.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fwai/v1/hardware.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {

using Serial = grpc::ClientReaderWriter<fwai::v1::SerialClientMessage, fwai::v1::SerialServerMessage>;

// Runs `fwaid tls ARGS...`; true when it exits 0.
inline bool FwaidTls(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {std::string(FWAI_BIN_DIR) + "/fwaid", "tls"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out, err;
  return RunCommand(argv, &out, &err) == 0;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Says `line` on the stream and reads until `want` comes back; false if the
// stream ends or a write is refused first (the reason in `end_reason`).
inline bool SayAndHear(Serial& s, const std::string& line, const std::string& want,
                       std::string* end_reason = nullptr) {
  fwai::v1::SerialClientMessage m;
  m.set_send_line(line);
  if (!s.Write(m)) return false;
  fwai::v1::SerialServerMessage r;
  while (s.Read(&r)) {
    if (!r.error().empty()) {  // a refused write: the lease is gone on the bench
      if (end_reason) *end_reason = r.error();
      return false;
    }
    if (r.end_of_stream()) {
      if (end_reason) *end_reason = r.reason();
      return false;
    }
    for (const auto& l : r.lines()) {
      if (l.line() == want) return true;
    }
  }
  return false;
}

}  // namespace fwai::testing
