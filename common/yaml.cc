#include "common/yaml.h"

#include "absl/strings/str_cat.h"

namespace fwai {

absl::Status YamlStatus(const std::string& label, const YAML::Exception& e) {
  return absl::InvalidArgumentError(absl::StrCat(label, ":", e.mark.line + 1, ": ", e.msg));
}

absl::StatusOr<YAML::Node> LoadYaml(const std::string& text, const std::string& label) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return YamlStatus(label, e);
  }
}

}  // namespace fwai
