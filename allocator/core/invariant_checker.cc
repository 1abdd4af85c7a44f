// InvariantChecker: the segment map, expandable chunks, statistics, shard counts and pools; the block
// chains are invariant_chain.cc.
#include "graphalloc/allocator/core/invariant_checker.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/core/invariant_violation.h"

namespace graphalloc {
namespace {

// The tracked statistics against those the blocks say, current values and peaks: the per-block ones of
// a shard (`block_stats`), else the device's segment statistics.
absl::Status CompareStats(absl::string_view scope, const DeviceStats& tracked, const DeviceStats& actual,
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
          return InvariantViolation(absl::StrFormat("%s stat %s.%s.current is %d but the blocks say %d",
                                                    scope, name, kTypes[t], have, want));
        }
        if (arrays.first->by_type[t].peak < have) {
          return InvariantViolation(
              absl::StrFormat("%s stat %s.%s.peak is below current", scope, name, kTypes[t]));
        }
      }
    }
    return absl::OkStatus();
  };
  return block_stats ? check(block_checks) : check(segment_checks);
}

}  // namespace

absl::Status InvariantChecker::Run() {
  DevicePtr previous_end = 0;
  for (const auto& [base, segment] : parts_.segments) {
    GRAPHALLOC_RETURN_IF_ERROR(CheckSegment(base, segment, &previous_end));
    Intervals chunk_mapped;
    if (segment->expandable) {
      GRAPHALLOC_RETURN_IF_ERROR(CheckChunks(segment, &chunk_mapped));
    } else {
      const bool small = segment->pool->is_small;
      device_expected_.segment.Increase(small, 1);
      device_expected_.reserved_bytes.Increase(small, static_cast<std::int64_t>(segment->size));
      if (segment->size >= parts_.max_split_size) device_expected_.oversize_segments.Increase(small, 1);
    }
    GRAPHALLOC_RETURN_IF_ERROR(CheckChain(segment, chunk_mapped));
  }
  std::size_t in_flight = 0;
  for (const auto& [shard, e] : expected_) in_flight += e.in_flight_blocks;
  GRAPHALLOC_RETURN_IF_ERROR(parts_.expandable.CheckInvariants(in_flight));
  if (parts_.sleep != nullptr) GRAPHALLOC_RETURN_IF_ERROR(parts_.sleep->CheckInvariants(parts_.segments));
  GRAPHALLOC_RETURN_IF_ERROR(
      CompareStats("device", parts_.segments.stats(), device_expected_, /*block_stats=*/false));
  absl::Status shard_status;
  parts_.lock.ForEach([&](StreamShard* shard) {
    if (shard_status.ok()) shard_status = CheckShard(shard, expected_[shard]);
  });
  GRAPHALLOC_RETURN_IF_ERROR(shard_status);
  return CheckPools();
}

absl::Status InvariantChecker::CheckSegment(DevicePtr base, const Segment* segment,
                                            DevicePtr* previous_end) const {
  if (segment->base != base) {
    return InvariantViolation(absl::StrFormat("segment keyed 0x%x has base 0x%x", base, segment->base));
  }
  if (base < *previous_end)
    return InvariantViolation(absl::StrFormat("segment 0x%x overlaps the previous one", base));
  *previous_end = base + segment->size;
  const StreamShard* shard = segment->shard;
  if (shard == nullptr || shard->stream != segment->stream) {
    return InvariantViolation(absl::StrFormat("segment 0x%x is not owned by its stream's shard", base));
  }
  if (segment->pool != &shard->small_pool && segment->pool != &shard->large_pool) {
    return InvariantViolation(absl::StrFormat("segment 0x%x belongs to a pool of another shard", base));
  }
  if (segment->expandable != (segment->vmm != nullptr)) {
    return InvariantViolation(absl::StrFormat("segment 0x%x: expandable flag and chunk map disagree", base));
  }
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckChunks(const Segment* segment, Intervals* chunk_mapped) {
  // Reserved bytes of an expandable segment are its mapped chunks; it is not counted as a segment. A
  // sleeping chunk (pool_sleep.h) reserves nothing, yet its blocks keep their state: for the chain, the
  // mapped blocks cover the mapped and the sleeping chunks together.
  const DevicePtr base = segment->base;
  const std::size_t gran = parts_.granularity;
  std::size_t chunk_bytes = 0;
  std::vector<std::pair<DevicePtr, std::size_t>> placed;  // mapped and sleeping, in address order
  for (const auto& [ptr, chunk] : segment->vmm->chunks()) placed.emplace_back(ptr, chunk.size);
  for (const auto& [ptr, chunk] : segment->vmm->sleeping_chunks()) placed.emplace_back(ptr, chunk.size);
  std::sort(placed.begin(), placed.end());
  for (const auto& [ptr, size] : placed) {
    if (ptr < base || ptr + size > base + segment->size || ptr % gran != 0 || size == 0 || size % gran != 0) {
      return InvariantViolation(
          absl::StrFormat("segment 0x%x: chunk 0x%x (%d bytes) is misplaced", base, ptr, size));
    }
    if (!chunk_mapped->empty() && ptr < chunk_mapped->back().second) {
      return InvariantViolation(absl::StrFormat("segment 0x%x: chunk 0x%x overlaps another", base, ptr));
    }
    AddInterval(*chunk_mapped, ptr, ptr + size);
  }
  for (const auto& [ptr, chunk] : segment->vmm->chunks()) chunk_bytes += chunk.size;
  if (chunk_bytes != segment->vmm->mapped_bytes()) {
    return InvariantViolation(absl::StrFormat("segment 0x%x: chunks add up to %d bytes, the segment says %d",
                                              base, chunk_bytes, segment->vmm->mapped_bytes()));
  }
  device_expected_.reserved_bytes.Increase(segment->pool->is_small, static_cast<std::int64_t>(chunk_bytes));
  return absl::OkStatus();
}

absl::Status InvariantChecker::CheckShard(const StreamShard* shard,
                                          const ShardExpectation& e) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const std::string scope = absl::StrFormat("stream 0x%x", static_cast<std::uintptr_t>(shard->stream));
  if (e.pointer_map_entries != shard->allocated.size()) {
    return InvariantViolation(absl::StrFormat("%s: pointer map holds %d entries for %d blocks (%d allocated)",
                                              scope, shard->allocated.size(), e.pointer_map_entries,
                                              e.allocated_blocks));
  }
  const std::size_t unmapped = shard->small_pool.unmapped.size() + shard->large_pool.unmapped.size();
  if (unmapped != e.unmapped_blocks) {
    return InvariantViolation(absl::StrFormat("%s: unmapped index holds %d entries, blocks say %d", scope,
                                              unmapped, e.unmapped_blocks));
  }
  const std::size_t indexed = shard->small_pool.blocks.size() + shard->large_pool.blocks.size();
  if (e.indexed_blocks != indexed || e.quick_blocks != shard->quick.size()) {
    return InvariantViolation(
        absl::StrFormat("%s: free index holds %d and quick cache %d, blocks say %d and %d", scope, indexed,
                        shard->quick.size(), e.indexed_blocks, e.quick_blocks));
  }
  if (e.blocks + shard->blocks_in_release != shard->arena.live()) {
    return InvariantViolation(absl::StrFormat("%s: %d block objects are live but segments hold %d", scope,
                                              shard->arena.live(), e.blocks));
  }
  std::size_t queued = 0;
  for (const auto& [stream, queue] : shard->pending_events) queued += queue.size();
  if (queued != e.event_waits || static_cast<std::int64_t>(queued) != shard->pending_event_count.load()) {
    return InvariantViolation(absl::StrFormat("%s: %d events queued, blocks wait on %d, counter says %d",
                                              scope, queued, e.event_waits,
                                              shard->pending_event_count.load()));
  }
  return CompareStats(scope, shard->stats, e.stats, /*block_stats=*/true);
}

absl::Status InvariantChecker::CheckPools() const {
  absl::Status status;
  parts_.pools.ForEach([&](PoolId id, const PoolState& pool) {
    if (!status.ok()) return;
    std::int64_t reserved = 0;
    std::int64_t allocated = 0;
    std::int64_t live = 0;
    for (const auto& [base, segment] : parts_.segments) {
      if (segment->shard->pool != &pool) continue;
      reserved +=
          static_cast<std::int64_t>(segment->vmm != nullptr ? segment->vmm->mapped_bytes() : segment->size);
      for (const Block* b = segment->head; b != nullptr; b = b->next) {
        if (!b->allocated) continue;
        if (!b->OwnerFreed()) allocated += static_cast<std::int64_t>(b->size);  // freed, its free underway
        ++live;
      }
    }
    if (reserved != pool.reserved_bytes) {
      status = InvariantViolation(absl::StrFormat("pool %d reserved_bytes is %d but its segments hold %d", id,
                                                  pool.reserved_bytes, reserved));
    } else if (pool.peak_reserved_bytes < pool.reserved_bytes) {
      status = InvariantViolation(absl::StrFormat("pool %d peak below current", id));
    } else if (allocated != pool.allocated_bytes.load() || live != pool.live_blocks.load()) {
      status = InvariantViolation(
          absl::StrFormat("pool %d counts %d bytes in %d live blocks, its blocks say %d in %d", id,
                          pool.allocated_bytes.load(), pool.live_blocks.load(), allocated, live));
    }
  });
  return status;
}

void InvariantChecker::AddInterval(Intervals& v, DevicePtr begin, DevicePtr end) {
  if (!v.empty() && v.back().second == begin) {
    v.back().second = end;
  } else {
    v.emplace_back(begin, end);
  }
}

}  // namespace graphalloc
