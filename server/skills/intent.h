// Intent resolution: free text -> a skill, in three tiers. (1) the exact name
// ("build", "/flash", "run build-flash-verify"); (2) keyword scoring over the
// skill's name, keywords and description; (3) the provider, when one is
// configured and tier 2 found something plausible but not certain.
// Confidence >= 0.8 runs the skill, >= 0.6 asks, below goes to free chat.
#pragma once

#include <string>
#include <vector>

#include "common/cancel.h"
#include "server/skills/skill.h"

namespace fwai {

class Provider;

struct IntentMatch {
  std::string skill;  // "" : none
  double confidence = 0;
  std::string tier = "none";  // exact | keywords | provider | none
  std::string reason;
  std::string action = "chat";  // run | ask | chat
};

constexpr double kIntentRun = 0.8;
constexpr double kIntentAsk = 0.6;

// `provider` may be null (tiers 1 and 2 only).
IntentMatch ResolveIntent(const std::string& text, const std::vector<Skill>& skills,
                          Provider* provider, CancelToken* cancel);

}  // namespace fwai
