#include "server/ota/ota_tool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fwai {
namespace {

using nlohmann::json;

class OtaStatusTool final : public Tool {
 public:
  explicit OtaStatusTool(RolloutManager& r) : rollouts_(r) {}
  std::string name() const override { return "otaStatus"; }
  std::string description() const override {
    return "Over-the-air update status: for each board the firmware version it runs, its MCUboot "
           "slots (version, "
           "image hash, image_ok / copy_done flags) and its last rollout; and the recent rollouts "
           "(state, stages, "
           "which boards confirmed, reverted or failed, and why). Give rollout_id for one "
           "rollout's full history.";
  }
  json input_schema() const override {
    return {
        {"type", "object"},
        {"properties",
         {{"rollout_id", {{"type", "string"}, {"description", "One rollout's every state change"}}},
          {"limit",
           {{"type", "integer"},
            {"description", "How many recent rollouts (default 5, max 50)"}}}}}};
  }
  bool read_only() const override { return true; }
  ToolResult Run(const json& input, ToolContext&) override {
    if (input.contains("rollout_id") && input["rollout_id"].is_string() &&
        !input["rollout_id"].get<std::string>().empty()) {
      auto r = rollouts_.Get(input["rollout_id"].get<std::string>());
      if (!r.ok()) return {std::string(r.status().message()), true};
      return {r->dump(2), false};
    }
    int limit = input.contains("limit") && input["limit"].is_number_integer()
                    ? input["limit"].get<int>()
                    : 5;
    limit = std::clamp(limit, 1, 50);
    auto boards = rollouts_.Boards();
    if (!boards.ok()) return {std::string(boards.status().message()), true};
    auto recent = rollouts_.List(static_cast<size_t>(limit));
    if (!recent.ok()) return {std::string(recent.status().message()), true};
    json out = {{"boards", *boards}, {"rollouts", *recent}};
    return {out.dump(2), false};
  }

 private:
  RolloutManager& rollouts_;
};

}  // namespace

void RegisterOtaTools(ToolRegistry& registry, RolloutManager& rollouts) {
  registry.Register(std::make_unique<OtaStatusTool>(rollouts));
}

}  // namespace fwai
