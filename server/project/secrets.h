// Secrets: finds API keys, tokens, private keys, passwords in URLs and
// password/secret assignments in text and replaces them with
// "[REDACTED:<kind>]" before the text reaches evidence, logs or a provider.
// Extra patterns come from the daemon config (secrets.patterns).
// Thread-safe after construction.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

class SecretScanner {
 public:
  struct Pattern {
    std::string name;
    std::regex re;
    std::vector<std::string> triggers;  // cheap pre-check: one must occur (empty: always try)
    int group = 0;                      // the part to replace (0: the whole match)
  };
  // The built-in patterns plus `extra` ("name=regex" or just "regex").
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const SecretScanner>> Make(
      const std::vector<std::string>& extra);
  // The built-in patterns only.
  static std::shared_ptr<const SecretScanner> Default();

  // `text` with every secret replaced; `found` (if given) counts them.
  std::string Redact(std::string_view text, int* found = nullptr) const;
  // Redacts every string (values, not keys) of a JSON document in place.
  int RedactJson(nlohmann::json& doc) const;

 private:
  std::vector<Pattern> patterns_;
};

}  // namespace fwai
