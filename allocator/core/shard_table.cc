#include "graphalloc/allocator/core/shard_table.h"

namespace graphalloc {

ShardTable::~ShardTable() {
  ForEach([](StreamShard* shard) { delete shard; });
}

StreamShard* ShardTable::Find(PoolId pool, Stream stream) const {
  StreamShard* found = nullptr;
  ForEach([&](StreamShard* s) {
    if (found == nullptr && s->key_stream.load(std::memory_order_acquire) == stream &&
        s->key_pool.load(std::memory_order_acquire) == pool) {
      found = s;
    }
  });
  return found;
}

StreamShard* ShardTable::Add(PoolId pool, Stream stream, PoolState* state) {
  if (!retired_.empty()) {
    // A shard of a released pool: empty, and unknown to every lookup until re-keyed here.
    StreamShard* found = retired_.back();
    retired_.pop_back();
    SpinLockHolder shard_lock(&found->mu);
    found->stream = stream;
    found->pool = state;
    found->key_stream.store(stream, std::memory_order_release);
    found->key_pool.store(pool, std::memory_order_release);
    return found;
  }
  const std::size_t n = count_.load(std::memory_order_relaxed);
  if (n == kMaxShards) return nullptr;
  auto* shard = new StreamShard(stream, state);
  shards_[n].store(shard, std::memory_order_release);
  count_.store(n + 1, std::memory_order_release);
  return shard;
}

void ShardTable::Retire(StreamShard* shard) {
  shard->key_pool.store(kRetiredPool, std::memory_order_release);
  shard->generation.fetch_add(1, std::memory_order_acq_rel);
  shard->pool = nullptr;
  retired_.push_back(shard);
}

PoolShardsLock::PoolShardsLock(const ShardTable& table, PoolId pool,
                               Mutex& device_mu) ABSL_NO_THREAD_SAFETY_ANALYSIS : device_mu_(device_mu) {
  table.ForEach([&](StreamShard* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (s->key_pool.load(std::memory_order_acquire) != pool) return;
    s->mu.Lock();
    // Re-keyed between the check and the lock: not ours after all.
    if (s->pool == nullptr || s->pool->id != pool) {
      s->mu.Unlock();
      return;
    }
    shards_.push_back(s);
  });
  device_mu_.Lock();
}

PoolShardsLock::~PoolShardsLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  device_mu_.Unlock();
  for (StreamShard* shard : shards_) shard->mu.Unlock();
}

}  // namespace graphalloc
