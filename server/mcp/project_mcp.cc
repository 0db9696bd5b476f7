#include "server/mcp/project_mcp.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/local_account.h"
#include "server/mcp/mcp_manager.h"
#include "server/tools/tool.h"

namespace fwai {

namespace fs = std::filesystem;

struct ProjectMcpServers::Entry {
  std::string key;  // the section, as parsed (a change restarts the servers)
  std::mutex tools_mu;
  std::vector<std::unique_ptr<Tool>>
      tools;  // appended only (a server that came up late or changed its list)
  uint64_t last_used = 0;
  std::mutex start_mu;  // one start per project at a time
  bool started = false;
  // Last, so it is stopped (and its callbacks are over) before the rest goes.
  std::unique_ptr<McpManager> manager;

  void AddTools(std::vector<McpToolInfo> infos) {
    std::lock_guard lock(tools_mu);
    for (auto& info : infos) {
      bool have = false;
      for (const auto& t : tools) have |= t->name() == info.qualified;
      if (!have) tools.push_back(MakeMcpTool(*manager, std::move(info)));
    }
  }
  // The tools their servers offer now.
  std::vector<Tool*> View() {
    std::lock_guard lock(tools_mu);
    std::vector<Tool*> out;
    for (const auto& t : tools) {
      if (t->available()) out.push_back(t.get());
    }
    return out;
  }
};

ProjectMcpServers::ProjectMcpServers(HttpClient* http, size_t max_projects)
    : http_(http), max_projects_(max_projects) {}

ProjectMcpServers::~ProjectMcpServers() {
  std::map<std::string, std::shared_ptr<Entry>> all;
  {
    std::lock_guard lock(mu_);
    all.swap(by_root_);
  }
  for (auto& [root, e] : all) {
    if (e->manager) e->manager->Stop();
  }
}

size_t ProjectMcpServers::running() {
  std::lock_guard lock(mu_);
  return by_root_.size();
}

namespace {
absl::StatusOr<std::map<std::string, McpServerEntry>> Declared(const std::string& project_root,
                                                               const LocalAccount& account) {
  const fs::path path = fs::path(project_root) / ".fwai" / "project.yaml";
  std::error_code ec;
  std::string text;
  {
    ScopedFsIdentity as(account);
    if (!as.status().ok()) return as.status();
    if (project_root.empty() || !fs::exists(path, ec))
      return std::map<std::string, McpServerEntry>{};
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  return ParseMcpServers(text, path.string());
}
}  // namespace

absl::StatusOr<bool> ProjectMcpServers::Declares(const std::string& project_root,
                                                 const LocalAccount& account) {
  auto d = Declared(project_root, account);
  if (!d.ok()) return d.status();
  return !d->empty();
}

absl::StatusOr<ProjectMcpServers::ToolSet> ProjectMcpServers::ToolsFor(
    const std::string& project_root, const LocalAccount& account) {
  auto declared = Declared(project_root, account);
  if (!declared.ok()) return declared.status();
  std::map<std::string, McpServerEntry> servers = std::move(*declared);
  // One set of servers per project and account.
  const std::string slot = absl::StrCat(project_root, "\x1d", account.uid);
  std::string key;
  for (const auto& [name, e] : servers) {
    absl::StrAppend(&key, name, "\x1f", e.url);
    for (const auto& c : e.command) absl::StrAppend(&key, "\x1f", c);
    for (const auto& [k, v] : e.env) absl::StrAppend(&key, "\x1f", k, "=", v);
    for (const auto& h : e.headers) absl::StrAppend(&key, "\x1f", h);
    key += '\x1e';
  }
  std::shared_ptr<Entry> entry, retired;
  std::vector<std::shared_ptr<Entry>> evicted;
  {
    std::lock_guard lock(mu_);
    auto it = by_root_.find(slot);
    if (it != by_root_.end() && it->second->key != key) {
      retired = it->second;
      by_root_.erase(it);
      it = by_root_.end();
    }
    if (servers.empty()) {
      entry = nullptr;
    } else if (it != by_root_.end()) {
      entry = it->second;
    } else {
      entry = std::make_shared<Entry>();
      entry->key = key;
      by_root_[slot] = entry;
      while (by_root_.size() > max_projects_) {
        auto oldest = by_root_.begin();
        for (auto j = by_root_.begin(); j != by_root_.end(); ++j) {
          if (j->second->last_used < oldest->second->last_used && j->second != entry) oldest = j;
        }
        if (oldest->second == entry) break;
        evicted.push_back(oldest->second);
        by_root_.erase(oldest);
      }
    }
    if (entry) entry->last_used = ++clock_;
  }
  if (retired && retired->manager) {
    spdlog::info("mcp: {}: its servers changed; restarting them", project_root);
    retired->manager->Stop();
  }
  for (auto& e : evicted) {
    if (e->manager) e->manager->Stop();
  }
  if (!entry) return ToolSet{};
  std::lock_guard start(entry->start_mu);
  if (!entry->started) {
    auto configs = McpServerConfigs(servers);
    for (auto& c : configs) c.run_as = account;
    entry->manager = std::make_unique<McpManager>(std::move(configs), http_);
    Entry* e = entry.get();
    entry->manager->OnTools(
        [e](const std::string&, const std::vector<McpToolInfo>& infos) { e->AddTools(infos); });
    entry->AddTools(entry->manager->Start());
    entry->started = true;
    spdlog::info("mcp: {}: {} servers, {} tools", project_root, servers.size(),
                 entry->View().size());
  }
  return ToolSet{entry, entry->View()};
}

}  // namespace fwai
