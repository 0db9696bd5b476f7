#include "tests/bench/chat_clients.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <mutex>

#include "common/clock.h"
#include "tests/bench/bench_util.h"

namespace fwai::testing {
namespace {

namespace pb = fwai::v1;

// Counts `ev`, received at `now`, into `st`; true at the turn's end.
bool Record(StreamStats* st, const pb::ServerEvent& ev, int64_t now, bool measure_latency,
            int warmup) {
  ++st->events;
  if (ev.has_text_delta()) {
    if (st->first_ns == 0) st->first_ns = now;
    st->last_ns = now;
    ++st->deltas;
    for (int64_t sent : ChunkStamps(ev.text_delta().text())) {
      ++st->chunks;
      if (st->first_sent_ns == 0) st->first_sent_ns = sent;
      st->last_sent_ns = sent;
      if (!measure_latency) continue;
      const double ms = (now - sent) / 1e6;
      st->latency_ms.push_back(ms);
      if (st->chunks > static_cast<uint64_t>(warmup)) {
        st->steady_latency_ms.push_back(ms);
      } else {
        st->first_latency_ms.push_back(ms);
        st->first_by_index_ms.push_back(ms);
      }
    }
  }
  if (ev.has_turn_finished()) st->finished = true;
  st->seconds = (st->last_ns - st->first_ns) / 1e9;
  return st->finished;
}

// One turn on the callback API. Writes, one at a time: the open, the
// message (at once, or when `Send` is called), and the half-close once the
// turn has finished; reads until fwaid ends the stream.
class ChatClient final : public grpc::ClientBidiReactor<pb::ClientEvent, pb::ServerEvent> {
 public:
  ChatClient(const ChatSpec& spec, bool measure_latency, int warmup, std::latch* opened,
             std::latch* done)
      : measure_(measure_latency), warmup_(warmup), opened_(opened), done_(done) {
    open_.mutable_open()->set_session_id(spec.session_id);
    message_.mutable_message()->set_text(spec.text);
  }

  void Begin(pb::Sessions::Stub& stub) {
    stub.async()->Chat(&ctx_, this);
    StartWrite(&open_);
    StartRead(&ev_);
    StartCall();
  }

  // Sends the message held back until every stream was open.
  void Send() {
    sent_ns_ = MonotonicNanos();
    StartWrite(&message_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++writes_done_;
    if (!ok) {  // the stream broke: OnDone follows
      if (writes_done_ == 1 && opened_ != nullptr) opened_->count_down();
      return;
    }
    if (writes_done_ == 1) {
      if (opened_ != nullptr) {
        lock.unlock();
        opened_->count_down();
        return;
      }
      sent_ns_ = MonotonicNanos();
      StartWrite(&message_);
    } else if (writes_done_ == 2 && stats_.finished) {
      StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // fwaid ended the stream: OnDone follows
    std::unique_lock<std::mutex> lock(mu_);
    if (!stats_.finished && Record(&stats_, ev_, MonotonicNanos(), measure_, warmup_) &&
        writes_done_ == 2) {
      StartWritesDone();
    }
    lock.unlock();
    StartRead(&ev_);
  }

  void OnDone(const grpc::Status&) override { done_->count_down(); }

  StreamStats stats() const { return stats_; }  // after the stream has ended
  int64_t sent_ns() const { return sent_ns_; }

 private:
  const bool measure_;
  const int warmup_;
  std::latch* const opened_;  // counted down once the open is written (message held)
  std::latch* const done_;
  grpc::ClientContext ctx_;
  pb::ClientEvent open_, message_;
  pb::ServerEvent ev_;
  std::mutex mu_;
  int writes_done_ = 0;  // 1: the open, 2: the message
  StreamStats stats_;
  int64_t sent_ns_ = 0;
};

}  // namespace

StreamStats Stream(pb::Sessions::Stub& stub, const std::string& session_id, bool measure_latency,
                   int warmup, const std::string& text, int64_t* sent_ns) {
  StreamStats st;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  auto stream = stub.Chat(&ctx);
  pb::ClientEvent open;
  open.mutable_open()->set_session_id(session_id);
  stream->Write(open);
  pb::ClientEvent msg;
  msg.mutable_message()->set_text(text);
  if (sent_ns) *sent_ns = MonotonicNanos();
  stream->Write(msg);
  pb::ServerEvent ev;
  while (stream->Read(&ev)) {
    if (Record(&st, ev, MonotonicNanos(), measure_latency, warmup)) break;
  }
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  if (!status.ok() && !st.finished)
    std::fprintf(stderr, "turn on %s: %s\n", session_id.c_str(), status.error_message().c_str());
  return st;
}

std::vector<StreamStats> RunChats(pb::Sessions::Stub& stub, const std::vector<ChatSpec>& specs,
                                  bool measure_latency, int warmup,
                                  const std::function<void()>& once_all_open,
                                  std::vector<int64_t>* sent_ns) {
  const auto n = static_cast<std::ptrdiff_t>(specs.size());
  std::latch opened(n), done(n);
  std::vector<std::unique_ptr<ChatClient>> clients;
  for (const ChatSpec& spec : specs) {
    clients.push_back(std::make_unique<ChatClient>(spec, measure_latency, warmup,
                                                   once_all_open ? &opened : nullptr, &done));
  }
  for (auto& c : clients) c->Begin(stub);
  if (once_all_open) {
    opened.wait();
    once_all_open();
    for (auto& c : clients) c->Send();
  }
  done.wait();
  std::vector<StreamStats> out;
  for (size_t i = 0; i < clients.size(); ++i) {
    out.push_back(clients[i]->stats());
    if (sent_ns) (*sent_ns)[i] = clients[i]->sent_ns();
  }
  return out;
}

}  // namespace fwai::testing
