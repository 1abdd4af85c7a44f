// The stream shards of one allocator, and the one way to lock all of them at once.
//
// A shard is created on the first allocation of its (pool, stream), never removed before the allocator
// goes, and read without a lock (appended to an array of atomics); the shard of a released private pool is
// kept aside (retired) and re-keyed for the next new (pool, stream). Creation order is the lock order.
// AllShardsLock freezes the set (no shard is created meanwhile) and locks every shard in that order, for
// the operations that must see every shard coherently (release, snapshot, invariant checks, ...).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_SHARD_TABLE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_SHARD_TABLE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {

class ShardTable {
 public:
  // (pool, stream) pairs served at once; shards of released pools are reused.
  static constexpr std::size_t kMaxShards = 4096;

  ShardTable() = default;
  // Deletes every shard (the allocator has returned their memory by then).
  ~ShardTable();
  ShardTable(const ShardTable&) = delete;
  ShardTable& operator=(const ShardTable&) = delete;

  // Runs f(shard) on each shard in creation order (the lock order), without locking it.
  template <typename F>
  void ForEach(F f) const {
    const std::size_t n = count_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < n; ++i) f(shards_[i].load(std::memory_order_acquire));
  }
  // The existing shard of (`pool`, `stream`) or nullptr; never creates one.
  StreamShard* Find(PoolId pool, Stream stream) const;
  // A shard for (`pool`, `stream`), whose pool's state is `state` (nullptr: the default pool): a retired
  // one re-keyed, else a new one; nullptr past kMaxShards. The caller found none under the set lock.
  StreamShard* Add(PoolId pool, Stream stream, PoolState* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(set_mu_);
  // Puts aside the shard of a released pool (empty, its lock held by the caller): unknown to every lookup
  // until Add() re-keys it.
  void Retire(StreamShard* shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(set_mu_);

  // Held across every all-shards sequence and while a shard is created or re-keyed. Lock order: this, then
  // shards (in creation order), then the allocator's device lock.
  Mutex& set_mu() const ABSL_LOCK_RETURNED(set_mu_) { return set_mu_; }

 private:
  std::array<std::atomic<StreamShard*>, kMaxShards> shards_{};
  std::atomic<std::size_t> count_{0};
  mutable Mutex set_mu_;
  std::vector<StreamShard*> retired_ ABSL_GUARDED_BY(set_mu_);
};

// Locks the shard set, then every shard in creation order, then (with `device_mu`) the device lock; unlocks
// all of them when it goes. Not movable: one scope, one set of shards.
class ABSL_SCOPED_LOCKABLE AllShardsLock {
 public:
  explicit AllShardsLock(const ShardTable& table) ABSL_EXCLUSIVE_LOCK_FUNCTION(table.set_mu())
      : table_(table), device_mu_(nullptr) {
    LockShards();
  }
  AllShardsLock(const ShardTable& table, Mutex& device_mu)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(table.set_mu(), device_mu)
      : table_(table), device_mu_(&device_mu) {
    LockShards();
    device_mu_->Lock();
  }
  ~AllShardsLock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (device_mu_ != nullptr) device_mu_->Unlock();
    table_.ForEach([](StreamShard* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { s->mu.Unlock(); });
    table_.set_mu().Unlock();
  }
  AllShardsLock(const AllShardsLock&) = delete;
  AllShardsLock& operator=(const AllShardsLock&) = delete;

  // Runs f(shard) on each shard (all locked by this), in creation order.
  template <typename F>
  void ForEach(F f) const {
    table_.ForEach(f);
  }

 private:
  void LockShards() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    table_.set_mu().Lock();  // no shard is created until the destructor unlocks it
    table_.ForEach([](StreamShard* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { s->mu.Lock(); });
  }

  const ShardTable& table_;
  Mutex* const device_mu_;
};

// Locks the shards of one private pool (in creation order), then the device lock; unlocks all of them when
// it goes. For the operations on one pool (checkpoint, restore), which need not stop every other stream.
class ABSL_SCOPED_LOCKABLE PoolShardsLock {
 public:
  PoolShardsLock(const ShardTable& table, PoolId pool, Mutex& device_mu)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(device_mu);
  ~PoolShardsLock() ABSL_UNLOCK_FUNCTION();
  PoolShardsLock(const PoolShardsLock&) = delete;
  PoolShardsLock& operator=(const PoolShardsLock&) = delete;

  // The pool's shards, all locked by this.
  const std::vector<StreamShard*>& shards() const { return shards_; }
  // Whether `shard` is one of them.
  bool Holds(const StreamShard* shard) const {
    return std::find(shards_.begin(), shards_.end(), shard) != shards_.end();
  }

 private:
  std::vector<StreamShard*> shards_;
  Mutex& device_mu_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_SHARD_TABLE_H_
