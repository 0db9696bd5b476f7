#include "server/firmware/sbom.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/ids.h"
#include "server/firmware/artifacts.h"
#include "server/firmware/elf_file.h"
#include "server/firmware/linker_map.h"
#include "server/firmware/toolchain.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Rel(const std::string& path, const std::string& root) {
  if (root.empty()) return path;
  const fs::path rel = fs::path(path).lexically_relative(root);
  return rel.empty() || rel.native().starts_with("..") ? path : rel.string();
}

bool Inside(const std::string& path, const std::string& root) {
  if (root.empty()) return false;
  const fs::path rel = fs::path(path).lexically_relative(root);
  return !rel.empty() && !rel.native().starts_with("..");
}

std::string Uuid4() {
  std::string h = NewId("") + NewId("");  // 32 hex digits from a CSPRNG
  h[12] = '4';
  h[16] = "89ab"[std::stoi(std::string(1, h[16]), nullptr, 16) & 3];
  return absl::StrCat(h.substr(0, 8), "-", h.substr(8, 4), "-", h.substr(12, 4), "-",
                      h.substr(16, 4), "-", h.substr(20, 12));
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

json Hashes(const FileDigests& d) {
  return json::array(
      {{{"alg", "SHA-256"}, {"content", d.sha256}}, {{"alg", "SHA-1"}, {"content", d.sha1}}});
}

json Prop(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

// Members of a Unix ar archive (GNU long names), by name, with their digests.
std::map<std::string, FileDigests> ArchiveMembers(const std::string& path,
                                                  const std::set<std::string>& wanted) {
  std::map<std::string, FileDigests> out;
  const std::string a = ReadAll(path);
  if (a.compare(0, 8, "!<arch>\n") != 0) return out;
  std::string long_names;
  size_t pos = 8;
  while (pos + 60 <= a.size()) {
    std::string name = std::string(absl::StripTrailingAsciiWhitespace(a.substr(pos, 16)));
    uint64_t size = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(a.substr(pos + 48, 10)), &size) ||
        pos + 60 + size > a.size())
      break;
    const std::string_view data(a.data() + pos + 60, size);
    if (name == "//") {
      long_names.assign(data);
    } else if (name != "/" && name != "/SYM64/") {
      if (name.size() > 1 && name[0] == '/') {
        uint64_t off = 0;
        if (absl::SimpleAtoi(name.substr(1), &off) && off < long_names.size()) {
          size_t end = long_names.find('\n', off);
          name = long_names.substr(off, end == std::string::npos ? std::string::npos : end - off);
        }
      }
      if (!name.empty() && name.back() == '/') name.pop_back();
      if (wanted.count(name) && !out.count(name)) out[name] = HashBytes(data);
    }
    pos += 60 + size + (size & 1);
  }
  return out;
}

std::string PurlDeb(const std::string& name, const std::string& version, const std::string& arch) {
  return absl::StrCat("pkg:deb/debian/", name, "@",
                      absl::StrReplaceAll(version, {{":", "%3A"}, {"+", "%2B"}}),
                      arch.empty() ? "" : "?arch=" + arch);
}

// What MakeSbom gathers: the firmware component, the others, what the
// firmware depends on (objects and libraries linked in), the bom-refs used
// and the Debian package of each toolchain file.
struct SbomParts {
  json firmware;
  json components = json::array();
  json depends = json::array();
  std::set<std::string> refs;
  std::map<std::string, std::string> package_of;  // file -> package
};

// The toolchain: one component per Debian package, its binaries inside.
void AddToolchain(const json& toolchain, SbomParts& parts) {
  std::map<std::string, json> by_package;
  for (const auto& p : toolchain.value("packages", json::array()))
    by_package[p.value("name", "")] = p;
  std::map<std::string, json> nested;
  for (const auto& b : toolchain.value("binaries", json::array())) {
    const std::string pkg = b.value("package", "");
    parts.package_of[b.value("path", "")] = pkg;
    json file = {{"type", "file"},
                 {"bom-ref", "toolchain-file:" + b.value("path", "")},
                 {"name", b.value("path", "")},
                 {"description", b.value("role", "")},
                 {"properties", json::array({Prop("fwai:role", "toolchain-file")})}};
    if (b.value("sha256", "").size() == 64)
      file["hashes"] = json::array({{{"alg", "SHA-256"}, {"content", b["sha256"]}}});
    nested[pkg.empty() ? "(not packaged)" : pkg].push_back(file);
  }
  const json verify = toolchain.value("dpkg_verify", json::object());
  for (auto& [pkg, files] : nested) {
    const json p = by_package.count(pkg) ? by_package[pkg] : json::object();
    json c = {
        {"type", absl::StrContains(pkg, "newlib") || absl::StrContains(pkg, "libc")
                     ? "library"
                     : "application"},
        {"bom-ref", "toolchain:" + pkg},
        {"name", pkg},
        {"components", files},
        {"properties",
         json::array({Prop("fwai:role", "toolchain"),
                      Prop("fwai:dpkg_verify", verify.value("ok", false) ? "ok" : "failed")})}};
    if (!p.value("version", "").empty()) {
      c["version"] = p.value("version", "");
      c["purl"] = PurlDeb(pkg, p.value("version", ""), p.value("architecture", ""));
    }
    parts.refs.insert(c["bom-ref"].get<std::string>());
    parts.components.push_back(std::move(c));
  }
  parts.firmware["properties"].push_back(
      Prop("fwai:toolchain_verified", toolchain.value("verified", false) ? "true" : "false"));
  if (!toolchain.value("producer", "").empty())
    parts.firmware["properties"].push_back(Prop("fwai:producer", toolchain.value("producer", "")));
}

// What the linker took: object files and archive members (the map), by hash.
void AddLinkerInputs(const std::string& image, const std::string& root, SbomParts& parts) {
  const std::string map = FindLinkerMap(image);
  if (map.empty()) return;
  parts.firmware["properties"].push_back(Prop("fwai:linker_map", Rel(map, root)));
  for (const auto& li : ParseLinkerInputs(
           ReadAll(map), root.empty() ? fs::path(image).parent_path().string() : root)) {
    auto d = HashFile(li.path);
    if (!d.ok()) continue;
    const std::string name = Inside(li.path, root) ? Rel(li.path, root) : li.path;
    json c = {{"type", li.archive ? "library" : "file"},
              {"bom-ref", (li.archive ? "library:" : "object:") + name},
              {"name", li.archive ? fs::path(li.path).filename().string() : name},
              {"hashes", Hashes(*d)},
              {"properties", json::array({Prop("fwai:role", li.archive ? "library" : "object"),
                                          Prop("fwai:path", name)})}};
    if (li.archive) {
      std::set<std::string> wanted(li.members.begin(), li.members.end());
      auto members = ArchiveMembers(li.path, wanted);
      json nested = json::array();
      for (const auto& m : li.members) {
        json mc = {{"type", "file"},
                   {"bom-ref", absl::StrCat("member:", name, "(", m, ")")},
                   {"name", absl::StrCat(fs::path(li.path).filename().string(), "(", m, ")")},
                   {"properties", json::array({Prop("fwai:role", "member")})}};
        if (members.count(m)) mc["hashes"] = Hashes(members[m]);
        nested.push_back(std::move(mc));
      }
      c["components"] = nested;
    }
    for (const auto& [file, pkg] : parts.package_of) {
      if (!pkg.empty() && fs::path(file).parent_path() == fs::path(li.path).parent_path()) {
        c["properties"].push_back(Prop("fwai:package", pkg));
        break;
      }
    }
    if (!parts.refs.insert(c["bom-ref"].get<std::string>()).second) continue;
    parts.depends.push_back(c["bom-ref"]);
    parts.components.push_back(std::move(c));
  }
}

// The project's sources compiled in (DWARF line tables), by hash.
void AddSources(const ElfFile& elf, const std::string& root, SbomParts& parts) {
  std::set<std::string> sources;
  for (const auto& u : elf.units) {
    sources.insert(u.name);
    for (const auto& f : u.files) sources.insert(f);
  }
  json source_refs = json::array();
  for (const auto& src : sources) {
    if (!Inside(src, root)) continue;
    auto d = HashFile(src);
    if (!d.ok()) continue;
    const std::string name = Rel(src, root);
    json c = {{"type", "file"},
              {"bom-ref", "source:" + name},
              {"name", name},
              {"hashes", Hashes(*d)},
              {"properties", json::array({Prop("fwai:role", "source")})}};
    if (!parts.refs.insert(c["bom-ref"].get<std::string>()).second) continue;
    source_refs.push_back(c["bom-ref"]);
    parts.components.push_back(std::move(c));
  }
  if (elf.units.empty())
    parts.firmware["properties"].push_back(
        Prop("fwai:sources", "unknown: the image has no DWARF (build with -g)"));
}

// Formulation: the run's steps as a CycloneDX workflow.
json Workflow(const SbomInput& in) {
  json steps = json::array();
  std::set<std::string> task_types;
  for (const auto& s : in.steps) {
    json step = {{"name", s.value("name", "")}};
    if (!s.value("command", "").empty())
      step["commands"] = json::array({{{"executed", s["command"]}}});
    json props = json::array({Prop("fwai:type", s.value("type", ""))});
    if (s.contains("exit_code"))
      props.push_back(Prop("fwai:exit_code", std::to_string(s.value("exit_code", -1))));
    if (s.contains("ok")) props.push_back(Prop("fwai:ok", s.value("ok", false) ? "true" : "false"));
    step["properties"] = props;
    steps.push_back(std::move(step));
    const std::string type = s.value("type", "");
    task_types.insert(type == "build"   ? "build"
                      : type == "test"  ? "test"
                      : type == "flash" ? "deploy"
                                        : "other");
  }
  if (task_types.empty()) task_types.insert("build");
  const std::string uid = in.run_id.empty() ? "image" : in.run_id;
  json workflow = {
      {"bom-ref", "workflow:" + uid},
      {"uid", uid},
      {"name", in.skill.empty() ? "build" : in.skill},
      {"taskTypes", json(std::vector<std::string>(task_types.begin(), task_types.end()))},
      {"steps", steps}};
  return workflow;
}

}  // namespace

absl::StatusOr<json> MakeSbom(const SbomInput& in) {
  auto elf = ReadElfFile(in.image, true);
  if (!elf.ok()) return elf.status();
  auto image = HashFile(in.image);
  if (!image.ok()) return image.status();
  const std::string root = in.project_root;
  SbomParts parts;
  parts.firmware = {
      {"type", "firmware"},
      {"bom-ref", "firmware"},
      {"name", in.project_name.empty() ? fs::path(in.image).stem().string() : in.project_name},
      {"hashes", json::array({{{"alg", "SHA-256"}, {"content", image->sha256}}})},
      {"properties", json::array({Prop("fwai:image", Rel(in.image, root)),
                                  Prop("fwai:image_bytes", std::to_string(image->bytes))})}};
  if (!in.target.empty()) parts.firmware["properties"].push_back(Prop("fwai:target", in.target));
  if (in.toolchain.is_object()) AddToolchain(in.toolchain, parts);
  AddLinkerInputs(in.image, root, parts);
  AddSources(*elf, root, parts);
  json dependencies = json::array({{{"ref", "firmware"}, {"dependsOn", parts.depends}}});
  const std::string uid = in.run_id.empty() ? "image" : in.run_id;
  json bom = {{"bomFormat", "CycloneDX"},
              {"specVersion", "1.6"},
              {"serialNumber", "urn:uuid:" + Uuid4()},
              {"version", 1},
              {"metadata",
               {{"timestamp", Now()},
                {"tools",
                 {{"components",
                   json::array({{{"type", "application"},
                                 {"name", "fwai"},
                                 {"version", in.tool_version.empty() ? "0" : in.tool_version}}})}}},
                {"component", parts.firmware}}},
              {"components", parts.components},
              {"dependencies", dependencies},
              {"formulation", json::array({{{"bom-ref", "formulation:" + uid},
                                            {"workflows", json::array({Workflow(in)})}}})}};
  if (!in.run_id.empty())
    bom["metadata"]["properties"] = json::array({Prop("fwai:run_id", in.run_id)});
  return bom;
}

json AddFlashToSbom(json sbom, const std::string& board, const std::string& flashed_sha256,
                    const std::string& flashed_file, const std::string& by) {
  if (!sbom.is_object()) return sbom;
  json& props = sbom["metadata"]["component"]["properties"];
  if (!props.is_array()) props = json::array();
  props.push_back(Prop("fwai:flashed_sha256", flashed_sha256));
  props.push_back(Prop("fwai:flashed_file", flashed_file));
  props.push_back(Prop("fwai:board", board));
  sbom["serialNumber"] = "urn:uuid:" + Uuid4();
  sbom["metadata"]["timestamp"] = Now();
  json step = {{"name", "flash"},
               {"description", absl::StrCat("written to ", board, " by ", by)},
               {"properties", json::array({Prop("fwai:type", "flash"),
                                           Prop("fwai:flashed_sha256", flashed_sha256)})}};
  json workflow = {{"bom-ref", "workflow:flash:" + board + ":" + flashed_sha256.substr(0, 16)},
                   {"uid", "flash:" + board},
                   {"name", "flash"},
                   {"taskTypes", json::array({"deploy"})},
                   {"steps", json::array({step})}};
  if (!sbom.contains("formulation") || !sbom["formulation"].is_array() ||
      sbom["formulation"].empty()) {
    sbom["formulation"] =
        json::array({{{"bom-ref", "formulation:flash"}, {"workflows", json::array()}}});
  }
  sbom["formulation"][0]["workflows"].push_back(workflow);
  return sbom;
}

json FlashRecordSbom(const json& flash, const json& build, const std::string& tool_version,
                     const std::string& dpkg_admindir) {
  json sbom;
  if (build.is_object() && build.contains("sbom") && build["sbom"].contains("bomFormat")) {
    sbom = build["sbom"];
  } else {
    SbomInput in;
    in.image = flash.value("image", "");
    in.project_root = flash.value("project", "");
    in.target = flash.value("target", "");
    in.tool_version = tool_version;
    in.steps = json::array();
    if (auto elf = ReadElfFile(in.image, true); elf.ok()) {
      ToolchainOptions to;
      to.dpkg_admindir = dpkg_admindir;
      in.toolchain =
          AttestToolchain(elf->machine, elf->units.empty() ? "" : elf->units.front().producer,
                          elf->comments.empty() ? "" : elf->comments.front(), to);
    }
    auto made = MakeSbom(in);
    if (!made.ok()) return {{"error", std::string(made.status().message())}};
    sbom = *made;
  }
  return AddFlashToSbom(std::move(sbom), flash.value("board", ""),
                        flash.value("flashed_sha256", ""), flash.value("flashed_file", ""),
                        flash.value("by", ""));
}

json SbomToSpdx(const json& cdx) {
  auto prop = [](const json& c, const std::string& name) -> std::string {
    for (const auto& p : c.value("properties", json::array())) {
      if (p.value("name", "") == name) return p.value("value", "");
    }
    return "";
  };
  auto hash = [](const json& c, const char* alg) -> std::string {
    for (const auto& h : c.value("hashes", json::array())) {
      if (h.value("alg", "") == alg) return h.value("content", "");
    }
    return "";
  };
  int n = 0;
  auto id = [&n](const std::string& kind) { return absl::StrCat("SPDXRef-", kind, "-", ++n); };
  const json fw = cdx["metadata"].value("component", json::object());
  json packages = json::array(), files = json::array(), relationships = json::array();
  json fwp = {{"SPDXID", "SPDXRef-firmware"},
              {"name", fw.value("name", "firmware")},
              {"downloadLocation", "NOASSERTION"},
              {"filesAnalyzed", false},
              {"primaryPackagePurpose", "FIRMWARE"},
              {"checksums",
               json::array({{{"algorithm", "SHA256"}, {"checksumValue", hash(fw, "SHA-256")}}})}};
  std::string comment;
  for (const auto& p : fw.value("properties", json::array()))
    absl::StrAppend(&comment, p.value("name", ""), "=", p.value("value", ""), "\n");
  if (!comment.empty()) fwp["comment"] = comment;
  packages.push_back(fwp);
  relationships.push_back({{"spdxElementId", "SPDXRef-DOCUMENT"},
                           {"relationshipType", "DESCRIBES"},
                           {"relatedSpdxElement", "SPDXRef-firmware"}});
  auto add_file = [&](const json& c, const std::string& type) {
    json f = {{"SPDXID", id("File")},
              {"fileName", absl::StartsWith(c.value("name", ""), "/") ? c.value("name", "")
                                                                      : "./" + c.value("name", "")},
              {"checksums",
               json::array({{{"algorithm", "SHA1"}, {"checksumValue", hash(c, "SHA-1")}},
                            {{"algorithm", "SHA256"}, {"checksumValue", hash(c, "SHA-256")}}})},
              {"fileTypes", json::array({type})}};
    files.push_back(f);
    return f["SPDXID"].get<std::string>();
  };
  for (const auto& c : cdx.value("components", json::array())) {
    const std::string role = prop(c, "fwai:role");
    if (role == "toolchain") {
      json p = {
          {"SPDXID", id("Package")},
          {"name", c.value("name", "")},
          {"downloadLocation", "NOASSERTION"},
          {"filesAnalyzed", false},
          {"primaryPackagePurpose", c.value("type", "") == "library" ? "LIBRARY" : "APPLICATION"},
          {"comment", absl::StrCat("dpkg -V: ", prop(c, "fwai:dpkg_verify"))}};
      if (c.contains("version")) p["versionInfo"] = c["version"];
      if (c.contains("purl")) {
        p["externalRefs"] = json::array({{{"referenceCategory", "PACKAGE-MANAGER"},
                                          {"referenceType", "purl"},
                                          {"referenceLocator", c["purl"]}}});
      }
      packages.push_back(p);
      relationships.push_back({{"spdxElementId", p["SPDXID"]},
                               {"relationshipType", "BUILD_TOOL_OF"},
                               {"relatedSpdxElement", "SPDXRef-firmware"}});
    } else if (role == "library") {
      json p = {{"SPDXID", id("Package")},
                {"name", c.value("name", "")},
                {"downloadLocation", "NOASSERTION"},
                {"filesAnalyzed", false},
                {"primaryPackagePurpose", "LIBRARY"},
                {"checksums",
                 json::array({{{"algorithm", "SHA256"}, {"checksumValue", hash(c, "SHA-256")}},
                              {{"algorithm", "SHA1"}, {"checksumValue", hash(c, "SHA-1")}}})},
                {"comment", prop(c, "fwai:path")}};
      packages.push_back(p);
      relationships.push_back({{"spdxElementId", "SPDXRef-firmware"},
                               {"relationshipType", "STATIC_LINK"},
                               {"relatedSpdxElement", p["SPDXID"]}});
      for (const auto& m : c.value("components", json::array())) {
        if (hash(m, "SHA-1").empty()) continue;
        std::string fid = add_file(m, "BINARY");
        relationships.push_back({{"spdxElementId", p["SPDXID"]},
                                 {"relationshipType", "CONTAINS"},
                                 {"relatedSpdxElement", fid}});
      }
    } else if (role == "object") {
      std::string fid = add_file(c, "BINARY");
      relationships.push_back({{"spdxElementId", "SPDXRef-firmware"},
                               {"relationshipType", "STATIC_LINK"},
                               {"relatedSpdxElement", fid}});
    } else if (role == "source") {
      std::string fid = add_file(c, "SOURCE");
      relationships.push_back({{"spdxElementId", "SPDXRef-firmware"},
                               {"relationshipType", "GENERATED_FROM"},
                               {"relatedSpdxElement", fid}});
    }
  }
  std::string serial = cdx.value("serialNumber", "");
  if (absl::StartsWith(serial, "urn:uuid:")) serial = serial.substr(9);
  return {{"spdxVersion", "SPDX-2.3"},
          {"dataLicense", "CC0-1.0"},
          {"SPDXID", "SPDXRef-DOCUMENT"},
          {"name", fw.value("name", "firmware")},
          {"documentNamespace", absl::StrCat("https://spdx.org/spdxdocs/fwai-",
                                             fw.value("name", "firmware"), "-", serial)},
          {"creationInfo",
           {{"created", cdx["metadata"].value("timestamp", Now())},
            {"creators", json::array({"Tool: fwai"})}}},
          {"packages", packages},
          {"files", files},
          {"relationships", relationships}};
}

}  // namespace fwai
