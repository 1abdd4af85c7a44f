// The hot path: allocate from and free into the cache, plus the small public operations.
#include "allocator/caching_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/size_policy.h"

namespace graphalloc {

absl::StatusOr<std::unique_ptr<CachingAllocator>> CachingAllocator::Create(std::shared_ptr<Driver> driver,
                                                                           Config config) {
  if (driver == nullptr) return absl::InvalidArgumentError("CachingAllocator::Create: driver is null");
  std::unique_ptr<CachingAllocator> allocator(new CachingAllocator(std::move(driver), config));
  if (config.per_process_memory_fraction < 1.0) {
    if (absl::Status s = allocator->SetMemoryFraction(config.per_process_memory_fraction); !s.ok()) return s;
  }
  return allocator;
}

CachingAllocator::CachingAllocator(std::shared_ptr<Driver> driver, Config config)
    : driver_(std::move(driver)), config_(config) {
  absl::MutexLock lock(&mu_);
  stats_.max_split_size = config_.max_split_size == std::numeric_limits<std::size_t>::max()
                              ? -1
                              : static_cast<std::int64_t>(config_.max_split_size);
}

CachingAllocator::~CachingAllocator() {
  // Teardown is best effort: the device may already be gone, and there is no one to report to.
  std::vector<Event> events;
  std::vector<Segment*> segments;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [stream, queue] : pending_events_) {
      for (const PendingEvent& p : queue) events.push_back(p.event);
    }
    pending_events_.clear();
    events.insert(events.end(), idle_events_.begin(), idle_events_.end());
    idle_events_.clear();
    for (auto& [base, segment] : segments_) segments.push_back(segment);
    segments_.clear();
  }
  for (Event e : events) {
    (void)driver_->EventSynchronize(e);
    (void)driver_->EventDestroy(e);
  }
  for (Segment* segment : segments) {
    (void)driver_->MemFree(segment->base);
    delete segment;
  }
}

absl::StatusOr<DevicePtr> CachingAllocator::Allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return DevicePtr{0};
  if (bytes > kMaxRequest) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory: tried to allocate %d bytes, more than 1 EiB; no device has that much memory", bytes));
  }
  if (pending_event_count_.load(std::memory_order_relaxed) > 0) ProcessEvents();
  const std::size_t size = RoundSize(bytes, config_);
  {
    absl::MutexLock lock(&mu_);
    BlockPool& pool = PoolFor(size);
    if (Block* block = TakeFreeBlock(pool, stream, size)) return FinishAllocation(pool, block, size, bytes);
  }
  return AllocateSlow(size, bytes, stream);
}

BlockPool& CachingAllocator::PoolFor(std::size_t size) { return IsSmall(size) ? small_pool_ : large_pool_; }

Block* CachingAllocator::TakeFreeBlock(BlockPool& pool, Stream stream, std::size_t size) {
  ++pool.free_block_lookups;
  auto it = pool.LowerBound(stream, size);
  if (it == pool.blocks.end()) return nullptr;
  Block* block = it->block;
  // Oversize blocks serve only oversize requests, and those only when the waste stays bounded.
  if (size < config_.max_split_size && block->size >= config_.max_split_size) return nullptr;
  if (size >= config_.max_split_size && block->size >= size + config_.max_non_split_rounding_size) {
    return nullptr;
  }
  pool.blocks.erase(it);
  return block;
}

DevicePtr CachingAllocator::FinishAllocation(BlockPool& pool, Block* block, std::size_t size,
                                             std::size_t requested) {
  const bool small = pool.is_small;
  const std::size_t remaining = block->size - size;
  // Large blocks keep remainders of up to 1 MiB (internal fragmentation beats unusable slivers);
  // oversize blocks are never split.
  const bool split =
      small ? remaining >= kMinBlockSize : (size < config_.max_split_size && remaining > kSmallSize);
  const bool was_split = block->IsSplit();
  if (split) {
    Block* rest = arena_.New();
    rest->ptr = block->ptr + size;
    rest->size = remaining;
    rest->stream = block->stream;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    rest->gc_count_base = pool.free_block_lookups;
    pool.Insert(rest);
    if (was_split) {
      stats_.inactive_split_bytes.Decrease(small, static_cast<std::int64_t>(size));
    } else {
      stats_.inactive_split.Increase(small, 1);
      stats_.inactive_split_bytes.Increase(small, static_cast<std::int64_t>(remaining));
    }
  } else if (was_split) {
    stats_.inactive_split.Decrease(small, 1);
    stats_.inactive_split_bytes.Decrease(small, static_cast<std::int64_t>(block->size));
  }
  block->allocated = true;
  block->requested_size = requested;
  allocated_.emplace(block->ptr, block);
  UpdateAllocationStats(block, small, +1);
  stats_.active.Increase(small, 1);
  stats_.active_bytes.Increase(small, static_cast<std::int64_t>(block->size));
  return block->ptr;
}

void CachingAllocator::UpdateAllocationStats(const Block* block, bool small, int sign) {
  const auto bytes = static_cast<std::int64_t>(block->size);
  const auto requested = static_cast<std::int64_t>(block->requested_size);
  const bool oversize = block->size >= config_.max_split_size;
  if (sign > 0) {
    stats_.allocation.Increase(small, 1);
    stats_.allocated_bytes.Increase(small, bytes);
    stats_.requested_bytes.Increase(small, requested);
    if (oversize) stats_.oversize_allocations.Increase(small, 1);
  } else {
    stats_.allocation.Decrease(small, 1);
    stats_.allocated_bytes.Decrease(small, bytes);
    stats_.requested_bytes.Decrease(small, requested);
    if (oversize) stats_.oversize_allocations.Decrease(small, 1);
  }
}

absl::Status CachingAllocator::Free(DevicePtr ptr) {
  if (ptr == 0) return absl::OkStatus();
  Block* block = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = allocated_.find(ptr);
    if (it == allocated_.end() || it->second->freeing) return UnknownPointerError("Free", ptr);
    block = it->second;
    if (block->stream_uses.empty()) {
      allocated_.erase(it);
      block->allocated = false;
      const bool small = block->segment->pool->is_small;
      UpdateAllocationStats(block, small, -1);
      block->requested_size = 0;
      ReleaseToPool(block);
      return absl::OkStatus();
    }
  }
  return FreeWithStreamUses(ptr, block);
}

void CachingAllocator::ReleaseToPool(Block* block) {
  BlockPool& pool = *block->segment->pool;
  const bool small = pool.is_small;
  const auto original_size = static_cast<std::int64_t>(block->size);
  std::int64_t split_blocks_delta = 0;
  std::int64_t split_bytes_delta = 0;
  for (Block* neighbour : {block->prev, block->next}) {
    const std::size_t absorbed = neighbour != nullptr ? neighbour->size : 0;
    if (TryMerge(block, neighbour, pool)) {
      split_blocks_delta -= 1;
      split_bytes_delta -= static_cast<std::int64_t>(absorbed);
    }
  }
  if (block->IsSplit()) {
    split_blocks_delta += 1;
    split_bytes_delta += static_cast<std::int64_t>(block->size);
  }
  if (split_blocks_delta > 0) stats_.inactive_split.Increase(small, split_blocks_delta);
  if (split_blocks_delta < 0) stats_.inactive_split.Decrease(small, -split_blocks_delta);
  if (split_bytes_delta > 0) stats_.inactive_split_bytes.Increase(small, split_bytes_delta);
  if (split_bytes_delta < 0) stats_.inactive_split_bytes.Decrease(small, -split_bytes_delta);
  stats_.active.Decrease(small, 1);
  stats_.active_bytes.Decrease(small, original_size);
  block->gc_count_base = pool.free_block_lookups;
  pool.Insert(block);
}

bool CachingAllocator::TryMerge(Block* dst, Block* src, BlockPool& pool) {
  if (src == nullptr || src->allocated || src->event_count > 0 || !src->stream_uses.empty() ||
      src->mapped != dst->mapped) {
    return false;
  }
  pool.Erase(src);
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
  arena_.Delete(src);
  return true;
}

absl::Status CachingAllocator::RecordStream(DevicePtr ptr, Stream stream) {
  absl::MutexLock lock(&mu_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) return UnknownPointerError("RecordStream", ptr);
  Block* block = it->second;
  if (stream == block->stream) return absl::OkStatus();
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
  return absl::OkStatus();
}

Segment* CachingAllocator::SegmentContaining(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return nullptr;
  --it;
  Segment* segment = it->second;
  return ptr < segment->base + segment->size ? segment : nullptr;
}

absl::Status CachingAllocator::UnknownPointerError(absl::string_view operation, DevicePtr ptr) const {
  if (Segment* segment = SegmentContaining(ptr)) {
    for (Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->ptr == ptr && !b->allocated) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s(0x%x): double free: the block at this address is not allocated (it was freed already); "
            "every other allocation is unchanged",
            operation, ptr));
      }
      if (ptr > b->ptr && ptr < b->end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s(0x%x): pointer is inside the %s block at 0x%x (%d bytes), not its start; pass the address "
            "Allocate() returned",
            operation, ptr, b->allocated ? "allocated" : "free", b->ptr, b->size));
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s(0x%x): unknown pointer: it was not returned by this allocator (device %d); every other allocation "
      "is unchanged",
      operation, ptr, driver_->Ordinal()));
}

DeviceStats CachingAllocator::GetStats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeakStats() {
  absl::MutexLock lock(&mu_);
  stats_.ResetPeak();
}

void CachingAllocator::ResetAccumulatedStats() {
  absl::MutexLock lock(&mu_);
  stats_.ResetAccumulated();
}

absl::Status CachingAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMemoryFraction: fraction must be in [0, 1], got ", fraction));
  }
  absl::MutexLock lock(&mu_);
  memory_fraction_ = fraction;
  memory_limit_ =
      fraction >= 1.0
          ? 0
          : static_cast<std::size_t>(fraction * static_cast<double>(driver_->Info().total_memory));
  // A zero fraction allows nothing; represent it as a one-byte cap rather than "no cap".
  if (fraction < 1.0 && memory_limit_ == 0) memory_limit_ = 1;
  return absl::OkStatus();
}

double CachingAllocator::GetMemoryFraction() const {
  absl::MutexLock lock(&mu_);
  return memory_fraction_;
}

void CachingAllocator::SetMemoryLimit(std::size_t bytes) {
  absl::MutexLock lock(&mu_);
  memory_limit_ = bytes;
  memory_fraction_ =
      bytes == 0 ? 1.0 : static_cast<double>(bytes) / static_cast<double>(driver_->Info().total_memory);
}

}  // namespace graphalloc
