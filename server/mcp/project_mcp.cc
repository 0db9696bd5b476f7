#include "server/mcp/project_mcp.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/local_account.h"
#include "common/mutex.h"
#include "server/mcp/mcp_manager.h"
#include "server/tools/tool.h"

namespace fwai {

namespace fs = std::filesystem;

struct ProjectMcpServers::Entry {
  // The section, as parsed (a change restarts the servers). Set before the
  // entry is in by_root_, read-only after.
  std::string key;
  Mutex tools_mu;
  // Appended only (a server that came up late or changed its list).
  std::vector<std::unique_ptr<Tool>> tools ABSL_GUARDED_BY(tools_mu);
  uint64_t last_used = 0;  // under ProjectMcpServers::mu_
  // One start per project at a time; its servers are stopped holding it too,
  // so a stop never runs during a start. Taken before (never under) mu_.
  Mutex start_mu;
  bool started ABSL_GUARDED_BY(start_mu) = false;
  // Last, so it is stopped (and its callbacks are over) before the rest goes.
  std::unique_ptr<McpManager> manager ABSL_GUARDED_BY(start_mu);

  // `m` is `manager` (passed in: the supervisor's callback calls this
  // without start_mu, which a Stop() that joins the supervisor may hold).
  void AddTools(McpManager& m, std::vector<McpToolInfo> infos) {
    MutexLock lock(&tools_mu);
    for (auto& info : infos) {
      bool have = false;
      for (const auto& t : tools) have |= t->name() == info.qualified;
      if (!have) tools.push_back(MakeMcpTool(m, std::move(info)));
    }
  }
  // The tools their servers offer now.
  std::vector<Tool*> View() {
    MutexLock lock(&tools_mu);
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
    MutexLock lock(&mu_);
    all.swap(by_root_);
  }
  for (auto& [root, e] : all) {
    MutexLock start(&e->start_mu);
    if (e->manager) e->manager->Stop();
  }
}

size_t ProjectMcpServers::running() {
  MutexLock lock(&mu_);
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

void ProjectMcpServers::EvictPastLimit(const Entry* keep) {
  // Each victim is stopped holding its start_mu, so no start of it runs
  // meanwhile; one busy starting (start_mu taken) is left running rather
  // than waited for. start_mu is taken before mu_, never under it.
  std::set<const Entry*> busy;
  while (true) {
    std::string slot;
    std::shared_ptr<Entry> victim;
    uint64_t used = 0;
    {
      MutexLock lock(&mu_);
      if (by_root_.size() <= max_projects_) return;
      for (const auto& [s, e] : by_root_) {
        if (e.get() == keep || busy.count(e.get())) continue;
        if (!victim || e->last_used < victim->last_used) {
          slot = s;
          victim = e;
        }
      }
      if (!victim) return;
      used = victim->last_used;
    }
    if (!victim->start_mu.TryLock()) {
      busy.insert(victim.get());
      continue;
    }
    bool evicted = false;
    {
      MutexLock lock(&mu_);
      auto it = by_root_.find(slot);
      // Still there, not used since it was picked, and still one too many.
      if (it != by_root_.end() && it->second == victim && victim->last_used == used &&
          by_root_.size() > max_projects_) {
        by_root_.erase(it);
        evicted = true;
      }
    }
    if (evicted && victim->manager) victim->manager->Stop();
    victim->start_mu.Unlock();
  }
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
  bool added = false;
  {
    MutexLock lock(&mu_);
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
      added = true;
    }
    if (entry) entry->last_used = ++clock_;
  }
  if (retired) {
    // Waits for a start of the old servers that is under way (no lock held).
    MutexLock start(&retired->start_mu);
    if (retired->manager) {
      spdlog::info("mcp: {}: its servers changed; restarting them", project_root);
      retired->manager->Stop();
    }
  }
  if (added) EvictPastLimit(entry.get());
  if (!entry) return ToolSet{};
  MutexLock start(&entry->start_mu);
  if (!entry->started) {
    auto configs = McpServerConfigs(servers);
    for (auto& c : configs) c.run_as = account;
    entry->manager = std::make_unique<McpManager>(std::move(configs), http_);
    Entry* e = entry.get();
    McpManager* m = entry->manager.get();
    entry->manager->OnTools([e, m](const std::string&, const std::vector<McpToolInfo>& infos) {
      e->AddTools(*m, infos);
    });
    entry->AddTools(*m, entry->manager->Start());
    entry->started = true;
    spdlog::info("mcp: {}: {} servers, {} tools", project_root, servers.size(),
                 entry->View().size());
  }
  return ToolSet{entry, entry->View()};
}

}  // namespace fwai
