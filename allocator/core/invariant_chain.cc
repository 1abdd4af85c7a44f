// InvariantChecker: each segment's block chain, block by block (invariant_checker.h).
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/core/invariant_checker.h"
#include "graphalloc/allocator/core/invariant_violation.h"

namespace graphalloc {

struct InvariantChecker::ChainWalk {
  // A run of adjacent free blocks counts as one (inactive split unless it is the whole segment), the way
  // coalescing would leave it: parked blocks are merged only lazily.
  void CloseRun(bool whole_segment) {
    if (run_bytes > 0 && !whole_segment && !segment->expandable) {
      e.stats.inactive_split.Increase(small, 1);
      e.stats.inactive_split_bytes.Increase(small, static_cast<std::int64_t>(run_bytes));
    }
    run_bytes = 0;
  }

  const Segment* segment;
  const StreamShard* shard;
  ShardExpectation& e;
  bool small;
  DevicePtr expected_ptr;  // where the next block must start
  const Block* prev = nullptr;
  bool prev_free = false;
  bool prev_parked = false;
  std::size_t run_bytes = 0;
  Intervals block_mapped;
};

absl::Status InvariantChecker::CheckChain(const Segment* segment, const Intervals& chunk_mapped) {
  const DevicePtr base = segment->base;
  if (segment->head == nullptr || segment->head->prev != nullptr) {
    return InvariantViolation(absl::StrFormat("segment 0x%x has no head block", base));
  }
  ChainWalk w{.segment = segment,
              .shard = segment->shard,
              .e = expected_[segment->shard],
              .small = segment->pool->is_small,
              .expected_ptr = base,
              .prev = nullptr,
              .prev_free = false,
              .prev_parked = false,
              .run_bytes = 0,
              .block_mapped = {}};
  for (const Block* b = segment->head; b != nullptr; w.prev = b, b = b->next) {
    ++w.e.blocks;
    GRAPHALLOC_RETURN_IF_ERROR(CheckLinks(w, b));
    w.expected_ptr += b->size;
    if (b->mapped) AddInterval(w.block_mapped, b->ptr, b->end());
    GRAPHALLOC_RETURN_IF_ERROR(CheckInFlight(w, b));
    GRAPHALLOC_RETURN_IF_ERROR(CheckUnmapped(w, b));
    GRAPHALLOC_RETURN_IF_ERROR(CheckWithinOneChunk(w, b));
    if (!b->mapped || b->in_flight) {
      // Neither free nor active: unmapped, or out of every index while its shard does driver calls.
      if (b->in_quick || segment->pool->Contains(b)) {
        return InvariantViolation(
            absl::StrFormat("unmapped or in-flight block 0x%x is in the free index", b->ptr));
      }
      w.CloseRun(/*whole_segment=*/false);
      w.prev_free = false;
      w.prev_parked = false;
      continue;
    }
    GRAPHALLOC_RETURN_IF_ERROR(CheckIndexes(w, b));
  }
  w.CloseRun(/*whole_segment=*/w.run_bytes == segment->size);
  if (segment->expandable && w.block_mapped != chunk_mapped) {
    return InvariantViolation(
        absl::StrFormat("segment 0x%x: mapped blocks and mapped chunks disagree (%d and %d ranges)", base,
                        w.block_mapped.size(), chunk_mapped.size()));
  }
  if (w.expected_ptr != base + segment->size) {
    return InvariantViolation(absl::StrFormat("blocks of segment 0x%x cover %d bytes, not its %d", base,
                                              w.expected_ptr - base, segment->size));
  }
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckLinks(const ChainWalk& w, const Block* b) const {
  if (b->ptr != w.expected_ptr) {
    return InvariantViolation(absl::StrFormat("block at 0x%x in segment 0x%x should start at 0x%x", b->ptr,
                                              w.segment->base, w.expected_ptr));
  }
  if (b->prev != w.prev)
    return InvariantViolation(absl::StrFormat("block 0x%x has a broken prev link", b->ptr));
  if (b->segment != w.segment) {
    return InvariantViolation(
        absl::StrFormat("block 0x%x disagrees with its segment about its segment", b->ptr));
  }
  if (b->size == 0 || b->size % 512 != 0) {
    return InvariantViolation(
        absl::StrFormat("block 0x%x has size %d, not a positive multiple of 512", b->ptr, b->size));
  }
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckInFlight(ChainWalk& w, const Block* b) const {
  if (!b->in_flight) return absl::OkStatus();
  ++w.e.in_flight_blocks;
  const BlockPool& pool = *w.segment->pool;
  if (b->allocated || b->in_quick || pool.Contains(b) || pool.unmapped.contains(b->ptr)) {
    return InvariantViolation(absl::StrFormat("in-flight block 0x%x is allocated or indexed", b->ptr));
  }
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckUnmapped(ChainWalk& w, const Block* b) const {
  if (b->mapped) return absl::OkStatus();
  const std::size_t gran = parts_.granularity;
  if (!w.segment->expandable || b->allocated || b->event_count > 0 || b->ptr % gran != 0 ||
      b->size % gran != 0) {
    return InvariantViolation(
        absl::StrFormat("unmapped block 0x%x is not an aligned free range of an expandable segment", b->ptr));
  }
  const BlockPool& pool = *w.segment->pool;
  auto u = pool.unmapped.find(b->ptr);
  const bool indexed = u != pool.unmapped.end() && u->second == b;
  if (indexed == b->in_flight) {
    return InvariantViolation(absl::StrFormat("unmapped block 0x%x: in the unmapped index %d, in flight %d",
                                              b->ptr, indexed, b->in_flight));
  }
  if (w.prev != nullptr && !w.prev->mapped && !w.prev->in_flight && !b->in_flight) {
    return InvariantViolation(
        absl::StrFormat("adjacent unmapped blocks 0x%x and 0x%x were not merged", w.prev->ptr, b->ptr));
  }
  w.e.unmapped_blocks += indexed ? 1 : 0;
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckWithinOneChunk(const ChainWalk& w, const Block* b) const {
  if (!w.segment->handle_aligned || !b->mapped) return absl::OkStatus();
  if (w.segment->vmm->ChunkStartsWithin(b->ptr, b->end())) {
    return InvariantViolation(absl::StrFormat(
        "block 0x%x (%d bytes) of handle-aligned segment 0x%x spans more than one physical handle", b->ptr,
        b->size, w.segment->base));
  }
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckIndexes(ChainWalk& w,
                                            const Block* b) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  ShardExpectation& e = w.e;
  const bool in_index = w.segment->pool->Contains(b);
  const bool in_quick = w.shard->quick.Holds(b);
  if (in_quick != b->in_quick) {
    return InvariantViolation(
        absl::StrFormat("block 0x%x's quick-cache flag disagrees with the cache", b->ptr));
  }
  const bool in_map = w.shard->allocated.Find(b->ptr) == b;
  if (in_map != b->in_pointer_map) {
    return InvariantViolation(
        absl::StrFormat("block 0x%x's pointer-map flag disagrees with the map", b->ptr));
  }
  e.pointer_map_entries += in_map ? 1 : 0;
  const bool is_free = !b->allocated && b->event_count == 0;
  if (b->allocated) {
    ++e.allocated_blocks;
    if (!in_map)
      return InvariantViolation(
          absl::StrFormat("allocated block 0x%x is missing from the pointer map", b->ptr));
    if (in_index || in_quick)
      return InvariantViolation(absl::StrFormat("allocated block 0x%x is cached as free", b->ptr));
    if (!b->OwnerFreed()) {  // a free underway counts as done (only active)
      e.stats.allocation.Increase(w.small, 1);
      e.stats.allocated_bytes.Increase(w.small, static_cast<std::int64_t>(b->size));
      e.stats.requested_bytes.Increase(w.small, static_cast<std::int64_t>(b->requested_size));
      if (b->size >= parts_.max_split_size) e.stats.oversize_allocations.Increase(w.small, 1);
    }
  } else {
    // A parked block may keep its entry (stream_shard.h); no other free block has one.
    if (in_map && !in_quick) {
      return InvariantViolation(absl::StrFormat("free block 0x%x is in the pointer map", b->ptr));
    }
    if (!b->stream_uses.empty())
      return InvariantViolation(absl::StrFormat("free block 0x%x lists stream uses", b->ptr));
  }
  if (!b->allocated && b->event_count > 0) {
    e.event_waits += static_cast<std::size_t>(b->event_count);
    if (in_index || in_quick) {
      return InvariantViolation(absl::StrFormat("block 0x%x awaiting events is cached as free", b->ptr));
    }
  }
  // A handle-aligned segment's free blocks merge only within a chunk.
  const bool chunk_edge = w.segment->handle_aligned && b->mapped && w.segment->vmm->ChunkStartsAt(b->ptr);
  const bool joins_run = is_free && w.prev_free && w.prev->mapped == b->mapped && !chunk_edge;
  if (!joins_run) w.CloseRun(/*whole_segment=*/false);
  if (is_free) {
    if (in_index == in_quick) {
      return InvariantViolation(absl::StrFormat(
          "free block 0x%x must be in exactly one of the free index and the quick cache", b->ptr));
    }
    e.indexed_blocks += in_index ? 1 : 0;
    e.quick_blocks += in_quick ? 1 : 0;
    if (joins_run && !in_quick && !w.prev_parked) {
      return InvariantViolation(
          absl::StrFormat("adjacent free blocks 0x%x and 0x%x were not merged", w.prev->ptr, b->ptr));
    }
    w.run_bytes += b->size;
  } else {
    e.stats.active.Increase(w.small, 1);
    e.stats.active_bytes.Increase(w.small, static_cast<std::int64_t>(b->size));
  }
  w.prev_free = is_free;
  w.prev_parked = in_quick;
  return absl::OkStatus();
}

}  // namespace graphalloc
