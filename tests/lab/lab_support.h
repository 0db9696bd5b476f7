// Helpers shared by the lab tests that run real fwaid processes: node
// certificates from `fwaid tls`, reading a file, and a serial round trip.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fwai/v1/hardware.grpc.pb.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai::testing {

using Serial =
    grpc::ClientReaderWriter<fwai::v1::SerialClientMessage, fwai::v1::SerialServerMessage>;

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

// A channel to a bench's TLS port as the holder of `tls_dir`/WHO.pem and
// .key ("" for no client certificate).
inline std::shared_ptr<grpc::Channel> BenchAs(const std::string& tls_dir, int port,
                                              const std::string& who) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadText(tls_dir + "/ca.pem");
  if (!who.empty()) {
    o.pem_cert_chain = ReadText(tls_dir + "/" + who + ".pem");
    o.pem_private_key = ReadText(tls_dir + "/" + who + ".key");
  }
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::SslCredentials(o));
}

// LabNode.Flash of board b1 on a bench directly, with a few bytes of image.
inline grpc::Status FlashOnBench(const std::shared_ptr<grpc::Channel>& ch,
                                 const std::string& lease_id, const std::string& token = "") {
  auto stub = fwai::v1::LabNode::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto stream = stub->Flash(&ctx);
  fwai::v1::LabFlashRequest start;
  start.mutable_start()->set_device_id("b1");
  start.mutable_start()->set_lease_id(lease_id);
  start.mutable_start()->set_file_name("evil.bin");
  start.mutable_start()->set_size(4);
  start.mutable_start()->set_approved(true);
  fwai::v1::LabFlashRequest data;
  data.set_data("\xde\xad\xbe\xef");
  if (stream->Write(start) && stream->Write(data)) stream->WritesDone();
  fwai::v1::FlashProgress p;
  while (stream->Read(&p)) {
  }
  return stream->Finish();
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
