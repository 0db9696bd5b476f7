// Tool documents: the shapes fwai accepts for a tool (its own, MCP, OpenAI,
// Anthropic) and the one normal form the catalog stores and indexes.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace fwai {

// Normalizes one tool JSON document of any accepted shape to
// {ToolName, ToolDescription, Args: [{ArgName, ArgDescription, type,
// required, enum?}], source?}. INVALID_ARGUMENT says what is wrong.
//  - fwai's own: {ToolName, ToolDescription, Args}
//  - MCP: {name, description, inputSchema}
//  - OpenAI: {type: function, function: {name, description, parameters}}
//    or {name, description, parameters}
//  - Anthropic: {name, description, input_schema}
[[nodiscard]] absl::StatusOr<std::string> NormalizeToolJson(const std::string& json_text);

}  // namespace fwai
