// A live reader of a session's events with a bounded queue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/config.h"
#include "common/mutex.h"

namespace fwai {

class Storage;

// A FIFO of serialized events that holds no memory while empty (a
// std::deque allocates about 600 bytes as it is made, and a subscriber that
// follows an idle session is empty nearly all the time): a vector read from
// `head_`, its storage given back once it drains (and what was taken
// dropped once it is half of it).
class EventQueue {
 public:
  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  std::string& front() { return items_[head_]; }
  std::string& back() { return items_.back(); }
  void push_back(std::string e) { items_.push_back(std::move(e)); }
  void pop_front() {
    if (++head_ == items_.size()) {
      clear();
    } else if (head_ >= 64 && head_ * 2 >= items_.size()) {
      // Never drained (a client always a little behind): drop what was taken.
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void clear() {
    std::vector<std::string>().swap(items_);
    head_ = 0;
  }

 private:
  std::vector<std::string> items_;
  size_t head_ = 0;  // items_[0, head_) are taken
};

class Subscriber {
 public:
  enum class PullResult { kEvent, kEmpty, kClosed };

  Subscriber(std::string session_id, Storage* storage, uint64_t replay_from, uint64_t replay_to,
             bool follow, SubscriberConfig limits, std::function<void()> notify);
  Subscriber(const Subscriber&) = delete;
  Subscriber& operator=(const Subscriber&) = delete;

  // Next serialized ServerEvent. kEmpty means "nothing now": notify() will be
  // called when something arrives. kClosed gives the final status in `status`.
  // With kEvent, `*more` (when given) says whether another event is already
  // waiting, so the next Pull returns kEvent or kClosed without waiting; false
  // when it may have to wait (or read the store) for one.
  PullResult Pull(std::string* event, absl::Status* status, bool* more = nullptr);

  // Called by the session manager with the session lock held; never blocks.
  // Returns true if the caller must invoke notify() after releasing its lock.
  bool Push(uint64_t seq, const std::string& serialized);
  // Closes the subscriber; Pull returns kClosed with `status` once the queue
  // drains (or at once when `drop_queued`). Returns true if notify() is due.
  bool Close(const absl::Status& status, bool drop_queued);
  void Notify() {
    if (notify_) notify_();
  }

  const std::string& session_id() const { return session_id_; }
  // Events coalesced into others and queue length, for tests and measures.
  uint64_t coalesced() const;
  size_t queued() const;

 private:
  const std::string session_id_;
  Storage* const storage_;
  const bool follow_;
  const SubscriberConfig limits_;
  const std::function<void()> notify_;

  mutable Mutex mu_;
  uint64_t replay_next_ ABSL_GUARDED_BY(mu_);
  const uint64_t replay_to_;
  EventQueue replay_buf_ ABSL_GUARDED_BY(mu_);
  EventQueue queue_ ABSL_GUARDED_BY(mu_);
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  uint64_t coalesced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fwai
