// EventPump: moves a session's events from a Subscriber to one gRPC server
// stream (Sessions.Chat and Sessions.Attach).
#pragma once

#include <grpcpp/impl/call_op_set.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <grpcpp/support/status.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "fwai/v1/events.pb.h"
#include "server/api/api.h"
#include "server/session/session_manager.h"
#include "server/session/subscriber.h"

namespace fwai {

// Moves events from a Subscriber to a gRPC stream: one write in flight, the
// message untouched until OnWriteDone, Finish exactly once. `R` is a server
// reactor with StartSendInitialMetadata(), StartWrite(const grpc::ByteBuffer*,
// grpc::WriteOptions) and Finish(grpc::Status); the reactor calls OnWriteDone
// from its own OnWriteDone and Detach from OnDone. A stored event is written
// as the bytes it was stored as (a serialized fwai.v1.ServerEvent): it is not
// parsed and serialized again for each client.
//
// A write made while another event already waits carries gRPC's buffer hint:
// it is held in the stream's buffer, and goes out with the later ones in one
// send when a write without the hint (the last of those waiting) or Finish
// comes. So a client that fell behind gets what waits for it in a few large
// sends, not a send (and a wake-up at each end) per event. The hint is given
// only when the next write is certain to follow at once: an event already in
// memory, never one still to be read or to arrive. Nor to a write that
// carries the stream's headers (its first, unless SendHeaders came before):
// gRPC holds headers back with a hinted message, and the write would not
// complete until some later write went out.
//
// Every call on the reactor that sends (headers, writes, Finish) is made
// under the pump's lock: gRPC's reactor keeps whether the headers went in a
// plain flag, and asserts on it.
template <typename R>
class EventPump {
 public:
  // Shared with the subscriber's notify callback so a late notify after the
  // reactor is gone does nothing.
  struct Link {
    Mutex mu;
    EventPump* pump ABSL_GUARDED_BY(mu) = nullptr;
  };

  explicit EventPump(R* reactor) : reactor_(reactor), link_(std::make_shared<Link>()) {
    link_->pump = this;
  }

  std::function<void()> NotifyFn() {
    std::weak_ptr<Link> weak = link_;
    return [weak] {
      if (auto link = weak.lock()) {
        MutexLock lock(&link->mu);
        if (link->pump) link->pump->TryWrite();
      }
    };
  }

  void SetSubscriber(std::shared_ptr<Subscriber> sub) {
    {
      MutexLock lock(&mu_);
      sub_ = std::move(sub);
    }
    TryWrite();
  }

  // An event for this stream alone, not in the session's log (seq 0): what
  // became of something this client sent, e.g. a plan another client had
  // decided first. Written before the session's next event.
  void Inject(fwai::v1::ServerEvent ev) {
    {
      MutexLock lock(&mu_);
      injected_.push_back(std::move(ev));
    }
    TryWrite();
  }

  void TryWrite() {
    MutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (!injected_.empty()) {
      SetOutLocked(injected_.front().SerializeAsString());
      injected_.pop_front();
      StartWriteLocked(!injected_.empty());
      return;
    }
    if (!sub_) return;
    std::string bytes;
    absl::Status status;
    bool more = false;
    switch (sub_->Pull(&bytes, &status, &more)) {
      case Subscriber::PullResult::kEvent:
        SetOutLocked(bytes);
        StartWriteLocked(more);
        return;
      case Subscriber::PullResult::kEmpty:
        return;
      case Subscriber::PullResult::kClosed:
        FinishLocked(ToGrpcStatus(status));
        return;
    }
  }

  void OnWriteDone(bool ok) {
    {
      MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The client is gone; the stream ends (the turn goes on).
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
        return;
      }
      if (pending_finish_) {
        auto s = *pending_finish_;
        pending_finish_.reset();
        FinishLocked(s);
        return;
      }
    }
    TryWrite();
  }

  void Finish(const grpc::Status& s) {
    MutexLock lock(&mu_);
    FinishLocked(s);
  }

  // The stream's headers now, before any event (the client hears that its
  // stream was accepted); nothing if they went already or the stream ended.
  void SendHeaders() {
    MutexLock lock(&mu_);
    if (finished_ || pending_finish_ || headers_sent_) return;
    headers_sent_ = true;
    reactor_->StartSendInitialMetadata();
  }

  // Called from the reactor's OnDone; after it no callback touches the reactor.
  void Detach(SessionManager* sessions) {
    {
      MutexLock lock(&link_->mu);
      link_->pump = nullptr;
    }
    std::shared_ptr<Subscriber> sub;
    {
      MutexLock lock(&mu_);
      sub = std::move(sub_);
    }
    if (sub) sessions->Unsubscribe(sub->session_id(), sub.get());
  }

 private:
  void SetOutLocked(const std::string& bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    grpc::Slice slice(bytes);
    out_ = grpc::ByteBuffer(&slice, 1);
  }

  // `more`: another event is in memory and will be written right after this
  // one (see the class comment).
  void StartWriteLocked(bool more) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    grpc::WriteOptions options;
    if (more && headers_sent_) options.set_buffer_hint();
    headers_sent_ = true;
    reactor_->StartWrite(&out_, options);
  }

  void FinishLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (writing_) {
      if (!pending_finish_) pending_finish_ = s;
      return;
    }
    finished_ = true;
    reactor_->Finish(s);
  }

  R* const reactor_;
  std::shared_ptr<Link> link_;
  Mutex mu_;
  std::shared_ptr<Subscriber> sub_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool headers_sent_ ABSL_GUARDED_BY(mu_) = false;  // by SendHeaders or with a write
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
  std::deque<fwai::v1::ServerEvent> injected_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);  // the event being written
};

}  // namespace fwai
