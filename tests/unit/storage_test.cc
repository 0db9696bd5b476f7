#include "server/storage/storage.h"

#include <gtest/gtest.h>
#include <rocksdb/env.h>

#include <chrono>
#include <filesystem>
#include <future>

#include "tests/unit/held_sync_fs.h"

namespace fwai {
namespace {

std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "fwai-storage-XXXXXX").string();
  return mkdtemp(t.data());
}

TEST(StorageTest, PutGetScanBatchAndReopen) {
  std::string dir = TempDir();
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Put(Cf::kEvents, SeqKey("s1", 1), "a", false).ok());
    ASSERT_TRUE((*db)->Put(Cf::kEvents, SeqKey("s1", 2), "b", false).ok());
    ASSERT_TRUE((*db)->Put(Cf::kEvents, SeqKey("s10", 1), "other", false).ok());
    WriteBatch batch;
    batch.Put(Cf::kEvents, SeqKey("s1", 300), "c");
    batch.Put(Cf::kSessions, "s1", "{}");
    ASSERT_TRUE((*db)->Write(batch, true).ok());
    std::vector<std::string> seen;
    ASSERT_TRUE((*db)
                    ->Scan(Cf::kEvents, SeqKey("s1", 0), SeqKeyEnd("s1"),
                           [&](auto, auto v) {
                             seen.emplace_back(v);
                             return true;
                           })
                    .ok());
    EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));
    auto last = (*db)->LastKey(Cf::kEvents, SeqKey("s1", 0), SeqKeyEnd("s1"));
    ASSERT_TRUE(last.ok() && *last);
    EXPECT_EQ(DecodeU64(last->value().substr(3)), 300u);
    auto none = (*db)->LastKey(Cf::kEvents, SeqKey("nope", 0), SeqKeyEnd("nope"));
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value());
  }
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok());
  auto v = (*db)->Get(Cf::kSessions, "s1");
  ASSERT_TRUE(v.ok() && v->has_value());
  // A second open of the same directory is refused with a clear reason.
  auto second = Storage::Open(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("another fwaid"), std::string::npos) << second.status();
  std::filesystem::remove_all(dir);
}

// A synced write (a document's batch, an evidence record) is answered only
// once the log is on disk, but the sessions' unsynced event appends go on
// while the disk syncs: nothing holds RocksDB's write queue for an fsync.
TEST(StorageTest, UnsyncedWritesDoNotWaitForALogSync) {
  const std::string dir = TempDir();
  HeldStore held;
  HeldSyncFs* fs = held.fs.get();
  auto db = held.Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  Storage& storage = **db;

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const int syncs_before = fs->syncs();
    fs->Hold(true);
    const std::string key = "doc" + std::to_string(round);
    // Round 0 a batch, round 1 a Put, round 2 a Delete; each synced.
    auto synced = std::async(std::launch::async, [&]() -> absl::Status {
      if (round == 0) {
        WriteBatch batch;
        for (int i = 0; i < 160; ++i) batch.Put(Cf::kChunks, key + std::to_string(i), "chunk");
        batch.Put(Cf::kDocuments, key, "{}");
        return storage.Write(batch, /*sync=*/true);
      }
      if (round == 1) return storage.Put(Cf::kEvidence, key, "record", /*sync=*/true);
      return storage.Delete(Cf::kDocuments, "doc0", /*sync=*/true);
    });
    ASSERT_TRUE(fs->WaitForHeldSync()) << "the synced write never synced the log";
    // The disk is busy with that sync: a session's events are written meanwhile.
    auto appends = std::async(std::launch::async, [&]() -> absl::Status {
      for (uint64_t n = 1; n <= 50; ++n) {
        WriteBatch batch;
        batch.Put(Cf::kEvents, SeqKey("s" + std::to_string(round), n), "event");
        if (absl::Status s = storage.Write(batch, /*sync=*/false); !s.ok()) return s;
      }
      return storage.Put(Cf::kSessions, "s" + std::to_string(round), "{}", /*sync=*/false);
    });
    const bool appended = appends.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    // The synced write is still waiting for the disk: it was not answered early.
    const bool answered_early =
        synced.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    fs->Hold(false);
    EXPECT_TRUE(appended) << "the event appends waited for another writer's log sync";
    EXPECT_FALSE(answered_early) << "a synced write returned before its log sync";
    ASSERT_TRUE(synced.get().ok());
    ASSERT_TRUE(appends.get().ok());
    EXPECT_GT(fs->syncs(), syncs_before);
    auto last = storage.LastKey(Cf::kEvents, SeqKey("s" + std::to_string(round), 0),
                                SeqKeyEnd("s" + std::to_string(round)));
    ASSERT_TRUE(last.ok() && *last);
    EXPECT_EQ(DecodeU64(last->value().substr(3)), 50u);
  }
  auto doc = storage.Get(Cf::kDocuments, "doc0");
  ASSERT_TRUE(doc.ok());
  EXPECT_FALSE(doc->has_value());  // the synced Delete of round 2
  auto record = storage.Get(Cf::kEvidence, "doc1");
  ASSERT_TRUE(record.ok() && record->has_value());
  db->reset();
  std::filesystem::remove_all(dir);
}

// A log sync that fails leaves unknown what it covered (a later fsync may
// report success for pages the failed one dropped): no synced write after it
// is answered as durable, however the next syncs go (RocksDB stops writing
// after a failed log sync; SyncThrough keeps the failure too). What was
// durable before stays.
TEST(StorageTest, NoSyncedWriteIsAnsweredAfterAFailedLogSync) {
  const std::string dir = TempDir();
  HeldStore held;
  HeldSyncFs* fs = held.fs.get();
  auto db = held.Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  Storage& storage = **db;
  ASSERT_TRUE(storage.Put(Cf::kEvidence, "before", "durable", /*sync=*/true).ok());
  fs->FailSyncs(true);
  const absl::Status failed = storage.Put(Cf::kEvidence, "during", "record", /*sync=*/true);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("sync"), std::string::npos) << failed;
  fs->FailSyncs(false);  // the disk answers again
  for (int i = 0; i < 3; ++i) {
    WriteBatch batch;
    batch.Put(Cf::kEvidence, "after" + std::to_string(i), "record");
    auto ticket = storage.WriteForSync(batch);
    const absl::Status synced = ticket.ok() ? storage.SyncThrough(*ticket) : ticket.status();
    EXPECT_FALSE(synced.ok()) << "a write after a failed sync was answered as durable";
  }
  EXPECT_FALSE(storage.Put(Cf::kEvidence, "later", "record", /*sync=*/true).ok());
  auto before = storage.Get(Cf::kEvidence, "before");
  ASSERT_TRUE(before.ok() && before->has_value());
  db->reset();
  std::filesystem::remove_all(dir);
}

// Many keys in one read: in the order asked (not key order), absent keys
// empty, from the memtable and from flushed files alike.
TEST(StorageTest, MultiGetAnswersInTheOrderAsked) {
  std::string dir = TempDir();
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    WriteBatch batch;
    for (uint64_t i = 0; i < 500; ++i)
      batch.Put(Cf::kChunks, EncodeU64(i), "v" + std::to_string(i));
    ASSERT_TRUE((*db)->Write(batch, true).ok());
  }
  auto db = Storage::Open(dir);  // reopened: the values are read from the log or files
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Put(Cf::kChunks, EncodeU64(7), "changed", false).ok());
  const std::vector<std::string> keys = {EncodeU64(420), EncodeU64(7),   EncodeU64(9999),
                                         EncodeU64(3),   EncodeU64(420), "short"};
  auto got = (*db)->MultiGet(Cf::kChunks, keys);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), keys.size());
  EXPECT_EQ((*got)[0], std::optional<std::string>("v420"));
  EXPECT_EQ((*got)[1], std::optional<std::string>("changed"));
  EXPECT_FALSE((*got)[2].has_value());
  EXPECT_EQ((*got)[3], std::optional<std::string>("v3"));
  EXPECT_EQ((*got)[4], std::optional<std::string>("v420"));
  EXPECT_FALSE((*got)[5].has_value());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto one = (*db)->Get(Cf::kChunks, keys[i]);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(*one, (*got)[i]) << i;
  }
  EXPECT_TRUE((*db)->MultiGet(Cf::kChunks, {})->empty());
  std::filesystem::remove_all(dir);
}

// A batch mixes puts, deletes and range deletes over several column
// families, keys and values with NULs and empty values; it applies in the
// order given. Events of many sessions interleaved (as the appender writes
// them, each session in seq order) read back per session in order, before
// and after the memtable is flushed by a reopen.
TEST(StorageTest, BatchesApplyInOrderAndInterleavedSessionsReadBackInOrder) {
  std::string dir = TempDir();
  const std::string with_nul("a\0b", 3);
  auto read = [](Storage& db, const std::string& session) {
    std::vector<std::string> seen;
    EXPECT_TRUE(db.Scan(Cf::kEvents, SeqKey(session, 0), SeqKeyEnd(session), [&](auto, auto v) {
                    seen.emplace_back(v);
                    return true;
                  }).ok());
    return seen;
  };
  std::vector<std::vector<std::string>> want(30);
  {
    auto db = Storage::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    WriteBatch first;
    first.Put(Cf::kSessions, "k", "old");
    first.Put(Cf::kSessions, with_nul, with_nul);
    first.Put(Cf::kSessions, "empty", "");
    first.Put(Cf::kMeta, "gone", "x");
    ASSERT_TRUE((*db)->Write(first, false).ok());
    WriteBatch second;
    second.Put(Cf::kSessions, "k", "new");  // the later op wins
    second.Delete(Cf::kMeta, "gone");
    second.Put(Cf::kEvents, SeqKey("r", 1), "1");
    second.Put(Cf::kEvents, SeqKey("r", 2), "2");
    second.DeleteRange(Cf::kEvents, SeqKey("r", 0), SeqKeyEnd("r"));
    second.Put(Cf::kEvents, SeqKey("r", 3), "3");  // after the range delete: kept
    ASSERT_TRUE((*db)->Write(second, false).ok());
    EXPECT_EQ(*(*db)->Get(Cf::kSessions, "k"), std::optional<std::string>("new"));
    EXPECT_EQ(*(*db)->Get(Cf::kSessions, with_nul), std::optional<std::string>(with_nul));
    EXPECT_EQ(*(*db)->Get(Cf::kSessions, "empty"), std::optional<std::string>(""));
    EXPECT_EQ(*(*db)->Get(Cf::kMeta, "gone"), std::optional<std::string>());
    EXPECT_EQ(read(**db, "r"), std::vector<std::string>{"3"});
    // A range delete of a session's events from the middle is refused whole
    // (the memtable's insert hints allow none), and the batch writes nothing.
    WriteBatch middle;
    middle.Put(Cf::kSessions, "k", "not written");
    middle.DeleteRange(Cf::kEvents, SeqKey("r", 2), SeqKeyEnd("r"));
    const absl::Status refused = (*db)->Write(middle, false);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_EQ(*(*db)->Get(Cf::kSessions, "k"), std::optional<std::string>("new"));
    // 30 sessions, 200 events each, interleaved in batches of 7 as they come.
    uint64_t next[30] = {};
    auto batch = std::make_unique<WriteBatch>();
    int in_batch = 0;
    for (int round = 0; round < 200; ++round) {
      for (int s = 0; s < 30; ++s) {
        const std::string session = "s-" + std::to_string(s * 7 % 30);
        const uint64_t seq = ++next[s];
        const std::string value = session + "#" + std::to_string(seq);
        batch->Put(Cf::kEvents, SeqKey(session, seq), value);
        want[s * 7 % 30].push_back(value);
        if (++in_batch == 7) {
          ASSERT_TRUE((*db)->Write(*batch, false).ok());
          batch = std::make_unique<WriteBatch>();
          in_batch = 0;
        }
      }
    }
    ASSERT_TRUE((*db)->Write(*batch, false).ok());
    for (int s = 0; s < 30; ++s) EXPECT_EQ(read(**db, "s-" + std::to_string(s)), want[s]);
  }
  auto db = Storage::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  for (int s = 0; s < 30; ++s) EXPECT_EQ(read(**db, "s-" + std::to_string(s)), want[s]);
  EXPECT_EQ(*(*db)->Get(Cf::kSessions, with_nul), std::optional<std::string>(with_nul));
  std::filesystem::remove_all(dir);
}

TEST(StorageTest, SeqKeysSortNumerically) {
  EXPECT_LT(SeqKey("s", 9), SeqKey("s", 10));
  EXPECT_LT(SeqKey("s", 255), SeqKey("s", 256));
  EXPECT_LT(SeqKey("s", 1u << 31), SeqKeyEnd("s"));
  EXPECT_EQ(DecodeU64(EncodeU64(0x0102030405060708ull)), 0x0102030405060708ull);
}

}  // namespace
}  // namespace fwai
