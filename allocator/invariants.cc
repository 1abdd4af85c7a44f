// CheckInvariants(): recomputes everything the allocator tracks incrementally and compares.
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/caching_allocator.h"

namespace graphalloc {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError(absl::StrCat("allocator invariant violated: ", what));
}

// What the blocks of one shard say its bookkeeping should be.
struct ShardExpectation {
  DeviceStats stats;
  std::size_t allocated_blocks = 0;
  std::size_t indexed_blocks = 0;
  std::size_t quick_blocks = 0;
  std::size_t blocks = 0;
  std::size_t event_waits = 0;
  std::size_t unmapped_blocks = 0;  // indexed unmapped blocks (not in flight)
  std::size_t in_flight_blocks = 0;
};

// Merged [begin, end) intervals.
using Intervals = std::vector<std::pair<DevicePtr, DevicePtr>>;
void AddInterval(Intervals& v, DevicePtr begin, DevicePtr end) {
  if (!v.empty() && v.back().second == begin) {
    v.back().second = end;
  } else {
    v.emplace_back(begin, end);
  }
}

absl::Status CompareArrays(absl::string_view scope, const DeviceStats& tracked, const DeviceStats& actual,
                           bool block_stats) {
  const std::pair<const char*, std::pair<const StatArray*, const StatArray*>> block_checks[] = {
      {"allocation", {&tracked.allocation, &actual.allocation}},
      {"allocated_bytes", {&tracked.allocated_bytes, &actual.allocated_bytes}},
      {"requested_bytes", {&tracked.requested_bytes, &actual.requested_bytes}},
      {"active", {&tracked.active, &actual.active}},
      {"active_bytes", {&tracked.active_bytes, &actual.active_bytes}},
      {"inactive_split", {&tracked.inactive_split, &actual.inactive_split}},
      {"inactive_split_bytes", {&tracked.inactive_split_bytes, &actual.inactive_split_bytes}},
      {"oversize_allocations", {&tracked.oversize_allocations, &actual.oversize_allocations}},
  };
  const std::pair<const char*, std::pair<const StatArray*, const StatArray*>> segment_checks[] = {
      {"segment", {&tracked.segment, &actual.segment}},
      {"reserved_bytes", {&tracked.reserved_bytes, &actual.reserved_bytes}},
      {"oversize_segments", {&tracked.oversize_segments, &actual.oversize_segments}},
  };
  constexpr const char* kTypes[] = {"all", "small_pool", "large_pool"};
  auto check = [&](const auto& checks) -> absl::Status {
    for (const auto& [name, arrays] : checks) {
      for (int t = 0; t < kNumStatTypes; ++t) {
        const std::int64_t have = arrays.first->by_type[t].current;
        const std::int64_t want = arrays.second->by_type[t].current;
        if (have != want) {
          return Violation(absl::StrFormat("%s stat %s.%s.current is %d but the blocks say %d", scope, name,
                                           kTypes[t], have, want));
        }
        if (arrays.first->by_type[t].peak < have) {
          return Violation(absl::StrFormat("%s stat %s.%s.peak is below current", scope, name, kTypes[t]));
        }
      }
    }
    return absl::OkStatus();
  };
  return block_stats ? check(block_checks) : check(segment_checks);
}

}  // namespace

absl::Status CachingAllocator::CheckInvariants() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AllShardsLock lock(shards_, device_mu_);
  absl::flat_hash_map<const StreamShard*, ShardExpectation> expected;
  DeviceStats device_expected;
  absl::Status status = [&]() -> absl::Status {
    DevicePtr previous_end = 0;
    for (const auto& [base, segment] : segments_) {
      if (segment->base != base) {
        return Violation(absl::StrFormat("segment keyed 0x%x has base 0x%x", base, segment->base));
      }
      if (base < previous_end)
        return Violation(absl::StrFormat("segment 0x%x overlaps the previous one", base));
      previous_end = base + segment->size;
      const StreamShard* shard = segment->shard;
      if (shard == nullptr || shard->stream != segment->stream) {
        return Violation(absl::StrFormat("segment 0x%x is not owned by its stream's shard", base));
      }
      if (segment->pool != &shard->small_pool && segment->pool != &shard->large_pool) {
        return Violation(absl::StrFormat("segment 0x%x belongs to a pool of another shard", base));
      }
      ShardExpectation& e = expected[shard];
      const bool small = segment->pool->is_small;
      const bool expandable = segment->expandable;
      if (expandable != (segment->vmm != nullptr)) {
        return Violation(absl::StrFormat("segment 0x%x: expandable flag and chunk map disagree", base));
      }
      Intervals block_mapped, chunk_mapped;
      if (expandable) {
        // Reserved bytes of an expandable segment are its mapped chunks; it is not counted as a segment.
        std::size_t chunk_bytes = 0;
        const std::size_t gran = driver_->Info().granularity;
        for (const auto& [ptr, chunk] : segment->vmm->chunks()) {
          if (ptr < base || ptr + chunk.size > base + segment->size || ptr % gran != 0 || chunk.size == 0 ||
              chunk.size % gran != 0) {
            return Violation(
                absl::StrFormat("segment 0x%x: chunk 0x%x (%d bytes) is misplaced", base, ptr, chunk.size));
          }
          if (!chunk_mapped.empty() && ptr < chunk_mapped.back().second) {
            return Violation(absl::StrFormat("segment 0x%x: chunk 0x%x overlaps another", base, ptr));
          }
          AddInterval(chunk_mapped, ptr, ptr + chunk.size);
          chunk_bytes += chunk.size;
        }
        if (chunk_bytes != segment->vmm->mapped_bytes()) {
          return Violation(absl::StrFormat("segment 0x%x: chunks add up to %d bytes, the segment says %d",
                                           base, chunk_bytes, segment->vmm->mapped_bytes()));
        }
        device_expected.reserved_bytes.Increase(small, static_cast<std::int64_t>(chunk_bytes));
      } else {
        device_expected.segment.Increase(small, 1);
        device_expected.reserved_bytes.Increase(small, static_cast<std::int64_t>(segment->size));
        if (segment->size >= config_.max_split_size) device_expected.oversize_segments.Increase(small, 1);
      }
      if (segment->head == nullptr || segment->head->prev != nullptr) {
        return Violation(absl::StrFormat("segment 0x%x has no head block", base));
      }
      DevicePtr expected_ptr = base;
      const Block* prev = nullptr;
      bool prev_free = false;
      bool prev_parked = false;
      // A run of adjacent free blocks counts as one (inactive split unless it is the whole segment), the
      // way coalescing would leave it: parked blocks are merged only lazily.
      std::size_t run_bytes = 0;
      auto close_run = [&](bool whole_segment) {
        if (run_bytes > 0 && !whole_segment && !expandable) {
          e.stats.inactive_split.Increase(small, 1);
          e.stats.inactive_split_bytes.Increase(small, static_cast<std::int64_t>(run_bytes));
        }
        run_bytes = 0;
      };
      for (const Block* b = segment->head; b != nullptr; prev = b, b = b->next) {
        ++e.blocks;
        if (b->ptr != expected_ptr) {
          return Violation(absl::StrFormat("block at 0x%x in segment 0x%x should start at 0x%x", b->ptr, base,
                                           expected_ptr));
        }
        if (b->prev != prev) return Violation(absl::StrFormat("block 0x%x has a broken prev link", b->ptr));
        if (b->segment != segment) {
          return Violation(
              absl::StrFormat("block 0x%x disagrees with its segment about its segment", b->ptr));
        }
        if (b->size == 0 || b->size % 512 != 0) {
          return Violation(
              absl::StrFormat("block 0x%x has size %d, not a positive multiple of 512", b->ptr, b->size));
        }
        expected_ptr += b->size;
        if (b->mapped) AddInterval(block_mapped, b->ptr, b->end());
        if (b->in_flight) {
          ++e.in_flight_blocks;
          if (b->allocated || b->in_quick || segment->pool->Contains(b) ||
              segment->pool->unmapped.contains(b->ptr)) {
            return Violation(absl::StrFormat("in-flight block 0x%x is allocated or indexed", b->ptr));
          }
        }
        if (!b->mapped) {
          const std::size_t gran = driver_->Info().granularity;
          if (!expandable || b->allocated || b->event_count > 0 || b->ptr % gran != 0 ||
              b->size % gran != 0) {
            return Violation(absl::StrFormat(
                "unmapped block 0x%x is not an aligned free range of an expandable segment", b->ptr));
          }
          auto u = segment->pool->unmapped.find(b->ptr);
          const bool indexed = u != segment->pool->unmapped.end() && u->second == b;
          if (indexed == b->in_flight) {
            return Violation(absl::StrFormat("unmapped block 0x%x: in the unmapped index %d, in flight %d",
                                             b->ptr, indexed, b->in_flight));
          }
          if (prev != nullptr && !prev->mapped && !prev->in_flight && !b->in_flight) {
            return Violation(
                absl::StrFormat("adjacent unmapped blocks 0x%x and 0x%x were not merged", prev->ptr, b->ptr));
          }
          e.unmapped_blocks += indexed ? 1 : 0;
        }
        if (!b->mapped || b->in_flight) {
          // Neither free nor active: unmapped, or out of every index while its shard does driver calls.
          if (b->in_quick || segment->pool->Contains(b)) {
            return Violation(
                absl::StrFormat("unmapped or in-flight block 0x%x is in the free index", b->ptr));
          }
          close_run(/*whole_segment=*/false);
          prev_free = false;
          prev_parked = false;
          continue;
        }
        const bool in_index = segment->pool->Contains(b);
        const bool in_quick = shard->quick.Holds(b);
        if (in_quick != b->in_quick) {
          return Violation(absl::StrFormat("block 0x%x's quick-cache flag disagrees with the cache", b->ptr));
        }
        const bool in_map = shard->allocated.Find(b->ptr) == b;
        const bool is_free = !b->allocated && b->event_count == 0;
        if (b->allocated) {
          ++e.allocated_blocks;
          if (!in_map)
            return Violation(absl::StrFormat("allocated block 0x%x is missing from the pointer map", b->ptr));
          if (in_index || in_quick)
            return Violation(absl::StrFormat("allocated block 0x%x is cached as free", b->ptr));
          e.stats.allocation.Increase(small, 1);
          e.stats.allocated_bytes.Increase(small, static_cast<std::int64_t>(b->size));
          e.stats.requested_bytes.Increase(small, static_cast<std::int64_t>(b->requested_size));
          if (b->size >= config_.max_split_size) e.stats.oversize_allocations.Increase(small, 1);
        } else {
          if (in_map) return Violation(absl::StrFormat("free block 0x%x is in the pointer map", b->ptr));
          if (!b->stream_uses.empty())
            return Violation(absl::StrFormat("free block 0x%x lists stream uses", b->ptr));
        }
        if (!b->allocated && b->event_count > 0) {
          e.event_waits += static_cast<std::size_t>(b->event_count);
          if (in_index || in_quick) {
            return Violation(absl::StrFormat("block 0x%x awaiting events is cached as free", b->ptr));
          }
        }
        const bool joins_run = is_free && prev_free && prev->mapped == b->mapped;
        if (!joins_run) close_run(/*whole_segment=*/false);
        if (is_free) {
          if (in_index == in_quick) {
            return Violation(
                absl::StrFormat("free block 0x%x must be in exactly one of the free index and the "
                                "quick cache",
                                b->ptr));
          }
          e.indexed_blocks += in_index ? 1 : 0;
          e.quick_blocks += in_quick ? 1 : 0;
          if (joins_run && !in_quick && !prev_parked) {
            return Violation(
                absl::StrFormat("adjacent free blocks 0x%x and 0x%x were not merged", prev->ptr, b->ptr));
          }
          run_bytes += b->size;
        } else {
          e.stats.active.Increase(small, 1);
          e.stats.active_bytes.Increase(small, static_cast<std::int64_t>(b->size));
        }
        prev_free = is_free;
        prev_parked = in_quick;
      }
      close_run(/*whole_segment=*/run_bytes == segment->size);
      if (expandable && block_mapped != chunk_mapped) {
        return Violation(
            absl::StrFormat("segment 0x%x: mapped blocks and mapped chunks disagree (%d and %d ranges)", base,
                            block_mapped.size(), chunk_mapped.size()));
      }
      if (expected_ptr != base + segment->size) {
        return Violation(absl::StrFormat("blocks of segment 0x%x cover %d bytes, not its %d", base,
                                         expected_ptr - base, segment->size));
      }
    }
    std::size_t in_flight = 0;
    for (const auto& [shard, e] : expected) in_flight += e.in_flight_blocks;
    if (absl::Status s = expandable_.CheckInvariants(in_flight); !s.ok()) return s;
    if (absl::Status s = CompareArrays("device", segments_.stats(), device_expected, /*block_stats=*/false);
        !s.ok()) {
      return s;
    }
    absl::Status shard_status;
    lock.ForEach([&](StreamShard* shard) {
      if (!shard_status.ok()) return;
      const ShardExpectation& e = expected[shard];
      const std::string scope = absl::StrFormat("stream 0x%x", static_cast<std::uintptr_t>(shard->stream));
      if (e.allocated_blocks != shard->allocated.size()) {
        shard_status = Violation(absl::StrFormat("%s: pointer map holds %d entries for %d allocated blocks",
                                                 scope, shard->allocated.size(), e.allocated_blocks));
        return;
      }
      const std::size_t unmapped = shard->small_pool.unmapped.size() + shard->large_pool.unmapped.size();
      if (unmapped != e.unmapped_blocks) {
        shard_status = Violation(absl::StrFormat("%s: unmapped index holds %d entries, blocks say %d", scope,
                                                 unmapped, e.unmapped_blocks));
        return;
      }
      const std::size_t indexed = shard->small_pool.blocks.size() + shard->large_pool.blocks.size();
      if (e.indexed_blocks != indexed || e.quick_blocks != shard->quick.size()) {
        shard_status =
            Violation(absl::StrFormat("%s: free index holds %d and quick cache %d, blocks say %d and %d",
                                      scope, indexed, shard->quick.size(), e.indexed_blocks, e.quick_blocks));
        return;
      }
      if (e.blocks + shard->blocks_in_release != shard->arena.live()) {
        shard_status = Violation(absl::StrFormat("%s: %d block objects are live but segments hold %d", scope,
                                                 shard->arena.live(), e.blocks));
        return;
      }
      std::size_t queued = 0;
      for (const auto& [stream, queue] : shard->pending_events) queued += queue.size();
      if (queued != e.event_waits || static_cast<std::int64_t>(queued) != shard->pending_event_count.load()) {
        shard_status =
            Violation(absl::StrFormat("%s: %d events queued, blocks wait on %d, counter says %d", scope,
                                      queued, e.event_waits, shard->pending_event_count.load()));
        return;
      }
      shard_status = CompareArrays(scope, shard->stats, e.stats, /*block_stats=*/true);
    });
    if (!shard_status.ok()) return shard_status;
    return CheckPoolInvariants();
  }();
  return status;
}

}  // namespace graphalloc
