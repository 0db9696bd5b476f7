// plugins: installs, verifies and removes plugins, and tells the rest of the
// daemon what they provide and may do.
//
// A plugin is a directory with a manifest, fwai-plugin.json: its name and
// version, what it adds (skills, sub-agent types, MCP servers, tool
// documents, project templates), the capabilities it needs (build, flash,
// the board tags it may touch, network) and the SHA-256 of every file. A
// minisign signature of the manifest (fwai-plugin.json.minisig) by a key in
// plugins.trusted_keys makes it trusted. Unsigned (or untrusted) plugins and
// tampered ones (a file that differs from the manifest, a missing or extra
// file, a signature that no longer matches) are refused unless the policy
// allows them. Installs and removals are evidence records.
//
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mutex.h"
#include "server/auth/caller.h"
#include "server/skills/skill.h"

namespace fwai {

class HttpClient;

inline constexpr char kPluginManifest[] = "fwai-plugin.json";
inline constexpr char kPluginSignature[] = "fwai-plugin.json.minisig";

struct PluginCapabilities {
  bool build = false;               // build, test and shell steps
  bool flash = false;               // flashing (and OTA) on boards it may touch
  std::vector<std::string> boards;  // tags; a board must carry one to be touched
  bool network = false;             // commands may use the network
};

struct PluginManifest {
  std::string name, version, description;
  std::vector<std::string> skills, agents, tools, templates;  // paths inside the plugin
  std::map<std::string, McpServerEntry> mcp_servers;
  PluginCapabilities capabilities;
  std::map<std::string, std::string> files;  // path -> SHA-256 (hex)
};

// Parses and checks a manifest; errors name `source` and the field.
[[nodiscard]] absl::StatusOr<PluginManifest> ParsePluginManifest(const std::string& text,
                                                                 const std::string& source);

struct PluginCheck {
  std::string signature;  // trusted | untrusted | unsigned | invalid
  std::string key_id;
  std::string signature_detail;
  std::vector<std::string> modified, missing, extra;
  bool tampered() const {
    return signature == "invalid" || !modified.empty() || !missing.empty() || !extra.empty();
  }
  nlohmann::json ToJson() const;
};

// Checks a plugin directory against its manifest and the trusted keys
// (minisign public keys).
[[nodiscard]] absl::StatusOr<PluginCheck> CheckPluginDir(
    const std::string& dir, const PluginManifest& manifest,
    const std::vector<std::string>& trusted_keys);

struct InstalledPlugin {
  std::string name, dir;
  PluginManifest manifest;
  nlohmann::json record;  // source, time, verification at install
};

class PluginStore {
 public:
  using AppendEvidence = std::function<absl::StatusOr<uint64_t>(const nlohmann::json&)>;
  // `dir`: where plugins live (the data dir's plugins/); `http` fetches
  // marketplace indexes over HTTPS (may be null: directories only).
  PluginStore(std::string dir, PluginsConfig config, HttpClient* http, AppendEvidence append);

  // Reads the trusted keys and the installed plugins.
  [[nodiscard]] absl::Status Start();

  [[nodiscard]] absl::StatusOr<nlohmann::json> Install(const std::string& source, bool replace,
                                                       const Caller& caller);
  [[nodiscard]] absl::StatusOr<nlohmann::json> Remove(const std::string& name,
                                                      const Caller& caller);
  [[nodiscard]] absl::StatusOr<nlohmann::json> Verify(const std::string& name) const;
  std::vector<InstalledPlugin> Installed() const;
  [[nodiscard]] absl::StatusOr<nlohmann::json> Search(const std::string& query,
                                                      const std::string& marketplace) const;

  // Sub-agent types and MCP servers the installed plugins declare, named
  // "<plugin>:<name>" and "<plugin>-<name>" (read at fwaid's start).
  std::map<std::string, SubagentConfig> Agents() const;
  std::map<std::string, McpServerEntry> McpServers() const;
  // Skills, available at once after an install.
  std::vector<PluginSkillSet> SkillSets() const;
  // A template directory of a plugin ("<plugin>:<template>"): its files.
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TemplateFiles(
      const std::string& name) const;
  // Tool documents (one JSON text each) for the catalog.
  std::vector<std::string> ToolDocuments() const;

 private:
  absl::StatusOr<std::string> Fetch(const std::string& source, const std::string& staging) const;
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string dir_;
  const PluginsConfig config_;
  HttpClient* const http_;
  const AppendEvidence append_;
  // Minisign public key lines; set by Start(), read-only after.
  std::vector<std::string> trusted_keys_;
  mutable Mutex mu_;
  std::map<std::string, InstalledPlugin> installed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fwai
