#include "server/session/subscriber.h"

#include "absl/strings/str_cat.h"
#include "fwai/v1/events.pb.h"
#include "server/storage/storage.h"

namespace fwai {
namespace {

constexpr int kReplayBatch = 256;

bool SameOrigin(const fwai::v1::AgentRef& a, const fwai::v1::AgentRef& b) {
  return a.agent() == b.agent() && a.parent_call_id() == b.parent_call_id();
}

// Merges `next` into `*back` if both are text deltas of the same stream.
bool TryCoalesce(std::string* back, const std::string& next) {
  fwai::v1::ServerEvent a, b;
  if (!a.ParseFromString(*back) || !b.ParseFromString(next)) return false;
  if (a.payload_case() != fwai::v1::ServerEvent::kTextDelta ||
      b.payload_case() != fwai::v1::ServerEvent::kTextDelta) {
    return false;
  }
  if (a.turn_id() != b.turn_id() || a.text_delta().thinking() != b.text_delta().thinking() ||
      !SameOrigin(a.text_delta().origin(), b.text_delta().origin())) {
    return false;
  }
  a.mutable_text_delta()->mutable_text()->append(b.text_delta().text());
  a.set_seq(b.seq());
  a.set_time_us(b.time_us());
  *back = a.SerializeAsString();
  return true;
}

}  // namespace

Subscriber::Subscriber(std::string session_id, Storage* storage, uint64_t replay_from,
                       uint64_t replay_to, bool follow, SubscriberConfig limits,
                       std::function<void()> notify)
    : session_id_(std::move(session_id)),
      storage_(storage),
      follow_(follow),
      limits_(limits),
      notify_(std::move(notify)),
      replay_next_(replay_from),
      replay_to_(replay_to) {}

Subscriber::PullResult Subscriber::Pull(std::string* event, absl::Status* status, bool* more) {
  MutexLock lock(&mu_);
  if (more) *more = false;
  if (closed_ && queue_.empty() && replay_buf_.empty() &&
      (!close_status_.ok() || replay_next_ > replay_to_)) {
    *status = close_status_;
    return PullResult::kClosed;
  }
  if (replay_buf_.empty() && replay_next_ <= replay_to_ && !(closed_ && !close_status_.ok())) {
    // Load the next batch of stored events. Short point-range reads only.
    const uint64_t from = replay_next_;
    const uint64_t to = std::min<uint64_t>(replay_to_, from + kReplayBatch - 1);
    lock.Unlock();
    std::vector<std::string> batch;
    // Stored events go to clients as they are stored: one that is not an
    // event ends the stream here, naming it, rather than reaching a client.
    v1::ServerEvent check;
    absl::Status damaged;
    absl::Status s = storage_->Scan(
        Cf::kEvents, SeqKey(session_id_, from), SeqKey(session_id_, to + 1),
        [&](std::string_view key, std::string_view v) {
          if (!check.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
            const uint64_t seq = key.size() >= 8 ? DecodeU64(key.substr(key.size() - 8)) : 0;
            damaged = absl::DataLossError(
                absl::StrCat("session ", session_id_, ": stored event ", seq, " is damaged"));
            return false;
          }
          batch.emplace_back(v);
          return true;
        });
    lock.Lock();
    if (!s.ok()) {
      closed_ = true;
      close_status_ = s;
      *status = s;
      return PullResult::kClosed;
    }
    replay_next_ = to + 1;
    for (auto& e : batch) replay_buf_.push_back(std::move(e));
    if (!damaged.ok()) {
      // The events before it go out; nothing after it does (not even live ones).
      closed_ = true;
      close_status_ = damaged;
      queue_.clear();
    }
  }
  if (!replay_buf_.empty()) {
    *event = std::move(replay_buf_.front());
    replay_buf_.pop_front();
    if (more) *more = !replay_buf_.empty();
    return PullResult::kEvent;
  }
  if (!queue_.empty()) {
    *event = std::move(queue_.front());
    queue_.pop_front();
    if (more) *more = !queue_.empty();
    return PullResult::kEvent;
  }
  if (closed_ || !follow_) {
    if (!closed_) {
      closed_ = true;
      close_status_ = absl::OkStatus();
    }
    *status = close_status_;
    return PullResult::kClosed;
  }
  waiting_ = true;
  return PullResult::kEmpty;
}

bool Subscriber::Push(uint64_t seq, const std::string& serialized) {
  MutexLock lock(&mu_);
  if (closed_ || !follow_ || seq <= replay_to_) return false;
  if (static_cast<int>(queue_.size()) >= limits_.high_water && !queue_.empty() &&
      TryCoalesce(&queue_.back(), serialized)) {
    ++coalesced_;
  } else {
    queue_.push_back(serialized);
  }
  if (static_cast<int>(queue_.size()) > limits_.max_queue) {
    queue_.clear();
    replay_buf_.clear();
    closed_ = true;
    close_status_ = absl::ResourceExhaustedError(
        absl::StrCat("session ", session_id_, ": this client fell more than ", limits_.max_queue,
                     " events behind and was dropped; re-attach after the last seq you received"));
  }
  if (waiting_) {
    waiting_ = false;
    return true;
  }
  return false;
}

bool Subscriber::Close(const absl::Status& status, bool drop_queued) {
  MutexLock lock(&mu_);
  if (closed_) return false;
  closed_ = true;
  close_status_ = status;
  if (drop_queued) {
    queue_.clear();
    replay_buf_.clear();
  }
  if (waiting_) {
    waiting_ = false;
    return true;
  }
  return false;
}

uint64_t Subscriber::coalesced() const {
  MutexLock lock(&mu_);
  return coalesced_;
}

size_t Subscriber::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace fwai
