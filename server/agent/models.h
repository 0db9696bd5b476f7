// agent: what fwai knows of models: their prices and context windows, from
// built-in tables by model-name prefix. The config (agent.prices,
// agent.context_windows) overrides them; its longest matching prefix wins.
#pragma once

#include <cstdint>
#include <string>

namespace fwai {

struct DaemonConfig;

// USD per million input/output tokens for well-known models (0 if unknown).
void PriceFor(const std::string& model, double* input_per_mtok, double* output_per_mtok);

// The context window of a model: known models from a table, else `configured`.
int64_t ContextWindowFor(const std::string& model, int64_t configured);

struct ModelPrice {
  double input_per_mtok = 0;
  double output_per_mtok = 0;
  double CostUsd(int64_t input_tokens, int64_t output_tokens) const {
    return (input_tokens * input_per_mtok + output_tokens * output_per_mtok) / 1e6;
  }
};

// PriceFor, or the config's price for the model.
ModelPrice ConfiguredPrice(const DaemonConfig& config, const std::string& model);

// ContextWindowFor (with the provider's configured window), or the config's
// window for the model.
int64_t ConfiguredContextWindow(const DaemonConfig& config, const std::string& model,
                                int64_t provider_window);

}  // namespace fwai
