#include "server/evidence/export.h"

#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace fwai {

using json = nlohmann::json;

namespace {

std::vector<json> Parsed(const std::vector<EvidenceRecord>& records) {
  std::vector<json> out;
  for (const auto& r : records) out.push_back(json::parse(r.bytes, nullptr, false));
  return out;
}

std::string Html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
}

std::string Time(const json& j) {
  if (!j.is_object() || !j.contains("time_us") || !j["time_us"].is_number()) return "";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                          absl::FromUnixMicros(j["time_us"].get<int64_t>()), absl::UTCTimeZone());
}

std::string Summary(const json& j) {
  const std::string kind = Str(j, "kind");
  if (kind == "skill_run") {
    return absl::StrCat("skill ", Str(j, "skill"),
                        j.value("ok", false) ? ": ok" : absl::StrCat(": ", Str(j, "failure_class")),
                        Str(j, "board").empty() ? "" : absl::StrCat(" on ", Str(j, "board")));
  }
  if (kind == "agent_turn") {
    return absl::StrCat("agent turn ", Str(j, "session_id"), " ", Str(j, "model"), ", ",
                        j.contains("tools") && j["tools"].is_array() ? j["tools"].size() : 0,
                        " tool calls");
  }
  if (kind == "flash")
    return absl::StrCat("flash ", Str(j, "board"), j.value("booted", false) ? ", booted" : "");
  if (kind == "skill_evidence")
    return absl::StrCat("artifacts of ", Str(j, "skill"), ": ", Str(j, "note"));
  return kind;
}

}  // namespace

std::string ExportSarif(const std::vector<EvidenceRecord>& records,
                        const std::string& tool_version) {
  const std::map<std::string, std::string> kRules = {
      {"compiler", "A compiler error, warning or note"},
      {"linker", "A linker error (undefined reference, missing library)"},
      {"region_overflow", "A memory region (FLASH, RAM) overflowed at link time"}};
  json rules = json::array();
  for (const auto& [id, text] : kRules)
    rules.push_back({{"id", id}, {"shortDescription", {{"text", text}}}});
  json runs = json::array();
  auto parsed = Parsed(records);
  for (size_t i = 0; i < records.size(); ++i) {
    const json& j = parsed[i];
    if (!j.is_object() || Str(j, "kind") != "skill_run") continue;
    json results = json::array();
    if (j.contains("diagnostic_items") && j["diagnostic_items"].is_array()) {
      for (const auto& d : j["diagnostic_items"]) {
        const std::string sev = d.value("severity", "error");
        json r = {{"ruleId", d.value("kind", "compiler")},
                  {"level", sev == "error"     ? "error"
                            : sev == "warning" ? "warning"
                                               : "note"},
                  {"message", {{"text", d.value("message", "")}}}};
        if (!d.value("file", "").empty()) {
          json region = json::object();
          if (d.value("line", 0) > 0) region["startLine"] = d["line"];
          if (d.value("column", 0) > 0) region["startColumn"] = d["column"];
          json phys = {{"artifactLocation", {{"uri", d["file"]}, {"uriBaseId", "PROJECTROOT"}}}};
          if (!region.empty()) phys["region"] = region;
          r["locations"] = json::array({{{"physicalLocation", phys}}});
        }
        json props = {{"step", d.value("step", "")}};
        for (const char* k : {"region", "bytes", "symbol"}) {
          if (d.contains(k)) props[k] = d[k];
        }
        r["properties"] = props;
        results.push_back(r);
      }
    }
    json run = {
        {"tool", {{"driver", {{"name", "fwai"}, {"version", tool_version}, {"rules", rules}}}}},
        {"automationDetails", {{"id", absl::StrCat(Str(j, "skill"), "/", records[i].run_id)}}},
        {"originalUriBaseIds",
         {{"PROJECTROOT", {{"uri", absl::StrCat("file://", Str(j, "project"), "/")}}}}},
        {"results", results},
        {"invocations", json::array({{{"executionSuccessful", j.value("ok", false)},
                                      {"exitCode", j.value("exit_code", 0)},
                                      {"properties",
                                       {{"evidence_index", records[i].index},
                                        {"leaf_hash", ToHex(records[i].leaf)},
                                        {"failure_class", Str(j, "failure_class")}}}}})}};
    runs.push_back(run);
  }
  json doc = {{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
              {"version", "2.1.0"},
              {"runs", runs}};
  return doc.dump(2);
}

std::string ExportHtml(const std::vector<EvidenceRecord>& records,
                       const EvidenceVerifyReport& verify, const std::string& public_key_hex,
                       const std::string& root_hex) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>fwai "
      "evidence</title>\n"
      "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:"
      "collapse;width:100%}"
      "td,th{border:1px solid #ccc;padding:4px "
      "8px;text-align:left;vertical-align:top}th{background:#f3f3f3}"
      ".ok{color:#176f2c}.bad{color:#b00020}code{font-size:90%}details{margin:.3em "
      "0}</style></head><body>\n";
  absl::StrAppend(
      &h, "<h1>fwai evidence</h1>\n<p>", records.size(), " records. Verification: ",
      verify.ok
          ? "<strong class=\"ok\">intact</strong>"
          : absl::StrCat("<strong class=\"bad\">FAILED at ", Html(verify.first_bad), "</strong>"),
      " — ", Html(verify.detail), "</p>\n<p>Merkle root (RFC 6962) <code>", Html(root_hex),
      "</code><br>Ed25519 public key <code>", Html(public_key_hex), "</code></p>\n");
  h += "<table><tr><th>#</th><th>Time</th><th>Run</th><th>What</th><th>Details</th><th>Leaf "
       "hash</th></tr>\n";
  auto parsed = Parsed(records);
  for (size_t i = 0; i < records.size(); ++i) {
    const json& j = parsed[i];
    const bool failed =
        j.is_object() && j.contains("ok") && j["ok"].is_boolean() && !j["ok"].get<bool>();
    absl::StrAppend(&h, "<tr><td>", records[i].index, "</td><td>", Html(Time(j)), "</td><td><code>",
                    Html(records[i].run_id), "</code></td><td", failed ? " class=\"bad\"" : "", ">",
                    Html(Summary(j)), "</td><td>");
    if (j.is_object() && j.contains("steps") && j["steps"].is_array()) {
      h += "<details><summary>steps</summary><table><tr><th>Step</th><th>Command</th><th>Exit</"
           "th><th>ms</th><th>Result</th></tr>";
      for (const auto& s : j["steps"]) {
        absl::StrAppend(&h, "<tr><td>", Html(Str(s, "name")), "</td><td><code>",
                        Html(Str(s, "command")), "</code></td><td>", Html(Str(s, "exit_code")),
                        "</td><td>", Html(Str(s, "duration_ms")), "</td><td>",
                        s.value("skipped", false) ? "skipped"
                        : s.value("ok", false)    ? "ok"
                                                  : Html(Str(s, "error")),
                        "</td></tr>");
      }
      h += "</table></details>";
    }
    if (j.is_object() && j.contains("diagnostic_items") && j["diagnostic_items"].is_array() &&
        !j["diagnostic_items"].empty()) {
      h += "<details><summary>diagnostics</summary><ul>";
      for (const auto& d : j["diagnostic_items"]) {
        absl::StrAppend(&h, "<li>", Html(d.value("severity", "")), " ", Html(d.value("file", "")),
                        d.value("line", 0) ? absl::StrCat(":", d["line"].get<int>()) : "", " ",
                        Html(d.value("message", "")), "</li>");
      }
      h += "</ul></details>";
    }
    if (j.is_object() && j.contains("images") && j["images"].is_array()) {
      for (const auto& im : j["images"]) {
        absl::StrAppend(&h, "<div>image <code>", Html(Str(im, "path")), "</code> sha256 <code>",
                        Html(Str(im, "sha256")), "</code> on ", Html(Str(im, "board")), "</div>");
      }
    }
    if (j.is_object() && j.contains("artifacts") && j["artifacts"].is_array()) {
      for (const auto& a : j["artifacts"]) {
        if (!a.is_object() || !a.contains("files") || !a["files"].is_array()) continue;
        for (const auto& f : a["files"]) {
          absl::StrAppend(&h, "<div>artifact <code>", Html(Str(f, "path")), "</code> sha256 <code>",
                          Html(Str(f, "sha256")), "</code></div>");
        }
      }
    }
    if (j.is_object() && j.contains("memory") && j["memory"].is_object() &&
        j["memory"].contains("report")) {
      for (const auto& r : j["memory"]["report"].value("regions", json::array())) {
        absl::StrAppend(&h, "<div>memory ", Html(Str(r, "name")), ": ", Html(Str(r, "used")),
                        " of ", Html(Str(r, "length")), " bytes (", Html(Str(r, "percent")),
                        "%)</div>");
      }
    }
    if (j.is_object() && Str(j, "kind") == "flash") {
      absl::StrAppend(&h, "<div>image sha256 <code>", Html(Str(j, "image_sha256")),
                      "</code></div>");
    }
    if (j.is_object() && j.contains("policy_refusals") && j["policy_refusals"].is_array()) {
      for (const auto& p : j["policy_refusals"]) {
        absl::StrAppend(&h, "<div class=\"bad\">refused ", Html(Str(p, "kind")), " ",
                        Html(Str(p, "target")), " by ", Html(Str(p, "rule")), "</div>");
      }
    }
    absl::StrAppend(&h, "<details><summary>record</summary><pre>",
                    Html(j.is_object() ? j.dump(2) : records[i].bytes),
                    "</pre></details></td><td><code>", ToHex(records[i].leaf).substr(0, 16),
                    "…</code></td></tr>\n");
  }
  h += "</table>\n</body></html>\n";
  return h;
}

std::string DssePae(std::string_view type, std::string_view body) {
  std::string out = "DSSEv1 " + std::to_string(type.size()) + " ";
  out.append(type);
  out += " " + std::to_string(body.size()) + " ";
  out.append(body);
  return out;
}

absl::StatusOr<std::string> ExportInToto(
    const std::vector<EvidenceRecord>& records, const std::string& root_hex,
    const std::string& public_key_hex,
    const std::function<absl::StatusOr<std::string>(std::string_view)>& sign) {
  // Subjects: every image built or flashed and every artifact recorded, by digest.
  json subjects = json::array();
  std::map<std::string, std::string> seen;  // sha256 -> name
  auto add = [&](const std::string& name, const std::string& sha) {
    if (sha.size() != 64 || seen.count(sha)) return;
    seen[sha] = name;
    subjects.push_back({{"name", name}, {"digest", {{"sha256", sha}}}});
  };
  json entries = json::array();
  auto parsed = Parsed(records);
  for (size_t i = 0; i < records.size(); ++i) {
    const json& j = parsed[i];
    if (!j.is_object()) continue;
    const std::string kind = Str(j, "kind");
    if (kind == "flash") {
      add(Str(j, "image"), Str(j, "image_sha256"));
      add(Str(j, "flashed_file"),
          Str(j, "flashed_sha256"));  // a .bin/.hex written instead of the ELF
    }
    // The images each build made (ELF, .bin, .hex).
    if (j.contains("artifacts") && j["artifacts"].is_array()) {
      for (const auto& a : j["artifacts"]) {
        if (!a.is_object() || !a.contains("files") || !a["files"].is_array()) continue;
        for (const auto& f : a["files"]) add(Str(f, "path"), Str(f, "sha256"));
      }
    }
    if (j.contains("images") && j["images"].is_array()) {
      for (const auto& im : j["images"]) add(Str(im, "path"), Str(im, "sha256"));
    }
    if (j.contains("files") && j["files"].is_array()) {
      for (const auto& f : j["files"]) add(Str(f, "path"), Str(f, "sha256"));
    }
    entries.push_back({{"index", records[i].index},
                       {"run_id", records[i].run_id},
                       {"kind", kind},
                       {"leaf_hash", ToHex(records[i].leaf)},
                       {"summary", Summary(j)}});
  }
  json statement = {
      {"_type", "https://in-toto.io/Statement/v1"},
      {"subject", subjects},
      {"predicateType", "https://fwai.dev/evidence-log/v1"},
      {"predicate",
       {{"log",
         {{"tree_size", records.size()}, {"root_hash", root_hex}, {"hash", "RFC 6962 SHA-256"}}},
        {"public_key_ed25519", public_key_hex},
        {"records", entries}}}};
  const std::string payload = statement.dump();
  const std::string type = "application/vnd.in-toto+json";
  const std::string pae = DssePae(type, payload);
  auto sig = sign(pae);
  if (!sig.ok()) return sig.status();
  json envelope = {{"payloadType", type},
                   {"payload", absl::Base64Escape(payload)},
                   {"signatures", json::array({{{"keyid", absl::StrCat("ed25519:", public_key_hex)},
                                                {"sig", absl::Base64Escape(*sig)}}})}};
  return envelope.dump(2);
}

}  // namespace fwai
