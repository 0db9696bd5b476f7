// held_sync_fs: a RocksDB file system for tests whose write-ahead log syncs
// can be held, as on a slow disk.
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/storage/storage.h"

namespace fwai {

// A file system whose log syncs can be held: a sync of a write-ahead log
// (*.log) waits while `hold` is set, as on a slow disk.
class HeldSyncFs : public rocksdb::FileSystemWrapper {
 public:
  HeldSyncFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "HeldSyncFs"; }

  void Hold(bool hold) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hold_ = hold;
    }
    cv_.notify_all();
  }
  // Waits until a log sync is being held; false after 60 s.
  bool WaitForHeldSync() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return held_ > 0; });
  }
  int syncs() {
    std::lock_guard<std::mutex> lock(mu_);
    return syncs_;
  }
  // While set, a log sync fails as a disk error would.
  void FailSyncs(bool fail) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = fail;
  }

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* file,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, file, dbg);
    if (s.ok() && name.size() > 4 && name.substr(name.size() - 4) == ".log") {
      *file = std::make_unique<Log>(std::move(*file), this);
    }
    return s;
  }

 private:
  class Log : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    Log(std::unique_ptr<rocksdb::FSWritableFile> f, HeldSyncFs* fs)
        : FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (!fs_->Wait()) return rocksdb::IOStatus::IOError("log sync failed (simulated)");
      return FSWritableFileOwnerWrapper::Sync(o, d);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* d) override {
      if (!fs_->Wait()) return rocksdb::IOStatus::IOError("log sync failed (simulated)");
      return FSWritableFileOwnerWrapper::Fsync(o, d);
    }

   private:
    HeldSyncFs* fs_;
  };

  // False: the sync fails.
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++syncs_;
    ++held_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_; });
    --held_;
    return !fail_;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  bool fail_ = false;
  int held_ = 0;
  int syncs_ = 0;
};

// A store on a HeldSyncFs: `fs` holds or fails its log syncs.
struct HeldStore {
  std::shared_ptr<HeldSyncFs> fs = std::make_shared<HeldSyncFs>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  absl::StatusOr<std::unique_ptr<Storage>> Open(const std::string& dir) {
    StorageOptions options;
    options.env = env.get();
    return Storage::Open(dir, options);
  }
};

}  // namespace fwai
