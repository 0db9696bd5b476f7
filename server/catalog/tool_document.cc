#include "server/catalog/tool_document.h"

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

namespace fwai {

using json = nlohmann::json;

namespace {

json ArgsFromSchema(const json& schema) {
  json args = json::array();
  if (!schema.is_object() || !schema.contains("properties") || !schema["properties"].is_object()) return args;
  std::vector<std::string> required;
  if (schema.contains("required") && schema["required"].is_array()) {
    for (const auto& r : schema["required"]) {
      if (r.is_string()) required.push_back(r.get<std::string>());
    }
  }
  for (const auto& [name, p] : schema["properties"].items()) {
    json a = {{"ArgName", name},
              {"ArgDescription", p.is_object() ? p.value("description", "") : ""},
              {"type", p.is_object() ? (p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "string")
                                     : "string"},
              {"required", std::find(required.begin(), required.end(), name) != required.end()}};
    if (p.is_object() && p.contains("enum") && p["enum"].is_array()) {
      json e = json::array();
      for (const auto& v : p["enum"]) e.push_back(v.is_string() ? v.get<std::string>() : v.dump());
      a["enum"] = e;
    }
    args.push_back(a);
  }
  return args;
}

}  // namespace

absl::StatusOr<std::string> NormalizeToolJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  json d;
  if (j.contains("ToolName")) {
    if (!j["ToolName"].is_string() || j["ToolName"].get<std::string>().empty()) {
      return absl::InvalidArgumentError("ToolName: expected a non-empty string");
    }
    d["ToolName"] = j["ToolName"];
    d["ToolDescription"] = j.value("ToolDescription", "");
    d["Args"] = json::array();
    if (j.contains("Args")) {
      if (!j["Args"].is_array()) return absl::InvalidArgumentError("Args: expected an array");
      for (const auto& a : j["Args"]) {
        if (!a.is_object() || !a.contains("ArgName") || !a["ArgName"].is_string()) {
          return absl::InvalidArgumentError("Args[]: each argument needs an ArgName string");
        }
        json n = {{"ArgName", a["ArgName"]},
                  {"ArgDescription", a.value("ArgDescription", "")},
                  {"type", a.value("type", "string")},
                  {"required", a.value("required", false)}};
        if (a.contains("enum") && a["enum"].is_array()) n["enum"] = a["enum"];
        d["Args"].push_back(n);
      }
    }
  } else {
    const json* f = &j;
    if (j.value("type", "") == "function" && j.contains("function")) f = &j["function"];  // OpenAI tools[]
    if (!f->contains("name") || !(*f)["name"].is_string() || (*f)["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError("expected ToolName, or name (MCP / OpenAI / Anthropic tool schema)");
    }
    d["ToolName"] = (*f)["name"];
    d["ToolDescription"] = f->value("description", "");
    const json* schema = nullptr;
    for (const char* k : {"inputSchema", "input_schema", "parameters"}) {
      if (f->contains(k)) schema = &(*f)[k];
    }
    d["Args"] = schema ? ArgsFromSchema(*schema) : json::array();
  }
  if (j.contains("source") && j["source"].is_string()) d["source"] = j["source"];
  return d.dump();
}

}  // namespace fwai
