#include "common/grpc_status.h"

#include "common/verdict.h"
#include "fwai/v1/errors.pb.h"

namespace fwai {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(s.code());
  const std::string verdict = VerdictOf(s);
  if (verdict.empty()) return grpc::Status(code, std::string(s.message()));
  v1::RpcStatus rich;
  rich.set_code(static_cast<int>(s.code()));
  rich.set_message(std::string(s.message()));
  v1::FailureVerdict fv;
  fv.set_verdict(verdict);
  rich.add_details()->PackFrom(fv);
  return grpc::Status(code, std::string(s.message()), rich.SerializeAsString());
}

std::string VerdictOf(const grpc::Status& s) {
  if (s.ok() || s.error_details().empty()) return "";
  v1::RpcStatus rich;
  if (!rich.ParseFromString(s.error_details())) return "";
  for (const auto& d : rich.details()) {
    v1::FailureVerdict fv;
    if (d.Is<v1::FailureVerdict>() && d.UnpackTo(&fv) && IsVerdict(fv.verdict()))
      return fv.verdict();
  }
  return "";
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status st(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return WithVerdict(std::move(st), VerdictOf(s));
}

}  // namespace fwai
