#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "fwai/v1/events.pb.h"
#include "server/session/session_manager.h"
#include "server/storage/storage.h"
#include "tests/unit/session_fixture.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

class SessionTest : public SessionFixture {};

TEST_F(SessionTest, CreateGetListDelete) {
  auto& sm = Sessions();
  auto s = sm.Create("uid:1", {"title", dir_ + "/proj/../proj", "", ""});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->project_root, std::filesystem::canonical(dir_ + "/proj").string());
  EXPECT_TRUE(sm.Get(s->id).ok());
  ASSERT_EQ(sm.List("uid:1")->size(), 1u);
  EXPECT_EQ(sm.List("uid:2")->size(), 0u);
  ASSERT_TRUE(sm.Publish(s->id, Text("a")).ok());
  ASSERT_TRUE(sm.Delete(s->id).ok());
  EXPECT_EQ(sm.Get(s->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sm.Publish(s->id, Text("b")).status().code(), absl::StatusCode::kNotFound);
  auto bad = sm.Create("uid:1", {"t", dir_ + "/missing", "", ""});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionTest, CountOwnedFollowsCreatesAndDeletesAndIsRecountedAfterARestart) {
  auto is = [](const std::string& who) {
    return [who](const std::string& owner) { return owner == who; };
  };
  std::vector<std::string> alice;
  {
    auto& sm = Sessions();
    // Sessions made before the first count are counted from storage.
    for (int i = 0; i < 3; ++i)
      alice.push_back(sm.Create("alice", {"t", dir_ + "/proj", "", ""})->id);
    EXPECT_EQ(*sm.CountOwned(is("alice")), 3);
    EXPECT_EQ(*sm.CountOwned(is("bob")), 0);
    // Then kept with each create and delete, whoever made them.
    ASSERT_TRUE(sm.Create("bob", {"t", dir_ + "/proj", "", ""}).ok());
    ASSERT_TRUE(sm.Create("alice", {"t", dir_ + "/proj", "", ""}).ok());
    EXPECT_EQ(*sm.CountOwned(is("alice")), 4);
    EXPECT_EQ(*sm.CountOwned(is("bob")), 1);
    EXPECT_EQ(*sm.CountOwned([](const std::string&) { return true; }), 5);
    ASSERT_TRUE(sm.Delete(alice[0]).ok());
    EXPECT_EQ(sm.Delete(alice[0]).code(), absl::StatusCode::kNotFound);  // not counted twice
    EXPECT_EQ(*sm.CountOwned(is("alice")), 3);
    EXPECT_EQ(static_cast<int64_t>(sm.List("alice")->size()), *sm.CountOwned(is("alice")));
    // A create that fails counts nothing.
    EXPECT_FALSE(sm.Create("alice", {"t", dir_ + "/missing", "", ""}).ok());
    EXPECT_EQ(*sm.CountOwned(is("alice")), 3);
  }
  // A restarted manager counts what is stored.
  sessions_.reset();
  auto& sm = Sessions();
  EXPECT_EQ(*sm.CountOwned(is("alice")), 3);
  EXPECT_EQ(*sm.CountOwned(is("bob")), 1);
}

TEST_F(SessionTest, SeqContinuesAfterRestartAndReplayMatchesLive) {
  std::string id;
  std::vector<pb::ServerEvent> live;
  {
    auto& sm = Sessions();
    id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
    int notified = 0;
    auto sub = sm.Subscribe(id, 0, false, true, [&] { ++notified; });
    ASSERT_TRUE(sub.ok());
    EXPECT_TRUE(Drain(**sub).empty());  // now waiting
    for (int i = 0; i < 5; ++i)
      ASSERT_EQ(*sm.Publish(id, Text(std::to_string(i))), uint64_t(i + 1));
    EXPECT_EQ(notified, 1);  // one wake-up for the first event after waiting
    live = Drain(**sub);
    ASSERT_EQ(live.size(), 5u);
  }
  sessions_.reset();
  auto& sm = Sessions();
  EXPECT_EQ(*sm.Publish(id, Finished()), 6u);  // seq continues from storage
  auto sub = sm.Subscribe(id, 0, true, false, nullptr);
  bool closed = false;
  auto replay = Drain(**sub, nullptr, &closed);
  EXPECT_TRUE(closed);
  ASSERT_EQ(replay.size(), 6u);
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(replay[i].SerializeAsString(), live[i].SerializeAsString());
  }
  auto tail = Drain(**sm.Subscribe(id, 4, true, false, nullptr));
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].seq(), 5u);
}

// An event handed over built (not as bytes) is completed the same way: the
// session, the next seq, the time unless it has one; both forms share one
// order, and a queued one is stored before a later waited-for one.
TEST_F(SessionTest, BuiltAndSerializedEventsShareOneOrder) {
  auto& sm = Sessions();
  const std::string id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  pb::ServerEvent built;
  built.set_turn_id("t1");
  built.mutable_text_delta()->set_text("built");
  EXPECT_EQ(*sm.Publish(id, std::move(built)), 1u);
  EXPECT_EQ(*sm.Publish(id, Text("bytes")), 2u);
  pb::ServerEvent queued;
  queued.mutable_text_delta()->set_text("queued");
  queued.set_time_us(42);
  EXPECT_EQ(*sm.PublishQueued(id, std::move(queued)), 3u);
  pb::ServerEvent finished;
  finished.set_turn_id("t1");
  finished.mutable_turn_finished()->set_stop_reason("end_turn");
  EXPECT_EQ(*sm.Publish(id, std::move(finished)), 4u);
  pb::ServerEvent elsewhere;
  EXPECT_EQ(sm.Publish("s-none", std::move(elsewhere)).status().code(),
            absl::StatusCode::kNotFound);
  auto stored = Drain(**sm.Subscribe(id, 0, true, false, nullptr));
  ASSERT_EQ(stored.size(), 4u);
  for (size_t i = 0; i < stored.size(); ++i) {
    EXPECT_EQ(stored[i].session_id(), id);
    EXPECT_EQ(stored[i].seq(), i + 1);
  }
  EXPECT_EQ(stored[0].text_delta().text(), "built");
  EXPECT_GT(stored[0].time_us(), 0);
  EXPECT_EQ(stored[1].text_delta().text(), "bytes");
  EXPECT_EQ(stored[2].time_us(), 42);
  EXPECT_TRUE(stored[3].has_turn_finished());
}

TEST_F(SessionTest, ReplayThenLiveHasNoGapOrDuplicate) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(sm.Publish(id, Text("x")).ok());  // > one replay batch
  auto sub = sm.Subscribe(id, 10, true, true, [] {});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sm.Publish(id, Text("y")).ok());
  auto got = Drain(**sub);
  ASSERT_EQ(got.size(), 593u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].seq(), 11 + i);
}

// `more` says another event is already in memory: the stream holds an event
// written with it in gRPC's buffer until the next write, so it must never be
// followed by "nothing now". It is false where the next event has to be read
// from the store (the end of a replay batch) or has yet to arrive.
TEST_F(SessionTest, PullSaysWhenTheNextEventIsAlreadyWaiting) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  for (int i = 0; i < 600; ++i) ASSERT_TRUE(sm.Publish(id, Text("x")).ok());  // 3 replay batches
  auto sub = sm.Subscribe(id, 0, true, true, [] {});
  ASSERT_TRUE(sub.ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(sm.Publish(id, Text("live")).ok());
  std::string bytes;
  absl::Status st;
  std::vector<uint64_t> last_of_run;  // seqs pulled with more == false
  bool more_before = false;
  for (int n = 0;; ++n) {
    bool more = true;
    const auto r = (*sub)->Pull(&bytes, &st, &more);
    if (r != Subscriber::PullResult::kEvent) {
      EXPECT_EQ(r, Subscriber::PullResult::kEmpty);
      EXPECT_FALSE(more);
      EXPECT_FALSE(more_before) << "promised another event after " << n << " events";
      break;
    }
    pb::ServerEvent ev;
    ASSERT_TRUE(ev.ParseFromString(bytes));
    ASSERT_EQ(ev.seq(), uint64_t(n + 1));
    if (!more) last_of_run.push_back(ev.seq());
    more_before = more;
  }
  EXPECT_EQ(last_of_run, (std::vector<uint64_t>{256, 512, 600, 602}));
  // A live event after a wait is the only one waiting.
  ASSERT_TRUE(sm.Publish(id, Text("later")).ok());
  bool more = true;
  ASSERT_EQ((*sub)->Pull(&bytes, &st, &more), Subscriber::PullResult::kEvent);
  EXPECT_FALSE(more);
}

// A subscriber's queue keeps its order whether it drains (storage given
// back) or never does (the taken front dropped as it grows).
TEST(EventQueueTest, FirstInFirstOutWhetherItDrainsOrNot) {
  EventQueue q;
  EXPECT_TRUE(q.empty());
  int pushed = 0, popped = 0;
  // Never drained: always two or more waiting, 5,000 through it.
  q.push_back(std::to_string(pushed++));
  while (pushed < 5000) {
    q.push_back(std::to_string(pushed++));
    q.push_back(std::to_string(pushed++));
    ASSERT_EQ(q.back(), std::to_string(pushed - 1));
    ASSERT_EQ(q.front(), std::to_string(popped));
    q.pop_front();
    ++popped;
    ASSERT_EQ(q.size(), static_cast<size_t>(pushed - popped));
  }
  while (!q.empty()) {
    ASSERT_EQ(q.front(), std::to_string(popped++));
    q.pop_front();
  }
  EXPECT_EQ(popped, pushed);
  // Drained, then used again.
  q.push_back("again");
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.front(), "again");
  q.clear();
  EXPECT_TRUE(q.empty());
}

TEST_F(SessionTest, SlowSubscriberIsCoalescedThenDropped) {
  SubscriberConfig limits;
  limits.high_water = 4;
  limits.max_queue = 8;
  auto& sm = Sessions(limits);
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  auto slow = sm.Subscribe(id, 0, false, true, [] {});
  auto fast = sm.Subscribe(id, 0, false, true, [] {});
  std::string fast_text;
  // 100 deltas: the slow one coalesces them past the high-water mark.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(sm.Publish(id, Text(std::to_string(i % 10))).ok());
    for (auto& ev : Drain(**fast)) fast_text += ev.text_delta().text();
  }
  EXPECT_EQ(fast_text.size(), 100u);
  EXPECT_GT((*slow)->coalesced(), 90u);
  std::string slow_text;
  auto got = Drain(**slow);
  for (auto& ev : got) slow_text += ev.text_delta().text();
  EXPECT_EQ(slow_text, fast_text);    // same text, fewer events
  EXPECT_EQ(got.back().seq(), 100u);  // the last seq it absorbed
  // Events that cannot be merged overflow the queue: the slow one is dropped.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(sm.Publish(id, Finished()).ok());
    Drain(**fast);
  }
  absl::Status st;
  bool closed = false;
  Drain(**slow, &st, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("re-attach"), std::string::npos);
  // The fast one is unaffected.
  ASSERT_TRUE(sm.Publish(id, Text("z")).ok());
  EXPECT_EQ(Drain(**fast).size(), 1u);
}

// Deltas are queued without waiting; the appender stores them (in batches
// across sessions) before any subscriber sees them, in seq order, and a later
// waited-for Publish comes after them.
TEST_F(SessionTest, QueuedEventsAreStoredBeforeSubscribersSeeThemInOrder) {
  auto& sm = Sessions();
  std::vector<std::string> ids;
  for (int k = 0; k < 3; ++k) ids.push_back(sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id);
  std::vector<std::shared_ptr<Subscriber>> subs;
  for (const auto& id : ids) subs.push_back(*sm.Subscribe(id, 0, false, true, [] {}));
  for (int i = 0; i < 300; ++i) {
    for (const auto& id : ids) ASSERT_EQ(*sm.PublishQueued(id, Text("x")), uint64_t(i + 1));
  }
  for (const auto& id : ids) ASSERT_EQ(*sm.Publish(id, Finished()), 301u);
  for (size_t k = 0; k < ids.size(); ++k) {
    // Everything a subscriber got was in storage when it got it.
    auto got = Drain(*subs[k]);
    ASSERT_EQ(got.size(), 301u);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].seq(), i + 1);
      auto stored = storage_->Get(Cf::kEvents, SeqKey(ids[k], got[i].seq()));
      ASSERT_TRUE(stored.ok() && stored->has_value()) << ids[k] << " seq " << got[i].seq();
    }
    EXPECT_TRUE(got.back().has_turn_finished());
  }
}

// Publishers on many threads into shared sessions, some waiting, some not:
// every subscriber gets every event of its session once, in seq order, and
// each is stored.
TEST_F(SessionTest, ConcurrentPublishersEachSessionInOrderNothingLost) {
  auto& sm = Sessions({.high_water = 1 << 20, .max_queue = 1 << 20});
  std::vector<std::string> ids;
  for (int k = 0; k < 4; ++k) ids.push_back(sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id);
  std::vector<std::shared_ptr<Subscriber>> subs;
  for (const auto& id : ids) subs.push_back(*sm.Subscribe(id, 0, false, true, [] {}));
  constexpr int kThreads = 8, kEach = 400;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string& id = ids[(t + i) % ids.size()];
        if (i % 50 == 49) {
          ASSERT_TRUE(sm.Publish(id, Text("w")).ok());  // waited for: stored on return
        } else {
          ASSERT_TRUE(sm.PublishQueued(id, Text("q")).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& id : ids) ASSERT_TRUE(sm.Publish(id, Finished()).ok());
  size_t total = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    auto got = Drain(*subs[k]);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].seq(), i + 1) << ids[k];
    ASSERT_FALSE(got.empty());
    EXPECT_TRUE(got.back().has_turn_finished());
    auto last = storage_->Get(Cf::kEvents, SeqKey(ids[k], got.size()));
    ASSERT_TRUE(last.ok() && last->has_value());
    total += got.size();
  }
  EXPECT_EQ(total, size_t{kThreads * kEach} + ids.size());
}

// Under load (events within the batch window of the last write) queued events
// wait for each other and share one write; a publisher that waits for its
// event, a full batch, and shutdown each end the wait at once. The window is a
// minute here, so nothing in the test waits it out by chance.
TEST_F(SessionTest, EventsInTheBatchWindowShareAWriteThatNoWaiterWaitsFor) {
  const auto start = std::chrono::steady_clock::now();
  std::string id;
  {
    auto& sm = Sessions({.batch_window_us = 60'000'000});
    id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
    std::mutex mu;
    std::condition_variable cv;
    int notified = 0;
    auto sub = *sm.Subscribe(id, 0, false, true, [&] {
      std::lock_guard<std::mutex> lock(mu);
      ++notified;
      cv.notify_all();
    });
    // Idle: the first event is written at once, alone.
    ASSERT_EQ(*sm.Publish(id, Text("a")), 1u);
    EXPECT_EQ(sm.Appended().batches, 1u);
    // Busy now: queued events wait in the window...
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(sm.PublishQueued(id, Text("q")).ok());
    EXPECT_EQ(Drain(*sub).size(), 1u);
    // ...until a publisher waits for its own: one write for all eleven.
    ASSERT_EQ(*sm.Publish(id, Text("b")), 12u);
    EXPECT_EQ(sm.Appended().batches, 2u);
    EXPECT_EQ(sm.Appended().events, 12u);
    auto got = Drain(*sub);
    ASSERT_EQ(got.size(), 11u);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].seq(), i + 2);
    // A full batch (256 queued) is written without waiting for the window.
    int seen = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      seen = notified;
    }
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(sm.PublishQueued(id, Text("f")).ok());
    size_t delivered = 0;
    while (delivered < 256) {
      {
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return notified > seen; }))
            << "a full batch waited for the window";
        seen = notified;
      }
      delivered += Drain(*sub).size();
    }
  }
  // What came after the full batch may still wait: it is written at shutdown,
  // which does not wait either.
  sessions_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  auto& sm = Sessions();
  EXPECT_EQ(sm.Get(id)->last_seq, 312u);
  EXPECT_EQ(Drain(**sm.Subscribe(id, 0, true, false, nullptr)).size(), 312u);
}

// Two users' events stored in one write of the batch window: each user's
// subscriber gets its own session's events and nothing of the other's, not
// even how many there were (its seqs run without a gap).
TEST_F(SessionTest, EventsSharingABatchWriteReachOnlyTheirOwnSession) {
  auto& sm = Sessions({.batch_window_us = 60'000'000});
  const auto alice = sm.Create("uid:1001", {"t", dir_ + "/proj", "", ""})->id;
  const auto bob = sm.Create("uid:1002", {"t", dir_ + "/proj", "", ""})->id;
  auto alice_sub = *sm.Subscribe(alice, 0, false, true, [] {});
  auto bob_sub = *sm.Subscribe(bob, 0, false, true, [] {});
  ASSERT_TRUE(sm.Publish(bob, Text("bob")).ok());  // written alone; the window opens
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(sm.PublishQueued(alice, Text("secret")).ok());
    if (i % 4 == 0) ASSERT_TRUE(sm.PublishQueued(bob, Text("bob")).ok());
  }
  ASSERT_TRUE(sm.Publish(bob, Text("bob")).ok());  // ends the wait: one write for all
  EXPECT_EQ(sm.Appended().batches, 2u);
  auto bobs = Drain(*bob_sub);
  ASSERT_EQ(bobs.size(), 7u);
  for (size_t i = 0; i < bobs.size(); ++i) {
    EXPECT_EQ(bobs[i].session_id(), bob);
    EXPECT_EQ(bobs[i].seq(), i + 1);
    EXPECT_EQ(bobs[i].text_delta().text(), "bob");
  }
  auto alices = Drain(*alice_sub);
  ASSERT_EQ(alices.size(), 20u);
  for (const auto& ev : alices) EXPECT_EQ(ev.session_id(), alice);
}

// Deleting a session with deltas still queued leaves none of them behind, and
// a restart right after queued deltas finds them all stored.
TEST_F(SessionTest, QueuedEventsNeitherOutliveDeleteNorAreLostAtShutdown) {
  std::string gone, kept;
  {
    auto& sm = Sessions();
    gone = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
    kept = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
    for (int i = 0; i < 500; ++i) {
      ASSERT_TRUE(sm.PublishQueued(gone, Text("x")).ok());
      ASSERT_TRUE(sm.PublishQueued(kept, Text("y")).ok());
    }
    ASSERT_TRUE(sm.Delete(gone).ok());
    EXPECT_EQ(sm.PublishQueued(gone, Text("z")).status().code(), absl::StatusCode::kNotFound);
    int left = 0;
    ASSERT_TRUE(storage_
                    ->Scan(Cf::kEvents, SeqKey(gone, 0), SeqKeyEnd(gone),
                           [&](std::string_view, std::string_view) {
                             ++left;
                             return true;
                           })
                    .ok());
    EXPECT_EQ(left, 0);
  }
  sessions_.reset();  // shutdown with deltas possibly still queued
  auto& sm = Sessions();
  EXPECT_EQ(sm.Get(kept)->last_seq, 500u);
  EXPECT_EQ(Drain(**sm.Subscribe(kept, 0, true, false, nullptr)).size(), 500u);
}

TEST_F(SessionTest, HistoryAppendAndReplace) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  ASSERT_TRUE(sm.AppendHistory(id, {"user", R"([{"type":"text","text":"hi"}])"}).ok());
  ASSERT_TRUE(sm.AppendHistory(id, {"assistant", R"([{"type":"text","text":"hello"}])"}).ok());
  auto h = sm.LoadHistory(id);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 2u);
  EXPECT_EQ((*h)[1].role, "assistant");
  ASSERT_TRUE(sm.ReplaceHistory(id, {{"user", R"([{"type":"text","text":"summary"}])"}}).ok());
  EXPECT_EQ(sm.LoadHistory(id)->size(), 1u);
  ASSERT_TRUE(sm.AppendHistory(id, {"assistant", "[]"}).ok());
  EXPECT_EQ(sm.LoadHistory(id)->size(), 2u);
}

// The history reads back as written, whatever the content holds (quotes,
// escapes, a "role" key of its own, numbers); what is not a history record is
// left out, and the log names the session and each such record.
TEST_F(SessionTest, HistoryReadsBackWhatWasWrittenWhateverItHolds) {
  auto& sm = Sessions();
  auto id = sm.Create("uid:1", {"t", dir_ + "/proj", "", ""})->id;
  const std::vector<HistoryEntry> written = {
      {"user",
       R"([{"type":"text","text":"a \" quote, a \\ and \n, é, 🚀, \u0001, \",\"role\":\"x"}])"},
      {"assistant",
       R"([{"type":"tool_use","id":"t1","name":"n","input":{"role":"user","n":1.5e-7,"big":12345678901234567890,"neg":-3,"x":{"role":"a"}}}])"},
      {"we\"ird", R"("a bare string")"},
      {"tool", "[]"},
  };
  for (const auto& e : written) ASSERT_TRUE(sm.AppendHistory(id, e).ok()) << e.content_json;
  // Not history records: damaged, or cut after the content.
  ASSERT_TRUE(
      storage_->Put(Cf::kHistory, SeqKey(id, 10), R"({"content":[{"a":1},"role":"user"})", false)
          .ok());
  ASSERT_TRUE(storage_->Put(Cf::kHistory, SeqKey(id, 11), R"({"content":[],"role":")", false).ok());
  ASSERT_TRUE(storage_->Put(Cf::kHistory, SeqKey(id, 12), "not json", false).ok());
  // The default logger writes to standard output.
  testing::internal::CaptureStdout();
  auto h = sm.LoadHistory(id);
  const std::string logged = testing::internal::GetCapturedStdout();
  EXPECT_NE(logged.find("session " + id + ": 3 damaged history record(s)"), std::string::npos)
      << logged;
  EXPECT_NE(logged.find("record 10, 11, 12;"), std::string::npos) << logged;
  // Left stored as it was.
  EXPECT_EQ(storage_->Get(Cf::kHistory, SeqKey(id, 12)).value(), "not json");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->size(), written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ((*h)[i].role, written[i].role);
    EXPECT_EQ((*h)[i].content_json, nlohmann::json::parse(written[i].content_json).dump());
  }
}

}  // namespace
}  // namespace fwai
