// Project templates for `fwai init --template`: bare-metal (STM32F100, runs
// on the simulated board as it is), FreeRTOS (the same MCU, the kernel from
// FREERTOS_KERNEL), Zephyr (west) and Arduino (arduino-cli). Each comes with
// the settings fwai needs (build, flash and test commands, image, boot line).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/project/project.h"

namespace fwai {

struct TemplateFile {
  std::string path;  // relative to the project root
  std::string content;
};

struct ProjectTemplate {
  std::string name;
  std::string description;
  std::vector<TemplateFile> files;
  ProjectSettings settings;
};

std::vector<std::string> TemplateNames();
// The template for a project called `project_name` (letters, digits, - _).
[[nodiscard]] absl::StatusOr<ProjectTemplate> MakeTemplate(const std::string& name,
                                                           const std::string& project_name);
// Writes the template's files under `root` (created if missing). Refuses,
// naming them, if any exist and `force` is false; nothing is written then.
[[nodiscard]] absl::Status WriteTemplate(const ProjectTemplate& t, const std::string& root,
                                         bool force);

}  // namespace fwai
