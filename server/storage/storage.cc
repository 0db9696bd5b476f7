#include "server/storage/storage.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status_macros.h"

namespace fwai {
namespace {

const char* const kCfNames[] = {"default",   "sessions", "events",    "history",
                                "documents", "chunks",   "tools",     "evidence",
                                "leases",    "ota",      "retrieval", "checkpoints"};
static_assert(sizeof(kCfNames) / sizeof(kCfNames[0]) == static_cast<int>(Cf::kCount));

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat("storage: ", std::string(what), ": ", s.ToString());
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat(msg, " (is another fwaid using this data directory?)"));
  }
  if (s.IsCorruption()) return absl::DataLossError(msg);
  return absl::InternalError(msg);
}

// The prefix of a SeqKey (its owner and the NUL after it): events of one
// session arrive in seq order, interleaved with other sessions', so the
// memtable keeps an insert hint per session instead of searching its skip
// list from the top for every event.
class SeqKeyPrefix : public rocksdb::SliceTransform {
 public:
  const char* Name() const override { return "fwai.SeqKeyPrefix"; }
  rocksdb::Slice Transform(const rocksdb::Slice& key) const override {
    return rocksdb::Slice(key.data(), key.size() - 8);
  }
  // Not SeqKey(owner, 0), where every range delete of a session's keys
  // begins: RocksDB keeps one hint per prefix for the memtable's point keys
  // and its range tombstones alike, and a hint taken in one table must not
  // be followed in the other. No event or history entry has seq 0.
  bool InDomain(const rocksdb::Slice& key) const override {
    if (key.size() < 9 || key[key.size() - 9] != '\0') return false;
    return DecodeU64(std::string_view(key.data() + key.size() - 8, 8)) != 0;
  }
};

}  // namespace

// A batch's operations, kept in one buffer until Write resolves the column
// families: no allocation per operation.
struct WriteBatch::Rep {
  enum class Kind : uint8_t { kPut, kDelete, kDeleteRange };
  struct Op {
    Kind kind;
    Cf cf;
    size_t a_len;  // key (or range begin) length
    size_t b_len;  // value (or range end) length; 0 for kDelete
  };
  std::vector<Op> ops;
  std::string data;  // each op's key then its value, in order

  void Add(Kind kind, Cf cf, std::string_view a, std::string_view b) {
    ops.push_back(Op{kind, cf, a.size(), b.size()});
    data.append(a);
    data.append(b);
  }
};

WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;

void WriteBatch::Put(Cf cf, std::string_view key, std::string_view value) {
  rep_->Add(Rep::Kind::kPut, cf, key, value);
}

void WriteBatch::Delete(Cf cf, std::string_view key) { rep_->Add(Rep::Kind::kDelete, cf, key, {}); }

void WriteBatch::DeleteRange(Cf cf, std::string_view begin, std::string_view end) {
  rep_->Add(Rep::Kind::kDeleteRange, cf, begin, end);
}

struct Storage::Rep {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  // Group commit of log syncs. Every write that wants to be durable takes a
  // ticket once it is in the log; a sync covers every ticket taken before it
  // began.
  Mutex sync_mu;
  CondVar sync_cv;
  uint64_t tickets ABSL_GUARDED_BY(sync_mu) = 0;  // taken
  uint64_t synced ABSL_GUARDED_BY(sync_mu) = 0;   // covered by a completed sync
  bool syncing ABSL_GUARDED_BY(sync_mu) = false;
  // The first failed sync: what was written after `synced` may be lost (a
  // later fsync can report success for pages the failed one dropped), so
  // every sync asked for past it fails the same way from then on.
  absl::Status sync_failed ABSL_GUARDED_BY(sync_mu);
  ~Rep() {
    if (db) {
      for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
      db->Close();
    }
  }
};

Storage::Storage(std::string dir, std::unique_ptr<Rep> rep)
    : dir_(std::move(dir)), rep_(std::move(rep)) {}
Storage::~Storage() = default;

absl::StatusOr<std::unique_ptr<Storage>> Storage::Open(const std::string& dir) {
  return Open(dir, StorageOptions());
}

absl::StatusOr<std::unique_ptr<Storage>> Storage::Open(const std::string& dir,
                                                       const StorageOptions& storage_options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(
        absl::StrCat("storage: cannot create ", dir, ": ", ec.message()));
  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.max_background_jobs = 2;
  options.keep_log_file_num = 3;
  options.max_log_file_size = 4 << 20;
  if (storage_options.env != nullptr) options.env = storage_options.env;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  // Writes come from few threads, most from the event appender in batches;
  // memtable insert hints need the memtable written by one thread at a time.
  options.allow_concurrent_memtable_write = false;
  auto seq_prefix = std::make_shared<SeqKeyPrefix>();
  for (const char* name : kCfNames) {
    rocksdb::ColumnFamilyOptions cfo;
    cfo.write_buffer_size = 8 << 20;
    const std::string_view n(name);
    if (n == "events" || n == "history")
      cfo.memtable_insert_with_hint_prefix_extractor = seq_prefix;
    static_assert(static_cast<int>(Cf::kEvents) == 2 && static_cast<int>(Cf::kHistory) == 3);
    cfs.emplace_back(name, cfo);
  }
  // Flushes and compactions must not take CPU from streaming on small machines.
  rocksdb::Env::Default()->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::LOW,
                                                      rocksdb::CpuPriority::kLow);
  rocksdb::Env::Default()->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::HIGH,
                                                      rocksdb::CpuPriority::kLow);
  auto rep = std::make_unique<Rep>();
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, cfs, &rep->handles, &raw);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", dir));
  rep->db.reset(raw);
  return std::unique_ptr<Storage>(new Storage(dir, std::move(rep)));
}

uint64_t Storage::Ticket() {
  MutexLock lock(&rep_->sync_mu);
  return ++rep_->tickets;
}

absl::Status Storage::SyncThrough(uint64_t ticket) {
  Rep& r = *rep_;
  MutexLock lock(&r.sync_mu);
  // A sync under way may have begun before this ticket's write reached the
  // log: wait for it, then sync again unless a later one covered the ticket.
  while (!(r.synced >= ticket || !r.syncing)) r.sync_cv.Wait(&r.sync_mu);
  if (r.synced >= ticket) return absl::OkStatus();
  if (!r.sync_failed.ok()) return r.sync_failed;
  r.syncing = true;
  const uint64_t through = r.tickets;
  lock.Unlock();
  // DB::SyncWAL syncs every log up to the current one without holding the
  // write queue.
  const rocksdb::Status s = r.db->SyncWAL();
  lock.Lock();
  r.syncing = false;
  if (s.ok()) {
    r.synced = std::max(r.synced, through);
  } else if (r.sync_failed.ok()) {
    r.sync_failed = FromRocks(s, "sync wal");
  }
  const absl::Status result = s.ok() ? absl::OkStatus() : r.sync_failed;
  lock.Unlock();
  r.sync_cv.SignalAll();
  return result;
}

absl::Status Storage::Put(Cf cf, std::string_view key, std::string_view value, bool sync) {
  RETURN_IF_ERROR(FromRocks(
      rep_->db->Put(rocksdb::WriteOptions(), rep_->handles[static_cast<int>(cf)], key, value),
      "put"));
  return sync ? SyncThrough(Ticket()) : absl::OkStatus();
}

absl::Status Storage::Delete(Cf cf, std::string_view key, bool sync) {
  RETURN_IF_ERROR(
      FromRocks(rep_->db->Delete(rocksdb::WriteOptions(), rep_->handles[static_cast<int>(cf)], key),
                "delete"));
  return sync ? SyncThrough(Ticket()) : absl::OkStatus();
}

absl::Status Storage::Write(WriteBatch& batch, bool sync) {
  rocksdb::WriteBatch b(batch.rep_->data.size() + 24 * batch.rep_->ops.size());
  const std::string& data = batch.rep_->data;
  size_t at = 0;
  for (const WriteBatch::Rep::Op& op : batch.rep_->ops) {
    rocksdb::ColumnFamilyHandle* h = rep_->handles[static_cast<int>(op.cf)];
    const rocksdb::Slice a(data.data() + at, op.a_len);
    const rocksdb::Slice v(data.data() + at + op.a_len, op.b_len);
    at += op.a_len + op.b_len;
    switch (op.kind) {
      case WriteBatch::Rep::Kind::kPut:
        b.Put(h, a, v);
        break;
      case WriteBatch::Rep::Kind::kDelete:
        b.Delete(h, a);
        break;
      case WriteBatch::Rep::Kind::kDeleteRange:
        if ((op.cf == Cf::kEvents || op.cf == Cf::kHistory) && SeqKeyPrefix().InDomain(a)) {
          return absl::InvalidArgumentError(
              "storage: a range delete of events or history must begin at SeqKey(owner, 0)");
        }
        b.DeleteRange(h, a, v);
        break;
    }
  }
  // Never WriteOptions::sync: a synced write holds RocksDB's write queue while
  // the disk syncs (and, at its head, waits for a DB::SyncWAL under way), and
  // every event append queued behind it waits as long.
  RETURN_IF_ERROR(FromRocks(rep_->db->Write(rocksdb::WriteOptions(), &b), "write batch"));
  return sync ? SyncThrough(Ticket()) : absl::OkStatus();
}

absl::Status Storage::WriteThenSync(WriteBatch& batch) { return Write(batch, /*sync=*/true); }

absl::StatusOr<uint64_t> Storage::WriteForSync(WriteBatch& batch) {
  RETURN_IF_ERROR(Write(batch, /*sync=*/false));
  return Ticket();
}

absl::StatusOr<std::optional<std::string>> Storage::Get(Cf cf, std::string_view key) {
  std::string value;
  rocksdb::Status s =
      rep_->db->Get(rocksdb::ReadOptions(), rep_->handles[static_cast<int>(cf)], key, &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return FromRocks(s, "get");
  return std::optional<std::string>(std::move(value));
}

absl::StatusOr<std::vector<std::optional<std::string>>> Storage::MultiGet(
    Cf cf, const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out(keys.size());
  if (keys.empty()) return out;
  std::vector<rocksdb::Slice> slices;
  slices.reserve(keys.size());
  for (const auto& k : keys) slices.emplace_back(k.data(), k.size());
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> statuses(keys.size());
  rep_->db->MultiGet(rocksdb::ReadOptions(), rep_->handles[static_cast<int>(cf)], keys.size(),
                     slices.data(), values.data(), statuses.data());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (statuses[i].IsNotFound()) continue;
    if (!statuses[i].ok()) return FromRocks(statuses[i], "multiget");
    out[i].emplace(values[i].data(), values[i].size());
  }
  return out;
}

absl::Status Storage::Scan(Cf cf, std::string_view begin, std::string_view end,
                           const std::function<bool(std::string_view, std::string_view)>& fn) {
  rocksdb::ReadOptions ro;
  rocksdb::Slice upper(end.data(), end.size());
  if (!end.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(
      rep_->db->NewIterator(ro, rep_->handles[static_cast<int>(cf)]));
  for (it->Seek(rocksdb::Slice(begin.data(), begin.size())); it->Valid(); it->Next()) {
    if (!fn(std::string_view(it->key().data(), it->key().size()),
            std::string_view(it->value().data(), it->value().size()))) {
      break;
    }
  }
  return FromRocks(it->status(), "scan");
}

absl::StatusOr<std::optional<std::string>> Storage::LastKey(Cf cf, std::string_view begin,
                                                            std::string_view end) {
  rocksdb::ReadOptions ro;
  rocksdb::Slice lower(begin.data(), begin.size());
  ro.iterate_lower_bound = &lower;
  std::unique_ptr<rocksdb::Iterator> it(
      rep_->db->NewIterator(ro, rep_->handles[static_cast<int>(cf)]));
  it->SeekForPrev(rocksdb::Slice(end.data(), end.size()));
  if (it->Valid() && it->key().compare(rocksdb::Slice(end.data(), end.size())) >= 0) it->Prev();
  if (!it->status().ok()) return FromRocks(it->status(), "seek");
  if (!it->Valid()) return std::optional<std::string>();
  return std::optional<std::string>(it->key().ToString());
}

absl::Status Storage::SyncWal() { return SyncThrough(Ticket()); }

std::string EncodeU64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i) {
    s[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return s;
}

uint64_t DecodeU64(std::string_view s) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < s.size(); ++i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

std::string SeqKey(std::string_view prefix, uint64_t n) {
  std::string k(prefix);
  k.push_back('\0');
  k += EncodeU64(n);
  return k;
}

std::string SeqKeyEnd(std::string_view prefix) {
  std::string k(prefix);
  k.push_back('\x01');
  return k;
}

}  // namespace fwai
