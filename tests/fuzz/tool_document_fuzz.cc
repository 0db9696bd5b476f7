// Tool documents (fwai's own, MCP, OpenAI, Anthropic): any bytes give an
// error or the normal form the catalog indexes, whose every field has the
// type the catalog reads it as.
#include <nlohmann/json.hpp>

#include "server/catalog/tool_document.h"
#include "tests/fuzz/fuzz_support.h"

namespace fwai::fuzz {
namespace {

using json = nlohmann::json;

bool Has(const json& j, const char* key, json::value_t type) {
  auto it = j.find(key);
  return it != j.end() && it->type() == type;
}

void CheckNormalForm(const std::string& text) {
  const json d = json::parse(text, nullptr, false);
  FUZZ_CHECK(d.is_object());
  FUZZ_CHECK(Has(d, "ToolName", json::value_t::string) &&
             !d["ToolName"].get<std::string>().empty());
  FUZZ_CHECK(Has(d, "ToolDescription", json::value_t::string));
  FUZZ_CHECK(Has(d, "Args", json::value_t::array));
  for (const auto& a : d["Args"]) {
    FUZZ_CHECK(a.is_object());
    FUZZ_CHECK(Has(a, "ArgName", json::value_t::string));
    FUZZ_CHECK(Has(a, "ArgDescription", json::value_t::string));
    FUZZ_CHECK(Has(a, "type", json::value_t::string));
    FUZZ_CHECK(Has(a, "required", json::value_t::boolean));
    if (a.contains("enum")) {
      FUZZ_CHECK(a["enum"].is_array());
      for (const auto& e : a["enum"]) FUZZ_CHECK(e.is_string());
    }
  }
  if (d.contains("source")) FUZZ_CHECK(d["source"].is_string());
}

}  // namespace
}  // namespace fwai::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  auto normal = NormalizeToolJson(std::string(AsText(data, size)));
  if (!normal.ok()) {
    FUZZ_CHECK(normal.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  CheckNormalForm(*normal);
  // Normalizing the normal form changes nothing.
  auto again = NormalizeToolJson(*normal);
  FUZZ_CHECK(again.ok() && *again == *normal);
  return 0;
}
