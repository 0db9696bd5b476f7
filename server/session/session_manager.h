// session: owns sessions, their per-session event log (seq numbers), their
// conversation history, and the live subscribers of each session.
//
// Events are stored as serialized fwai.v1.ServerEvent: the proto is the storage
// format on purpose, so a replay is byte-for-byte what live subscribers saw.
//
// Thread-safe. Publishing never blocks on a subscriber: each subscriber has a
// bounded queue; past its high-water mark adjacent text deltas are coalesced,
// past its maximum it is closed with RESOURCE_EXHAUSTED and may re-attach.
//
// Appends are group-committed: Publish assigns the seq and queues the event;
// one appender thread writes everything queued (across sessions) as one
// RocksDB batch, then hands each event to the session's subscribers. An event
// reaches a subscriber only after the write that stores it has returned.
// Under load (events arriving within limits.batch_window_us of the last
// write) the appender waits up to that window, or until 256 events are queued,
// before it writes: many sessions' events share one write and one wake-up of
// each thread involved. A publisher that waits for its event, and Drain, end
// the wait at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config.h"
#include "common/mutex.h"
#include "server/session/subscriber.h"

namespace fwai::v1 {
class ServerEvent;
}  // namespace fwai::v1

namespace fwai {

class Storage;

struct SessionInfo {
  std::string id;
  std::string title;
  std::string owner;
  std::string project_root;  // "" : the session has no project (no file tools, no commands)
  std::string account;       // the local account its file tools and commands act as
  int64_t created_us = 0;
  int64_t updated_us = 0;
  std::string provider;
  std::string model;
  std::string mode = "act";  // act | plan
  bool auto_approve_plan = false;
  bool ask_before_edits = false;  // write_file / edit_file wait for the user's accept
  std::string todos_json = "[]";  // the session's todo list
  double temperature = -1;        // < 0: the provider's
  int max_tokens = 0;             // 0: the provider's
  int64_t input_tokens = 0;       // totals over all turns
  int64_t output_tokens = 0;
  double cost_usd = 0;
  uint64_t last_seq = 0;
};

struct NewSession {
  std::string title;
  std::string project_root;  // must be an existing directory; canonicalized
  std::string provider;
  std::string model;
  std::string mode = "act";
  bool auto_approve_plan = false;
  double temperature = -1;
  int max_tokens = 0;
  bool without_project = false;  // then project_root is ignored and left empty
  std::string account = {};      // the local account the session acts as ("" : none)
  bool ask_before_edits = false;
};

// One message of the conversation: role + Anthropic-style content blocks (JSON array).
struct HistoryEntry {
  std::string role;
  std::string content_json;
};

class SessionManager {
 public:
  SessionManager(Storage& storage, SubscriberConfig limits);
  ~SessionManager();
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  [[nodiscard]] absl::StatusOr<SessionInfo> Create(const std::string& owner, NewSession params);
  // NOT_FOUND names the id.
  [[nodiscard]] absl::StatusOr<SessionInfo> Get(const std::string& id);
  // Sessions of `owner` (all owners when owner is empty), newest first.
  [[nodiscard]] absl::StatusOr<std::vector<SessionInfo>> List(const std::string& owner);
  // How many sessions belong to owners for which `owns` is true. Counted
  // from storage on first use, then kept with each create and delete, so a
  // limit check costs the number of owners, not of sessions.
  [[nodiscard]] absl::StatusOr<int64_t> CountOwned(
      const std::function<bool(const std::string& owner)>& owns);
  // Removes the session, its events and history; closes its subscribers.
  [[nodiscard]] absl::Status Delete(const std::string& id);
  [[nodiscard]] absl::Status Update(const SessionInfo& info);

  // Assigns seq and time, stores, and fans out. `event` is a serialized-able
  // fwai.v1.ServerEvent passed as bytes to keep proto types out of this header.
  // Returns the assigned seq once the event is stored (and handed to the
  // subscribers).
  [[nodiscard]] absl::StatusOr<uint64_t> Publish(const std::string& session_id,
                                                 std::string serialized_event);
  // The same without waiting for the write: returns the assigned seq once the
  // event is queued. It is stored with (or before) the next Publish of any
  // session and reaches subscribers only once stored; a failed write is
  // logged. For the stream of text deltas, where the caller has nothing to do
  // with an error.
  [[nodiscard]] absl::StatusOr<uint64_t> PublishQueued(const std::string& session_id,
                                                       std::string serialized_event);
  // The same for an event already built (fwai.v1.ServerEvent): it is
  // completed in place (session, seq, time) and serialized once, here.
  [[nodiscard]] absl::StatusOr<uint64_t> Publish(const std::string& session_id,
                                                 v1::ServerEvent&& event);
  [[nodiscard]] absl::StatusOr<uint64_t> PublishQueued(const std::string& session_id,
                                                       v1::ServerEvent&& event);

  // A subscriber that first replays stored events with seq > after_seq (when
  // `replay`), then, when `follow`, receives live events. `notify` is called
  // (from a publishing thread, with no lock of ours held) when events become
  // available after Pull returned kEmpty.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Subscriber>> Subscribe(const std::string& session_id,
                                                                      uint64_t after_seq,
                                                                      bool replay, bool follow,
                                                                      std::function<void()> notify);
  void Unsubscribe(const std::string& session_id, const Subscriber* sub);

  // History.
  [[nodiscard]] absl::StatusOr<std::vector<HistoryEntry>> LoadHistory(const std::string& id);
  [[nodiscard]] absl::Status AppendHistory(const std::string& id, const HistoryEntry& entry);
  // Replaces the whole history (used by compaction).
  [[nodiscard]] absl::Status ReplaceHistory(const std::string& id,
                                            const std::vector<HistoryEntry>& entries);

  // Ends every turn a previous process left open (it stopped between a turn's
  // user message and its turn_finished): each gets turn_finished with
  // stop_reason "interrupted", `why` as its detail and the usage its model
  // calls reported. Call before clients can attach. Returns how many.
  [[nodiscard]] absl::StatusOr<int> FinishInterruptedTurns(const std::string& why);

  // Closes every subscriber with `status` (daemon shutdown).
  void CloseAll(const absl::Status& status);
  // Number of sessions with in-memory state (for measurements).
  size_t LoadedCount();
  // Writes of the event log so far and the events they stored (for
  // measurements and tests).
  struct AppendCounts {
    uint64_t batches = 0;
    uint64_t events = 0;
  };
  AppendCounts Appended();

 private:
  struct Live {
    Mutex mu;
    bool loaded ABSL_GUARDED_BY(mu) = false;
    uint64_t last_seq ABSL_GUARDED_BY(mu) = 0;    // the last seq assigned
    uint64_t stored_seq ABSL_GUARDED_BY(mu) = 0;  // the last seq written (<= last_seq)
    uint64_t history_len ABSL_GUARDED_BY(mu) = 0;
    bool deleted ABSL_GUARDED_BY(mu) = false;
    std::vector<std::shared_ptr<Subscriber>> subscribers ABSL_GUARDED_BY(mu);
  };
  // Returns the in-memory state of an existing session, loading it on first use.
  absl::StatusOr<std::shared_ptr<Live>> GetLive(const std::string& id);

  // An event waiting for the appender. Its fields are read and written
  // under append_mu_.
  struct Done {
    bool done = false;
    absl::Status status;
  };
  struct Pending {
    std::shared_ptr<Live> live;
    std::string session_id;
    uint64_t seq = 0;
    std::string bytes;
    int open_turn = 0;  // +1: the event opens turn `turn_id`; -1: it finishes it
    std::string turn_id;
    std::shared_ptr<Done> done;  // null: nobody waits
  };
  absl::StatusOr<uint64_t> Enqueue(const std::string& session_id, v1::ServerEvent& ev, bool wait);
  void AppendLoop();
  // Waits for queued events and moves them into `batch`, first waiting out
  // the batch window when the last write was less than a window ago. Returns
  // false when stopping with nothing left to write.
  bool TakeBatch(std::vector<Pending>& batch, std::chrono::steady_clock::time_point last_write);
  // Blocks until everything queued so far is written and fanned out.
  void Drain();

  Storage& storage_;
  const SubscriberConfig limits_;
  // Sessions per owner once counted; creates and deletes write under the
  // lock, so a count from storage never misses or doubles one under way.
  Mutex count_mu_;
  bool counted_ ABSL_GUARDED_BY(count_mu_) = false;
  std::map<std::string, int64_t> owned_ ABSL_GUARDED_BY(count_mu_);
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Live>> live_ ABSL_GUARDED_BY(mu_);

  Mutex append_mu_;
  CondVar append_cv_;   // work queued, or stop
  CondVar written_cv_;  // a batch was written
  std::vector<Pending> queue_ ABSL_GUARDED_BY(append_mu_);
  uint64_t queued_ ABSL_GUARDED_BY(append_mu_) = 0;   // events queued so far
  uint64_t written_ ABSL_GUARDED_BY(append_mu_) = 0;  // events written and fanned out
  uint64_t batches_ ABSL_GUARDED_BY(append_mu_) = 0;  // writes of them
  // Queued events whose publisher waits, plus callers of Drain: while there
  // are any, the appender does not wait out its batch window.
  int waiters_ ABSL_GUARDED_BY(append_mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(append_mu_) = false;
  std::thread appender_;
};

// JSON encoding of SessionInfo as stored.
std::string SessionToJson(const SessionInfo& s);
absl::StatusOr<SessionInfo> SessionFromJson(const std::string& json);

}  // namespace fwai
