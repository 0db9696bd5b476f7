#include "server/session/session_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/status_macros.h"
#include "fwai/v1/events.pb.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

constexpr char kOpenTurnPrefix[] = "open-turn/";
// Events queued for the appender past which publishers wait for it: a
// provider faster than the disk slows down instead of filling memory.
constexpr size_t kMaxQueued = 8192;
// Events queued past which the appender stops waiting out its batch window.
constexpr size_t kBatchFill = 256;

// "open-turn/<session>\0<turn>" -> big-endian seq of the turn's user message.
std::string OpenTurnKey(const std::string& session_id, const std::string& turn_id) {
  return absl::StrCat(kOpenTurnPrefix, session_id, std::string(1, '\0'), turn_id);
}

}  // namespace

std::string SessionToJson(const SessionInfo& s) {
  nlohmann::json j = {{"id", s.id},
                      {"title", s.title},
                      {"owner", s.owner},
                      {"project_root", s.project_root},
                      {"account", s.account},
                      {"created_us", s.created_us},
                      {"updated_us", s.updated_us},
                      {"provider", s.provider},
                      {"model", s.model},
                      {"mode", s.mode},
                      {"auto_approve_plan", s.auto_approve_plan},
                      {"ask_before_edits", s.ask_before_edits},
                      {"temperature", s.temperature},
                      {"max_tokens", s.max_tokens},
                      {"input_tokens", s.input_tokens},
                      {"output_tokens", s.output_tokens},
                      {"cost_usd", s.cost_usd},
                      {"todos", nlohmann::json::parse(s.todos_json, nullptr, false).is_array()
                                    ? nlohmann::json::parse(s.todos_json)
                                    : nlohmann::json::array()}};
  return j.dump();
}

absl::StatusOr<SessionInfo> SessionFromJson(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    SessionInfo s;
    s.id = j.value("id", "");
    s.title = j.value("title", "");
    s.owner = j.value("owner", "");
    s.project_root = j.value("project_root", "");
    s.account = j.value("account", "");
    s.created_us = j.value("created_us", int64_t{0});
    s.updated_us = j.value("updated_us", int64_t{0});
    s.provider = j.value("provider", "");
    s.model = j.value("model", "");
    s.mode = j.value("mode", "act");
    s.auto_approve_plan = j.value("auto_approve_plan", false);
    s.ask_before_edits = j.value("ask_before_edits", false);
    s.temperature = j.value("temperature", -1.0);
    s.max_tokens = j.value("max_tokens", 0);
    s.input_tokens = j.value("input_tokens", int64_t{0});
    s.output_tokens = j.value("output_tokens", int64_t{0});
    s.cost_usd = j.value("cost_usd", 0.0);
    s.todos_json = j.contains("todos") ? j["todos"].dump() : "[]";
    return s;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("stored session record is not valid JSON: ", e.what()));
  }
}

SessionManager::SessionManager(Storage& storage, SubscriberConfig limits)
    : storage_(storage), limits_(limits), appender_([this] { AppendLoop(); }) {}

SessionManager::~SessionManager() {
  {
    MutexLock lock(&append_mu_);
    stop_ = true;
  }
  append_cv_.SignalAll();
  appender_.join();  // it writes what is queued before it stops
  CloseAll(absl::UnavailableError("fwaid is shutting down"));
}

absl::StatusOr<SessionInfo> SessionManager::Create(const std::string& owner, NewSession params) {
  std::error_code ec;
  std::filesystem::path root;
  if (!params.without_project) {
    if (params.project_root.empty()) {
      return absl::InvalidArgumentError(
          "project_root: required (the directory the session works on)");
    }
    root = std::filesystem::canonical(params.project_root, ec);
    if (ec || !std::filesystem::is_directory(root)) {
      return absl::InvalidArgumentError(
          absl::StrCat("project_root: '", params.project_root, "' is not an existing directory",
                       ec ? absl::StrCat(" (", ec.message(), ")") : std::string()));
    }
  }
  if (params.title.size() > 200) {
    return absl::InvalidArgumentError("title: at most 200 characters");
  }
  SessionInfo s;
  s.id = NewId("s-");
  s.title = params.title;
  s.owner = owner;
  s.project_root = root.string();
  s.account = params.without_project ? "" : params.account;
  s.created_us = s.updated_us = NowMicros();
  s.provider = params.provider;
  s.model = params.model;
  if (params.mode != "act" && params.mode != "plan" && !params.mode.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: expected act or plan, got '", params.mode, "'"));
  }
  s.mode = params.mode.empty() ? "act" : params.mode;
  s.auto_approve_plan = params.auto_approve_plan;
  s.ask_before_edits = params.ask_before_edits;
  if (params.temperature > 2) return absl::InvalidArgumentError("temperature: expected 0..2");
  if (params.max_tokens < 0 || params.max_tokens > 1000000)
    return absl::InvalidArgumentError("max_tokens: expected 0..1000000");
  s.temperature = params.temperature;
  s.max_tokens = params.max_tokens;
  {
    MutexLock count(&count_mu_);
    RETURN_IF_ERROR(storage_.Put(Cf::kSessions, s.id, SessionToJson(s), /*sync=*/false));
    if (counted_) ++owned_[s.owner];
  }
  // A new session has no events or history: its live state needs no seek.
  auto live = std::make_shared<Live>();
  {
    MutexLock l(&live->mu);
    live->loaded = true;
  }
  MutexLock lock(&mu_);
  live_[s.id] = std::move(live);
  return s;
}

absl::StatusOr<std::shared_ptr<SessionManager::Live>> SessionManager::GetLive(
    const std::string& id) {
  std::shared_ptr<Live> live;
  {
    MutexLock lock(&mu_);
    auto& slot = live_[id];
    if (!slot) slot = std::make_shared<Live>();
    live = slot;
  }
  MutexLock lock(&live->mu);
  if (live->deleted) return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
  if (!live->loaded) {
    ASSIGN_OR_RETURN(auto rec, storage_.Get(Cf::kSessions, id));
    if (!rec) {
      MutexLock l2(&mu_);
      if (live_[id] == live && live->subscribers.empty()) live_.erase(id);
      return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
    }
    ASSIGN_OR_RETURN(auto last, storage_.LastKey(Cf::kEvents, SeqKey(id, 0), SeqKeyEnd(id)));
    live->last_seq = last ? DecodeU64(std::string_view(*last).substr(id.size() + 1)) : 0;
    live->stored_seq = live->last_seq;
    ASSIGN_OR_RETURN(auto hlast, storage_.LastKey(Cf::kHistory, SeqKey(id, 0), SeqKeyEnd(id)));
    live->history_len = hlast ? DecodeU64(std::string_view(*hlast).substr(id.size() + 1)) : 0;
    live->loaded = true;
  }
  return live;
}

absl::StatusOr<SessionInfo> SessionManager::Get(const std::string& id) {
  ASSIGN_OR_RETURN(auto live, GetLive(id));
  ASSIGN_OR_RETURN(auto rec, storage_.Get(Cf::kSessions, id));
  if (!rec) return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
  ASSIGN_OR_RETURN(SessionInfo s, SessionFromJson(*rec));
  MutexLock lock(&live->mu);
  s.last_seq = live->stored_seq;
  return s;
}

absl::StatusOr<std::vector<SessionInfo>> SessionManager::List(const std::string& owner) {
  std::vector<SessionInfo> out;
  absl::Status parse_error;
  RETURN_IF_ERROR(storage_.Scan(Cf::kSessions, "", "", [&](std::string_view, std::string_view v) {
    auto s = SessionFromJson(std::string(v));
    if (!s.ok()) {
      parse_error = s.status();
      return true;  // skip a damaged record, keep listing the rest
    }
    if (owner.empty() || s->owner == owner) out.push_back(*std::move(s));
    return true;
  }));
  for (auto& s : out) {
    auto last = storage_.LastKey(Cf::kEvents, SeqKey(s.id, 0), SeqKeyEnd(s.id));
    if (last.ok() && *last)
      s.last_seq = DecodeU64(std::string_view(**last).substr(s.id.size() + 1));
  }
  std::sort(out.begin(), out.end(),
            [](const SessionInfo& a, const SessionInfo& b) { return a.updated_us > b.updated_us; });
  return out;
}

absl::StatusOr<int64_t> SessionManager::CountOwned(
    const std::function<bool(const std::string& owner)>& owns) {
  MutexLock lock(&count_mu_);
  if (!counted_) {
    std::map<std::string, int64_t> owned;
    RETURN_IF_ERROR(storage_.Scan(Cf::kSessions, "", "", [&](std::string_view, std::string_view v) {
      auto s = SessionFromJson(std::string(v));
      if (s.ok()) ++owned[s->owner];  // a damaged record is listed by nobody: not counted
      return true;
    }));
    owned_ = std::move(owned);
    counted_ = true;
  }
  int64_t n = 0;
  for (const auto& [owner, count] : owned_) n += owns(owner) ? count : 0;
  return n;
}

absl::Status SessionManager::Update(const SessionInfo& info) {
  SessionInfo s = info;
  s.updated_us = NowMicros();
  return storage_.Put(Cf::kSessions, s.id, SessionToJson(s), /*sync=*/false);
}

absl::Status SessionManager::Delete(const std::string& id) {
  ASSIGN_OR_RETURN(auto live, GetLive(id));
  {
    // No event is queued for the session from here on; those queued before
    // are written first, so none outlives the delete.
    MutexLock lock(&live->mu);
    if (live->deleted) return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
    live->deleted = true;
  }
  Drain();
  std::vector<std::shared_ptr<Subscriber>> to_notify;
  // Its owner, for the count (read as stored: the session is marked deleted).
  std::optional<std::string> owner;
  if (auto rec = storage_.Get(Cf::kSessions, id); rec.ok() && *rec) {
    if (auto info = SessionFromJson(**rec); info.ok()) owner = info->owner;
  }
  {
    MutexLock lock(&live->mu);
    WriteBatch batch;
    batch.Delete(Cf::kSessions, id);
    batch.DeleteRange(Cf::kEvents, SeqKey(id, 0), SeqKeyEnd(id));
    batch.DeleteRange(Cf::kHistory, SeqKey(id, 0), SeqKeyEnd(id));
    MutexLock count(&count_mu_);
    if (absl::Status s = storage_.Write(batch, /*sync=*/false); !s.ok()) {
      live->deleted = false;
      return s;
    }
    if (counted_ && owner) {
      auto it = owned_.find(*owner);
      if (it != owned_.end() && --it->second <= 0) owned_.erase(it);
    }
    for (auto& sub : live->subscribers) {
      if (sub->Close(absl::NotFoundError(absl::StrCat("session ", id, " was deleted")), false)) {
        to_notify.push_back(sub);
      }
    }
    live->subscribers.clear();
  }
  {
    MutexLock lock(&mu_);
    live_.erase(id);
  }
  for (auto& sub : to_notify) sub->Notify();
  return absl::OkStatus();
}

namespace {

absl::StatusOr<fwai::v1::ServerEvent> ParseEvent(const std::string& serialized) {
  fwai::v1::ServerEvent ev;
  if (!ev.ParseFromString(serialized)) {
    return absl::InternalError("Publish: event is not a serialized ServerEvent");
  }
  return ev;
}

}  // namespace

absl::StatusOr<uint64_t> SessionManager::Publish(const std::string& session_id,
                                                 std::string serialized) {
  ASSIGN_OR_RETURN(auto ev, ParseEvent(serialized));
  return Enqueue(session_id, ev, /*wait=*/true);
}

absl::StatusOr<uint64_t> SessionManager::PublishQueued(const std::string& session_id,
                                                       std::string serialized) {
  ASSIGN_OR_RETURN(auto ev, ParseEvent(serialized));
  return Enqueue(session_id, ev, /*wait=*/false);
}

absl::StatusOr<uint64_t> SessionManager::Publish(const std::string& session_id,
                                                 fwai::v1::ServerEvent&& ev) {
  return Enqueue(session_id, ev, /*wait=*/true);
}

absl::StatusOr<uint64_t> SessionManager::PublishQueued(const std::string& session_id,
                                                       fwai::v1::ServerEvent&& ev) {
  return Enqueue(session_id, ev, /*wait=*/false);
}

absl::StatusOr<uint64_t> SessionManager::Enqueue(const std::string& session_id,
                                                 fwai::v1::ServerEvent& ev, bool wait) {
  ASSIGN_OR_RETURN(auto live, GetLive(session_id));
  Pending p;
  p.live = live;
  p.session_id = session_id;
  // A turn is open from its user message to its turn_finished; the marker
  // is written with the event, so a crash leaves it behind and the next
  // start can end the turn (FinishInterruptedTurns).
  if (!ev.turn_id().empty() && ev.has_user_message()) {
    p.open_turn = 1;
  } else if (!ev.turn_id().empty() && ev.has_turn_finished()) {
    p.open_turn = -1;
  }
  p.turn_id = ev.turn_id();
  if (wait) p.done = std::make_shared<Done>();
  std::shared_ptr<Done> done = p.done;
  {
    // Waited for before the session's lock: the appender takes it to fan out.
    MutexLock lock(&append_mu_);
    while (queue_.size() >= kMaxQueued) written_cv_.Wait(&append_mu_);
  }
  uint64_t seq;
  bool wake = false;
  {
    MutexLock lock(&live->mu);
    if (live->deleted)
      return absl::NotFoundError(absl::StrCat("session ", session_id, " not found"));
    seq = live->last_seq + 1;
    ev.set_session_id(session_id);
    ev.set_seq(seq);
    if (ev.time_us() == 0) ev.set_time_us(NowMicros());
    p.seq = seq;
    p.bytes = ev.SerializeAsString();
    live->last_seq = seq;
    // Queued under the session's lock: the queue holds its events in seq order.
    MutexLock q(&append_mu_);
    queue_.push_back(std::move(p));
    ++queued_;
    if (done) ++waiters_;
    // The appender waits for a first event, a full batch or a waiter: other
    // events join the queue without waking it.
    wake = queue_.size() == 1 || queue_.size() == kBatchFill || done != nullptr;
  }
  if (wake) append_cv_.Signal();
  if (!done) return seq;
  MutexLock lock(&append_mu_);
  while (!done->done) written_cv_.Wait(&append_mu_);
  if (!done->status.ok()) return done->status;
  return seq;
}

bool SessionManager::TakeBatch(std::vector<Pending>& batch,
                               std::chrono::steady_clock::time_point last_write) {
  MutexLock lock(&append_mu_);
  while (!stop_ && queue_.empty()) append_cv_.Wait(&append_mu_);
  if (queue_.empty()) return false;  // stopping, and everything is written
  const auto window = std::chrono::microseconds(limits_.batch_window_us);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_write < window) {
    // Busy: more events are on their way; gather them for one write.
    const auto deadline = now + window;
    while (!stop_ && waiters_ == 0 && queue_.size() < kBatchFill) {
      if (append_cv_.WaitWithDeadline(&append_mu_, deadline)) break;
    }
  }
  for (const Pending& p : queue_) {
    if (p.done) --waiters_;
  }
  batch.swap(queue_);
  return true;
}

void SessionManager::AppendLoop() {
  std::chrono::steady_clock::time_point last_write;
  std::vector<Pending> batch_events;
  std::vector<std::shared_ptr<Subscriber>> to_notify;
  while (TakeBatch(batch_events, last_write)) {
    // One write for everything queued meanwhile, whatever its session.
    WriteBatch batch;
    for (const Pending& p : batch_events) {
      batch.Put(Cf::kEvents, SeqKey(p.session_id, p.seq), p.bytes);
      if (p.open_turn > 0) {
        batch.Put(Cf::kMeta, OpenTurnKey(p.session_id, p.turn_id), EncodeU64(p.seq));
      } else if (p.open_turn < 0) {
        batch.Delete(Cf::kMeta, OpenTurnKey(p.session_id, p.turn_id));
      }
    }
    const absl::Status status = storage_.Write(batch, /*sync=*/false);
    last_write = std::chrono::steady_clock::now();
    if (!status.ok()) {
      spdlog::error("cannot store {} event(s): {}", batch_events.size(), status.ToString());
    }
    // Stored: now, and only now, the subscribers get them.
    for (Pending& p : batch_events) {
      if (!status.ok()) continue;
      MutexLock lock(&p.live->mu);
      p.live->stored_seq = p.seq;
      for (auto& sub : p.live->subscribers) {
        if (sub->Push(p.seq, p.bytes)) to_notify.push_back(sub);
      }
    }
    for (auto& sub : to_notify) sub->Notify();
    to_notify.clear();
    {
      MutexLock lock(&append_mu_);
      for (Pending& p : batch_events) {
        if (p.done) {
          p.done->done = true;
          p.done->status = status;
        }
      }
      written_ += batch_events.size();
      ++batches_;
    }
    written_cv_.SignalAll();
    batch_events.clear();
  }
}

void SessionManager::Drain() {
  MutexLock lock(&append_mu_);
  const uint64_t target = queued_;
  ++waiters_;
  append_cv_.Signal();
  while (written_ < target) written_cv_.Wait(&append_mu_);
  --waiters_;
}

SessionManager::AppendCounts SessionManager::Appended() {
  MutexLock lock(&append_mu_);
  return {batches_, written_};
}

absl::StatusOr<std::shared_ptr<Subscriber>> SessionManager::Subscribe(
    const std::string& session_id, uint64_t after_seq, bool replay, bool follow,
    std::function<void()> notify) {
  ASSIGN_OR_RETURN(auto live, GetLive(session_id));
  MutexLock lock(&live->mu);
  if (live->deleted) return absl::NotFoundError(absl::StrCat("session ", session_id, " not found"));
  // Replay (after_seq, last] from storage; live events are those with seq >
  // last, handed over by the appender once stored.
  const uint64_t last = live->stored_seq;
  const uint64_t from = replay ? after_seq + 1 : last + 1;
  auto sub = std::make_shared<Subscriber>(session_id, &storage_, from, last, follow, limits_,
                                          std::move(notify));
  if (follow) live->subscribers.push_back(sub);
  return sub;
}

void SessionManager::Unsubscribe(const std::string& session_id, const Subscriber* sub) {
  std::shared_ptr<Live> live;
  {
    MutexLock lock(&mu_);
    auto it = live_.find(session_id);
    if (it == live_.end()) return;
    live = it->second;
  }
  MutexLock lock(&live->mu);
  auto& v = live->subscribers;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& s) { return s.get() == sub; }),
          v.end());
}

namespace {

// A history record as AppendHistory and ReplaceHistory write it:
// {"content":C,"role":"R"} (nlohmann's key order, no spaces), C the content
// as nlohmann writes it. Its content is taken as stored once it is checked to
// be JSON, not parsed and written out again; false for anything else.
bool SplitHistoryRecord(std::string_view v, HistoryEntry* out) {
  constexpr std::string_view kHead = "{\"content\":", kRole = ",\"role\":\"", kTail = "\"}";
  if (!v.starts_with(kHead) || !v.ends_with(kTail)) return false;
  // R holds no quote, so the last `,"role":"` is the record's own.
  const size_t at = v.rfind(kRole);
  if (at == std::string_view::npos || at < kHead.size()) return false;
  const size_t role_at = at + kRole.size();
  if (role_at > v.size() - kTail.size()) return false;
  const std::string_view role = v.substr(role_at, v.size() - kTail.size() - role_at);
  if (role.find_first_of("\"\\") != std::string_view::npos) return false;  // escaped: parse it
  const std::string_view content = v.substr(kHead.size(), at - kHead.size());
  if (!nlohmann::json::accept(content)) return false;
  out->role = std::string(role);
  out->content_json = std::string(content);
  return true;
}

}  // namespace

absl::StatusOr<std::vector<HistoryEntry>> SessionManager::LoadHistory(const std::string& id) {
  ASSIGN_OR_RETURN(auto live, GetLive(id));
  std::vector<HistoryEntry> out;
  // Records that are not history entries are left out of what the model is
  // sent (and left stored as they are); the log says which.
  std::vector<uint64_t> damaged;
  std::string first_why;
  RETURN_IF_ERROR(storage_.Scan(
      Cf::kHistory, SeqKey(id, 0), SeqKeyEnd(id), [&](std::string_view k, std::string_view v) {
        if (HistoryEntry e; SplitHistoryRecord(v, &e)) {
          out.push_back(std::move(e));
          return true;
        }
        try {
          auto j = nlohmann::json::parse(v);
          out.push_back({j.at("role").get<std::string>(), j.at("content").dump()});
        } catch (const nlohmann::json::exception& e) {
          damaged.push_back(k.size() >= 8 ? DecodeU64(k.substr(k.size() - 8)) : 0);
          if (first_why.empty()) first_why = e.what();
        }
        return true;
      }));
  if (!damaged.empty()) {
    spdlog::warn(
        "session {}: {} damaged history record(s) left out of the conversation "
        "(record {}; the first: {})",
        id, damaged.size(), absl::StrJoin(damaged, ", "), first_why);
  }
  return out;
}

absl::Status SessionManager::AppendHistory(const std::string& id, const HistoryEntry& entry) {
  ASSIGN_OR_RETURN(auto live, GetLive(id));
  nlohmann::json j;
  j["role"] = entry.role;
  try {
    j["content"] = nlohmann::json::parse(entry.content_json);
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(absl::StrCat("history content is not JSON: ", e.what()));
  }
  MutexLock lock(&live->mu);
  const uint64_t n = live->history_len + 1;
  RETURN_IF_ERROR(storage_.Put(Cf::kHistory, SeqKey(id, n), j.dump(), /*sync=*/false));
  live->history_len = n;
  return absl::OkStatus();
}

absl::Status SessionManager::ReplaceHistory(const std::string& id,
                                            const std::vector<HistoryEntry>& entries) {
  ASSIGN_OR_RETURN(auto live, GetLive(id));
  MutexLock lock(&live->mu);
  WriteBatch batch;
  batch.DeleteRange(Cf::kHistory, SeqKey(id, 0), SeqKeyEnd(id));
  uint64_t n = 0;
  for (const auto& e : entries) {
    nlohmann::json j;
    j["role"] = e.role;
    j["content"] = nlohmann::json::parse(e.content_json, nullptr, false);
    batch.Put(Cf::kHistory, SeqKey(id, ++n), j.dump());
  }
  RETURN_IF_ERROR(storage_.Write(batch, /*sync=*/false));
  live->history_len = n;
  return absl::OkStatus();
}

void SessionManager::CloseAll(const absl::Status& status) {
  std::vector<std::shared_ptr<Live>> lives;
  {
    MutexLock lock(&mu_);
    for (auto& [id, l] : live_) lives.push_back(l);
  }
  for (auto& live : lives) {
    std::vector<std::shared_ptr<Subscriber>> to_notify;
    {
      MutexLock lock(&live->mu);
      for (auto& sub : live->subscribers) {
        if (sub->Close(status, /*drop_queued=*/false)) to_notify.push_back(sub);
      }
      live->subscribers.clear();
    }
    for (auto& sub : to_notify) sub->Notify();
  }
}

size_t SessionManager::LoadedCount() {
  MutexLock lock(&mu_);
  return live_.size();
}

}  // namespace fwai

namespace fwai {

absl::StatusOr<int> SessionManager::FinishInterruptedTurns(const std::string& why) {
  struct Open {
    std::string session_id, turn_id;
    uint64_t first_seq = 0;
  };
  std::vector<Open> open;
  const std::string begin = kOpenTurnPrefix;
  std::string end = begin;
  end.back() += 1;
  RETURN_IF_ERROR(storage_.Scan(Cf::kMeta, begin, end, [&](std::string_view k, std::string_view v) {
    k.remove_prefix(begin.size());
    size_t nul = k.find('\0');
    if (nul != std::string_view::npos && v.size() == 8) {
      open.push_back({std::string(k.substr(0, nul)), std::string(k.substr(nul + 1)), DecodeU64(v)});
    }
    return true;
  }));
  int finished = 0;
  for (const Open& t : open) {
    auto info = Get(t.session_id);
    if (!info.ok()) {
      // The session is gone (deleted in the same crash window): drop the marker.
      (void)storage_.Delete(Cf::kMeta, OpenTurnKey(t.session_id, t.turn_id), false);
      continue;
    }
    // The usage known so far: what the model calls of this turn reported.
    int64_t in = 0, out = 0, first_us = 0, last_us = 0;
    double cost = 0;
    RETURN_IF_ERROR(storage_.Scan(Cf::kEvents, SeqKey(t.session_id, t.first_seq),
                                  SeqKeyEnd(t.session_id),
                                  [&](std::string_view, std::string_view v) {
                                    fwai::v1::ServerEvent ev;
                                    if (!ev.ParseFromArray(v.data(), static_cast<int>(v.size())))
                                      return true;
                                    if (ev.turn_id() != t.turn_id) return true;
                                    if (first_us == 0) first_us = ev.time_us();
                                    last_us = ev.time_us();
                                    if (ev.has_message_done()) {
                                      in += ev.message_done().usage().input_tokens();
                                      out += ev.message_done().usage().output_tokens();
                                      cost += ev.message_done().usage().cost_usd();
                                    }
                                    return true;
                                  }));
    fwai::v1::ServerEvent ev;
    ev.set_turn_id(t.turn_id);
    auto* f = ev.mutable_turn_finished();
    f->set_stop_reason("interrupted");
    f->set_detail(why);
    f->mutable_usage()->set_input_tokens(in);
    f->mutable_usage()->set_output_tokens(out);
    f->mutable_usage()->set_cost_usd(cost);
    f->set_duration_ms(last_us > first_us ? (last_us - first_us) / 1000 : 0);
    RETURN_IF_ERROR(Publish(t.session_id, std::move(ev)).status());
    info->input_tokens += in;
    info->output_tokens += out;
    info->cost_usd += cost;
    RETURN_IF_ERROR(Update(*info));
    ++finished;
  }
  if (finished > 0) RETURN_IF_ERROR(storage_.SyncWal());
  return finished;
}

}  // namespace fwai
