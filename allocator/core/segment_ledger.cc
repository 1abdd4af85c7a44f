#include "graphalloc/allocator/core/segment_ledger.h"

#include <algorithm>
#include <iterator>

#include "graphalloc/allocator/core/address_owners.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/stream_shard.h"
#include "graphalloc/allocator/stats/stat_events.h"

namespace graphalloc {

SegmentLedger::SegmentLedger(std::size_t max_split_size, HistoryRing& history, int device)
    : max_split_size_(max_split_size), history_(history), device_(device) {}

void SegmentLedger::AddReservation(Segment* segment) {
  segments_.emplace(segment->base, segment);
  AddressOwners::Global().Add(segment->base, segment->size, device_);
}

void SegmentLedger::RemoveReservation(Segment* segment) {
  segments_.erase(segment->base);
  AddressOwners::Global().Remove(segment->base, segment->size, device_);
}

void SegmentLedger::Forget(const Segment& segment) const {
  AddressOwners::Global().Remove(segment.base, segment.size, device_);
}

Segment* SegmentLedger::Find(DevicePtr base) const {
  auto it = segments_.find(base);
  return it == segments_.end() ? nullptr : it->second;
}

Segment* SegmentLedger::Containing(DevicePtr ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return nullptr;
  Segment* segment = std::prev(it)->second;
  return ptr < segment->base + segment->size ? segment : nullptr;
}

void SegmentLedger::Link(Segment* segment) {
  segments_.emplace(segment->base, segment);
  AddressOwners::Global().Add(segment->base, segment->size, device_);
  stat_events::SegmentLinked(stats_, segment->pool->is_small, static_cast<std::int64_t>(segment->size),
                             segment->size >= max_split_size_);
  AddPoolReserved(segment, static_cast<std::int64_t>(segment->size));
}

void SegmentLedger::Unlink(Segment* segment) {
  segments_.erase(segment->base);
  AddressOwners::Global().Remove(segment->base, segment->size, device_);
  stat_events::SegmentUnlinked(stats_, segment->pool->is_small, static_cast<std::int64_t>(segment->size),
                               segment->size >= max_split_size_);
  AddPoolReserved(segment, -static_cast<std::int64_t>(segment->size));
}

void SegmentLedger::ChunkMapped(Segment* segment, const ChunkPlacement& chunk) {
  segment->vmm->AddChunk(chunk);
  stat_events::ChunkMapped(stats_, segment->pool->is_small, static_cast<std::int64_t>(chunk.size));
  AddPoolReserved(segment, static_cast<std::int64_t>(chunk.size));
  history_.Record(HistoryAction::kSegmentMap, chunk.ptr, chunk.size,
                  static_cast<std::uint64_t>(segment->stream), 0);
}

void SegmentLedger::ChunkUnmapped(Segment* segment, const ChunkPlacement& chunk) {
  segment->vmm->RemoveChunk(chunk.ptr);
  stat_events::ChunkUnmapped(stats_, segment->pool->is_small, static_cast<std::int64_t>(chunk.size));
  AddPoolReserved(segment, -static_cast<std::int64_t>(chunk.size));
  history_.Record(HistoryAction::kSegmentUnmap, chunk.ptr, chunk.size,
                  static_cast<std::uint64_t>(segment->stream), 0);
}

void SegmentLedger::ChunkAsleep(Segment* segment, const ChunkPlacement& chunk) {
  segment->vmm->ChunkAsleep(chunk.ptr);
  stat_events::ChunkUnmapped(stats_, segment->pool->is_small, static_cast<std::int64_t>(chunk.size));
  AddPoolReserved(segment, -static_cast<std::int64_t>(chunk.size));
  history_.Record(HistoryAction::kSleep, chunk.ptr, chunk.size, static_cast<std::uint64_t>(segment->stream),
                  0);
}

void SegmentLedger::ChunkAwake(Segment* segment, const ChunkPlacement& chunk) {
  segment->vmm->ChunkAwake(chunk);
  stat_events::ChunkMapped(stats_, segment->pool->is_small, static_cast<std::int64_t>(chunk.size));
  AddPoolReserved(segment, static_cast<std::int64_t>(chunk.size));
  history_.Record(HistoryAction::kWake, chunk.ptr, chunk.size, static_cast<std::uint64_t>(segment->stream),
                  0);
}

void SegmentLedger::AddPoolReserved(const Segment* segment, std::int64_t bytes) {
  PoolState* pool = segment->shard->pool;
  if (pool == nullptr) return;
  pool->reserved_bytes += bytes;
  pool->peak_reserved_bytes = std::max(pool->peak_reserved_bytes, pool->reserved_bytes);
}

}  // namespace graphalloc
