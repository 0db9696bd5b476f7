// Exports of the evidence log beyond JSON and CSV: SARIF 2.1.0 (the typed
// build diagnostics of skill runs), a readable HTML report, and an in-toto
// Statement (v1) about the flashed images and artifacts in a DSSE envelope
// signed with the log's Ed25519 key.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/evidence/evidence_log.h"

namespace fwai {

std::string ExportSarif(const std::vector<EvidenceRecord>& records,
                        const std::string& tool_version);
std::string ExportHtml(const std::vector<EvidenceRecord>& records,
                       const EvidenceVerifyReport& verify, const std::string& public_key_hex,
                       const std::string& root_hex);

// DSSE's pre-authentication encoding: "DSSEv1 <len> <type> <len> <body>".
std::string DssePae(std::string_view payload_type, std::string_view payload);
// `sign` returns a raw Ed25519 signature of its argument.
[[nodiscard]] absl::StatusOr<std::string> ExportInToto(
    const std::vector<EvidenceRecord>& records, const std::string& root_hex,
    const std::string& public_key_hex,
    const std::function<absl::StatusOr<std::string>(std::string_view)>& sign);

}  // namespace fwai
