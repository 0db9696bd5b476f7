// scripts/thread-safety's own check: each function below breaks a lock rule
// the analysis must catch. The script compiles this file first and fails if
// the compiler does not report every marked line (a check that cannot fail
// proves nothing).
#include "common/mutex.h"

namespace fwai {

class Counter {
 public:
  int ReadWithoutTheLock() {
    return n_;  // EXPECT: reading variable 'n_' requires holding mutex 'mu_'
  }

  void WriteAfterGivingItUp() {
    MutexLock lock(&mu_);
    lock.Unlock();
    ++n_;  // EXPECT: writing variable 'n_' requires holding mutex 'mu_' exclusively
  }

  void CallAHelperThatNeedsTheLock() {
    Bump();  // EXPECT: calling function 'Bump' requires holding mutex 'mu_' exclusively
  }

  int WriteUnderAReaderLock() {
    ReaderMutexLock lock(&smu_);
    return ++shared_;  // EXPECT: writing variable 'shared_' requires holding mutex 'smu_'
  }

  void LeaveItLocked() { mu_.Lock(); }  // EXPECT: mutex 'mu_' is still held at the end of function

  void WaitWithoutTheLock() {
    ready_.Wait(&mu_);  // EXPECT: calling function 'Wait' requires holding mutex 'mu_' exclusively
  }

 private:
  void Bump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++n_; }

  Mutex mu_;
  CondVar ready_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
  SharedMutex smu_;
  int shared_ ABSL_GUARDED_BY(smu_) = 0;
};

}  // namespace fwai
