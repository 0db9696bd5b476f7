// Query expansion for lexical retrieval: the words engineers use for the
// same thing (wipe / erase, program memory / flash, show / list / display)
// and part-number families (STM32H743 -> stm32h7x, stm32h7; nRF52832 ->
// nrf52, nrf5x; ATSAMD21 -> atsamd), as extra index terms with weights
// below the query's own terms.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fwai {

struct ExpansionWeights {
  float synonym = 0.35f;
  float family = 0.8f;
};

// `terms`: the query's own index terms (from Tokenize). Returns extra
// (term, weight) pairs, none of them already in `terms`.
std::vector<std::pair<std::string, float>> ExpandQuery(std::string_view text,
                                                       const std::vector<std::string>& terms,
                                                       const ExpansionWeights& weights = {});

// The query's own terms at weight 1 followed by the expansion.
std::vector<std::pair<std::string, float>> WeightedQuery(std::string_view text,
                                                         const std::vector<std::string>& terms,
                                                         const ExpansionWeights& weights = {});

}  // namespace fwai
