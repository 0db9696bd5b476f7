// fwai's locks: std::mutex, std::shared_mutex and std::condition_variable
// wrapped as capabilities that clang's thread-safety analysis understands
// (scripts/thread-safety), with absl::Mutex's method names.
//
// Every lock in server/, common/ and client/ is one of these, and every
// member a lock protects is declared ABSL_GUARDED_BY(that lock); a function
// that expects its caller to hold a lock says ABSL_EXCLUSIVE_LOCKS_REQUIRED.
// Reading or writing a guarded member without its lock then fails the
// build's thread-safety check instead of racing at run time.
//
// They are thin: a Mutex is a std::mutex (a pthread mutex), so
// ThreadSanitizer (scripts/tsan) sees every acquire and release, which it
// cannot for the uninstrumented absl::Mutex of a distribution's package.
//
//   fwai::Mutex mu_;
//   int n_ ABSL_GUARDED_BY(mu_) = 0;
//   fwai::CondVar changed_;
//
//   void Add() {
//     fwai::MutexLock lock(&mu_);
//     ++n_;
//     changed_.SignalAll();
//   }
//   void AwaitPositive() {
//     fwai::MutexLock lock(&mu_);
//     while (n_ <= 0) changed_.Wait(&mu_);
//   }
//
// Waits are written as loops over the condition (as above), not with a
// predicate lambda: the analysis cannot see that a lambda runs under the
// lock, so the loop keeps the guarded reads checked.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace fwai {

class CondVar;

// An exclusive lock. Not recursive: locking a Mutex the thread already holds
// deadlocks.
class ABSL_LOCKABLE Mutex {
 public:
  constexpr Mutex() noexcept = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Takes the lock if it is free; returns whether it did.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis that the lock is held here (no run-time check).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// A lock many readers may share, or one writer hold.
class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex for its scope. Unlock() and Lock() let a scope give the lock
// up for a while (a call out, a slow write) and take it back; the destructor
// releases it only if it is held.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// Holds a SharedMutex exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~WriterMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds a SharedMutex shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// A condition variable for a Mutex. Spurious wake-ups happen: wait in a loop
// over the condition. Timeouts are on the monotonic clock.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases mu, waits for a signal, and takes mu back.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait, for at most `timeout`; returns true if it timed out.
  bool WaitWithTimeout(Mutex* mu, std::chrono::steady_clock::duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitWithDeadline(mu, std::chrono::steady_clock::now() + timeout);
  }
  // As Wait, until `deadline`; returns true if the deadline passed.
  bool WaitWithDeadline(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool timed_out = cv_.wait_until(lock, deadline) == std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace fwai
