#include "server/api/event_pump.h"

#include <grpcpp/impl/codegen/proto_utils.h>
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
  // The bytes written, read back as the event they must be.
  void StartWrite(const grpc::ByteBuffer* bytes, grpc::WriteOptions options) {
    grpc::ByteBuffer copy(*bytes);
    pb::ServerEvent ev;
    const bool parsed = grpc::SerializationTraits<pb::ServerEvent>::Deserialize(&copy, &ev).ok();
    calls.push_back((parsed ? "write " + std::to_string(ev.seq()) : std::string("write garbage")) +
                    (options.get_buffer_hint() ? " hinted" : ""));
    texts.push_back(ev.text_delta().text());
  }
  std::vector<std::string> texts;  // each write's text delta
  void Finish(const grpc::Status& s) {
    calls.push_back("finish " + std::to_string(s.error_code()));
  }
};

// What a stream that is not following (as Attach with no_follow) is asked
// to do for the stored events of session `id`.
RecordingReactor Replayed(SessionManager& sm, const std::string& id) {
  RecordingReactor r;
  EventPump<RecordingReactor> pump(&r);
  pump.SetSubscriber(*sm.Subscribe(id, 0, true, false, pump.NotifyFn()));
  for (int i = 0; i < 8 && (r.calls.empty() || r.calls.back().rfind("finish", 0) != 0); ++i) {
    pump.OnWriteDone(true);
  }
  pump.Detach(&sm);
  return r;
}

// A write is hinted only when the next event is already waiting and the
// headers have gone; a stream with no headers yet sends them with its first
// write, unhinted.
TEST_F(EventPumpTest, HintsOnlyWritesAnotherWriteFollows) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sm.Publish(id, Text("x")).ok());
  // As Attach: no headers before the first event.
  EXPECT_EQ(Replayed(sm, id).calls,
            (std::vector<std::string>{"write 1", "write 2 hinted", "write 3", "finish 0"}));
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

// Events go out as the bytes they were stored as; a stored record that is
// not an event is never written: the events before it go out, then the
// stream ends with DATA_LOSS naming it (nothing after it, live or stored).
TEST_F(EventPumpTest, StoredEventsGoOutAsStoredAndADamagedOneEndsTheStreamNamingIt) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  for (const char* t : {"one", "two", "three"}) ASSERT_TRUE(sm.Publish(id, Text(t)).ok());
  const RecordingReactor whole = Replayed(sm, id);
  EXPECT_EQ(whole.calls,
            (std::vector<std::string>{"write 1", "write 2 hinted", "write 3", "finish 0"}));
  EXPECT_EQ(whole.texts, (std::vector<std::string>{"one", "two", "three"}));
  // Event 2's record damaged on disk (a field with a wire type that does not exist).
  ASSERT_TRUE(storage_->Put(Cf::kEvents, SeqKey(id, 2), std::string("\x0f\xff\xff", 3), true).ok());
  EXPECT_EQ(Replayed(sm, id).calls,
            (std::vector<std::string>{"write 1", "finish 15"}));  // 15: DATA_LOSS
  absl::Status closed;
  auto sub = sm.Subscribe(id, 0, true, false, [] {});
  ASSERT_TRUE(sub.ok());
  std::string bytes;
  bool more = false;
  EXPECT_EQ((*sub)->Pull(&bytes, &closed, &more), Subscriber::PullResult::kEvent);  // event 1
  EXPECT_EQ((*sub)->Pull(&bytes, &closed, &more), Subscriber::PullResult::kClosed);
  EXPECT_EQ(closed.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(closed.message().find("stored event 2 is damaged"), std::string::npos) << closed;
  EXPECT_NE(closed.message().find(id), std::string::npos) << closed;
  sm.Unsubscribe(id, sub->get());
}

}  // namespace
}  // namespace fwai
