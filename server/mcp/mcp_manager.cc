#include "server/mcp/mcp_manager.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/tools/tool.h"

namespace fwai {

using json = nlohmann::json;

std::string McpManager::QualifiedName(const std::string& server, const std::string& tool) {
  std::string q = "mcp_" + server + "_" + tool;
  for (auto& c : q) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
  }
  if (q.size() > 64) q.resize(64);
  return q;
}

McpManager::McpManager(std::vector<McpServerConfig> servers, HttpClient* http) : http_(http) {
  for (auto& c : servers) servers_[c.name].config = std::move(c);
}

McpManager::~McpManager() { Stop(); }

McpManager::Connection McpManager::Connect(const McpServerConfig& config) const {
  Connection out;
  auto c = McpClient::Start(config, http_);
  if (!c.ok()) {
    out.error = std::string(c.status().message());
    return out;
  }
  auto tools = (*c)->ListTools();
  if (!tools.ok()) {
    out.error = std::string(tools.status().message());
    return out;
  }
  out.client = std::shared_ptr<McpClient>(std::move(*c));
  for (const auto& t : *tools) {
    out.tools.push_back(
        {config.name, t.name, QualifiedName(config.name, t.name), t.description, t.input_schema});
  }
  return out;
}

void McpManager::Adopt(Server& s, const Connection& c) {
  if (!c.client) {
    s.last_error = c.error;
    return;
  }
  s.client = c.client;
  s.last_error.clear();
  s.backoff_ms = 1000;
  s.tools.clear();
  for (const auto& t : c.tools) s.tools.insert(t.tool);
}

std::vector<McpToolInfo> McpManager::Start() {
  // Servers start in parallel and outside the lock.
  std::vector<McpServerConfig> configs;
  {
    MutexLock lock(&mu_);
    for (const auto& [name, s] : servers_) configs.push_back(s.config);
  }
  std::vector<Connection> conns(configs.size());
  {
    std::vector<std::thread> starters;
    for (size_t i = 0; i < configs.size(); ++i)
      starters.emplace_back([&, i] { conns[i] = Connect(configs[i]); });
    for (auto& t : starters) t.join();
  }
  std::vector<McpToolInfo> all;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < configs.size(); ++i) {
      const std::string& name = configs[i].name;
      Server& s = servers_[name];
      Adopt(s, conns[i]);
      if (!s.client) {
        spdlog::warn("mcp server {}: {}; retrying in the background", name, s.last_error);
        s.next_try = std::chrono::steady_clock::now() + std::chrono::milliseconds(s.backoff_ms);
      } else {
        spdlog::info("mcp server {}: {} tools", name, conns[i].tools.size());
      }
      all.insert(all.end(), conns[i].tools.begin(), conns[i].tools.end());
    }
  }
  supervisor_ = std::thread([this] { Supervise(); });
  return all;
}

void McpManager::Supervise() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    cv_.WaitWithTimeout(&mu_, std::chrono::milliseconds(200));
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, std::shared_ptr<McpClient>>>
        changed;                       // said their tool list changed
    std::vector<McpServerConfig> due;  // down, and their next try has come
    for (auto& [name, s] : servers_) {
      if (s.client && s.client->alive()) {
        if (s.client->TakeToolsChanged()) changed.emplace_back(name, s.client);
        continue;
      }
      if (s.client) {  // it died: schedule a restart
        s.last_error = "stopped; restarting";
        s.client.reset();
        s.next_try = now + std::chrono::milliseconds(s.backoff_ms);
        spdlog::warn("mcp server {} died; restarting in {} ms", name, s.backoff_ms);
        continue;
      }
      if (now < s.next_try) continue;
      ++s.restarts;
      due.push_back(s.config);
    }
    if (due.empty() && changed.empty()) continue;
    // Starting a server or reading its tools may take seconds (up to its
    // timeouts): outside the lock, so calls to the other servers go on.
    lock.Unlock();
    std::vector<std::pair<std::string, Connection>> restarted;
    for (const auto& c : due) restarted.emplace_back(c.name, Connect(c));
    std::vector<std::pair<std::string, std::vector<McpToolInfo>>> ready;  // tools to announce
    std::map<std::string, std::set<std::string>> relisted;
    for (const auto& [name, client] : changed) {
      auto tools = client->ListTools(5000);
      if (!tools.ok()) {
        spdlog::warn("mcp server {}: its tool list changed but could not be read: {}", name,
                     tools.status().ToString());
        continue;
      }
      std::vector<McpToolInfo> infos;
      for (const auto& t : *tools) {
        infos.push_back({name, t.name, QualifiedName(name, t.name), t.description, t.input_schema});
        relisted[name].insert(t.name);
      }
      spdlog::info("mcp server {}: tool list changed: {} tools", name, infos.size());
      ready.emplace_back(name, std::move(infos));
    }
    lock.Lock();
    if (stopping_) break;  // the connections close as `restarted` goes
    for (auto& [name, tools] : relisted) servers_[name].tools = std::move(tools);
    const auto after = std::chrono::steady_clock::now();
    for (auto& [name, conn] : restarted) {
      Server& s = servers_[name];
      Adopt(s, conn);
      if (!s.client) {
        s.backoff_ms = std::min(s.backoff_ms * 2, 60000);
        s.next_try = after + std::chrono::milliseconds(s.backoff_ms);
        spdlog::warn("mcp server {}: restart failed ({}); next try in {} ms", name, s.last_error,
                     s.backoff_ms);
      } else {
        spdlog::info("mcp server {} restarted: {} tools", name, conn.tools.size());
        ready.emplace_back(name, conn.tools);
      }
    }
    if (!ready.empty() && on_tools_) {
      // Outside the lock: the callback indexes tools and may take a while.
      lock.Unlock();
      for (const auto& [name, tools] : ready) on_tools_(name, tools);
      lock.Lock();
    }
  }
}

absl::StatusOr<McpCallResult> McpManager::Call(const std::string& server, const std::string& tool,
                                               const json& args, CancelToken* cancel) {
  std::shared_ptr<McpClient> client;
  {
    MutexLock lock(&mu_);
    auto it = servers_.find(server);
    if (it == servers_.end())
      return absl::NotFoundError(absl::StrCat("no mcp server named ", server));
    client = it->second.client;
    if (!client || !client->alive()) {
      return absl::UnavailableError(
          absl::StrCat("mcp server ", server, " is not running (",
                       it->second.last_error.empty() ? "restarting" : it->second.last_error,
                       "); try again shortly"));
    }
  }
  auto r = client->CallTool(tool, args, cancel);
  if (!r.ok()) cv_.SignalAll();  // let the supervisor look at it now
  return r;
}

void McpManager::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.SignalAll();
  if (supervisor_.joinable()) supervisor_.join();
  MutexLock lock(&mu_);
  for (auto& [name, s] : servers_) s.client.reset();
}

int McpManager::pid(const std::string& server) {
  MutexLock lock(&mu_);
  auto it = servers_.find(server);
  return it != servers_.end() && it->second.client ? it->second.client->pid() : -1;
}

int McpManager::restarts(const std::string& server) {
  MutexLock lock(&mu_);
  auto it = servers_.find(server);
  return it == servers_.end() ? 0 : it->second.restarts;
}

namespace {

class McpProxyTool final : public Tool {
 public:
  McpProxyTool(McpManager& m, McpToolInfo info) : m_(m), info_(std::move(info)) {}
  std::string name() const override { return info_.qualified; }
  std::string description() const override {
    return absl::StrCat(info_.description, " (MCP server ", info_.server, ")");
  }
  json input_schema() const override {
    return info_.input_schema.is_object() && !info_.input_schema.empty() ? info_.input_schema
                                                                         : json{{"type", "object"}};
  }
  // Whatever the server does is outside fwaid's view: never read-only.
  bool read_only() const override { return false; }
  bool available() const override { return m_.Lists(info_.server, info_.tool); }
  ToolResult Run(const json& input, ToolContext& ctx) override {
    auto r = m_.Call(info_.server, info_.tool, input, ctx.cancel);
    if (!r.ok()) return {std::string(r.status().message()), true};
    return {r->text, r->is_error};
  }

 private:
  McpManager& m_;
  const McpToolInfo info_;
};

}  // namespace

bool McpManager::Lists(const std::string& server, const std::string& tool) {
  MutexLock lock(&mu_);
  auto it = servers_.find(server);
  return it != servers_.end() && it->second.tools.count(tool) > 0;
}

std::unique_ptr<Tool> MakeMcpTool(McpManager& manager, McpToolInfo info) {
  return std::make_unique<McpProxyTool>(manager, std::move(info));
}

std::vector<McpServerConfig> McpServerConfigs(
    const std::map<std::string, McpServerEntry>& entries) {
  std::vector<McpServerConfig> out;
  for (const auto& [name, e] : entries) {
    McpServerConfig mc;
    mc.name = name;
    mc.command = e.command;
    mc.env = e.env;
    mc.url = e.url;
    mc.headers = e.headers;
    out.push_back(std::move(mc));
  }
  return out;
}

}  // namespace fwai
