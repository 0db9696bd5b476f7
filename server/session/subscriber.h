// A live reader of a session's events with a bounded queue.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/config.h"
#include "common/mutex.h"

namespace fwai {

class Storage;

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
  std::deque<std::string> replay_buf_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  uint64_t coalesced_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fwai
