// SegmentReleaser: regular segments back to the driver or their source, or cached again when refused.
#include "graphalloc/allocator/core/segment_releaser.h"

#include <cstdint>

#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/segment_source.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {

SegmentReleaser::SegmentReleaser(const Parts& parts)
    : driver_(parts.driver),
      history_(parts.history),
      device_mu_(parts.device_mu),
      segments_(parts.segments),
      hooks_(parts.hooks) {}

absl::Status SegmentReleaser::FreeMemory(const Segment& segment) {
  if (segment.source == nullptr) return driver_.MemFree(segment.base);
  return segment.source->Free(segment.base, segment.size, segment.stream);
}

absl::Status SegmentReleaser::Release(std::vector<Segment*> segments) {
  absl::Status first_error;
  std::int64_t released = 0;
  for (Segment* segment : segments) {
    const PoolId pool = PoolOf(*segment);
    const bool reported = segment->source == nullptr;
    if (reported) hooks_.Unmap(pool, segment->base, segment->size, PhysicalHandle{}, false);
    absl::Status s = FreeMemory(*segment);
    if (!s.ok() && reported) hooks_.Map(pool, segment->base, segment->size, PhysicalHandle{}, false);
    StreamShard& shard = *segment->shard;
    SpinLockHolder shard_lock(&shard.mu);
    --shard.blocks_in_release;
    if (s.ok()) {
      ++released;
      history_.Record(HistoryAction::kSegmentFree, segment->base, segment->size,
                      static_cast<std::uint64_t>(segment->stream), 0);
      shard.arena.Delete(segment->head);
      delete segment;
      continue;
    }
    // A segment the device refused to free stays cached, exactly as before.
    if (first_error.ok()) first_error = s;
    MutexLock lock(&device_mu_);
    segments_.Link(segment);
    segment->pool->Insert(segment->head);
  }
  MutexLock lock(&device_mu_);
  segments_.stats().num_device_free += released;
  return first_error;
}

}  // namespace graphalloc
