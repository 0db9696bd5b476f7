#include "server/agent/models.h"

#include <map>

#include "absl/strings/match.h"
#include "common/config.h"

namespace fwai {
namespace {

// The value of the longest key of `by_prefix` that `model` starts with; null if none.
template <typename T>
const T* LongestPrefixMatch(const std::map<std::string, T>& by_prefix, const std::string& model) {
  const T* found = nullptr;
  size_t best = 0;
  for (const auto& [prefix, value] : by_prefix) {
    if (absl::StartsWith(model, prefix) && prefix.size() >= best) {
      best = prefix.size();
      found = &value;
    }
  }
  return found;
}

}  // namespace

void PriceFor(const std::string& model, double* in, double* out) {
  struct P {
    const char* prefix;
    double in, out;
  };
  static const P kPrices[] = {
      {"claude-opus-4", 15, 75},    {"claude-sonnet-4", 3, 15}, {"claude-3-7-sonnet", 3, 15},
      {"claude-3-5-sonnet", 3, 15}, {"claude-haiku-4", 1, 5},   {"claude-3-5-haiku", 0.8, 4},
      {"gpt-4o-mini", 0.15, 0.6},   {"gpt-4o", 2.5, 10},        {"gpt-4.1-mini", 0.4, 1.6},
      {"gpt-4.1-nano", 0.1, 0.4},   {"gpt-4.1", 2, 8},          {"o3-mini", 1.1, 4.4},
      {"o4-mini", 1.1, 4.4},        {"gpt-5-mini", 0.25, 2},    {"gpt-5", 1.25, 10},
  };
  *in = *out = 0;
  for (const auto& p : kPrices) {
    if (absl::StartsWith(model, p.prefix)) {
      *in = p.in;
      *out = p.out;
      return;
    }
  }
}

int64_t ContextWindowFor(const std::string& model, int64_t configured) {
  struct W {
    const char* prefix;
    int64_t tokens;
  };
  static const W kWindows[] = {
      {"claude-", 200000},     {"gpt-4o", 128000},      {"gpt-4.1", 1047576},
      {"gpt-5", 400000},       {"o3", 200000},          {"o4-mini", 200000},
      {"gemini-2.5", 1048576}, {"gemini-2.0", 1048576}, {"gemini-1.5-pro", 2097152},
      {"llama3.1", 131072},    {"llama3.2", 131072},    {"qwen2.5-coder", 32768},
      {"mistral", 32768},
  };
  for (const auto& w : kWindows) {
    if (absl::StartsWith(model, w.prefix)) return w.tokens;
  }
  return configured > 0 ? configured : 128000;
}

ModelPrice ConfiguredPrice(const DaemonConfig& config, const std::string& model) {
  if (const auto* p = LongestPrefixMatch(config.prices, model)) return {p->first, p->second};
  ModelPrice price;
  PriceFor(model, &price.input_per_mtok, &price.output_per_mtok);
  return price;
}

int64_t ConfiguredContextWindow(const DaemonConfig& config, const std::string& model,
                                int64_t provider_window) {
  if (const int64_t* w = LongestPrefixMatch(config.context_windows, model)) return *w;
  return ContextWindowFor(model, provider_window);
}

}  // namespace fwai
