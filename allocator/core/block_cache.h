// The cached blocks of a shard, and everything done to them under the shard's lock: best fit, the quick
// cache, splitting and coalescing, and the statistics those move. The allocator's hot path is here: a
// cache hit is Allocate(), a free that needs no stream event is Free().
//
// PyTorch's rules: a request takes the smallest free block that fits (lowest address among equals), split
// when the rest is worth keeping apart (any rest in the small pool and in expandable segments, more than
// 1 MiB in the large pool, never for oversize blocks); a freed block merges with its free neighbours. The
// quick cache (quick_cache.h) parks a freed block unmerged and hands it back only when that is exactly
// what best fit over the merged layout would do, so every decision stays PyTorch's.
//
// Stateless apart from the configuration it was built with: every method works on the shard it is given,
// whose lock the caller holds.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_BLOCK_CACHE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_BLOCK_CACHE_H_

#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "graphalloc/allocator/core/allocation_request.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/core/stream_shard.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "graphalloc/allocator/stats/stat_events.h"

namespace graphalloc {

// Records a block event when history is on. The check comes first so that, with history off, nothing of
// the block or its segment (which has the block's stream) is read. Block events carry the caller's
// requested size, as PyTorch's trace entries do (the block's rounded size is in the snapshot's blocks).
inline void RecordBlockEvent(HistoryRing& history, HistoryAction action, const Block* block) {
  if (!history.enabled()) return;
  history.Record(action, block->ptr, block->requested_size, static_cast<std::uint64_t>(block->stream()), 0);
}

class BlockCache {
 public:
  BlockCache(const Config& config, HistoryRing& history);

  // ---- Allocation. ----
  // Serves `request` from the shard's free blocks (a parked block when that is best fit, else best fit
  // over the coalesced layout); 0 when none fits.
  DevicePtr Allocate(StreamShard& shard, const AllocationRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Best fit over the coalesced layout (the quick cache flushed first); 0 when none fits.
  DevicePtr AllocateBestFit(StreamShard& shard, const AllocationRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Hands out `block` (out of every index, free, at least request.size) for `request`, split when the
  // rules say so; a new segment's first block comes here too.
  DevicePtr FinishAllocation(StreamShard& shard, BlockPool& pool, Block* block,
                             const AllocationRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  // ---- Freeing. ----
  // A block its owner frees, used on no other stream: free for reuse at once.
  void Free(StreamShard& shard, Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Statistics of a block its owner freed (it may stay active, waiting on stream events). With
  // `live_block_gone` false the pool still counts it among its live blocks (PoolStats::live_blocks: it has
  // not left the pointer map yet).
  void CountFreed(StreamShard& shard, const Block* block, bool live_block_gone = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Undoes CountFreed(..., false) for a free that failed: the owner keeps the block, as if never freed.
  void UndoCountFreed(StreamShard& shard, const Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // A block that stopped being active goes back: merged into the index, or parked in the quick cache when
  // merging would not change it.
  void Release(StreamShard& shard, Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Merges every parked block with its free neighbours into the index: the coalesced layout, which every
  // decision but a quick hit needs.
  void FlushQuickCache(StreamShard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  // ---- Carving (expandable growth and release, restore). ----
  // Splits `b` at `at`: `b` keeps [ptr, at), the returned new block gets [at, end) with b's state.
  Block* SplitOff(StreamShard& shard, Block* b, DevicePtr at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Takes [begin, end) out of the free block `b` (indexed) as an in-flight block; the rest stays free.
  Block* CarveRange(StreamShard& shard, Block* b, DevicePtr begin, DevicePtr end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // A block out of every index (in flight or just mapped/unmapped) goes back: merged with neighbours of
  // its mapped state, into the free index or the unmapped index.
  void ReturnToIndex(StreamShard& shard, Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  // The block as the statistics see it (stat_events.h).
  stat_events::BlockFigures FiguresOf(const Block* block, bool small) const {
    return {small, static_cast<std::int64_t>(block->size), static_cast<std::int64_t>(block->requested_size),
            block->size >= max_split_size_};
  }

 private:
  using FreeRun = stat_events::FreeRunFigures;

  // A free block of `pool` that best fit gives `size` (taken out of the index), or nullptr.
  Block* TakeFreeBlock(StreamShard& shard, BlockPool& pool, std::size_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // True when handing out the parked `block` for `size` is exactly what best fit would do; then `run` is
  // the block's run of free neighbours, from the same walk, for the statistics.
  bool QuickHitIsBestFit(StreamShard& shard, BlockPool& pool, const Block* block, std::size_t size,
                         FreeRun* run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  DevicePtr HandOutParked(StreamShard& shard, BlockPool& pool, Block* block, const FreeRun& run,
                          const AllocationRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Whether a free block of `block_size` serves a request of `size` (oversize rules) and, taken, is split.
  bool Serves(std::size_t size, std::size_t block_size) const;
  bool SplitsRest(const StreamShard& shard, bool small, bool expandable, std::size_t size,
                  std::size_t rest) const;
  // The last step of every allocation: allocated, in the pointer map, counted, recorded.
  DevicePtr MarkAllocated(StreamShard& shard, Block* block, bool small, const AllocationRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  void InsertFree(StreamShard& shard, Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  bool TryMerge(StreamShard& shard, Block* dst, Block* src, BlockPool& pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // The free neighbours coalescing would merge with `block`.
  static FreeRun WalkFreeRun(const Block* block);

  const std::size_t max_split_size_;
  const std::size_t max_non_split_rounding_size_;
  const bool track_free_age_;  // garbage collection is on: blocks remember when they became free
  HistoryRing& history_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_BLOCK_CACHE_H_
