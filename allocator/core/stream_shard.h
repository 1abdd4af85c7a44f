// Everything the allocator keeps for one stream of one memory pool (the default pool or a private pool):
// its free blocks, its allocated blocks, its statistics and the stream events its freed blocks wait on,
// under one lock.
//
// Blocks are reused only by the stream they were allocated on, so streams share nothing on the hot path:
// threads working on different streams never touch the same lock or cache line.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_STREAM_SHARD_H_
#define GRAPHALLOC_ALLOCATOR_CORE_STREAM_SHARD_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/pointer_map.h"
#include "graphalloc/allocator/core/pool_state.h"
#include "graphalloc/allocator/core/quick_cache.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc {

// A stream event a freed block waits for (one per stream it was used on).
struct PendingEvent {
  Event event;
  Block* block;
  std::uint64_t id;  // unique per record: events are recycled, so (event, block) can repeat
};

struct alignas(64) StreamShard {
  StreamShard(Stream s, PoolState* p)
      : key_pool(p != nullptr ? p->id : kDefaultPool), key_stream(s), stream(s), pool(p) {}

  BlockPool& PoolFor(std::size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return IsSmall(rounded) ? small_pool : large_pool;
  }

  // The pointer map holds every allocated block. A block freed into the quick cache keeps its entry until
  // it leaves the cache other than by being handed out again (BlockCache): a cache hit, a free and the
  // allocation that takes the block back, then writes nothing to the map, which was a ninth of the pair's
  // instructions. Lookups therefore check Block::allocated.
  void AddToPointerMap(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    allocated.Insert(b->ptr, b);
    b->in_pointer_map = true;
  }
  void RemoveFromPointerMap(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!b->in_pointer_map) return;
    allocated.Erase(b->ptr);
    b->in_pointer_map = false;
  }

  // Identity, read without a lock by the allocator's shard lookup. It changes only when the shard of a
  // released private pool is reused for another (pool, stream), with no block left in it; `generation`
  // counts those changes so that cached lookups can tell.
  std::atomic<PoolId> key_pool;
  std::atomic<Stream> key_stream;
  std::atomic<std::uint64_t> generation{0};
  // The same identity for code that holds the lock (or owns a block of the shard).
  Stream stream;
  PoolState* pool;  // nullptr: the default pool

  mutable SpinLock mu;
  // Set (under `mu`) when a statistic went past its escrow grant; the allocator then folds the device's
  // peaks (CachingAllocator::SettlePeaks) once the lock is released, which clears it. Beside the lock: every
  // allocation and free reads it, and that line is in the cache already.
  std::atomic<bool> peak_over{false};
  BlockPool small_pool ABSL_GUARDED_BY(mu){true};
  BlockPool large_pool ABSL_GUARDED_BY(mu){false};
  QuickCache quick ABSL_GUARDED_BY(mu);
  BlockArena arena ABSL_GUARDED_BY(mu);
  PointerMap allocated ABSL_GUARDED_BY(mu);  // through AddToPointerMap and RemoveFromPointerMap only
  // Statistics of the blocks of this stream (allocation, active, inactive_split, ... - the per-block ones;
  // the per-segment ones live with the allocator). Each Stat's `peak` is this shard's escrow grant, not a
  // peak: the device's exact peaks are the allocator's PeakLedger's (peak_ledger.h).
  DeviceStats stats ABSL_GUARDED_BY(mu);
  void NotePeak(bool raised) {
    if (raised) [[unlikely]]
      peak_over.store(true, std::memory_order_relaxed);
  }
  std::size_t blocks_in_release ABSL_GUARDED_BY(mu) = 0;  // heads of segments being freed unlocked

  // Events recorded on other streams for blocks of this stream, per recorded stream, in record order.
  absl::flat_hash_map<Stream, std::deque<PendingEvent>> pending_events ABSL_GUARDED_BY(mu);
  std::vector<Event> idle_events ABSL_GUARDED_BY(mu);
  std::uint64_t next_pending_event_id ABSL_GUARDED_BY(mu) = 1;
  std::atomic<std::int64_t> pending_event_count{0};
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_STREAM_SHARD_H_
