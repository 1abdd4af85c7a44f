// PoolRestorer: validation, phase 1 (map) and phase 3 (unmap); phase 2 is pool_rebuild.cc.
#include "graphalloc/allocator/core/pool_restorer.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/size_policy.h"

namespace graphalloc {
namespace {

// Unmapped ranges [begin, end) of a checkpointed segment.
std::vector<std::pair<DevicePtr, DevicePtr>> UnmappedRanges(const CheckpointSegment& s) {
  std::vector<std::pair<DevicePtr, DevicePtr>> out;
  for (const CheckpointBlock& b : s.blocks) {
    if (b.mapped) continue;
    const DevicePtr begin = s.base + b.offset;
    if (!out.empty() && out.back().second == begin) {
      out.back().second = begin + b.size;
    } else {
      out.emplace_back(begin, begin + b.size);
    }
  }
  return out;
}

// The checkpoint's mapped ranges of an expandable segment: between its unmapped ones.
std::vector<std::pair<DevicePtr, DevicePtr>> MappedRanges(const CheckpointSegment& s) {
  std::vector<std::pair<DevicePtr, DevicePtr>> out;
  DevicePtr at = s.base;
  for (const auto& [begin, end] : UnmappedRanges(s)) {
    if (begin > at) out.emplace_back(at, begin);
    at = end;
  }
  if (at < s.base + s.size) out.emplace_back(at, s.base + s.size);
  return out;
}

absl::Status Malformed(const CheckpointSegment& s, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("Restore: the checkpoint's segment at 0x%x is malformed: %s", s.base, why));
}

absl::Status ValidateSegmentState(const CheckpointSegment& s, std::size_t granularity) {
  std::size_t offset = 0;
  for (const CheckpointBlock& b : s.blocks) {
    if (b.offset != offset) return Malformed(s, "its blocks do not tile it in address order");
    if (b.size == 0 || b.size % kMinBlockSize != 0)
      return Malformed(s, "a block size is not a multiple of 512");
    if (!b.mapped && (!s.expandable || b.allocated)) {
      return Malformed(s, "only free blocks of expandable segments can be unmapped");
    }
    if (s.expandable && !b.mapped && (b.offset % granularity != 0 || b.size % granularity != 0)) {
      return Malformed(s, "an unmapped range is not aligned to the device's granularity");
    }
    offset += b.size;
  }
  if (offset != s.size) return Malformed(s, "its blocks do not cover it");
  return absl::OkStatus();
}

Block* BlockContaining(Segment* segment, DevicePtr ptr) {
  for (Block* b = segment->head; b != nullptr; b = b->next) {
    if (ptr >= b->ptr && ptr < b->end()) return b;
  }
  return nullptr;
}

}  // namespace

// An unmapped range of the pool being mapped again.
struct PoolRestorer::MapJob {
  StreamShard* shard;
  Block* block;  // in flight, unmapped
  ChunkPlacement chunk;
  bool mapped = false;
  bool no_access = false;  // mapped, but neither granted access nor unmapped: quarantined
};

// A chunk in a range the checkpoint had unmapped, being unmapped.
struct PoolRestorer::UnmapJob {
  StreamShard* shard;
  Block* block;  // in flight, exactly the chunk
  ChunkPlacement chunk;
  bool unmapped = false;
};

PoolRestorer::PoolRestorer(RestoreHost& host, PoolId pool, const PoolCheckpoint& checkpoint)
    : host_(host), pool_(pool), checkpoint_(checkpoint) {}

absl::StatusOr<RestoreResult> PoolRestorer::Run() {
  if (absl::Status s = ValidateShape(); !s.ok()) return s;
  // A quarantined chunk would make the pool look busy (CheckQuiet): fix what can be fixed first.
  (void)host_.RepairQuarantinedChunks();
  if (absl::Status s = MapMissingRanges(); !s.ok()) return s;
  std::vector<UnmapJob> unmap_jobs;
  if (absl::Status s = RebuildChains(&unmap_jobs); !s.ok()) return s;
  if (unmap_jobs.empty()) return std::move(result_);
  Unmap(unmap_jobs);
  SettleUnmaps(unmap_jobs);
  return std::move(result_);
}

// ---- Validation. ----

absl::Status PoolRestorer::ValidateShape() const {
  for (const CheckpointSegment& s : checkpoint_.segments) {
    if (absl::Status st = ValidateSegmentState(s, host_.Granularity()); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status PoolRestorer::ValidateAgainstPool(const PoolLock& lock) const {
  if (absl::Status st = host_.CheckQuiet(lock); !st.ok()) return st;
  for (const CheckpointSegment& s : checkpoint_.segments) {
    const Segment* live = host_.FindSegment(lock, s.base);
    if (live == nullptr || !lock.Holds(live->shard) || live->size != s.size ||
        live->expandable != s.expandable || live->stream != s.stream || live->pool->is_small != s.small) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "Restore: the checkpoint's segment at 0x%x (%d bytes) is no longer in pool %d (released by "
          "EmptyPoolCache while no graph pinned the pool?)",
          s.base, s.size, pool_));
    }
  }
  if (absl::Status st = CheckHandleAligned(lock); !st.ok()) return st;
  // A block freed by the restore must not be in use on another stream: nothing would wait for that use.
  // Checked before phase 1 maps anything, so that such a refusal leaves the pool as it was.
  for (const Segment* segment : host_.SegmentsOf(lock)) {
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->allocated && !b->stream_uses.empty()) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "Restore: live block 0x%x of pool %d is used on other streams (RecordStream); free it first",
            b->ptr, pool_));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PoolRestorer::CheckHandleAligned(const PoolLock& lock) const {
  for (const CheckpointSegment& s : checkpoint_.segments) {
    const Segment* live = host_.FindSegment(lock, s.base);
    if (!s.expandable || !live->handle_aligned) continue;
    const auto& chunks = live->vmm->chunks();
    for (const CheckpointBlock& c : s.blocks) {
      if (!c.allocated) continue;
      const DevicePtr begin = s.base + c.offset;
      const DevicePtr end = begin + c.size;
      auto it = chunks.upper_bound(begin);
      if (it != chunks.begin()) --it;
      int overlapping = 0;
      bool inside = false;
      for (; it != chunks.end() && it->first < end; ++it) {
        const DevicePtr chunk_end = it->first + it->second.size;
        if (chunk_end <= begin) continue;
        ++overlapping;
        inside = it->first <= begin && chunk_end >= end;
      }
      // No chunk under it: phase 1 maps one for the whole unmapped range around it.
      if (overlapping == 0 || (overlapping == 1 && inside)) continue;
      return absl::FailedPreconditionError(absl::StrFormat(
          "Restore: the checkpoint's block 0x%x (%d bytes) of handle-aligned pool %d would span more than "
          "one physical handle (its memory was released and mapped again in other pieces since the "
          "checkpoint)",
          begin, c.size, pool_));
    }
  }
  return absl::OkStatus();
}

// ---- Phase 1: map the ranges the checkpoint had mapped that are unmapped now. ----

absl::Status PoolRestorer::MapMissingRanges() {
  std::vector<MapJob> jobs;
  std::vector<int> peers;
  if (absl::Status s = PlanMaps(&jobs, &peers); !s.ok()) return s;
  absl::Status error = Map(jobs, peers);
  if (!error.ok()) UndoMaps(jobs);
  SettleMaps(jobs);
  return error;
}

absl::Status PoolRestorer::PlanMaps(std::vector<MapJob>* jobs, std::vector<int>* peers) {
  const std::unique_ptr<PoolLock> lock = host_.LockPool(pool_);
  if (absl::Status s = ValidateAgainstPool(*lock); !s.ok()) return s;
  for (const CheckpointSegment& s : checkpoint_.segments) {
    if (s.expandable) PlanSegmentMaps(*lock, s, jobs);
  }
  *peers = host_.Peers(*lock);
  return absl::OkStatus();
}

void PoolRestorer::PlanSegmentMaps(const PoolLock& lock, const CheckpointSegment& s,
                                   std::vector<MapJob>* jobs) {
  Segment* segment = host_.FindSegment(lock, s.base);
  StreamShard& shard = *segment->shard;
  BlockPool& bp = *segment->pool;
  for (const auto& [begin, end] : MappedRanges(s)) {
    for (Block* u = BlockContaining(segment, begin); u != nullptr && u->ptr < end; u = u->next) {
      if (u->mapped || u->in_flight) continue;
      const DevicePtr b = std::max(begin, u->ptr);
      const DevicePtr e = std::min(end, u->end());
      bp.unmapped.erase(u->ptr);
      Block* mid = u;
      if (e < u->end()) bp.unmapped.emplace(e, host_.SplitOff(lock, shard, u, e));
      if (b > u->ptr) {
        mid = host_.SplitOff(lock, shard, u, b);
        bp.unmapped.emplace(u->ptr, u);
      }
      mid->in_flight = true;
      jobs->push_back({&shard, mid, ChunkPlacement{mid->ptr, mid->size, PhysicalHandle{}}});
      u = mid;
    }
  }
}

absl::Status PoolRestorer::Map(std::vector<MapJob>& jobs, const std::vector<int>& peers) {
  std::vector<ChunkPlacement> no_access;
  for (MapJob& job : jobs) {
    absl::StatusOr<PhysicalHandle> h = host_.CreateHandle(job.shard->pool, job.chunk.size);
    if (!h.ok()) return h.status();
    job.chunk.handle = *h;
    absl::Status s = host_.MapChunk(job.chunk, peers, &no_access);
    if (!s.ok()) {
      // A chunk whose undo failed stays mapped without access: unmapped again below, else quarantined.
      job.mapped = job.no_access = !no_access.empty();
      if (!job.mapped && !host_.ReleaseHandle(job.chunk.handle).ok()) {
        host_.LockAndCacheHandle(job.chunk);  // released with the cache, or reused
      }
      return s;
    }
    job.mapped = true;
    host_.ReportMapped(*job.block->segment, job.chunk);
  }
  return absl::OkStatus();
}

void PoolRestorer::UndoMaps(std::vector<MapJob>& jobs) {
  // The pool goes back to its layout before the call (a chunk the driver will not unmap stays mapped and
  // accounted, as a free block, or quarantined when it has no access).
  for (MapJob& job : jobs) {
    if (!job.mapped) continue;
    // Observers know of the chunks mapped with access (Map), not of one left without it.
    const Segment& segment = *job.block->segment;
    if (!job.no_access) host_.ReportUnmapped(segment, job.chunk);
    if (host_.UnmapChunk(job.chunk).ok()) {
      job.mapped = job.no_access = false;
      host_.LockAndCacheHandle(job.chunk);
    } else if (!job.no_access) {
      host_.ReportMapped(segment, job.chunk);
    }
  }
}

void PoolRestorer::SettleMaps(std::vector<MapJob>& jobs) {
  const std::unique_ptr<PoolLock> lock = host_.LockPool(pool_);
  for (MapJob& job : jobs) {
    if (job.mapped) host_.AccountMapped(*lock, job.block->segment, job.chunk);
    host_.SettleInFlight(*lock, *job.shard, job.block, job.chunk, job.mapped, job.no_access);
  }
}

// ---- Phase 3: unmap chunks lying in ranges the checkpoint had unmapped. ----

void PoolRestorer::PlanUnmaps(const PoolLock& lock, std::vector<UnmapJob>* jobs) {
  for (const CheckpointSegment& s : checkpoint_.segments) {
    if (!s.expandable) continue;
    Segment* segment = host_.FindSegment(lock, s.base);
    for (const auto& [begin, end] : UnmappedRanges(s)) {
      std::vector<ChunkPlacement> inside;
      for (const auto& [cb, chunk] : segment->vmm->chunks()) {
        const DevicePtr ce = cb + chunk.size;
        if (ce <= begin || cb >= end) continue;
        if (cb >= begin && ce <= end) {
          inside.push_back({cb, chunk.size, chunk.handle});
        } else {
          // Straddles the range's edge: a chunk is unmapped only whole.
          result_.bytes_left_mapped += std::min(ce, end) - std::max(cb, begin);
        }
      }
      for (const ChunkPlacement& c : inside) {
        Block* b = BlockContaining(segment, c.ptr);
        jobs->push_back(
            {segment->shard, host_.CarveRange(lock, *segment->shard, b, c.ptr, c.ptr + c.size), c});
      }
    }
  }
}

void PoolRestorer::Unmap(std::vector<UnmapJob>& jobs) {
  // A pinned pool keeps every mapping: graphs recorded since the checkpoint may still replay into that
  // memory (an unmapped range there would be an illegal address). The chunks stay mapped and free, as when
  // an unmap fails. The blocks restored to free may have been used by work still queued: it completes
  // before any unmap (an unmap is not stream-ordered). If the device cannot say it has, the chunks stay
  // mapped. Nor when a capture began since the call was admitted (synchronizing would break it).
  host_.WithUnmapGate([&](bool device_idle) {
    for (UnmapJob& job : jobs) {
      const PoolState* owner = job.shard->pool;
      const ChunkPlacement& c = job.chunk;
      const Segment& segment = *job.block->segment;
      const bool pinned = (owner != nullptr && owner->pins.load(std::memory_order_acquire) > 0) ||
                          host_.MustStayMapped(segment, c.ptr, c.ptr + c.size);
      if (!device_idle || pinned) continue;
      host_.ReportUnmapped(segment, c);
      job.unmapped = host_.UnmapChunk(c).ok();
      if (!job.unmapped) host_.ReportMapped(segment, c);
    }
  });
}

void PoolRestorer::SettleUnmaps(std::vector<UnmapJob>& jobs) {
  const std::unique_ptr<PoolLock> lock = host_.LockPool(pool_);
  for (UnmapJob& job : jobs) {
    if (job.unmapped) {
      host_.AccountUnmapped(*lock, job.block->segment, job.chunk);
      // Kept for the next growth, as any unmapped handle (released by EmptyCache or under pressure).
      host_.CacheHandle(*lock, job.chunk);
    } else {
      result_.bytes_left_mapped += job.chunk.size;
    }
    host_.SettleInFlight(*lock, *job.shard, job.block, job.chunk, /*mapped=*/!job.unmapped,
                         /*no_access=*/false);
  }
}

}  // namespace graphalloc
