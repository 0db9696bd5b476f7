// The serial stream of a board (Hardware.Serial, LabNode.Serial): lines from
// the broker's reader to the client, writes from the client to the board.
// On a front, a board of another node is served by relaying the same stream
// to and from the bench that owns it. Internal to server/api.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "fwai/v1/hardware.pb.h"
#include "fwai/v1/lab.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/queued_writer.h"
#include "server/hardware/broker.h"

namespace fwai {

// Where a front relays a serial stream: the owning bench, and the open
// message to send it (board and lab lease).
struct SerialRelay {
  std::shared_ptr<grpc::Channel> channel;
  fwai::v1::SerialOpen open;
};

struct SerialHooks {
  // Who the opener is, with the lease it writes under; the status ends the stream.
  std::function<absl::StatusOr<Caller>(const fwai::v1::SerialOpen&)> admit;
  // Set on a front: the relay for a board of another node (nullopt: local).
  std::function<absl::StatusOr<std::optional<SerialRelay>>(const Caller&,
                                                           const fwai::v1::SerialOpen&)>
      relay;
  // Set where a token may open the stream: called once the opener is
  // admitted, it watches the opener's token for the stream's life
  // (Gate::Track); `end` ends the stream when the token stops being valid.
  std::function<std::unique_ptr<Gate::Ticket>(std::function<void(const grpc::Status&)> end)> track;
};

class SerialReactor final
    : public grpc::ServerBidiReactor<fwai::v1::SerialClientMessage, fwai::v1::SerialServerMessage> {
 public:
  SerialReactor(HardwareBroker* hardware, SerialHooks hooks)
      : hardware_(hardware), hooks_(std::move(hooks)) {
    writer_.Bind([this](const fwai::v1::SerialServerMessage* m) { StartWrite(m); },
                 [this](grpc::Status s) { Finish(std::move(s)); });
    if (!hardware_) {
      writer_.Close(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "the hardware broker is not running"));
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed or went away: stop reading; keep writing
      // until it cancels (a reader may half-close right away).
      return;
    }
    if (in_.has_open()) {
      if (opened_) {
        Error("the stream is already open");
      } else {
        Open(in_.open());
      }
    } else if (!opened_) {
      Error("send open first");
    } else if (remote_) {
      // Relayed as it came; the bench answers a refused write on the stream.
      std::lock_guard lock(remote_mu_);
      if (!remote_->Write(in_)) Error("the bench's serial stream has ended");
    } else if (in_.kind_case() == fwai::v1::SerialClientMessage::kWrite) {
      if (auto s = hardware_->SerialWrite(caller_, board_, in_.write()); !s.ok())
        Error(std::string(s.message()));
    } else if (in_.kind_case() == fwai::v1::SerialClientMessage::kSendLine) {
      if (auto s = hardware_->SerialSendLine(caller_, board_, in_.send_line()); !s.ok()) {
        Error(std::string(s.message()));
      }
    }
    if (!writer_.done()) StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { writer_.OnWriteDone(ok); }
  void OnCancel() override {
    stop_ = true;
    CancelRemote();
  }
  void OnDone() override {
    ticket_.reset();  // first: the gate no longer ends a stream that is gone
    stop_ = true;
    CancelRemote();
    if (pump_.joinable()) {
      if (pump_.get_id() == std::this_thread::get_id()) {
        pump_.detach();
      } else {
        pump_.join();
      }
    }
    if (reader_) hardware_->CloseSerial(board_, reader_);
    delete this;
  }

 private:
  // OnCancel may run on another thread while OpenRelay makes the context:
  // it is published under ctx_mu_, and a relay opened after the cancel is
  // cancelled at once.
  void CancelRemote() {
    std::lock_guard lock(ctx_mu_);
    if (remote_ctx_) remote_ctx_->TryCancel();
  }

  void Error(const std::string& msg) {
    fwai::v1::SerialServerMessage m;
    m.set_error(msg);
    writer_.Push(std::move(m));
  }

  void Open(const fwai::v1::SerialOpen& o) {
    auto admitted = hooks_.admit(o);
    if (!admitted.ok()) {
      writer_.Close(ToGrpcStatus(admitted.status()));
      return;
    }
    caller_ = *admitted;
    if (hooks_.track) {
      // A revoked or expired token: the stream ends with the gate's status,
      // and the pump (or the relay to the bench) stops as on a cancel.
      ticket_ = hooks_.track([this](const grpc::Status& why) {
        writer_.Close(why);
        stop_ = true;
        CancelRemote();
      });
    }
    if (hooks_.relay) {
      auto relay = hooks_.relay(caller_, o);
      if (!relay.ok()) {
        writer_.Close(ToGrpcStatus(relay.status()));
        return;
      }
      if (relay->has_value()) {
        OpenRelay(**relay);
        return;
      }
    }
    auto board = hardware_->ResolveBoard(o.device_id(), caller_);
    if (!board.ok()) {
      writer_.Close(ToGrpcStatus(board.status()));
      return;
    }
    board_ = *board;
    auto r = hardware_->OpenSerial(caller_, board_, o.from_history());
    if (!r.ok()) {
      writer_.Close(ToGrpcStatus(r.status()));
      return;
    }
    reader_ = *r;
    opened_ = true;
    fwai::v1::SerialServerMessage hello;
    hello.set_opened(board_);
    writer_.Push(std::move(hello));
    pump_ = std::thread([this] {
      // Backpressure: lines wait in the reader's bounded queue (oldest
      // dropped past its limit) while this client is slow; whatever has
      // piled up goes out as one batch.
      uint64_t reported_drops = 0;
      while (writer_.WaitBelow(2, stop_)) {
        SerialLine l;
        auto n = reader_->Wait(l, 200);
        if (n == SerialReader::Next::kTimeout) continue;
        fwai::v1::SerialServerMessage m;
        if (n == SerialReader::Next::kEnded) {
          m.set_end_of_stream(true);
          m.set_reason(reader_->end_reason());
          m.set_daemon_stopping(hardware_->stopping());
          writer_.Push(std::move(m));
          writer_.Close(grpc::Status::OK);
          return;
        }
        auto add = [&m](SerialLine& x) {
          auto* o = m.add_lines();
          o->set_time_us(x.time_us);
          o->set_line(std::move(x.text));
          o->set_seq(x.seq);
        };
        add(l);
        while (m.lines_size() < 512 && reader_->Wait(l, 0) == SerialReader::Next::kLine) add(l);
        if (uint64_t d = reader_->dropped(); d != reported_drops) {
          m.set_dropped(d - reported_drops);
          reported_drops = d;
        }
        writer_.Push(std::move(m));
      }
      writer_.Close(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    });
  }

  // The bench's stream, relayed both ways: its messages (the opened line,
  // lines, refused writes, the end and why) go to the client as they are.
  void OpenRelay(const SerialRelay& relay) {
    {
      std::lock_guard lock(ctx_mu_);
      remote_ctx_ = std::make_unique<grpc::ClientContext>();
      if (stop_) remote_ctx_->TryCancel();
    }
    auto stub = fwai::v1::LabNode::NewStub(relay.channel);
    remote_ = stub->Serial(remote_ctx_.get());
    fwai::v1::SerialClientMessage open;
    *open.mutable_open() = relay.open;
    if (!remote_->Write(open)) {
      grpc::Status s = remote_->Finish();
      writer_.Close(
          grpc::Status(s.ok() ? grpc::StatusCode::UNAVAILABLE : s.error_code(),
                       "the bench of board " + relay.open.device_id() + ": " + s.error_message()));
      return;
    }
    opened_ = true;
    pump_ = std::thread([this, board = relay.open.device_id()] {
      fwai::v1::SerialServerMessage m;
      while (writer_.WaitBelow(2, stop_) && remote_->Read(&m)) writer_.Push(std::move(m));
      remote_ctx_->TryCancel();
      grpc::Status s = remote_->Finish();
      if (stop_) {
        writer_.Close(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      } else if (s.ok()) {
        writer_.Close(grpc::Status::OK);
      } else {
        writer_.Close(
            grpc::Status(s.error_code(), "the bench of board " + board + ": " + s.error_message()));
      }
    });
  }

  HardwareBroker* const hardware_;
  const SerialHooks hooks_;
  fwai::v1::SerialClientMessage in_;
  QueuedWriter<fwai::v1::SerialServerMessage> writer_;
  std::shared_ptr<SerialReader> reader_;
  Caller caller_;
  std::string board_;
  bool opened_ = false;
  std::atomic<bool> stop_{false};
  std::thread pump_;
  std::mutex ctx_mu_;
  std::unique_ptr<grpc::ClientContext> remote_ctx_;  // set once, under ctx_mu_
  std::mutex remote_mu_;
  std::unique_ptr<
      grpc::ClientReaderWriter<fwai::v1::SerialClientMessage, fwai::v1::SerialServerMessage>>
      remote_;
  std::unique_ptr<Gate::Ticket> ticket_;  // set once admitted, reset first in OnDone
};

}  // namespace fwai
