// Locks with Abseil's thread-safety annotations, on the standard library's primitives.
//
// Why not absl::Mutex: Debian's Abseil is a prebuilt shared library that ThreadSanitizer cannot see into,
// so every lock taken through it is invisible to TSan and the suite drowns in false reports. std::mutex
// goes through pthread, which TSan intercepts; SpinLock is plain std::atomic, which TSan understands.
#ifndef GRAPHALLOC_ALLOCATOR_BASE_MUTEX_H_
#define GRAPHALLOC_ALLOCATOR_BASE_MUTEX_H_

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace graphalloc {

// A general-purpose mutex (std::mutex), for locks that may be held across longer work or contended.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // For annotation only: documents (to the analysis) that the caller holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  std::mutex mu_;
};

// A test-and-test-and-set spin lock for very short, rarely contended critical sections (the allocator's
// per-stream hot path): taking it uncontended is one atomic exchange, releasing it one store.
class ABSL_LOCKABLE SpinLock {
 public:
  SpinLock() = default;
  SpinLock(const SpinLock&) = delete;
  SpinLock& operator=(const SpinLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      int spins = 0;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        } else {
          std::this_thread::yield();
          spins = 0;
        }
      }
    }
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  std::atomic<bool> locked_{false};
};

// Scoped holders, as absl::MutexLock.
template <typename Lockable>
class ABSL_SCOPED_LOCKABLE ScopedLock {
 public:
  explicit ScopedLock(Lockable* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~ScopedLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  ScopedLock(const ScopedLock&) = delete;
  ScopedLock& operator=(const ScopedLock&) = delete;

 private:
  Lockable* const mu_;
};
using MutexLock = ScopedLock<Mutex>;
using SpinLockHolder = ScopedLock<SpinLock>;

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_BASE_MUTEX_H_
