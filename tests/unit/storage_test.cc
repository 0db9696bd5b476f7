#include <gtest/gtest.h>

#include <filesystem>

#include "server/storage/storage.h"

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
    ASSERT_TRUE((*db)->Scan(Cf::kEvents, SeqKey("s1", 0), SeqKeyEnd("s1"), [&](auto, auto v) {
                       seen.emplace_back(v);
                       return true;
                     }).ok());
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

TEST(StorageTest, SeqKeysSortNumerically) {
  EXPECT_LT(SeqKey("s", 9), SeqKey("s", 10));
  EXPECT_LT(SeqKey("s", 255), SeqKey("s", 256));
  EXPECT_LT(SeqKey("s", 1u << 31), SeqKeyEnd("s"));
  EXPECT_EQ(DecodeU64(EncodeU64(0x0102030405060708ull)), 0x0102030405060708ull);
}

}  // namespace
}  // namespace fwai
