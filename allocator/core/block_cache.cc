#include "graphalloc/allocator/core/block_cache.h"

#include "absl/base/attributes.h"
#include "graphalloc/allocator/core/size_policy.h"

namespace graphalloc {
namespace {

// In a handle-aligned segment two mapped blocks never merge across a chunk's edge (block.h); the lookup
// is for such segments only, so that other segments pay one predictable branch. `src` is the next block
// of a run walked from `dst` (either way), so the edge it would cross is its own side facing `dst`.
bool CrossesChunkEdge(const Block* dst, const Block* src) {
  const Segment* s = dst->segment;
  if (!s->handle_aligned || !dst->mapped) [[likely]]
    return false;
  return s->vmm->ChunkStartsAt(src->ptr < dst->ptr ? src->end() : src->ptr);
}

bool Mergeable(const Block* dst, const Block* src) {
  return src != nullptr && !src->allocated && src->event_count == 0 && src->stream_uses.empty() &&
         src->mapped == dst->mapped && !src->in_flight && !CrossesChunkEdge(dst, src);
}

}  // namespace

// The steps of an allocation and a free below are functions of their own to be read one at a time, and some
// are called from other files too; here they are inlined into the hot path (HOT), which saves a call per
// step: a few percent of a churn operation (bench/allocator_bench), whose steps are each a few
// nanoseconds. Callers in other files still call the out-of-line copy.
// GCC inlines them here as asked, keeps the out-of-line copies, and warns that it might not (-Wattributes).
#define HOT ABSL_ATTRIBUTE_ALWAYS_INLINE
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
#endif

BlockCache::BlockCache(const Config& config, HistoryRing& history)
    : max_split_size_(config.max_split_size),
      max_non_split_rounding_size_(config.max_non_split_rounding_size),
      track_free_age_(config.garbage_collection_threshold > 0.0),
      history_(history) {}

// ---- Allocation. ----

DevicePtr BlockCache::Allocate(StreamShard& shard, const AllocationRequest& request) {
  BlockPool& pool = shard.PoolFor(request.size);
  Block* parked = shard.quick.Peek(request.size, &pool);
  FreeRun run;
  if (parked != nullptr && QuickHitIsBestFit(shard, pool, parked, request.size, &run)) {
    return HandOutParked(shard, pool, parked, run, request);
  }
  // Best fit must see every free block: parked ones of other sizes go back to the index first.
  return AllocateBestFit(shard, request);
}

DevicePtr BlockCache::AllocateBestFit(StreamShard& shard, const AllocationRequest& request) {
  FlushQuickCache(shard);
  BlockPool& pool = shard.PoolFor(request.size);
  Block* block = TakeFreeBlock(shard, pool, request.size);
  return block != nullptr ? FinishAllocation(shard, pool, block, request) : 0;
}

HOT Block* BlockCache::TakeFreeBlock(StreamShard& shard, BlockPool& pool, std::size_t size) {
  ++pool.free_block_lookups;
  auto it = pool.LowerBound(size);
  if (it == pool.blocks.end()) return nullptr;
  // The block's pointer-map entry is written once the block is allocated: start loading it now, so that
  // its cache miss overlaps the ones on the block and its neighbour.
  shard.allocated.Prefetch(it->ptr);
  Block* block = it->block;
  // Expandable segments' blocks always serve (they split off any rest: PyTorch's rule too).
  if (!block->segment->expandable && !Serves(size, block->size)) return nullptr;
  pool.blocks.Erase(it);
  return block;
}

bool BlockCache::Serves(std::size_t size, std::size_t block_size) const {
  // Oversize blocks serve only oversize requests, and those only when the waste stays bounded.
  if (size < max_split_size_) return block_size < max_split_size_;
  return block_size < size + max_non_split_rounding_size_;
}

bool BlockCache::SplitsRest(const StreamShard& shard, bool small, bool expandable, std::size_t size,
                            std::size_t rest) const {
  // Large blocks keep remainders of up to 1 MiB (internal fragmentation beats unusable slivers); oversize
  // blocks are never split. Expandable segments split any remainder: their free space is contiguous and
  // merges back. A no_split pool never splits.
  if (shard.pool != nullptr && shard.pool->options.no_split) return false;
  if (small || expandable) return rest >= kMinBlockSize;
  return size < max_split_size_ && rest > kSmallSize;
}

HOT DevicePtr BlockCache::FinishAllocation(StreamShard& shard, BlockPool& pool, Block* block,
                                           const AllocationRequest& request) {
  const bool small = pool.is_small;
  const bool expandable = block->segment->expandable;
  const std::size_t rest = block->size - request.size;
  const bool split = SplitsRest(shard, small, expandable, request.size, rest);
  const bool was_split = block->IsSplit();
  if (split) {
    Block* free_rest = SplitOff(shard, block, block->ptr + request.size);
    free_rest->gc_count_base = pool.free_block_lookups;
    pool.Insert(free_rest);
  }
  if (!expandable) {  // inactive_split excludes expandable blocks
    shard.NotePeak(stat_events::FreeBlockTaken(shard.stats, small, was_split,
                                               static_cast<std::int64_t>(block->size),
                                               split ? static_cast<std::int64_t>(rest) : 0));
  }
  return MarkAllocated(shard, block, small, request);
}

bool BlockCache::QuickHitIsBestFit(StreamShard& shard, BlockPool& pool, const Block* block, std::size_t size,
                                   FreeRun* run) {
  // Best fit would see `block` merged with its free neighbours into one block M, choose the smallest free
  // block that fits (lowest address among equals) and split it. Handing out `block` itself gives exactly
  // that layout when it is the only parked block (so every other free block has its coalesced size), M
  // starts at `block`, nothing smaller than M fits, and M would be split right after `block` (or is
  // `block`). Anything else goes the long way, through the coalesced layout, so decisions stay PyTorch's.
  if (shard.quick.size() != 1 || Mergeable(block, block->prev)) return false;
  // The one walk of the run: M's extent here, and the statistics' run.
  std::size_t rest = 0;
  std::size_t run_blocks = 0;  // all indexed: `block` is the only parked block
  const Block* run_end = block->next;
  for (; run_end != nullptr && Mergeable(block, run_end); run_end = run_end->next) {
    rest += run_end->size;
    ++run_blocks;
  }
  const std::size_t merged = size + rest;
  if (size < max_split_size_ && merged >= max_split_size_) return false;
  if (size >= max_split_size_ && rest != 0) return false;  // oversize blocks are never split
  // A large block keeps a rest of up to 1 MiB inside, unless it is in an expandable segment, whose blocks
  // split off any rest (FinishAllocation).
  if (rest != 0 && !pool.is_small && !block->segment->expandable && rest <= kSmallSize) return false;
  *run = FreeRun{0, static_cast<std::int64_t>(block->size), static_cast<std::int64_t>(rest),
                 block->prev == nullptr && run_end == nullptr};
  // Nothing else can compete when every indexed block is part of M, or none is large enough: both are
  // O(1) to see, and common when a stream reuses one size in a loop (the search below costs more).
  if (pool.blocks.size() == run_blocks || pool.blocks.LargestSize() < size) return true;
  // The smallest indexed block that fits, skipping the ones that are part of M (they follow `block`).
  for (auto it = pool.LowerBound(size); it != pool.blocks.end(); ++it) {
    if (it->ptr > block->ptr && it->ptr < block->ptr + merged) continue;
    return it->size > merged || (it->size == merged && it->ptr > block->ptr);
  }
  return true;
}

DevicePtr BlockCache::HandOutParked(StreamShard& shard, BlockPool& pool, Block* block, const FreeRun& run,
                                    const AllocationRequest& request) {
  shard.quick.Remove(block);
  if (!block->segment->expandable)
    shard.NotePeak(stat_events::FreeRunChanged(shard.stats, pool.is_small, run, /*joining=*/false));
  return MarkAllocated(shard, block, pool.is_small, request);
}

HOT DevicePtr BlockCache::MarkAllocated(StreamShard& shard, Block* block, bool small,
                                        const AllocationRequest& request) {
  block->allocated = true;
  block->requested_size = request.requested;
  if (!block->in_pointer_map) shard.AddToPointerMap(block);  // a parked block kept its entry
  const stat_events::BlockFigures figures = FiguresOf(block, small);
  if (shard.pool != nullptr) shard.pool->AddAllocated(figures.bytes, 1);
  shard.NotePeak(stat_events::BlockAllocated(shard.stats, figures));
  RecordBlockEvent(history_, HistoryAction::kAlloc, block);
  return block->ptr;
}

// ---- Freeing. ----

void BlockCache::Free(StreamShard& shard, Block* block) {
  // The pointer-map entry goes in InsertFree, unless the block is parked (stream_shard.h).
  block->allocated = false;
  CountFreed(shard, block);
  Release(shard, block);
}

HOT void BlockCache::CountFreed(StreamShard& shard, const Block* block, bool live_block_gone) {
  const stat_events::BlockFigures figures = FiguresOf(block, block->segment->pool->is_small);
  if (shard.pool != nullptr) shard.pool->AddAllocated(-figures.bytes, live_block_gone ? -1 : 0);
  stat_events::BlockFreed(shard.stats, figures);
}

void BlockCache::UndoCountFreed(StreamShard& shard, const Block* block) {
  const stat_events::BlockFigures figures = FiguresOf(block, block->segment->pool->is_small);
  if (shard.pool != nullptr) shard.pool->AddAllocated(figures.bytes, 0);
  stat_events::BlockFreeUndone(shard.stats, figures);
}

HOT void BlockCache::Release(StreamShard& shard, Block* block) {
  RecordBlockEvent(history_, HistoryAction::kFreeCompleted, block);
  block->requested_size = 0;  // kept while the free was pending, for the event above
  stat_events::BlockReleased(shard.stats, block->segment->pool->is_small,
                             static_cast<std::int64_t>(block->size));
  InsertFree(shard, block);
}

HOT void BlockCache::InsertFree(StreamShard& shard, Block* block) {
  BlockPool& pool = *block->segment->pool;
  // Only garbage collection reads the age (which shares its word with the requested size).
  if (track_free_age_) block->gc_count_base = pool.free_block_lookups;
  if (shard.quick.Push(block, &pool)) {
    // Parked without merging; statistics count its free run as if it were merged.
    if (!block->segment->expandable) {
      shard.NotePeak(
          stat_events::FreeRunChanged(shard.stats, pool.is_small, WalkFreeRun(block), /*joining=*/true));
    }
    return;
  }
  shard.RemoveFromPointerMap(block);  // before merging moves its address
  // Merging must see neighbours as they would be: parked blocks merge first. `block` is in neither free
  // list yet, so it is held out of that flush (as if still allocated) and merges below, with the stats.
  block->allocated = true;
  FlushQuickCache(shard);
  block->allocated = false;
  std::int64_t merged = 0;
  std::int64_t merged_bytes = 0;
  for (Block* neighbour : {block->prev, block->next}) {
    const std::size_t absorbed = neighbour != nullptr ? neighbour->size : 0;
    if (TryMerge(shard, block, neighbour, pool)) {
      ++merged;
      merged_bytes += static_cast<std::int64_t>(absorbed);
    }
  }
  if (!block->segment->expandable) {  // no inactive_split accounting for expandable segments (as PyTorch)
    shard.NotePeak(stat_events::FreeBlockCoalesced(shard.stats, pool.is_small, merged, merged_bytes,
                                                   block->IsSplit(), static_cast<std::int64_t>(block->size)));
  }
  pool.Insert(block);
}

HOT bool BlockCache::TryMerge(StreamShard& shard, Block* dst, Block* src, BlockPool& pool) {
  if (!Mergeable(dst, src)) return false;
  if (src->in_quick) {
    shard.quick.Remove(src);
    shard.RemoveFromPointerMap(src);
  } else if (!src->mapped) {
    pool.unmapped.erase(src->ptr);
  } else {
    pool.Erase(src);
  }
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) dst->prev->next = dst;
    if (dst->segment->head == src) dst->segment->head = dst;
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  dst->size += src->size;
  shard.arena.Delete(src);
  return true;
}

void BlockCache::FlushQuickCache(StreamShard& shard) {
  // Statistics already count parked blocks as merged with their free neighbours: merging them now changes
  // the layout, not the numbers.
  shard.quick.Drain([&](Block* b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    shard.RemoveFromPointerMap(b);
    BlockPool& pool = *b->segment->pool;
    // A run may alternate parked and indexed blocks: absorb neighbours until none is free.
    while (TryMerge(shard, b, b->prev, pool)) {
    }
    while (TryMerge(shard, b, b->next, pool)) {
    }
    pool.Insert(b);
  });
}

BlockCache::FreeRun BlockCache::WalkFreeRun(const Block* block) {
  FreeRun run;
  run.block_bytes = static_cast<std::int64_t>(block->size);
  const Block* p = block->prev;
  for (; p != nullptr && Mergeable(block, p); p = p->prev)
    run.left_bytes += static_cast<std::int64_t>(p->size);
  const Block* n = block->next;
  for (; n != nullptr && Mergeable(block, n); n = n->next)
    run.right_bytes += static_cast<std::int64_t>(n->size);
  run.whole_segment = p == nullptr && n == nullptr;
  return run;
}

// ---- Carving. ----

HOT Block* BlockCache::SplitOff(StreamShard& shard, Block* b, DevicePtr at) {
  Block* r = shard.arena.New();
  r->ptr = at;
  r->size = b->end() - at;
  r->segment = b->segment;
  r->mapped = b->mapped;
  r->in_flight = b->in_flight;
  r->gc_count_base = b->gc_count_base;
  r->prev = b;
  r->next = b->next;
  if (r->next != nullptr) r->next->prev = r;
  b->next = r;
  b->size = at - b->ptr;
  return r;
}

Block* BlockCache::CarveRange(StreamShard& shard, Block* b, DevicePtr begin, DevicePtr end) {
  BlockPool& pool = *b->segment->pool;
  pool.Erase(b);
  if (end < b->end()) pool.Insert(SplitOff(shard, b, end));
  Block* mid = b;
  if (begin > b->ptr) {
    mid = SplitOff(shard, b, begin);
    pool.Insert(b);
  }
  mid->in_flight = true;
  return mid;
}

void BlockCache::ReturnToIndex(StreamShard& shard, Block* b) {
  BlockPool& pool = *b->segment->pool;
  // A neighbour may be parked in the quick cache next to an indexed block (another thread freed it while
  // the lock was released for driver calls): keep absorbing until no free neighbour is left.
  while (TryMerge(shard, b, b->prev, pool)) {
  }
  while (TryMerge(shard, b, b->next, pool)) {
  }
  if (b->mapped) {
    b->gc_count_base = pool.free_block_lookups;
    pool.Insert(b);
  } else {
    pool.unmapped.emplace(b->ptr, b);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef HOT

}  // namespace graphalloc
