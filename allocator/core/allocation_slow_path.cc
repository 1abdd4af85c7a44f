// The slow path: the retry ladder's steps (their order is retry_policy.cc's), new segments, releasing the
// cache under pressure, garbage collection and the out-of-memory report. Driver calls happen here, always
// with every lock released.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/retry_policy.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "graphalloc/allocator/snapshot/oom_report.h"

namespace graphalloc {
namespace {

// Puts the calling thread in relaxed capture mode for its lifetime, as PyTorch does around cudaMalloc
// during a capture: a new segment for a pool being captured into is legal, but a global-mode capture
// would refuse (and be invalidated by) the allocation call otherwise.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(Driver& driver) : driver_(driver) {
    absl::StatusOr<CaptureMode> previous = driver_.ExchangeCaptureMode(CaptureMode::kRelaxed);
    exchanged_ = previous.ok();
    if (exchanged_) previous_ = *previous;
  }
  ~RelaxedCaptureMode() {
    if (exchanged_) (void)driver_.ExchangeCaptureMode(previous_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  Driver& driver_;
  // Not std::optional: GCC 12 at -O1 wrongly reports its payload as maybe-uninitialized.
  bool exchanged_ = false;
  CaptureMode previous_ = CaptureMode::kGlobal;
};

}  // namespace

absl::StatusOr<DevicePtr> CachingAllocator::AllocateSlow(StreamShard& shard,
                                                         const AllocationRequest& request) {
  if (!captures_.underway()) return RunRetryLadder(shard, request, /*capturing=*/false);
  // Relaxed for the whole ladder: the report's device query as well as the new segment.
  RelaxedCaptureMode relaxed(*driver_);
  return RunRetryLadder(shard, request, /*capturing=*/true);
}

absl::StatusOr<DevicePtr> CachingAllocator::RunRetryLadder(StreamShard& shard,
                                                           const AllocationRequest& request, bool capturing) {
  const PoolId pool = shard.pool != nullptr ? shard.pool->id : kDefaultPool;
  auto new_segment = [&]() -> absl::StatusOr<DevicePtr> {
    {
      SpinLockHolder lock(&shard.mu);
      if (DevicePtr p = blocks_.AllocateBestFit(shard, request)) return p;
    }
    return NewSegmentFor(shard, request);
  };
  for (const RetryRung& rung : RetryPolicy::SlowPath(capturing)) {
    if (!RetryPolicy::Takes(rung.step, config_, shard.pool == nullptr)) continue;
    absl::StatusOr<std::size_t> freed = std::size_t{0};
    switch (rung.step) {
      case RetryStep::kCollectGarbage:
        freed = GarbageCollect();
        break;
      case RetryStep::kNewSegment:
        if (absl::StatusOr<DevicePtr> result = new_segment(); !result.ok() || *result != 0) return result;
        break;
      case RetryStep::kReleaseOversizeCached:
        freed = ReleaseCachedSegments(/*only_oversize=*/true, std::max(request.size, config_.max_split_size));
        break;
      case RetryStep::kReleaseAllCached:
        if (absl::Status s = SynchronizeAndFreeEvents(); !s.ok()) return s;
        freed = ReleaseCachedSegments(/*only_oversize=*/false, 0);
        break;
      case RetryStep::kOomPools:
        if (DevicePtr p = AllocateFromOomPools(request)) return p;
        break;
      case RetryStep::kReleaseHandleCache:
        (void)expandable_.ReleaseCachedHandles();
        break;
      case RetryStep::kReportOutOfMemory:
        return OutOfMemory(request, pool);
    }
    if (!freed.ok()) return freed.status();
    if (!RetryPolicy::RetriesAfter(rung, *freed)) continue;
    if (rung.counted) {
      MutexLock lock(&device_mu_);
      ++segments_.stats().num_alloc_retries;
    }
    if (absl::StatusOr<DevicePtr> result = new_segment(); !result.ok() || *result != 0) return result;
  }
  return absl::InternalError("the retry ladder ended without the out-of-memory report");
}

absl::StatusOr<DevicePtr> CachingAllocator::NewSegmentFor(StreamShard& shard,
                                                          const AllocationRequest& request) {
  // A no_split pool wants one segment per block, which expandable segments (one growing range) are not; a
  // pool with a segment source gets whole allocations from it, not pages to map.
  const bool regular_only =
      shard.pool != nullptr && (shard.pool->options.no_split || shard.pool->segment_source != nullptr);
  if (config_.expandable_segments && !regular_only) return expandable_.Allocate(shard, request);
  return AllocateSegment(shard, request);
}

absl::StatusOr<DevicePtr> CachingAllocator::AllocateSegment(StreamShard& shard,
                                                            const AllocationRequest& request) {
  const bool no_split = shard.pool != nullptr && shard.pool->options.no_split;
  const std::size_t segment_size =
      no_split ? RoundUp(request.size, kRoundLarge) : SegmentSizeFor(request.size, config_);
  {
    MutexLock lock(&device_mu_);
    const auto reserved = segments_.reserved_bytes();
    if (!budget_.BeginSegment(reserved, segment_size)) return DevicePtr{0};
  }
  const std::shared_ptr<SegmentSource> source = shard.pool != nullptr ? shard.pool->segment_source : nullptr;
  absl::StatusOr<DevicePtr> base =
      source != nullptr ? source->Allocate(segment_size, shard.stream) : driver_->MemAlloc(segment_size);
  if (base.ok() && *base == 0) base = absl::ResourceExhaustedError("the segment source returned no memory");
  // Before the segment's first block is handed out (a source's segments are not the allocator's mappings).
  if (base.ok() && source == nullptr) {
    hooks_.Map(shard.pool != nullptr ? shard.pool->id : kDefaultPool, *base, segment_size, PhysicalHandle{},
               false);
  }
  SpinLockHolder shard_lock(&shard.mu);
  BlockPool& pool = shard.PoolFor(request.size);
  auto* segment = new Segment;
  {
    MutexLock lock(&device_mu_);
    budget_.EndSegment(segment_size);
    if (!base.ok()) {
      delete segment;
      if (absl::IsResourceExhausted(base.status())) return DevicePtr{0};
      return base.status();
    }
    segment->base = *base;
    segment->size = segment_size;
    segment->stream = shard.stream;
    segment->source = source;
    segment->shard = &shard;
    segment->pool = &pool;
    segments_.Link(segment);
    ++segments_.stats().num_device_alloc;
  }
  history_.Record(HistoryAction::kSegmentAlloc, segment->base, segment->size,
                  static_cast<std::uint64_t>(shard.stream), 0);
  Block* block = shard.arena.New();
  block->ptr = *base;
  block->size = segment_size;
  block->segment = segment;
  segment->head = block;
  // The new block is active from birth: FinishAllocation accounts for it as a taken free block.
  return blocks_.FinishAllocation(shard, pool, block, request);
}

absl::StatusOr<std::size_t> CachingAllocator::ReleaseCachedSegments(
    bool only_oversize, std::size_t wanted, PoolId scope) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::vector<Segment*> victims;
  std::size_t freed = 0;
  {
    // Candidates from every shard, chosen with all of them locked so that the choice is coherent.
    AllShardsLock lock(shards_, device_mu_);
    std::vector<Block*> candidates;
    lock.ForEach([&](StreamShard* shard) {
      if (!PoolRegistry::Releasable(shard->pool, scope)) return;
      blocks_.FlushQuickCache(*shard);
      for (BlockPool* pool : {&shard->large_pool, &shard->small_pool}) {
        if (only_oversize && pool->is_small) continue;
        for (const FreeKey& key : pool->blocks) {
          Block* b = key.block;
          if (b->IsSplit() || b->segment->expandable) continue;
          if (expandable_.MustStayMapped(*b->segment, b->ptr, b->end())) continue;
          if (only_oversize && b->size < config_.max_split_size) continue;
          candidates.push_back(b);
        }
      }
    });
    bool enough = true;
    if (only_oversize) {
      // One block that covers the need if there is one (the smallest such), else the largest first.
      std::sort(candidates.begin(), candidates.end(), [](Block* a, Block* b) { return a->size < b->size; });
      auto fit =
          std::find_if(candidates.begin(), candidates.end(), [&](Block* b) { return b->size >= wanted; });
      if (fit != candidates.end()) {
        candidates = {*fit};
      } else {
        std::reverse(candidates.begin(), candidates.end());
        std::size_t total = 0;
        std::size_t n = 0;
        while (n < candidates.size() && total < wanted) total += candidates[n++]->size;
        enough = total >= wanted;
        candidates.resize(n);
      }
    }
    if (enough) {
      for (Block* b : candidates) {
        b->segment->pool->Erase(b);
        ++b->segment->shard->blocks_in_release;
        segments_.Unlink(b->segment);
        victims.push_back(b->segment);
        freed += b->size;
      }
    }
  }
  if (absl::Status s = releaser_.Release(std::move(victims)); !s.ok()) return s;
  if (!only_oversize) {
    // Expandable segments give back their free pages wherever they are (never counted as oversize).
    absl::StatusOr<std::size_t> unmapped = expandable_.Release(scope);
    if (!unmapped.ok()) return unmapped.status();
    freed += *unmapped;
  }
  return freed;
}

absl::StatusOr<std::size_t> CachingAllocator::GarbageCollect() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::size_t target = 0;
  {
    MutexLock lock(&device_mu_);
    target =
        budget_.GarbageCollectionTarget(segments_.reserved_bytes(), config_.garbage_collection_threshold);
    if (target == 0) return std::size_t{0};
  }
  std::vector<Segment*> victims;
  std::size_t freed = 0;
  {
    // Free the oldest unsplit large blocks first: those at least as old as the mean, repeatedly.
    AllShardsLock lock(shards_, device_mu_);
    while (freed < target) {
      std::vector<Block*> candidates;
      double total_age = 0;
      lock.ForEach([&](StreamShard* shard) {
        if (!PoolRegistry::Releasable(shard->pool, kDefaultPool)) return;
        blocks_.FlushQuickCache(*shard);
        const BlockPool& pool = shard->large_pool;
        for (const FreeKey& key : pool.blocks) {
          if (key.block->IsSplit() || key.block->segment->expandable) continue;
          if (expandable_.MustStayMapped(*key.block->segment, key.block->ptr, key.block->end())) continue;
          candidates.push_back(key.block);
          total_age += static_cast<double>(pool.free_block_lookups - key.block->gc_count_base);
        }
      });
      if (candidates.empty()) break;
      const double mean_age = total_age / static_cast<double>(candidates.size());
      std::size_t freed_now = 0;
      for (Block* b : candidates) {
        BlockPool& pool = *b->segment->pool;
        if (static_cast<double>(pool.free_block_lookups - b->gc_count_base) < mean_age) continue;
        pool.Erase(b);
        ++b->segment->shard->blocks_in_release;
        segments_.Unlink(b->segment);
        victims.push_back(b->segment);
        freed_now += b->size;
      }
      if (freed_now == 0) break;
      freed += freed_now;
    }
  }
  if (absl::Status s = releaser_.Release(std::move(victims)); !s.ok()) return s;
  return freed;
}

absl::Status CachingAllocator::OutOfMemory(const AllocationRequest& request, PoolId pool) {
  const std::size_t size = request.size;
  const Stream stream = request.stream;
  absl::StatusOr<MemoryInfo> info = driver_->GetMemoryInfo();
  std::size_t limit = 0;
  {
    MutexLock lock(&device_mu_);
    ++segments_.stats().num_ooms;
    limit = budget_.limit();
  }
  history_.Record(HistoryAction::kOom, info.ok() ? info->free : 0, size, static_cast<std::uint64_t>(stream),
                  pool);
  // The explanation reads the state as a snapshot would, so that `graphalloc oom-report` on a snapshot
  // taken now says the same; the history only for the stacks of the largest allocations.
  const MemorySnapshot state =
      history_.enabled() ? TakeSnapshot("oom", /*record_event=*/false) : StateSnapshot();
  OomRequest oom{size,  static_cast<std::uint64_t>(stream), pool, std::nullopt,
                 limit, config_.expandable_segments};
  if (info.ok()) oom.device_free = info->free;
  const OomReport report = ExplainOutOfMemory(state, oom);
  const auto allocated = static_cast<std::size_t>(state.stats.allocated_bytes.all().current);
  const auto reserved = static_cast<std::size_t>(state.stats.reserved_bytes.all().current);
  std::string device = absl::StrFormat("device %d", driver_->Ordinal());
  if (info.ok()) {
    absl::StrAppend(&device, " has ", FormatBytes(info->total), " total, ", FormatBytes(info->free), " free");
  }
  std::string limit_text;
  if (limit != 0) limit_text = absl::StrCat("; this allocator is capped at ", FormatBytes(limit));
  // The first sentence as before (programs match it), then what to do first, then the whole explanation.
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: tried to allocate %s (a new segment of %s) on stream 0x%x; %s%s; %s allocated by "
      "graphalloc, %s reserved but unallocated (cached)%s\n%s",
      FormatBytes(size), FormatBytes(SegmentSizeFor(size, config_)), static_cast<std::uintptr_t>(stream),
      device, limit_text, FormatBytes(allocated), FormatBytes(reserved - allocated),
      report.remedies.empty() ? "" : absl::StrCat("; ", report.remedies.front()), FormatOomReport(report)));
}

absl::Status CachingAllocator::EmptyCache() {
  if (captures_.underway()) {
    return absl::FailedPreconditionError(
        "EmptyCache during a CUDA graph capture: freeing device memory is illegal while capturing (and the "
        "capture may use the cached memory); call it after the capture ends");
  }
  if (absl::Status s = RunDeferredFrees(); !s.ok()) return s;
  if (absl::Status s = SynchronizeAndFreeEvents(); !s.ok()) return s;
  absl::StatusOr<std::size_t> freed = ReleaseCachedSegments(/*only_oversize=*/false, 0);
  if (!freed.ok()) return freed.status();
  // Pools whose last user left while their memory could not go yet: finish them now.
  std::vector<PoolId> orphans;
  {
    MutexLock lock(&device_mu_);
    orphans = pools_.Orphans();
  }
  for (PoolId id : orphans) {
    if (absl::Status s = MaybeReleasePool(id); !s.ok()) return s;
  }
  // The pinned host memory wakes kept for the next backed-up sleep is cached memory too.
  return sleep_.FreeKeptBackups();
}

}  // namespace graphalloc
