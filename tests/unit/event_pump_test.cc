#include "server/api/event_pump.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/session_fixture.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

class EventPumpTest : public SessionFixture {};

// What an EventPump asks of its stream, in order.
struct RecordingReactor {
  std::vector<std::string> calls;  // "headers", "write <seq>[ hinted]", "finish <code>"
  void StartSendInitialMetadata() { calls.push_back("headers"); }
  void StartWrite(const pb::ServerEvent* ev, grpc::WriteOptions options) {
    calls.push_back("write " + std::to_string(ev->seq()) +
                    (options.get_buffer_hint() ? " hinted" : ""));
  }
  void Finish(const grpc::Status& s) {
    calls.push_back("finish " + std::to_string(s.error_code()));
  }
};

// A write is hinted only when the next event is already waiting and the
// headers have gone; a stream with no headers yet sends them with its first
// write, unhinted.
TEST_F(EventPumpTest, HintsOnlyWritesAnotherWriteFollows) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sm.Publish(id, Text("x")).ok());
  {  // As Attach: no headers before the first event.
    RecordingReactor r;
    EventPump<RecordingReactor> pump(&r);
    pump.SetSubscriber(*sm.Subscribe(id, 0, true, false, pump.NotifyFn()));
    for (int i = 0; i < 3; ++i) pump.OnWriteDone(true);
    EXPECT_EQ(r.calls,
              (std::vector<std::string>{"write 1", "write 2 hinted", "write 3", "finish 0"}));
    pump.Detach(&sm);
  }
  {  // As Chat: the headers first, then every write but the last is hinted.
    RecordingReactor r;
    EventPump<RecordingReactor> pump(&r);
    pump.SendHeaders();
    pump.SetSubscriber(*sm.Subscribe(id, 0, true, true, pump.NotifyFn()));
    for (int i = 0; i < 3; ++i) pump.OnWriteDone(true);
    ASSERT_TRUE(sm.Publish(id, Text("live")).ok());  // written by the appender's notify
    pump.OnWriteDone(true);
    pump.SendHeaders();  // once only
    EXPECT_EQ(r.calls, (std::vector<std::string>{"headers", "write 1 hinted", "write 2 hinted",
                                                 "write 3", "write 4"}));
    pump.Finish(grpc::Status::OK);
    pump.Detach(&sm);
  }
  {  // Ended before its headers: Finish sends them; SendHeaders does nothing.
    RecordingReactor r;
    EventPump<RecordingReactor> pump(&r);
    pump.Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    pump.SendHeaders();
    EXPECT_EQ(r.calls, (std::vector<std::string>{"finish 1"}));
    pump.Detach(&sm);
  }
}

}  // namespace
}  // namespace fwai
