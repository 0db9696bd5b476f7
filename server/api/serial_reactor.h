// The serial stream of a board (Hardware.Serial, LabNode.Serial): lines from
// the board's reader to the client, writes from the client to the board.
// The board is resolved and opened through the board contract, so a board
// of another node (a front relaying to its bench) is served the same way
// as one of this node. Internal to server/api.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "fwai/v1/hardware.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/queued_writer.h"
#include "server/boards/boards.h"

namespace fwai {

struct SerialHooks {
  // Who the opener is, with the lease it writes under; the status ends the stream.
  std::function<absl::StatusOr<Caller>(const fwai::v1::SerialOpen&)> admit;
  // Set where a token may open the stream: called once the opener is
  // admitted, it watches the opener's token for the stream's life
  // (Gate::Track); `end` ends the stream when the token stops being valid.
  std::function<std::unique_ptr<Gate::Ticket>(std::function<void(const grpc::Status&)> end)> track;
};

class SerialReactor final
    : public grpc::ServerBidiReactor<fwai::v1::SerialClientMessage, fwai::v1::SerialServerMessage> {
 public:
  SerialReactor(Boards* boards, SerialHooks hooks) : boards_(boards), hooks_(std::move(hooks)) {
    writer_.Bind([this](const fwai::v1::SerialServerMessage* m) { StartWrite(m); },
                 [this](grpc::Status s) { Finish(std::move(s)); });
    if (!boards_) {
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
    } else if (in_.kind_case() == fwai::v1::SerialClientMessage::kWrite) {
      if (auto s = serial_->Write(in_.write()); !s.ok()) Error(std::string(s.message()));
    } else if (in_.kind_case() == fwai::v1::SerialClientMessage::kSendLine) {
      if (auto s = serial_->SendLine(in_.send_line()); !s.ok()) Error(std::string(s.message()));
    }
    if (!writer_.done()) StartRead(&in_);
  }
  void OnWriteDone(bool ok) override { writer_.OnWriteDone(ok); }
  void OnCancel() override { stop_ = true; }
  void OnDone() override {
    ticket_.reset();  // first: the gate no longer ends a stream that is gone
    stop_ = true;
    if (pump_.joinable()) {
      if (pump_.get_id() == std::this_thread::get_id()) {
        pump_.detach();
      } else {
        pump_.join();
      }
    }
    serial_.reset();
    delete this;
  }

 private:
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
      // and the pump stops as on a cancel.
      ticket_ = hooks_.track([this](const grpc::Status& why) {
        writer_.Close(why);
        stop_ = true;
      });
    }
    auto board = boards_->Resolve(caller_, o.device_id(), o.lease_id());
    if (!board.ok()) {
      writer_.Close(ToGrpcStatus(board.status()));
      return;
    }
    auto serial = boards_->OpenSerial(caller_, *board, o.from_history(), o.stream());
    if (!serial.ok()) {
      writer_.Close(ToGrpcStatus(serial.status()));
      return;
    }
    serial_ = *std::move(serial);
    opened_ = true;
    fwai::v1::SerialServerMessage hello;
    hello.set_opened(board->id);
    hello.set_next_seq(serial_->next_seq());
    hello.set_stream(o.stream().empty() ? "uart" : o.stream());
    writer_.Push(std::move(hello));
    pump_ = std::thread([this] { Pump(); });
  }

  // Backpressure: lines wait in the reader's bounded queue (oldest dropped
  // past its limit) while this client is slow; whatever has piled up goes
  // out as one batch. Writes a host refused after they left are told here.
  void Pump() {
    uint64_t reported_drops = 0;
    while (writer_.WaitBelow(2, stop_)) {
      SerialLine l;
      auto n = serial_->Wait(l, 200);
      for (std::string r = serial_->TakeRefusal(); !r.empty(); r = serial_->TakeRefusal()) Error(r);
      if (n == SerialReader::Next::kTimeout) continue;
      fwai::v1::SerialServerMessage m;
      if (n == SerialReader::Next::kEnded) {
        m.set_end_of_stream(true);
        m.set_reason(serial_->end_reason());
        m.set_daemon_stopping(serial_->host_stopping());
        writer_.Push(std::move(m));
        writer_.Close(grpc::Status::OK);
        return;
      }
      auto add = [&m](SerialLine& x) {
        auto* o = m.add_lines();
        o->set_time_us(x.time_us);
        o->set_line(std::move(x.text));
        o->set_seq(x.seq);
        o->set_notice(x.notice);
      };
      add(l);
      while (m.lines_size() < 512 && serial_->Wait(l, 0) == SerialReader::Next::kLine) add(l);
      if (uint64_t d = serial_->dropped(); d != reported_drops) {
        m.set_dropped(d - reported_drops);
        reported_drops = d;
      }
      writer_.Push(std::move(m));
    }
    writer_.Close(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  Boards* const boards_;
  const SerialHooks hooks_;
  fwai::v1::SerialClientMessage in_;
  QueuedWriter<fwai::v1::SerialServerMessage> writer_;
  std::unique_ptr<BoardSerial> serial_;  // set once, before the pump starts
  Caller caller_;
  bool opened_ = false;
  std::atomic<bool> stop_{false};
  std::thread pump_;
  std::unique_ptr<Gate::Ticket> ticket_;  // set once admitted, reset first in OnDone
};

}  // namespace fwai
