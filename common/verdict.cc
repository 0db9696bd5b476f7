#include "common/verdict.h"

#include "absl/strings/cord.h"
#include "common/strings.h"

namespace fwai {

bool IsVerdict(std::string_view v) {
  return v == kVerdictFirmware || v == kVerdictLab || v == kVerdictInfra || v == kVerdictConfig ||
         v == kVerdictUnknown;
}

absl::Status WithVerdict(absl::Status st, std::string_view verdict) {
  if (st.ok() || !IsVerdict(verdict)) return st;
  st.SetPayload(AV(kVerdictPayload), absl::Cord(AV(verdict)));
  return st;
}

std::string VerdictOf(const absl::Status& st) {
  if (st.ok()) return "";
  auto p = st.GetPayload(AV(kVerdictPayload));
  if (!p) return "";
  std::string v(*p);
  return IsVerdict(v) ? v : "";
}

std::string VerdictOfClass(std::string_view c, std::string_view from_status) {
  if (c.empty() || c == "cancelled") return "";
  if (c == "build" || c == "test" || c == "verify" || c == "registers")
    return std::string(kVerdictFirmware);
  if (c == "config" || c == "policy") return std::string(kVerdictConfig);
  if (c == "provider" || c == "interrupted") return std::string(kVerdictInfra);
  if (IsVerdict(from_status)) return std::string(from_status);
  return std::string(kVerdictUnknown);
}

int VerdictExitCode(std::string_view v) {
  if (v == kVerdictFirmware) return 30;
  if (v == kVerdictLab) return 31;
  if (v == kVerdictInfra) return 32;
  if (v == kVerdictConfig) return 33;
  return 34;
}

}  // namespace fwai
