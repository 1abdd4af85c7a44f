// The slow path: new segments, releasing the cache under pressure, garbage collection and the
// out-of-memory report. Driver calls happen here, always with the lock released.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/size_policy.h"

namespace graphalloc {

absl::StatusOr<DevicePtr> CachingAllocator::AllocateSlow(std::size_t size, std::size_t requested,
                                                         Stream stream) {
  // Another thread may have freed a fitting block since the fast path looked: each step below retries the
  // cache before asking the device for more.
  auto from_cache = [&]() -> DevicePtr {
    absl::MutexLock lock(&mu_);
    BlockPool& pool = PoolFor(size);
    Block* block = TakeFreeBlock(pool, stream, size);
    return block != nullptr ? FinishAllocation(pool, block, size, requested) : 0;
  };
  auto new_segment = [&]() -> absl::StatusOr<DevicePtr> {
    if (DevicePtr p = from_cache()) return p;
    return AllocateSegment(size, requested, stream);
  };

  if (config_.garbage_collection_threshold > 0.0) {
    absl::StatusOr<std::size_t> collected = GarbageCollect();
    if (!collected.ok()) return collected.status();
  }
  absl::StatusOr<DevicePtr> result = new_segment();
  if (!result.ok() || *result != 0) return result;

  // Free oversize cached blocks (only when max_split_size is set), then everything cached.
  if (config_.max_split_size != std::numeric_limits<std::size_t>::max()) {
    absl::StatusOr<std::size_t> freed =
        ReleaseCachedSegments(/*only_oversize=*/true, std::max(size, config_.max_split_size));
    if (!freed.ok()) return freed.status();
    if (*freed > 0) {
      result = new_segment();
      if (!result.ok() || *result != 0) return result;
    }
  }
  if (absl::Status s = SynchronizeAndFreeEvents(); !s.ok()) return s;
  absl::StatusOr<std::size_t> freed = ReleaseCachedSegments(/*only_oversize=*/false, 0);
  if (!freed.ok()) return freed.status();
  {
    absl::MutexLock lock(&mu_);
    ++stats_.num_alloc_retries;
  }
  result = new_segment();
  if (!result.ok() || *result != 0) return result;
  return OutOfMemory(size, stream);
}

absl::StatusOr<DevicePtr> CachingAllocator::AllocateSegment(std::size_t size, std::size_t requested,
                                                            Stream stream) {
  const std::size_t segment_size = SegmentSizeFor(size, config_);
  {
    absl::MutexLock lock(&mu_);
    const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
    if (memory_limit_ != 0 && reserved + reserved_in_flight_ + segment_size > memory_limit_)
      return DevicePtr{0};
    reserved_in_flight_ += segment_size;
  }
  absl::StatusOr<DevicePtr> base = driver_->MemAlloc(segment_size);
  absl::MutexLock lock(&mu_);
  reserved_in_flight_ -= segment_size;
  if (!base.ok()) {
    if (absl::IsResourceExhausted(base.status())) return DevicePtr{0};
    return base.status();
  }
  BlockPool& pool = PoolFor(size);
  auto* segment = new Segment;
  segment->base = *base;
  segment->size = segment_size;
  segment->stream = stream;
  segment->pool = &pool;
  Block* block = arena_.New();
  block->ptr = *base;
  block->size = segment_size;
  block->stream = stream;
  block->segment = segment;
  segment->head = block;
  LinkSegment(segment);
  ++stats_.num_device_alloc;
  // The new block is active from birth: FinishAllocation accounts for it as a taken free block.
  return FinishAllocation(pool, block, size, requested);
}

void CachingAllocator::LinkSegment(Segment* segment) {
  const bool small = segment->pool->is_small;
  segments_.emplace(segment->base, segment);
  stats_.segment.Increase(small, 1);
  stats_.reserved_bytes.Increase(small, static_cast<std::int64_t>(segment->size));
  if (segment->size >= config_.max_split_size) stats_.oversize_segments.Increase(small, 1);
}

void CachingAllocator::UnlinkSegment(Segment* segment) {
  const bool small = segment->pool->is_small;
  segments_.erase(segment->base);
  stats_.segment.Decrease(small, 1);
  stats_.reserved_bytes.Decrease(small, static_cast<std::int64_t>(segment->size));
  if (segment->size >= config_.max_split_size) stats_.oversize_segments.Decrease(small, 1);
}

absl::StatusOr<std::size_t> CachingAllocator::ReleaseCachedSegments(bool only_oversize, std::size_t wanted) {
  std::vector<Segment*> victims;
  std::size_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Block*> candidates;
    for (BlockPool* pool : {&large_pool_, &small_pool_}) {
      if (only_oversize && pool->is_small) continue;
      for (const FreeKey& key : pool->blocks) {
        Block* b = key.block;
        if (b->IsSplit()) continue;
        if (only_oversize && b->size < config_.max_split_size) continue;
        candidates.push_back(b);
      }
    }
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
        if (total < wanted) return std::size_t{0};
        candidates.resize(n);
      }
    }
    for (Block* b : candidates) {
      b->segment->pool->Erase(b);
      UnlinkSegment(b->segment);
      victims.push_back(b->segment);
      freed += b->size;
    }
    blocks_in_release_ += victims.size();
  }
  if (absl::Status s = ReleaseSegments(std::move(victims)); !s.ok()) return s;
  return freed;
}

absl::Status CachingAllocator::ReleaseSegments(std::vector<Segment*> segments) {
  absl::Status first_error;
  std::vector<Segment*> kept;
  std::size_t released = 0;
  for (Segment* segment : segments) {
    absl::Status s = driver_->MemFree(segment->base);
    if (s.ok()) {
      ++released;
      absl::MutexLock lock(&mu_);
      arena_.Delete(segment->head);
      --blocks_in_release_;
      delete segment;
    } else {
      if (first_error.ok()) first_error = s;
      kept.push_back(segment);
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.num_device_free += static_cast<std::int64_t>(released);
  // A segment the device refused to free stays cached, exactly as before.
  for (Segment* segment : kept) {
    --blocks_in_release_;
    LinkSegment(segment);
    segment->pool->Insert(segment->head);
  }
  return first_error;
}

absl::StatusOr<std::size_t> CachingAllocator::GarbageCollect() {
  std::vector<Segment*> victims;
  std::size_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    if (memory_limit_ == 0) return std::size_t{0};
    const auto reserved = static_cast<double>(stats_.reserved_bytes.all().current);
    const double threshold = config_.garbage_collection_threshold * static_cast<double>(memory_limit_);
    if (reserved <= threshold) return std::size_t{0};
    const auto target = static_cast<std::size_t>(reserved - threshold);
    // Free the oldest unsplit large blocks first: those at least as old as the mean, repeatedly.
    BlockPool& pool = large_pool_;
    while (freed < target) {
      std::vector<Block*> candidates;
      double total_age = 0;
      for (const FreeKey& key : pool.blocks) {
        if (key.block->IsSplit()) continue;
        candidates.push_back(key.block);
        total_age += static_cast<double>(pool.free_block_lookups - key.block->gc_count_base);
      }
      if (candidates.empty()) break;
      const double mean_age = total_age / static_cast<double>(candidates.size());
      std::size_t freed_now = 0;
      for (Block* b : candidates) {
        if (static_cast<double>(pool.free_block_lookups - b->gc_count_base) < mean_age) continue;
        pool.Erase(b);
        UnlinkSegment(b->segment);
        victims.push_back(b->segment);
        freed_now += b->size;
      }
      if (freed_now == 0) break;
      freed += freed_now;
    }
    blocks_in_release_ += victims.size();
  }
  if (absl::Status s = ReleaseSegments(std::move(victims)); !s.ok()) return s;
  return freed;
}

absl::Status CachingAllocator::OutOfMemory(std::size_t size, Stream stream) {
  absl::StatusOr<MemoryInfo> info = driver_->GetMemoryInfo();
  absl::MutexLock lock(&mu_);
  ++stats_.num_ooms;
  const auto allocated = static_cast<std::size_t>(stats_.allocated_bytes.all().current);
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes.all().current);
  std::string device = absl::StrFormat("device %d", driver_->Ordinal());
  if (info.ok()) {
    absl::StrAppend(&device, " has ", FormatBytes(info->total), " total, ", FormatBytes(info->free), " free");
  }
  std::string limit;
  if (memory_limit_ != 0) limit = absl::StrCat("; this allocator is capped at ", FormatBytes(memory_limit_));
  const std::string hint = config_.expandable_segments
                               ? "free memory held elsewhere, lower the batch size, or raise the memory cap"
                               : "if cached memory is large, set GRAPHALLOC_CONF=expandable_segments:True to "
                                 "reduce fragmentation";
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: tried to allocate %s (a new segment of %s) on stream 0x%x; %s%s; %s allocated by "
      "graphalloc, %s reserved but unallocated (cached); %s",
      FormatBytes(size), FormatBytes(SegmentSizeFor(size, config_)), static_cast<std::uintptr_t>(stream),
      device, limit, FormatBytes(allocated), FormatBytes(reserved - allocated), hint));
}

absl::Status CachingAllocator::EmptyCache() {
  if (absl::Status s = SynchronizeAndFreeEvents(); !s.ok()) return s;
  absl::StatusOr<std::size_t> freed = ReleaseCachedSegments(/*only_oversize=*/false, 0);
  return freed.status();
}

}  // namespace graphalloc
