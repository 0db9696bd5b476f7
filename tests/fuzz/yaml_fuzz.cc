// A YAML file fwai reads (FWAI_FUZZ_YAML: config = fwaid.yaml and its
// mcp_servers, policy = a policy file, project = .fwai/project.yaml, skill =
// a skill file): any bytes give the parsed settings or an error that names
// the file, never a crash or an exception.
#include <map>
#include <string>

#include "common/config.h"
#include "server/project/policy.h"
#include "server/project/project.h"
#include "server/skills/skill.h"
#include "tests/fuzz/fuzz_support.h"

#ifndef FWAI_FUZZ_YAML
#error "FWAI_FUZZ_YAML names the kind of file"
#endif

namespace fwai::fuzz {
namespace {

constexpr std::string_view kKind = FWAI_FUZZ_YAML;

// An error names the file it is about.
template <typename T>
void CheckNamesFile(const absl::StatusOr<T>& r, const std::string& source) {
  if (!r.ok()) FUZZ_CHECK(r.status().message().find(source) != std::string_view::npos);
}

}  // namespace
}  // namespace fwai::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  const std::string text(AsText(data, size));
  if (kKind == "config") {
    CheckNamesFile(ParseConfig(text, "fwaid.yaml"), "fwaid.yaml");
    CheckNamesFile(ParseMcpServers(text, "fwaid.yaml"), "fwaid.yaml");
  } else if (kKind == "policy") {
    auto rules = ParsePolicy(text, "policy.yaml");
    CheckNamesFile(rules, "policy.yaml");
    if (rules.ok()) {
      // The engine answers every kind of check from what was parsed.
      (void)CheckPolicy(*rules, "write", "src/boot/startup.c");
      (void)CheckPolicy(*rules, "command", "rm -rf build");
      (void)CheckPolicy(*rules, "tool", "bash");
      (void)CheckFlashPolicy(*rules, "sim-stm32vl", false);
      (void)MergePolicy(*rules, *rules, true);
    }
  } else if (kKind == "project") {
    auto s = ParseProjectYaml(text, "project.yaml");
    CheckNamesFile(s, "project.yaml");
    (void)UnmanagedSections(text);
    if (s.ok()) {
      // What init writes back parses again.
      auto again = ParseProjectYaml(ProjectYaml(*s), "project.yaml");
      FUZZ_CHECK(again.ok());
    }
  } else if (kKind == "skill") {
    auto skill = ParseSkill(text, "skill.yaml");
    CheckNamesFile(skill, "skill.yaml");
    if (skill.ok()) {
      std::map<std::string, std::string> vars = skill->vars;
      for (const auto& step : skill->steps) {
        for (const std::string* field :
             {&step.command, &step.expect, &step.send, &step.prompt, &step.goal}) {
          (void)Interpolate(*field, vars);
          (void)ReferencedVars(*field);
        }
      }
    }
  }
  return 0;
}
