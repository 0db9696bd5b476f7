#include "server/lab/registry.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "server/lab/etcd_client.h"

namespace fwai::lab {

namespace {

nlohmann::json StreamsToJson(const std::vector<std::pair<std::string, std::string>>& streams) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [id, name] : streams) out.push_back({{"id", id}, {"name", name}});
  return out;
}

}  // namespace

std::string BoardToJson(const LabBoard& b) {
  return nlohmann::json{{"id", b.id},
                        {"node", b.node},
                        {"kind", b.kind},
                        {"name", b.name},
                        {"target", b.target},
                        {"tags", b.tags},
                        {"health", b.health},
                        {"health_reason", b.health_reason},
                        {"streams", StreamsToJson(b.streams)}}
      .dump();
}

absl::StatusOr<LabBoard> BoardFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string()) {
    return absl::InvalidArgumentError("not a board record");
  }
  LabBoard b;
  b.id = j.value("id", "");
  b.node = j.value("node", "");
  b.kind = j.value("kind", "");
  b.name = j.value("name", "");
  b.target = j.value("target", "");
  b.health = j.value("health", "");
  b.health_reason = j.value("health_reason", "");
  if (j.contains("tags") && j["tags"].is_array()) {
    for (const auto& t : j["tags"]) {
      if (t.is_string()) b.tags.push_back(t.get<std::string>());
    }
  }
  // A bench's streams, if it says (an older one does not).
  if (j.contains("streams") && j["streams"].is_array()) {
    for (const auto& s : j["streams"]) {
      if (s.is_object() && s.value("id", "") != "") {
        b.streams.emplace_back(s.value("id", ""), s.value("name", ""));
      }
    }
  }
  return b;
}

absl::StatusOr<LabView> ReadLab(EtcdClient& etcd) {
  LabView view;
  auto nodes = etcd.GetPrefix(kNodesPrefix);
  if (!nodes.ok()) return nodes.status();
  for (const auto& kv : nodes->kvs) {
    auto j = nlohmann::json::parse(kv.value, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    LabNode n;
    n.node = j.value("node", kv.key.substr(sizeof(kNodesPrefix) - 1));
    n.advertise = j.value("advertise", "");
    n.version = j.value("version", "");
    n.pid = j.value("pid", int64_t{0});
    n.started_us = j.value("started_us", int64_t{0});
    view.nodes.push_back(std::move(n));
  }
  auto boards = etcd.GetPrefix(kBoardsPrefix);
  if (!boards.ok()) return boards.status();
  for (const auto& kv : boards->kvs) {
    auto b = BoardFromJson(kv.value);
    if (b.ok()) view.boards.push_back(*std::move(b));
  }
  view.revision = boards->revision;
  return view;
}

struct LabRegistrar::Rep {
  const LabConfig config;  // its advertise is `advertise`'s first value
  EtcdClient& etcd;
  std::function<std::vector<LabBoard>()> boards;
  std::string version;
  int64_t started_us = NowMicros();

  mutable Mutex mu;
  CondVar cv;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool poked ABSL_GUARDED_BY(mu) = false;
  State state ABSL_GUARDED_BY(mu);
  std::string advertise ABSL_GUARDED_BY(mu);  // SetAdvertise may change it
  std::thread thread;                         // started by Start, joined by Stop

  Rep(LabConfig c, EtcdClient& e, std::function<std::vector<LabBoard>()> b, std::string v)
      : config(std::move(c)),
        etcd(e),
        boards(std::move(b)),
        version(std::move(v)),
        advertise(config.advertise) {}

  void SetError(const absl::Status& s, const std::string& doing) ABSL_LOCKS_EXCLUDED(mu) {
    MutexLock lock(&mu);
    const std::string msg = absl::StrCat(doing, ": ", s.message());
    if (state.last_error != msg) spdlog::warn("lab: {}", msg);
    state.last_error = msg;
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu) {
    const std::string node_key = absl::StrCat(kNodesPrefix, config.node);
    const std::string boards_prefix = absl::StrCat(kBoardsPrefix, config.node, "/");
    std::map<std::string, std::string> published;  // board key -> value written under `lease`
    int64_t lease = 0;
    auto last_keepalive = std::chrono::steady_clock::now();
    const auto keepalive_every = std::chrono::milliseconds(config.ttl_s * 1000 / 3);
    while (true) {
      {
        MutexLock lock(&mu);
        if (stopping) break;
      }
      if (lease == 0) {
        auto granted = etcd.LeaseGrant(config.ttl_s);
        if (!granted.ok()) {
          SetError(granted.status(), "joining the lab");
        } else {
          lease = *granted;
          published.clear();
          // Boards a previous life of this node left (until their TTL) go now.
          std::string advertised;
          {
            MutexLock lock(&mu);
            advertised = advertise;
          }
          nlohmann::json node = {{"node", config.node},
                                 {"advertise", advertised},
                                 {"pid", getpid()},
                                 {"version", version},
                                 {"started_us", started_us}};
          absl::Status s = etcd.DeletePrefix(boards_prefix).status();
          if (s.ok()) s = etcd.Put(node_key, node.dump(), lease).status();
          if (!s.ok()) {
            SetError(s, "registering the node");
            (void)etcd.LeaseRevoke(lease);
            lease = 0;
          } else {
            last_keepalive = std::chrono::steady_clock::now();
            spdlog::info("lab: joined as node {} (etcd lease {:x}, ttl {} s)", config.node, lease,
                         config.ttl_s);
            MutexLock lock(&mu);
            state.joined = true;
            state.lease = lease;
            state.last_error.clear();
          }
        }
      }
      if (lease != 0) {
        // What changed on this node's boards since the last write.
        std::map<std::string, std::string> now;
        for (LabBoard b : boards()) {
          b.node = config.node;
          now[boards_prefix + b.id] = BoardToJson(b);
        }
        absl::Status s;
        for (const auto& [key, value] : now) {
          auto it = published.find(key);
          if (it != published.end() && it->second == value) continue;
          s = etcd.Put(key, value, lease).status();
          if (!s.ok()) break;
          published[key] = value;
        }
        for (auto it = published.begin(); s.ok() && it != published.end();) {
          if (now.count(it->first)) {
            ++it;
            continue;
          }
          s = etcd.Delete(it->first).status();
          if (s.ok()) it = published.erase(it);
        }
        if (!s.ok()) SetError(s, "writing boards");
        if (std::chrono::steady_clock::now() - last_keepalive >= keepalive_every) {
          auto ttl = etcd.LeaseKeepAlive(lease);
          if (ttl.ok()) {
            last_keepalive = std::chrono::steady_clock::now();
            MutexLock lock(&mu);
            if (!state.joined) spdlog::info("lab: node {} is registered again", config.node);
            state.joined = true;
            state.last_error.clear();
          } else if (absl::IsNotFound(ttl.status())) {
            // etcd let the lease lapse (we were cut off too long): join afresh.
            SetError(ttl.status(), "keeping the registration alive");
            lease = 0;
            MutexLock lock(&mu);
            state.joined = false;
            state.lease = 0;
          } else {
            SetError(ttl.status(), "keeping the registration alive");
          }
        }
      }
      MutexLock lock(&mu);
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(lease == 0 ? 1000 : 500);
      while (!(stopping || poked)) {
        if (cv.WaitWithDeadline(&mu, deadline)) break;
      }
      poked = false;
    }
  }
};

LabRegistrar::LabRegistrar(LabConfig config, EtcdClient& etcd,
                           std::function<std::vector<LabBoard>()> boards, std::string version)
    : rep_(std::make_unique<Rep>(std::move(config), etcd, std::move(boards), std::move(version))) {}

LabRegistrar::~LabRegistrar() { Stop(true); }

void LabRegistrar::Start() {
  rep_->thread = std::thread([this] { rep_->Run(); });
}

void LabRegistrar::Stop(bool leave) {
  {
    MutexLock lock(&rep_->mu);
    rep_->stopping = true;
    rep_->cv.SignalAll();
  }
  if (rep_->thread.joinable()) rep_->thread.join();
  int64_t lease = 0;
  {
    MutexLock lock(&rep_->mu);
    lease = rep_->state.lease;
    rep_->state.lease = 0;
    rep_->state.joined = false;
  }
  if (leave && lease != 0) {
    if (auto s = rep_->etcd.LeaseRevoke(lease); !s.ok()) {
      spdlog::warn("lab: leaving: {} (the registration ends with its TTL)", s.ToString());
    }
  }
}

void LabRegistrar::SetAdvertise(std::string advertise) {
  MutexLock lock(&rep_->mu);
  rep_->advertise = std::move(advertise);
}

void LabRegistrar::Poke() {
  MutexLock lock(&rep_->mu);
  rep_->poked = true;
  rep_->cv.SignalAll();
}

LabRegistrar::State LabRegistrar::state() const {
  MutexLock lock(&rep_->mu);
  return rep_->state;
}

}  // namespace fwai::lab
