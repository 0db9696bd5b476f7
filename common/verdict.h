// verdict: whose fault a failure was, said where the cause is known.
//
// Every flash, skill run and test that fails ends with a verdict:
//   firmware  the image under test: a build error, a boot pattern that never
//             came, a fault, a test assertion, a register error;
//   lab       the bench: a probe or port gone, the simulator died, a flash
//             transport error, the board's power;
//   infra     what carries the work: etcd, the network, a daemon, the LLM
//             service;
//   config    what was asked: a board or image that does not fit, a rule or
//             the flash guard refusing, a bad pattern;
//   unknown   the cause is not known. A verdict is never guessed from an
//             error's words: code that knows the cause sets it on the status
//             (WithVerdict) where it makes the error, and it travels with
//             the status, across gRPC too (common/grpc_status.h).
//
// CI reads verdicts as exit codes (`fwai run --ci --exit-by verdict`):
// 30 firmware, 31 lab, 32 infra, 33 config, 34 unknown (docs/cli.md).
//
// Thread-safety: free functions without state.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fwai {

inline constexpr std::string_view kVerdictFirmware = "firmware";
inline constexpr std::string_view kVerdictLab = "lab";
inline constexpr std::string_view kVerdictInfra = "infra";
inline constexpr std::string_view kVerdictConfig = "config";
inline constexpr std::string_view kVerdictUnknown = "unknown";

// The payload's key on an absl::Status.
inline constexpr std::string_view kVerdictPayload = "type.googleapis.com/fwai.v1.FailureVerdict";

// True for the five verdicts above.
bool IsVerdict(std::string_view v);

// `st` with its verdict set (an OK status is returned as it is; a verdict
// already set is replaced).
absl::Status WithVerdict(absl::Status st, std::string_view verdict);

// The verdict set on `st`: "" when `st` is OK or none was set.
std::string VerdictOf(const absl::Status& st);

// The verdict of a skill step's failure class where the class says it
// (build, test, verify, registers: firmware; config, policy: config;
// provider, interrupted: infra); otherwise `from_status` (the failing
// call's own verdict) or unknown. "" for a cancelled run.
std::string VerdictOfClass(std::string_view failure_class, std::string_view from_status);

// The exit code CI gets for a failed run's verdict: 30..34 (34 for anything
// but the four known causes).
int VerdictExitCode(std::string_view verdict);

}  // namespace fwai
