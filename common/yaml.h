// YAML text loaded with parse errors that name the file and line. Only for
// .cc files that read YAML: it pulls in yaml-cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fwai {

// "LABEL:LINE: what the parser said" as INVALID_ARGUMENT.
absl::Status YamlStatus(const std::string& label, const YAML::Exception& e);

// The document in `text`; a syntax error is reported with YamlStatus.
[[nodiscard]] absl::StatusOr<YAML::Node> LoadYaml(const std::string& text,
                                                  const std::string& label);

}  // namespace fwai
