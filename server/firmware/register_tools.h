// Register truth inside fwaid: a project's register code checked as the
// caller (the Firmware.CheckRegisters call, the flash guard, skill steps),
// the agent's checkRegisters tool, and the findings that come back with
// write_file / edit_file on the lines they changed.
//
// The device is the request's (svd, target), else the project's: `svd:` or
// `target:` in .fwai/project.yaml, else the target detected from the
// project's build files. Every project file, the project settings included,
// is read as the caller's account; fwaid's own SVDs (shipped, added to the
// knowledge base) as fwaid.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/local_account.h"
#include "server/firmware/check_registers.h"
#include "server/tools/tool.h"

namespace fwai {

// The SVD directories fwaid uses: $FWAI_SVD_DIR, else the one installed
// beside the program (../share/fwai/svd), else the source tree's data/svd;
// then DATA_DIR/svd for SVDs added to the knowledge base (the catalog's
// added_dir).
SvdCatalog MakeSvdCatalog(const std::string& data_dir);

// Reads and lists as `account` (each call under its file identity); null:
// as this process.
FileAccess AccountFileAccess(const LocalAccount* account);

// CheckRegisters with the project's device filled in, read as `account`.
[[nodiscard]] absl::StatusOr<nlohmann::json> CheckProjectRegisters(const SvdCatalog& catalog,
                                                                   const LocalAccount* account,
                                                                   RegisterCheckRequest req);

// What write_file / edit_file add to their result for a C/C++ file: the
// findings on the lines written ("" when there are none, or the project has
// no device fwai knows).
std::string RegisterNoteAfterWrite(const SvdCatalog& catalog, ToolContext& ctx,
                                   const std::string& rel, const std::set<int>& lines);

// Registers checkRegisters (read-only). `catalog` outlives the registry.
void RegisterRegisterTools(ToolRegistry& registry, const SvdCatalog* catalog);

}  // namespace fwai
