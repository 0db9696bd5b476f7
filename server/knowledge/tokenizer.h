// Index terms for lexical retrieval over hardware documentation.
//
// Identifiers are first-class: `RCC_AHB2ENR`, `PA5`, `snps,dw-apb-uart`,
// `0x40021000`, `max_hw_heartbeat_ms` are kept whole (lowercased, never
// stemmed) and their parts are indexed too (`rcc`, `ahb2enr`; `snps`, `dw`,
// `apb`, `uart`). Plain English words are lowercased, stop words dropped, and
// Porter-stemmed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fwai {

struct TokenizerOptions {
  bool stem = true;
  bool drop_stop_words = true;
  bool identifier_parts = true;
};

// Appends the terms of `text` to `terms`, in text order.
void Tokenize(std::string_view text, std::vector<std::string>* terms,
              const TokenizerOptions& options = {});

// The identifiers found in `text` (register, bit-field, pin, part-number and
// property names), in their original spelling, deduplicated, in text order.
std::vector<std::string> FindIdentifiers(std::string_view text, size_t max = 64);

// True if `word` (as written) looks like an identifier rather than a word.
bool LooksLikeIdentifier(std::string_view word);

// Porter (1980) stemmer on a lowercase ASCII word.
std::string PorterStem(std::string_view word);

bool IsStopWord(std::string_view lowercase_word);

}  // namespace fwai
