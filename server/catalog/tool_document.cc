#include "server/catalog/tool_document.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace fwai {

using json = nlohmann::json;

namespace {

// An optional string member: absent is "", another type is an error naming
// `field`.
absl::Status OptionalString(const json& j, const char* key, const std::string& field,
                            std::string* out) {
  out->clear();
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string())
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected a string"));
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// Enum values as strings: one that is not a string is kept as its JSON text.
json EnumValues(const json& values) {
  json e = json::array();
  for (const auto& v : values) e.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  return e;
}

// A JSON Schema's properties as Args. A property's type may be a list
// (["string", "null"]): its first string counts.
absl::StatusOr<json> ArgsFromSchema(const json& schema, const std::string& where) {
  json args = json::array();
  if (!schema.is_object() || !schema.contains("properties") || !schema["properties"].is_object())
    return args;
  std::vector<std::string> required;
  if (schema.contains("required") && schema["required"].is_array()) {
    for (const auto& r : schema["required"]) {
      if (r.is_string()) required.push_back(r.get<std::string>());
    }
  }
  for (const auto& [name, p] : schema["properties"].items()) {
    std::string description, type = "string";
    if (p.is_object()) {
      RETURN_IF_ERROR(OptionalString(p, "description",
                                     absl::StrCat(where, ".properties.", name, ".description"),
                                     &description));
      // The first type named (an empty name names none: "string", as the
      // normal form reads it).
      if (auto t = p.find("type"); t != p.end()) {
        if (t->is_string() && !t->get<std::string>().empty()) {
          type = t->get<std::string>();
        } else if (t->is_array()) {
          for (const auto& x : *t) {
            if (x.is_string() && !x.get<std::string>().empty()) {
              type = x.get<std::string>();
              break;
            }
          }
        }
      }
    }
    json a = {{"ArgName", name},
              {"ArgDescription", description},
              {"type", type},
              {"required", std::find(required.begin(), required.end(), name) != required.end()}};
    if (p.is_object() && p.contains("enum") && p["enum"].is_array())
      a["enum"] = EnumValues(p["enum"]);
    args.push_back(a);
  }
  return args;
}

}  // namespace

absl::StatusOr<std::string> NormalizeToolJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  json d;
  std::string s;
  if (j.contains("ToolName")) {
    if (!j["ToolName"].is_string() || j["ToolName"].get<std::string>().empty()) {
      return absl::InvalidArgumentError("ToolName: expected a non-empty string");
    }
    d["ToolName"] = j["ToolName"];
    RETURN_IF_ERROR(OptionalString(j, "ToolDescription", "ToolDescription", &s));
    d["ToolDescription"] = s;
    d["Args"] = json::array();
    if (j.contains("Args")) {
      if (!j["Args"].is_array()) return absl::InvalidArgumentError("Args: expected an array");
      for (size_t i = 0; i < j["Args"].size(); ++i) {
        const json& a = j["Args"][i];
        const std::string where = absl::StrCat("Args[", i, "]");
        if (!a.is_object() || !a.contains("ArgName") || !a["ArgName"].is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": each argument needs an ArgName string"));
        }
        json n = {{"ArgName", a["ArgName"]}};
        RETURN_IF_ERROR(OptionalString(a, "ArgDescription", where + ".ArgDescription", &s));
        n["ArgDescription"] = s;
        RETURN_IF_ERROR(OptionalString(a, "type", where + ".type", &s));
        n["type"] = s.empty() ? "string" : s;
        n["required"] = false;
        if (auto r = a.find("required"); r != a.end() && !r->is_null()) {
          if (!r->is_boolean())
            return absl::InvalidArgumentError(
                absl::StrCat(where, ".required: expected true or false"));
          n["required"] = r->get<bool>();
        }
        if (auto e = a.find("enum"); e != a.end() && !e->is_null()) {
          if (!e->is_array())
            return absl::InvalidArgumentError(absl::StrCat(where, ".enum: expected a list"));
          n["enum"] = EnumValues(*e);
        }
        d["Args"].push_back(n);
      }
    }
  } else {
    const json* f = &j;
    if (j.contains("type") && j["type"] == "function" && j.contains("function"))
      f = &j["function"];  // OpenAI tools[]
    if (!f->is_object() || !f->contains("name") || !(*f)["name"].is_string() ||
        (*f)["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          "expected ToolName, or name (MCP / OpenAI / Anthropic tool schema)");
    }
    d["ToolName"] = (*f)["name"];
    RETURN_IF_ERROR(OptionalString(*f, "description", "description", &s));
    d["ToolDescription"] = s;
    const char* schema_key = nullptr;
    for (const char* k : {"inputSchema", "input_schema", "parameters"}) {
      if (f->contains(k)) schema_key = k;
    }
    if (schema_key != nullptr) {
      ASSIGN_OR_RETURN(d["Args"], ArgsFromSchema((*f)[schema_key], schema_key));
    } else {
      d["Args"] = json::array();
    }
  }
  if (j.contains("source") && j["source"].is_string()) d["source"] = j["source"];
  return d.dump();
}

}  // namespace fwai
