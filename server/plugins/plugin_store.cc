#include "server/plugins/plugin_store.h"

#include <openssl/sha.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/minisign.h"
#include "common/paths.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "server/llm/http_client.h"

namespace fwai {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr char kInstallRecord[] =
    ".install.json";  // beside the plugin's directory: <name>.install.json
constexpr size_t kMaxPluginBytes = 64 << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Sha256Hex(std::string_view data) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(out), sizeof out));
}

// A path inside the plugin: relative, no "..", no empty parts.
bool SafeRelative(const std::string& p) {
  if (p.empty() || p[0] == '/' || absl::StrContains(p, "\\")) return false;
  for (absl::string_view part : absl::StrSplit(p, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

bool ValidName(const std::string& n) {
  static const std::regex kName("^[a-z0-9][a-z0-9-]{0,63}$");
  return std::regex_match(n, kName);
}

// Every regular file under `root` (relative paths); refuses symlinks and
// special files, skips .git.
absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InternalError(absl::StrCat("reading ", root, ": ", ec.message()));
    const auto rel = fs::relative(it->path(), root, ec).generic_string();
    if (it->is_symlink(ec))
      return absl::InvalidArgumentError(
          absl::StrCat(rel, ": a symbolic link (plugins hold regular files only)"));
    if (it->is_directory(ec)) {
      if (it->path().filename() == ".git") it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec))
      return absl::InvalidArgumentError(absl::StrCat(rel, ": not a regular file"));
    out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status CopyTree(const std::string& from, const std::string& to) {
  auto files = ListFiles(from);
  if (!files.ok()) return files.status();
  std::error_code ec;
  for (const auto& f : *files) {
    fs::create_directories(fs::path(to) / fs::path(f).parent_path(), ec);
    fs::copy_file(fs::path(from) / f, fs::path(to) / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat("copying ", f, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> StringList(const json& j, const std::string& field,
                                                    const std::string& source) {
  std::vector<std::string> out;
  if (!j.contains(field)) return out;
  if (!j[field].is_array())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", field, ": expected a list of paths"));
  for (const auto& v : j[field]) {
    if (!v.is_string() || !SafeRelative(v.get<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, ": ", v.dump(),
                                                     " is not a relative path inside the plugin"));
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

absl::StatusOr<PluginManifest> ParsePluginManifest(const std::string& text,
                                                   const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  static const std::set<std::string> kKeys = {
      "name",  "version",   "description", "skills",       "agents",
      "tools", "templates", "mcp_servers", "capabilities", "files"};
  for (const auto& [k, v] : j.items()) {
    if (!kKeys.count(k)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": ", k, ": unknown field; expected one of: ", absl::StrJoin(kKeys, ", ")));
    }
  }
  PluginManifest m;
  m.name = j.value("name", "");
  if (!ValidName(m.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": name: '", m.name,
                     "' must be 1-64 of a-z, 0-9 and - (starting with a letter or digit)"));
  }
  m.version = j.value("version", "");
  if (m.version.empty())
    return absl::InvalidArgumentError(absl::StrCat(source, ": version: required"));
  m.description = j.value("description", "");
  const std::pair<const char*, std::vector<std::string>*> lists[] = {{"skills", &m.skills},
                                                                     {"agents", &m.agents},
                                                                     {"tools", &m.tools},
                                                                     {"templates", &m.templates}};
  for (const auto& [field, out] : lists) {
    auto l = StringList(j, field, source);
    if (!l.ok()) return l.status();
    *out = *l;
  }
  if (j.contains("mcp_servers")) {
    if (!j["mcp_servers"].is_object())
      return absl::InvalidArgumentError(absl::StrCat(source, ": mcp_servers: expected a mapping"));
    for (const auto& [name, v] : j["mcp_servers"].items()) {
      McpServerEntry e;
      if (!v.is_object() || !v.contains("command") || !v["command"].is_array() ||
          v["command"].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": mcp_servers.", name, ".command: expected a list (program and arguments)"));
      }
      for (const auto& a : v["command"]) {
        if (!a.is_string())
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": mcp_servers.", name, ".command: strings only"));
        e.command.push_back(a.get<std::string>());
      }
      if (v.contains("env") && v["env"].is_object()) {
        for (const auto& [k, ev] : v["env"].items())
          e.env[k] = ev.is_string() ? ev.get<std::string>() : ev.dump();
      }
      m.mcp_servers[name] = e;
    }
  }
  if (j.contains("capabilities")) {
    const json& c = j["capabilities"];
    if (!c.is_object())
      return absl::InvalidArgumentError(absl::StrCat(source, ": capabilities: expected a mapping"));
    for (const auto& [k, v] : c.items()) {
      if (k != "build" && k != "flash" && k != "boards" && k != "network") {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": capabilities.", k, ": unknown; expected build, flash, boards, network"));
      }
      if (k != "boards" && !v.is_boolean()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": capabilities.", k, ": expected true or false"));
      }
    }
    m.capabilities.build = c.value("build", false);
    m.capabilities.flash = c.value("flash", false);
    m.capabilities.network = c.value("network", false);
    if (c.contains("boards")) {
      if (!c["boards"].is_array())
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": capabilities.boards: expected a list of board tags"));
      for (const auto& t : c["boards"]) {
        if (!t.is_string())
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": capabilities.boards: tags are strings"));
        m.capabilities.boards.push_back(t.get<std::string>());
      }
    }
    if (m.capabilities.flash && m.capabilities.boards.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": capabilities.flash: name the board tags it may flash (capabilities.boards)"));
    }
  }
  if (!j.contains("files") || !j["files"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": files: required, a mapping of every file to its SHA-256 (fwai plugin sign writes it)"));
  }
  static const std::regex kHex("^[0-9a-f]{64}$");
  for (const auto& [path, v] : j["files"].items()) {
    if (!SafeRelative(path))
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": files: '", path, "' is not a relative path inside the plugin"));
    if (!v.is_string() || !std::regex_match(v.get<std::string>(), kHex)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": files.", path, ": expected a SHA-256 (64 hex digits)"));
    }
    m.files[path] = v.get<std::string>();
  }
  std::vector<std::string> declared = m.skills;
  declared.insert(declared.end(), m.agents.begin(), m.agents.end());
  declared.insert(declared.end(), m.tools.begin(), m.tools.end());
  for (const auto& p : declared) {
    if (!m.files.count(p))
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": '", p, "' is declared but not in files"));
  }
  for (const auto& t : m.templates) {
    bool any = std::any_of(m.files.begin(), m.files.end(),
                           [&](const auto& f) { return absl::StartsWith(f.first, t + "/"); });
    if (!any)
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": templates: '", t, "' holds no file listed in files"));
  }
  return m;
}

json PluginCheck::ToJson() const {
  return {{"signature", signature}, {"key_id", key_id},   {"detail", signature_detail},
          {"modified", modified},   {"missing", missing}, {"extra", extra},
          {"tampered", tampered()}};
}

absl::StatusOr<PluginCheck> CheckPluginDir(const std::string& dir, const PluginManifest& manifest,
                                           const std::vector<std::string>& trusted_keys) {
  PluginCheck c;
  auto files = ListFiles(dir);
  if (!files.ok()) return files.status();
  std::set<std::string> present(files->begin(), files->end());
  for (const auto& [path, sha] : manifest.files) {
    if (!present.count(path)) {
      c.missing.push_back(path);
      continue;
    }
    auto bytes = ReadFile(dir + "/" + path);
    if (!bytes.ok()) return bytes.status();
    if (Sha256Hex(*bytes) != sha) c.modified.push_back(path);
  }
  for (const auto& f : present) {
    if (f == kPluginManifest || f == kPluginSignature) continue;
    if (!manifest.files.count(f)) c.extra.push_back(f);
  }
  auto sig = ReadFile(dir + "/" + kPluginSignature);
  if (!sig.ok()) {
    c.signature = "unsigned";
    return c;
  }
  auto manifest_bytes = ReadFile(dir + "/" + kPluginManifest);
  if (!manifest_bytes.ok()) return manifest_bytes.status();
  auto key_id = minisign::SignatureKeyIdHex(*sig);
  if (!key_id.ok()) {
    c.signature = "invalid";
    c.signature_detail = std::string(key_id.status().message());
    return c;
  }
  c.key_id = *key_id;
  for (const auto& k : trusted_keys) {
    auto pk = minisign::ParsePublicKey(k);
    if (!pk.ok() || pk->KeyIdHex() != *key_id) continue;
    auto v = minisign::Verify(*sig, *manifest_bytes, *pk);
    if (v.ok()) {
      c.signature = "trusted";
      c.signature_detail = v->trusted_comment;
    } else {
      c.signature = "invalid";
      c.signature_detail = std::string(v.status().message());
    }
    return c;
  }
  c.signature = "untrusted";
  c.signature_detail =
      absl::StrCat("signed with key ", *key_id, ", which is not in plugins.trusted_keys");
  return c;
}

PluginStore::PluginStore(std::string dir, PluginsConfig config, HttpClient* http,
                         AppendEvidence append)
    : dir_(std::move(dir)), config_(std::move(config)), http_(http), append_(std::move(append)) {}

absl::Status PluginStore::Start() {
  for (const auto& k : config_.trusted_keys) {
    std::string text = k;
    std::error_code ec;
    if (fs::is_regular_file(k, ec)) {
      auto f = ReadFile(k);
      if (!f.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("plugins.trusted_keys: ", f.status().message()));
      text = *f;
    }
    auto pk = minisign::ParsePublicKey(text);
    if (!pk.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("plugins.trusted_keys: ", k, ": ", pk.status().message()));
    trusted_keys_.push_back(pk->Base64());
  }
  if (auto s = MakeDirs(dir_, 0700); !s.ok()) return s;
  return Load();
}

absl::Status PluginStore::Load() {
  std::map<std::string, InstalledPlugin> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (!e.is_directory(ec) || e.path().filename().string().front() == '.') continue;
    const std::string name = e.path().filename().string();
    auto text = ReadFile((e.path() / kPluginManifest).string());
    if (!text.ok()) continue;
    auto m = ParsePluginManifest(*text, (e.path() / kPluginManifest).string());
    if (!m.ok()) {
      spdlog::warn("plugin {}: {}", name, m.status().ToString());
      continue;
    }
    InstalledPlugin p{name, e.path().string(), *m, json::object()};
    if (auto rec = ReadFile(absl::StrCat(dir_, "/", name, kInstallRecord)); rec.ok()) {
      auto j = json::parse(*rec, nullptr, false);
      if (!j.is_discarded()) p.record = j;
    }
    found[name] = std::move(p);
  }
  MutexLock lock(&mu_);
  installed_ = std::move(found);
  return absl::OkStatus();
}

absl::StatusOr<std::string> PluginStore::Fetch(const std::string& source,
                                               const std::string& staging) const {
  std::error_code ec;
  fs::create_directories(staging, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", staging, ": ", ec.message()));
  // git+URL@COMMIT: a clone checked out at exactly that commit.
  if (absl::StartsWith(source, "git+")) {
    std::string spec = source.substr(4);
    auto at = spec.rfind('@');
    static const std::regex kCommit("^[0-9a-f]{40}$");
    if (at == std::string::npos || !std::regex_match(spec.substr(at + 1), kCommit)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": a git source is pinned to a commit: git+URL@<40-hex commit id>"));
    }
    const std::string url = spec.substr(0, at), commit = spec.substr(at + 1);
    const std::string repo = staging + "/src";
    ProcessOptions po;
    po.timeout_ms = 300000;
    auto r = RunProcess({"git", "clone", "--quiet", "--no-checkout", "--", url, repo}, po);
    if (!r.ok()) return r.status();
    if (r->exit_code != 0)
      return absl::UnavailableError(absl::StrCat("git clone ", url, " failed: ", r->err));
    r = RunProcess({"git", "-C", repo, "-c", "advice.detachedHead=false", "checkout", "--quiet",
                    "--detach", commit},
                   po);
    if (!r.ok()) return r.status();
    if (r->exit_code != 0)
      return absl::NotFoundError(
          absl::StrCat(url, ": commit ", commit, " cannot be checked out: ", r->err));
    r = RunProcess({"git", "-C", repo, "rev-parse", "HEAD"}, po);
    if (!r.ok() || r->exit_code != 0 || absl::StripAsciiWhitespace(r->out) != commit) {
      return absl::InternalError(absl::StrCat(url, ": HEAD is not ", commit, " after checkout"));
    }
    fs::remove_all(repo + "/.git", ec);
    return repo;
  }
  if (absl::StartsWith(source, "http://") || absl::StartsWith(source, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": download the tarball and install the file, or use git+URL@COMMIT"));
  }
  if (fs::is_directory(source, ec)) {
    const std::string copy = staging + "/src";
    if (auto s = CopyTree(source, copy); !s.ok()) return s;
    return copy;
  }
  if (fs::is_regular_file(source, ec)) {
    if (!absl::EndsWith(source, ".tar") && !absl::EndsWith(source, ".tar.gz") &&
        !absl::EndsWith(source, ".tgz")) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": expected a directory, a .tar/.tar.gz/.tgz, or git+URL@COMMIT"));
    }
    // Members with absolute paths or ".." are refused before anything is extracted.
    auto list = RunProcess({"tar", "-tf", source});
    if (!list.ok()) return list.status();
    if (list->exit_code != 0)
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": not a readable tarball: ", list->err));
    for (absl::string_view line : absl::StrSplit(list->out, '\n', absl::SkipEmpty())) {
      std::string m(line);
      while (absl::StartsWith(m, "./")) m = m.substr(2);
      if (m.empty()) continue;
      if (m[0] == '/' || absl::StrContains(m, "../") || m == ".." || absl::EndsWith(m, "/..")) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": member '", std::string(line),
                                                       "' leaves the plugin's directory"));
      }
    }
    const std::string out = staging + "/src";
    fs::create_directories(out, ec);
    auto x =
        RunProcess({"tar", "-xf", source, "-C", out, "--no-same-owner", "--no-same-permissions"});
    if (!x.ok()) return x.status();
    if (x->exit_code != 0)
      return absl::InvalidArgumentError(absl::StrCat(source, ": tar failed: ", x->err));
    // A tarball of one directory holds the plugin inside it.
    if (!fs::exists(fs::path(out) / kPluginManifest, ec)) {
      std::vector<fs::path> entries;
      for (const auto& e : fs::directory_iterator(out, ec)) entries.push_back(e.path());
      if (entries.size() == 1 && fs::is_directory(entries[0], ec) &&
          !fs::is_symlink(entries[0], ec))
        return entries[0].string();
    }
    return out;
  }
  return absl::NotFoundError(absl::StrCat(source, ": no such directory or file"));
}

absl::StatusOr<json> PluginStore::Install(const std::string& source, bool replace,
                                          const Caller& caller) {
  const std::string staging = absl::StrCat(dir_, "/.staging-", NewId("p"));
  std::error_code ec;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(dir, e);
    }
  } cleanup{staging};
  auto root = Fetch(source, staging);
  if (!root.ok()) return root.status();
  uintmax_t total = 0;
  for (auto it = fs::recursive_directory_iterator(*root, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  if (total > kMaxPluginBytes)
    return absl::InvalidArgumentError(absl::StrCat(source, ": more than 64 MB"));
  auto text = ReadFile(*root + "/" + kPluginManifest);
  if (!text.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": no ", kPluginManifest, " at its top"));
  auto m = ParsePluginManifest(*text, absl::StrCat(source, "/", kPluginManifest));
  if (!m.ok()) return m.status();
  auto check = CheckPluginDir(*root, *m, trusted_keys_);
  if (!check.ok()) return check.status();
  json rec = {{"kind", "plugin"},
              {"event", "install"},
              {"name", m->name},
              {"version", m->version},
              {"source", source},
              {"manifest_sha256", Sha256Hex(*text)},
              {"files", m->files.size()},
              {"verification", check->ToJson()},
              {"capabilities",
               {{"build", m->capabilities.build},
                {"flash", m->capabilities.flash},
                {"boards", m->capabilities.boards},
                {"network", m->capabilities.network}}},
              {"by", caller.display}};
  auto refuse = [&](const std::string& rule, const std::string& why) -> absl::Status {
    rec["event"] = "install_refused";
    rec["rule"] = rule;
    rec["reason"] = why;
    if (append_) (void)append_(rec);
    return absl::PermissionDeniedError(absl::StrCat("refused by policy (", rule, "): ", why));
  };
  if (check->tampered() && !config_.allow_tampered) {
    std::vector<std::string> what;
    if (check->signature == "invalid")
      what.push_back(absl::StrCat("signature: ", check->signature_detail));
    if (!check->modified.empty())
      what.push_back(absl::StrCat("changed: ", absl::StrJoin(check->modified, ", ")));
    if (!check->missing.empty())
      what.push_back(absl::StrCat("missing: ", absl::StrJoin(check->missing, ", ")));
    if (!check->extra.empty())
      what.push_back(absl::StrCat("not in the manifest: ", absl::StrJoin(check->extra, ", ")));
    return refuse("plugins.allow_tampered",
                  absl::StrCat(m->name, " ", m->version, " does not match its manifest (",
                               absl::StrJoin(what, "; "), ")"));
  }
  if ((check->signature == "unsigned" || check->signature == "untrusted") &&
      !config_.allow_unsigned) {
    return refuse("plugins.allow_unsigned",
                  check->signature == "unsigned"
                      ? absl::StrCat(m->name, " ", m->version, " is not signed (", kPluginSignature,
                                     " is missing)")
                      : absl::StrCat(m->name, " ", m->version, ": ", check->signature_detail));
  }
  const std::string target = absl::StrCat(dir_, "/", m->name);
  {
    MutexLock lock(&mu_);
    if (installed_.count(m->name) && !replace) {
      return absl::AlreadyExistsError(absl::StrCat(
          "plugin ", m->name, " ", installed_[m->name].manifest.version,
          " is installed (fwai plugin install --replace, or fwai plugin rm ", m->name, ")"));
    }
    const std::string old = absl::StrCat(dir_, "/.old-", NewId("p"));
    if (fs::exists(target, ec)) fs::rename(target, old, ec);
    fs::rename(*root, target, ec);
    if (ec) {
      if (fs::exists(old)) fs::rename(old, target, ec);
      return absl::InternalError(absl::StrCat("cannot install into ", target, ": ", ec.message()));
    }
    fs::remove_all(old, ec);
    chmod(target.c_str(), 0700);
    rec["time_us"] = NowMicros();
    if (append_) {
      auto idx = append_(rec);
      if (idx.ok()) rec["evidence_index"] = *idx;
    }
    (void)WriteFileAtomic(absl::StrCat(dir_, "/", m->name, kInstallRecord), rec.dump(2), 0600);
    installed_[m->name] = InstalledPlugin{m->name, target, *m, rec};
  }
  return rec;
}

absl::StatusOr<json> PluginStore::Remove(const std::string& name, const Caller& caller) {
  MutexLock lock(&mu_);
  auto it = installed_.find(name);
  if (it == installed_.end())
    return absl::NotFoundError(absl::StrCat("no plugin '", name, "' is installed"));
  std::error_code ec;
  fs::remove_all(it->second.dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot remove ", it->second.dir, ": ", ec.message()));
  fs::remove(absl::StrCat(dir_, "/", name, kInstallRecord), ec);
  json rec = {{"kind", "plugin"},     {"event", "remove"},
              {"name", name},         {"version", it->second.manifest.version},
              {"by", caller.display}, {"time_us", NowMicros()}};
  if (append_) {
    auto idx = append_(rec);
    if (idx.ok()) rec["evidence_index"] = *idx;
  }
  installed_.erase(it);
  return rec;
}

absl::StatusOr<json> PluginStore::Verify(const std::string& name) const {
  InstalledPlugin p;
  {
    MutexLock lock(&mu_);
    auto it = installed_.find(name);
    if (it == installed_.end())
      return absl::NotFoundError(absl::StrCat("no plugin '", name, "' is installed"));
    p = it->second;
  }
  // The manifest on disk may have changed too: parse it again.
  auto text = ReadFile(p.dir + "/" + kPluginManifest);
  if (!text.ok()) return text.status();
  auto m = ParsePluginManifest(*text, p.dir + "/" + kPluginManifest);
  if (!m.ok()) return m.status();
  auto check = CheckPluginDir(p.dir, *m, trusted_keys_);
  if (!check.ok()) return check.status();
  bool ok = !check->tampered() && check->signature == "trusted";
  return json{{"name", name},
              {"version", m->version},
              {"ok", ok},
              {"manifest_sha256", Sha256Hex(*text)},
              {"installed_manifest_sha256", p.record.value("manifest_sha256", "")},
              {"verification", check->ToJson()}};
}

std::vector<InstalledPlugin> PluginStore::Installed() const {
  MutexLock lock(&mu_);
  std::vector<InstalledPlugin> out;
  for (const auto& [n, p] : installed_) out.push_back(p);
  return out;
}

absl::StatusOr<json> PluginStore::Search(const std::string& query,
                                         const std::string& marketplace) const {
  std::vector<std::string> places =
      marketplace.empty() ? config_.marketplaces : std::vector<std::string>{marketplace};
  if (places.empty())
    return absl::FailedPreconditionError(
        "no marketplace: add plugins.marketplaces to fwaid.yaml, or give one");
  std::vector<std::string> words =
      absl::StrSplit(absl::AsciiStrToLower(query), ' ', absl::SkipEmpty());
  json results = json::array();
  json errors = json::array();
  for (const auto& place : places) {
    std::string text;
    if (absl::StartsWith(place, "https://") || absl::StartsWith(place, "http://")) {
      if (!absl::StartsWith(place, "https://")) {
        errors.push_back(
            {{"marketplace", place}, {"error", "marketplaces over the network must use https://"}});
        continue;
      }
      if (!http_) {
        errors.push_back({{"marketplace", place}, {"error", "no HTTP client"}});
        continue;
      }
      HttpRequest req;
      req.method = "GET";
      req.url = place;
      CancelToken cancel;
      std::string body;
      auto r = http_->PostStream(
          req, [&](std::string_view d) { body.append(d); }, cancel, nullptr);
      if (!r.ok() || r->status / 100 != 2) {
        errors.push_back({{"marketplace", place},
                          {"error", !r.ok() ? std::string(r.status().message())
                                            : absl::StrCat("HTTP ", r->status)}});
        continue;
      }
      text = body;
    } else {
      std::error_code ec;
      std::string path = fs::is_directory(place, ec) ? place + "/index.json" : place;
      auto f = ReadFile(path);
      if (!f.ok()) {
        errors.push_back({{"marketplace", place}, {"error", std::string(f.status().message())}});
        continue;
      }
      text = *f;
    }
    json idx = json::parse(text, nullptr, false);
    if (idx.is_discarded() || !idx.contains("plugins") || !idx["plugins"].is_array()) {
      errors.push_back(
          {{"marketplace", place}, {"error", "not a marketplace index ({\"plugins\": [...]})"}});
      continue;
    }
    for (const auto& p : idx["plugins"]) {
      if (!p.is_object()) continue;
      std::string hay = absl::AsciiStrToLower(
          absl::StrCat(p.value("name", ""), " ", p.value("description", ""), " ",
                       p.contains("keywords") ? p["keywords"].dump() : ""));
      bool all = std::all_of(words.begin(), words.end(),
                             [&](const std::string& w) { return absl::StrContains(hay, w); });
      if (!all) continue;
      json r = p;
      r["marketplace"] = place;
      // A relative source in a directory marketplace is relative to it.
      std::string src = p.value("source", "");
      std::error_code ec;
      if (!src.empty() && src[0] != '/' && !absl::StrContains(src, "://") &&
          !absl::StartsWith(src, "git+") && fs::is_directory(place, ec)) {
        r["source"] = (fs::path(place) / src).lexically_normal().string();
      }
      bool installed;
      {
        MutexLock lock(&mu_);
        installed = installed_.count(p.value("name", "")) > 0;
      }
      r["installed"] = installed;
      results.push_back(r);
    }
  }
  return json{{"results", results}, {"errors", errors}};
}

std::map<std::string, SubagentConfig> PluginStore::Agents() const {
  std::map<std::string, SubagentConfig> out;
  for (const auto& p : Installed()) {
    for (const auto& rel : p.manifest.agents) {
      const std::string path = p.dir + "/" + rel;
      try {
        YAML::Node body = YAML::LoadFile(path);
        const std::string name =
            body["name"] ? body["name"].as<std::string>() : fs::path(rel).stem().string();
        YAML::Node agent = YAML::Clone(body);
        agent.remove("name");
        YAML::Node root;
        root["agent"]["subagents"][p.name + ":" + name] = agent;
        YAML::Emitter em;
        em << root;
        auto cfg = ParseConfig(em.c_str(), path);
        if (!cfg.ok()) {
          spdlog::warn("plugin {}: agent {}: {}", p.name, rel, cfg.status().ToString());
          continue;
        }
        for (const auto& [n, s] : cfg->subagents) {
          if (absl::StartsWith(n, p.name + ":")) out[n] = s;
        }
      } catch (const std::exception& e) {
        spdlog::warn("plugin {}: agent {}: {}", p.name, rel, e.what());
      }
    }
  }
  return out;
}

std::map<std::string, McpServerEntry> PluginStore::McpServers() const {
  std::map<std::string, McpServerEntry> out;
  for (const auto& p : Installed()) {
    for (const auto& [name, e] : p.manifest.mcp_servers) {
      McpServerEntry entry = e;
      // Commands run in the plugin's directory: ${PLUGIN_DIR} names it.
      for (auto& a : entry.command) a = absl::StrReplaceAll(a, {{"${PLUGIN_DIR}", p.dir}});
      out[p.name + "-" + name] = entry;
    }
  }
  return out;
}

std::vector<std::string> PluginStore::ToolDocuments() const {
  std::vector<std::string> out;
  for (const auto& p : Installed()) {
    for (const auto& rel : p.manifest.tools) {
      auto text = ReadFile(p.dir + "/" + rel);
      if (!text.ok()) continue;
      json j = json::parse(*text, nullptr, false);
      auto add = [&](json d) {
        if (!d.is_object()) return;
        d["source"] = "plugin:" + p.name;
        out.push_back(d.dump());
      };
      if (!j.is_discarded() && j.is_array()) {
        for (const auto& d : j) add(d);
      } else if (!j.is_discarded()) {
        add(j);
      } else {
        for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
          json d = json::parse(std::string(line), nullptr, false);
          if (!d.is_discarded()) add(d);
        }
      }
    }
  }
  return out;
}

std::vector<PluginSkillSet> PluginStore::SkillSets() const {
  std::vector<PluginSkillSet> out;
  for (const auto& p : Installed()) {
    if (p.manifest.skills.empty()) continue;
    PluginSkillSet set;
    set.dir = p.dir;
    set.files = p.manifest.skills;
    for (const auto& rel : set.files) {
      // Read here, as fwaid: the caller the skills are loaded for may not
      // read fwaid's data directory. An unreadable file is left out later.
      std::ifstream in(p.dir + "/" + rel, std::ios::binary);
      std::stringstream ss;
      if (in) ss << in.rdbuf();
      set.texts.push_back(in ? ss.str() : std::string());
    }
    set.scope.plugin = p.name;
    set.scope.build = p.manifest.capabilities.build;
    set.scope.flash = p.manifest.capabilities.flash;
    set.scope.network = p.manifest.capabilities.network;
    set.scope.boards = p.manifest.capabilities.boards;
    out.push_back(std::move(set));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> PluginStore::TemplateFiles(
    const std::string& name) const {
  auto colon = name.find(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not <plugin>:<template>"));
  const std::string plugin = name.substr(0, colon), tpl = name.substr(colon + 1);
  for (const auto& p : Installed()) {
    if (p.name != plugin) continue;
    for (const auto& t : p.manifest.templates) {
      if (fs::path(t).filename().string() != tpl && t != tpl) continue;
      std::vector<std::pair<std::string, std::string>> files;
      for (const auto& [path, sha] : p.manifest.files) {
        if (!absl::StartsWith(path, t + "/")) continue;
        auto text = ReadFile(p.dir + "/" + path);
        if (!text.ok()) return text.status();
        files.emplace_back(path.substr(t.size() + 1), *text);
      }
      return files;
    }
    std::vector<std::string> names;
    for (const auto& t : p.manifest.templates)
      names.push_back(plugin + ":" + fs::path(t).filename().string());
    return absl::NotFoundError(
        absl::StrCat("plugin ", plugin, " has no template '", tpl, "' (",
                     names.empty() ? "it has none" : absl::StrJoin(names, ", "), ")"));
  }
  return absl::NotFoundError(absl::StrCat("no plugin '", plugin, "' is installed"));
}

}  // namespace fwai
