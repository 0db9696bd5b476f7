// QueuedWriter: writes messages produced on worker threads to a gRPC
// callback server stream, one write in flight, with backpressure.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/cancel.h"
#include "common/mutex.h"
#include "server/api/gate.h"

namespace fwai {

// Writes messages produced on another thread to a server stream: one write
// in flight, Finish once after the queue drains. Once closed, what is pushed
// is dropped: the status comes next.
template <typename Msg>
class QueuedWriter {
 public:
  using Start = std::function<void(const Msg*)>;
  using FinishFn = std::function<void(grpc::Status)>;
  void Bind(Start start, FinishFn finish) {
    start_ = std::move(start);
    finish_ = std::move(finish);
  }
  void Push(Msg m) {
    MutexLock lock(&mu_);
    if (done_ || closing_) return;
    queue_.push_back(std::move(m));
    Pump();
  }
  void Close(grpc::Status s) {
    MutexLock lock(&mu_);
    if (closing_ || done_) return;
    closing_ = true;
    status_ = std::move(s);
    Pump();
  }
  void OnWriteDone(bool ok) {
    MutexLock lock(&mu_);
    writing_ = false;
    space_.SignalAll();
    if (!ok) {
      queue_.clear();
      closing_ = true;
      if (status_.ok()) status_ = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    }
    Pump();
  }
  bool done() {
    MutexLock lock(&mu_);
    return done_ || closing_;
  }
  // Blocks while `limit` or more messages wait (backpressure for producers);
  // false once the stream is closing or `stop` is set.
  bool WaitBelow(size_t limit, const std::atomic<bool>& stop) {
    MutexLock lock(&mu_);
    while (queue_.size() >= limit && !done_ && !closing_ && !stop) {
      space_.WaitWithTimeout(&mu_, std::chrono::milliseconds(100));
    }
    return !done_ && !closing_ && !stop;
  }

 private:
  // Starts the next write, or finishes once closing and drained; calls
  // start_ and finish_ with the lock held.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || done_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      start_(&current_);
      return;
    }
    if (closing_) {
      done_ = true;
      finish_(status_);
    }
  }
  Mutex mu_;
  CondVar space_;
  std::deque<Msg> queue_ ABSL_GUARDED_BY(mu_);
  Msg current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  // Set by Bind before anything is pushed, read-only after.
  Start start_;
  FinishFn finish_;
};

// A server stream fed by work done elsewhere (a worker pool or a thread of
// its own). `start` gets the reactor and the shared state and hands the work
// on, or closes the writer at once; the client's cancel fires the token. The
// state outlives the reactor: nothing is written after Finish.
template <typename Msg>
class WorkStreamReactor final : public grpc::ServerWriteReactor<Msg> {
 public:
  struct State {
    QueuedWriter<Msg> writer;
    CancelToken cancel;
    // The gate's status when the token went (TrackAndCancel), else
    // `otherwise`: what the work ends the stream with.
    grpc::Status Final(const grpc::Status& otherwise) {
      MutexLock lock(&mu);
      return revoked ? *revoked : otherwise;
    }
    Mutex mu;
    std::optional<grpc::Status> revoked ABSL_GUARDED_BY(mu);
  };
  using StartFn = std::function<void(WorkStreamReactor&, const std::shared_ptr<State>&)>;
  explicit WorkStreamReactor(const StartFn& start) : state_(std::make_shared<State>()) {
    state_->writer.Bind([this](const Msg* m) { this->StartWrite(m); },
                        [this](grpc::Status s) { this->Finish(std::move(s)); });
    start(*this, state_);
  }
  // The stream of a service whose backend may be missing: closes with
  // UNAVAILABLE `why` at once when `available` is false, else runs `start`.
  static WorkStreamReactor* Serve(bool available, const std::string& why, const StartFn& start) {
    return new WorkStreamReactor([&](WorkStreamReactor& r, const std::shared_ptr<State>& st) {
      if (!available) {
        st->writer.Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, why));
        return;
      }
      start(r, st);
    });
  }
  // While the stream is open, `who`'s token is watched (Gate::Track): once
  // it is revoked or expires the stream ends with the gate's status
  // (UNAUTHENTICATED saying why) and the work is cancelled as a client's
  // cancel cancels it. Call once, from `start`, when `who` is admitted.
  void Track(Gate& gate, const Principal& who, grpc::CallbackServerContext* ctx) {
    ticket_ = gate.Track(who, ctx, [st = state_](const grpc::Status& why) {
      st->writer.Close(why);
      st->cancel.Cancel();
    });
  }
  // As Track, but the stream stays open until the work, cancelled, has
  // undone what it holds (a lease released): it then ends the stream with
  // State::Final, the gate's status.
  void TrackAndCancel(Gate& gate, const Principal& who, grpc::CallbackServerContext* ctx) {
    ticket_ = gate.Track(who, ctx, [st = state_](const grpc::Status& why) {
      {
        MutexLock lock(&st->mu);
        st->revoked = why;
      }
      st->cancel.Cancel();
    });
  }
  void OnWriteDone(bool ok) override { state_->writer.OnWriteDone(ok); }
  void OnCancel() override { state_->cancel.Cancel(); }
  void OnDone() override {
    ticket_.reset();  // first: the gate no longer ends a stream that is gone
    delete this;
  }

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<Gate::Ticket> ticket_;
};

}  // namespace fwai
