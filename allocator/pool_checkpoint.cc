// Checkpoint and restore of a private pool's layout (PyTorch's getCheckpointState/setCheckpointPoolState,
// which graph trees use to rewind a shared pool before recording a new branch).
//
// Restore rebuilds each segment's block chain directly from the checkpoint rather than replaying
// allocations, so it is exact for any layout, regular or expandable. It runs in three phases, since
// driver calls never happen under a lock:
//   1. map what the checkpoint had mapped and is unmapped now (can fail: the pool is then unchanged, apart
//      from the new mappings, undone where the driver lets us);
//   2. under the locks, replace every block chain of the pool (cannot fail);
//   3. unmap the chunks lying in ranges the checkpoint had unmapped (a failure leaves the chunk mapped and
//      free, reported in RestoreResult::bytes_left_mapped).
#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/caching_allocator.h"
#include "graphalloc/allocator/size_policy.h"

namespace graphalloc {
namespace {

struct Piece {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  bool allocated = false;
  bool mapped = true;
  std::size_t requested = 0;
};

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

// True when the segment's chain is exactly the checkpointed one: nothing to rebuild.
bool ChainMatches(const Segment* segment, const CheckpointSegment& s) {
  std::size_t i = 0;
  for (const Block* b = segment->head; b != nullptr; b = b->next, ++i) {
    if (i == s.blocks.size()) return false;
    const CheckpointBlock& c = s.blocks[i];
    if (b->ptr != s.base + c.offset || b->size != c.size || b->allocated != c.allocated ||
        b->mapped != c.mapped || (b->allocated && b->requested_size != c.requested_size)) {
      return false;
    }
  }
  return i == s.blocks.size();
}

Block* BlockContaining(Segment* segment, DevicePtr ptr) {
  for (Block* b = segment->head; b != nullptr; b = b->next) {
    if (ptr >= b->ptr && ptr < b->end()) return b;
  }
  return nullptr;
}

}  // namespace

absl::Status CachingAllocator::CheckPoolQuiet(const std::vector<StreamShard*>& shards) const {
  for (const StreamShard* shard : shards) {
    if (shard->pending_event_count.load(std::memory_order_relaxed) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool %d has freed blocks waiting on stream events; synchronize the streams and call EmptyCache() "
          "(or wait) before a checkpoint or restore",
          shard->pool->id));
    }
    if (shard->blocks_in_release != 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("pool %d is releasing memory on another thread; retry", shard->pool->id));
    }
  }
  for (const auto& [base, segment] : segments_) {
    if (std::find(shards.begin(), shards.end(), segment->shard) == shards.end()) continue;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (expandable_.IsQuarantined(b)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "pool %d holds a chunk at 0x%x (%d bytes) that the device mapped but would neither grant access "
            "to nor unmap; retry (EmptyCache() retries it too)",
            segment->shard->pool->id, b->ptr, b->size));
      }
      if (b->in_flight) {
        return absl::FailedPreconditionError(
            absl::StrFormat("pool %d is being changed by another thread (block 0x%x); the pool must be quiet",
                            segment->shard->pool->id, b->ptr));
      }
      if (b->freeing) {
        return absl::FailedPreconditionError(
            absl::StrFormat("pool %d has a free of block 0x%x pending (deferred until the capture routes "
                            "end, or in progress)",
                            segment->shard->pool->id, b->ptr));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolCheckpoint> CachingAllocator::Checkpoint(const PrivatePool& pool)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (pool.allocator() != this) {
    return absl::InvalidArgumentError("Checkpoint: the pool handle is empty or belongs to another allocator");
  }
  // A quarantined chunk would make the pool look busy (CheckPoolQuiet): fix what can be fixed first.
  (void)expandable_.RepairQuarantinedChunks(/*may_unmap=*/!captures_.underway());
  std::vector<StreamShard*> shards = LockPoolShards(pool.id());
  device_mu_.Lock();
  absl::Status status = CheckPoolQuiet(shards);
  PoolCheckpoint checkpoint{.pool = pool.id(), .allocator_id = id_, .segments = {}};
  if (status.ok()) {
    for (StreamShard* shard : shards) blocks_.FlushQuickCache(*shard);
    for (const auto& [base, segment] : segments_) {
      if (std::find(shards.begin(), shards.end(), segment->shard) == shards.end()) continue;
      CheckpointSegment s{.base = segment->base,
                          .size = segment->size,
                          .stream = segment->stream,
                          .small = segment->pool->is_small,
                          .expandable = segment->expandable,
                          .blocks = {}};
      for (const Block* b = segment->head; b != nullptr; b = b->next) {
        s.blocks.push_back(CheckpointBlock{.offset = b->ptr - segment->base,
                                           .size = b->size,
                                           .allocated = b->allocated,
                                           .mapped = b->mapped,
                                           .requested_size = b->allocated ? b->requested_size : 0});
      }
      checkpoint.segments.push_back(std::move(s));
    }
  }
  device_mu_.Unlock();
  for (StreamShard* shard : shards) shard->mu.Unlock();
  if (!status.ok()) return status;
  return checkpoint;
}

absl::StatusOr<RestoreResult> CachingAllocator::Restore(
    const PrivatePool& pool, const PoolCheckpoint& checkpoint) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (pool.allocator() != this) {
    return absl::InvalidArgumentError("Restore: the pool handle is empty or belongs to another allocator");
  }
  if (checkpoint.allocator_id != id_ || checkpoint.pool != pool.id()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Restore: the checkpoint is of pool %d%s, not of pool %d of this allocator", checkpoint.pool,
        checkpoint.allocator_id != id_ ? " of another allocator" : "", pool.id()));
  }
  if (captures_.underway()) {
    return absl::FailedPreconditionError(
        "Restore during a CUDA graph capture: it may unmap memory, which is illegal while capturing");
  }
  const std::size_t gran = driver_->Info().granularity;
  for (const CheckpointSegment& s : checkpoint.segments) {
    if (absl::Status st = ValidateSegmentState(s, gran); !st.ok()) return st;
  }
  // A quarantined chunk would make the pool look busy (CheckPoolQuiet): fix what can be fixed first.
  (void)expandable_.RepairQuarantinedChunks(/*may_unmap=*/true);

  // Validation against the live pool, run with the locks held (phase 1 and again in phase 2).
  auto validate = [&](const std::vector<StreamShard*>& shards) -> absl::Status {
    if (absl::Status st = CheckPoolQuiet(shards); !st.ok()) return st;
    for (const CheckpointSegment& s : checkpoint.segments) {
      const Segment* live = segments_.Find(s.base);
      if (live == nullptr || std::find(shards.begin(), shards.end(), live->shard) == shards.end() ||
          live->size != s.size || live->expandable != s.expandable || live->stream != s.stream ||
          live->pool->is_small != s.small) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "Restore: the checkpoint's segment at 0x%x (%d bytes) is no longer in pool %d (released by "
            "EmptyPoolCache while no graph pinned the pool?)",
            s.base, s.size, pool.id()));
      }
    }
    // A block freed by the restore must not be in use on another stream: nothing would wait for that use.
    // Checked before phase 1 maps anything, so that such a refusal leaves the pool as it was.
    for (const auto& entry : segments_) {
      const Segment* segment = entry.second;
      if (std::find(shards.begin(), shards.end(), segment->shard) == shards.end()) continue;
      for (const Block* b = segment->head; b != nullptr; b = b->next) {
        if (b->allocated && !b->stream_uses.empty()) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "Restore: live block 0x%x of pool %d is used on other streams (RecordStream); free it first",
              b->ptr, pool.id()));
        }
      }
    }
    return absl::OkStatus();
  };
  struct MapJob {
    StreamShard* shard;
    Block* block;  // in flight, unmapped
    ChunkPlacement chunk;
    bool mapped = false;
    bool no_access = false;  // mapped, but neither granted access nor unmapped: quarantined
  };

  // ---- Phase 1: map the ranges the checkpoint had mapped that are unmapped now. ----
  std::vector<MapJob> map_jobs;
  std::vector<int> peers;
  {
    std::vector<StreamShard*> shards = LockPoolShards(pool.id());
    device_mu_.Lock();
    absl::Status st = validate(shards);
    if (st.ok()) {
      for (const CheckpointSegment& s : checkpoint.segments) {
        if (!s.expandable) continue;
        Segment* segment = segments_.Find(s.base);
        StreamShard& shard = *segment->shard;
        BlockPool& bp = *segment->pool;
        // The checkpoint's mapped ranges (between its unmapped ones, which are granularity-aligned).
        std::vector<std::pair<DevicePtr, DevicePtr>> mapped_ranges;
        DevicePtr at = s.base;
        for (const auto& [ub, ue] : UnmappedRanges(s)) {
          if (ub > at) mapped_ranges.emplace_back(at, ub);
          at = ue;
        }
        if (at < s.base + s.size) mapped_ranges.emplace_back(at, s.base + s.size);
        for (const auto& [begin, end] : mapped_ranges) {
          for (Block* u = BlockContaining(segment, begin); u != nullptr && u->ptr < end; u = u->next) {
            if (u->mapped || u->in_flight) continue;
            const DevicePtr b = std::max(begin, u->ptr);
            const DevicePtr e = std::min(end, u->end());
            bp.unmapped.erase(u->ptr);
            Block* mid = u;
            if (e < u->end()) bp.unmapped.emplace(e, blocks_.SplitOff(shard, u, e));
            if (b > u->ptr) {
              mid = blocks_.SplitOff(shard, u, b);
              bp.unmapped.emplace(u->ptr, u);
            }
            mid->in_flight = true;
            map_jobs.push_back({&shard, mid, ChunkPlacement{mid->ptr, mid->size, PhysicalHandle{}}});
            u = mid;
          }
        }
      }
      peers = expandable_.peers();
    }
    device_mu_.Unlock();
    for (StreamShard* shard : shards) shard->mu.Unlock();
    if (!st.ok()) return st;
  }
  absl::Status map_error;
  std::vector<ChunkPlacement> no_access;
  for (MapJob& job : map_jobs) {
    absl::StatusOr<PhysicalHandle> h = driver_->MemCreate(job.chunk.size);
    if (absl::IsResourceExhausted(h.status()) && expandable_.ReleaseCachedHandles().ok())
      h = driver_->MemCreate(job.chunk.size);
    if (!h.ok()) {
      map_error = h.status();
      break;
    }
    job.chunk.handle = *h;
    if (absl::Status s =
            MapChunks(*driver_, std::span<const ChunkPlacement>(&job.chunk, 1), peers, &no_access);
        !s.ok()) {
      map_error = s;
      // A chunk whose undo failed stays mapped without access: unmapped again below, else quarantined.
      job.mapped = job.no_access = !no_access.empty();
      if (!job.mapped && !driver_->MemRelease(job.chunk.handle).ok()) {
        MutexLock lock(&device_mu_);
        expandable_.CacheHandle(job.chunk);  // released with the cache, or reused
      }
      break;
    }
    job.mapped = true;
  }
  if (!map_error.ok()) {
    // Undo: the pool goes back to its layout before the call (a chunk the driver will not unmap stays
    // mapped and accounted, as a free block, or quarantined when it has no access).
    for (MapJob& job : map_jobs) {
      if (!job.mapped) continue;
      if (driver_->MemUnmap(job.chunk.ptr, job.chunk.size).ok()) {
        job.mapped = job.no_access = false;
        MutexLock lock(&device_mu_);
        expandable_.CacheHandle(job.chunk);
      }
    }
  }
  {
    std::vector<StreamShard*> shards = LockPoolShards(pool.id());
    device_mu_.Lock();
    for (MapJob& job : map_jobs) {
      if (job.mapped) segments_.ChunkMapped(job.block->segment, job.chunk);
      expandable_.SettleInFlight(*job.shard, job.block, std::span<const ChunkPlacement>(&job.chunk, 1),
                                 std::vector<bool>{job.mapped}, std::vector<bool>{job.no_access});
    }
    device_mu_.Unlock();
    for (StreamShard* shard : shards) shard->mu.Unlock();
  }
  if (!map_error.ok()) return map_error;

  // ---- Phase 2: rebuild every block chain of the pool. ----
  RestoreResult result;
  struct UnmapJob {
    StreamShard* shard;
    Block* block;  // in flight, exactly the chunk
    ChunkPlacement chunk;
    bool unmapped = false;
  };
  std::vector<UnmapJob> unmap_jobs;
  std::vector<StreamShard*> shards = LockPoolShards(pool.id());
  device_mu_.Lock();
  if (absl::Status st = validate(shards); !st.ok()) {
    device_mu_.Unlock();
    for (StreamShard* shard : shards) shard->mu.Unlock();
    return st;
  }
  absl::flat_hash_map<DevicePtr, const CheckpointSegment*> wanted;
  for (const CheckpointSegment& s : checkpoint.segments) wanted.emplace(s.base, &s);
  // A block freed by the restore must not be in use on another stream: nothing would wait for that use.
  for (const auto& [base, segment] : segments_) {
    if (std::find(shards.begin(), shards.end(), segment->shard) == shards.end()) continue;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (b->allocated && !b->stream_uses.empty()) {
        device_mu_.Unlock();
        for (StreamShard* shard : shards) shard->mu.Unlock();
        return absl::FailedPreconditionError(absl::StrFormat(
            "Restore: live block 0x%x of pool %d is used on other streams (RecordStream); free it first",
            b->ptr, pool.id()));
      }
    }
  }
  for (StreamShard* shard : shards) blocks_.FlushQuickCache(*shard);

  struct Live {
    DevicePtr ptr;
    std::size_t size;
    Stream stream;
    std::size_t requested;  // what the history's events carry
  };
  // Both in address order (segments_ is, and so is each chain): the differences are a linear merge.
  std::vector<Live> live_before;
  std::vector<Live> allocated_after;
  // Statistics deltas per (shard, pool kind), applied after the loop.
  struct ShardDelta {
    StreamShard* shard;
    bool small;
    // Statistics of the blocks taken out and put in, applied once: a 10,000-block restore would otherwise
    // spend much of its time on per-block counter updates.
    stat_events::BlockTotals out, in;
  };
  std::vector<ShardDelta> deltas;
  auto delta_for = [&](StreamShard* shard, bool small) -> ShardDelta& {
    for (ShardDelta& d : deltas) {
      if (d.shard == shard && d.small == small) return d;
    }
    deltas.push_back({shard, small, {}, {}});
    return deltas.back();
  };
  std::vector<Piece> pieces;
  std::vector<Piece> merged;
  for (const auto& entry : segments_) {
    Segment* segment = entry.second;  // named, not a structured binding: the lambdas below capture it
    if (std::find(shards.begin(), shards.end(), segment->shard) == shards.end()) continue;
    auto w = wanted.find(segment->base);
    if (w != wanted.end() && ChainMatches(segment, *w->second)) continue;  // already the checkpoint's
    StreamShard& shard = *segment->shard;
    BlockPool& bp = *segment->pool;
    ShardDelta& delta = delta_for(&shard, bp.is_small);
    const bool split_counted = !segment->expandable;
    // Out with the old chain.
    const bool was_split = segment->head->next != nullptr;
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      if (b->allocated) {
        live_before.push_back({b->ptr, b->size, b->stream(), b->requested_size});
        shard.allocated.Erase(b->ptr);
        delta.out.AddAllocated(blocks_.FiguresOf(b, bp.is_small));
      } else {
        if (b->mapped) {
          bp.Erase(b);
        } else {
          bp.unmapped.erase(b->ptr);
        }
        if (split_counted && was_split) delta.out.AddInactiveSplit(static_cast<std::int64_t>(b->size));
      }
      shard.arena.Delete(b);
      b = next;
    }
    // The new chain: the checkpoint's blocks, or (a segment created since) one free range. Free ranges of
    // an expandable segment follow its chunk map, since what is mapped now is what the blocks must say.
    pieces.clear();
    const Segment* const this_segment = segment;  // clang 14 cannot capture structured bindings
    auto add_free = [&](DevicePtr begin, DevicePtr end) {
      if (!this_segment->expandable) {
        pieces.push_back({begin, end - begin, false, true, 0});
        return;
      }
      DevicePtr at = begin;
      const auto& chunks = this_segment->vmm->chunks();
      auto it = chunks.upper_bound(begin);
      if (it != chunks.begin()) --it;
      for (; at < end; ++it) {
        const bool have = it != chunks.end() && it->first < end;
        const DevicePtr chunk_begin = have ? std::max(it->first, at) : end;
        if (have && it->first + it->second.size <= at) continue;
        if (chunk_begin > at) pieces.push_back({at, chunk_begin - at, false, false, 0});
        if (!have) break;
        const DevicePtr chunk_end = std::min(it->first + it->second.size, end);
        pieces.push_back({chunk_begin, chunk_end - chunk_begin, false, true, 0});
        at = chunk_end;
      }
    };
    if (w != wanted.end()) {
      for (const CheckpointBlock& bs : w->second->blocks) {
        const DevicePtr p = segment->base + bs.offset;
        if (bs.allocated) {
          pieces.push_back({p, bs.size, true, true, bs.requested_size});
          allocated_after.push_back({p, bs.size, segment->stream, bs.requested_size});
        } else {
          add_free(p, p + bs.size);
        }
      }
    } else {
      add_free(segment->base, segment->base + segment->size);
    }
    // Neighbouring free pieces of one mapped state are one block.
    merged.clear();
    for (const Piece& p : pieces) {
      if (!merged.empty() && !p.allocated && !merged.back().allocated && merged.back().mapped == p.mapped) {
        merged.back().size += p.size;
      } else {
        merged.push_back(p);
      }
    }
    Block* prev = nullptr;
    const bool now_split = merged.size() > 1;
    for (const Piece& p : merged) {
      Block* b = shard.arena.New();
      b->ptr = p.ptr;
      b->size = p.size;
      b->segment = segment;
      b->mapped = p.mapped;
      b->prev = prev;
      if (prev != nullptr) {
        prev->next = b;
      } else {
        segment->head = b;
      }
      prev = b;
      if (p.allocated) {
        b->allocated = true;
        b->requested_size = p.requested;
        shard.allocated.Insert(b->ptr, b);
        delta.in.AddAllocated(blocks_.FiguresOf(b, bp.is_small));
      } else if (p.mapped) {
        b->gc_count_base = bp.free_block_lookups;
        bp.Insert(b);
        if (split_counted && now_split) delta.in.AddInactiveSplit(static_cast<std::int64_t>(b->size));
      } else {
        bp.unmapped.emplace(b->ptr, b);
      }
    }
  }
  for (const ShardDelta& d : deltas) {
    stat_events::BlocksReplaced(d.shard->stats, d.small, d.out, d.in);
    d.shard->pool->AddAllocated(d.in.bytes - d.out.bytes, d.in.blocks - d.out.blocks);
  }
  auto key = [](const Live& l) { return std::make_pair(l.ptr, l.size); };
  std::size_t i = 0, j = 0;
  while (i < live_before.size() || j < allocated_after.size()) {
    if (j == allocated_after.size() ||
        (i < live_before.size() && key(live_before[i]) < key(allocated_after[j]))) {
      const Live& l = live_before[i++];
      result.freed.push_back(l.ptr);
      history_.Record(HistoryAction::kFreeCompleted, l.ptr, l.requested, static_cast<std::uint64_t>(l.stream),
                      0);
    } else if (i == live_before.size() || key(allocated_after[j]) < key(live_before[i])) {
      const Live& l = allocated_after[j++];
      result.created.push_back({l.ptr, l.size, l.stream});
      history_.Record(HistoryAction::kAlloc, l.ptr, l.requested, static_cast<std::uint64_t>(l.stream), 0);
    } else {
      ++i;  // live in both
      ++j;
    }
  }

  // ---- Phase 3: unmap chunks lying in ranges the checkpoint had unmapped. ----
  for (const CheckpointSegment& s : checkpoint.segments) {
    if (!s.expandable) continue;
    Segment* segment = segments_.Find(s.base);
    for (const auto& [begin, end] : UnmappedRanges(s)) {
      std::vector<ChunkPlacement> inside;
      for (auto it = segment->vmm->chunks().begin(); it != segment->vmm->chunks().end(); ++it) {
        const DevicePtr cb = it->first;
        const DevicePtr ce = cb + it->second.size;
        if (ce <= begin || cb >= end) continue;
        if (cb >= begin && ce <= end) {
          inside.push_back({cb, it->second.size, it->second.handle});
        } else {
          // Straddles the range's edge: a chunk is unmapped only whole.
          result.bytes_left_mapped += std::min(ce, end) - std::max(cb, begin);
        }
      }
      for (const ChunkPlacement& c : inside) {
        Block* b = BlockContaining(segment, c.ptr);
        unmap_jobs.push_back(
            {segment->shard, blocks_.CarveRange(*segment->shard, b, c.ptr, c.ptr + c.size), c});
      }
    }
  }
  device_mu_.Unlock();
  for (StreamShard* shard : shards) shard->mu.Unlock();
  if (unmap_jobs.empty()) return result;

  // A pinned pool keeps every mapping: graphs recorded since the checkpoint may still replay into that memory
  // (an unmapped range there would be an illegal address). The chunks stay mapped and free, as when an
  // unmap fails.
  // The blocks restored to free may have been used by work still queued: it completes before any unmap (an
  // unmap is not stream-ordered). If the device cannot say it has, the chunks stay mapped.
  // Nor when a capture began since the call was admitted (synchronizing would break it).
  captures_.gate().Lock();
  const bool device_idle = captures_.WaitForWorkBeforeUnmap(std::nullopt).ok();
  for (UnmapJob& job : unmap_jobs) {
    const PoolState* owner = job.shard->pool;
    const bool pinned = owner != nullptr && owner->pins.load(std::memory_order_acquire) > 0;
    job.unmapped = device_idle && !pinned && driver_->MemUnmap(job.chunk.ptr, job.chunk.size).ok();
  }
  captures_.gate().Unlock();
  shards = LockPoolShards(pool.id());
  device_mu_.Lock();
  for (UnmapJob& job : unmap_jobs) {
    if (job.unmapped) {
      segments_.ChunkUnmapped(job.block->segment, job.chunk);
      // Kept for the next growth, as any unmapped handle (released by EmptyCache or under pressure).
      expandable_.CacheHandle(job.chunk);
    } else {
      result.bytes_left_mapped += job.chunk.size;
    }
    expandable_.SettleInFlight(*job.shard, job.block, std::span<const ChunkPlacement>(&job.chunk, 1),
                               std::vector<bool>{!job.unmapped});
  }
  device_mu_.Unlock();
  for (StreamShard* shard : shards) shard->mu.Unlock();
  return result;
}

}  // namespace graphalloc
