// Expandable segments, release: unmap every chunk wholly covered by free blocks (anywhere in a segment,
// also between live blocks), release the physical handles, and give back reservations left wholly
// unmapped. EmptyCache() and the slow path before out-of-memory call it; driver calls run with every lock
// released, the blocks concerned being in flight meanwhile.
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/pool_registry.h"

namespace graphalloc {

// Chunks of one free block being unmapped.
struct ExpandableSegments::ReleaseJob {
  StreamShard* shard;
  Block* block;  // in flight, tiled exactly by `chunks`
  std::vector<ChunkPlacement> chunks;
  std::vector<bool> still_mapped;
};

bool ExpandableSegments::MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const {
  const PoolState* pool = segment.shard->pool;
  // A communication pool keeps its chunks registered (mapped) until the pool goes (PoolOptions).
  if (pool != nullptr && pool->options.communication && !pool->orphaned.load(std::memory_order_acquire)) {
    return true;
  }
  return hooks_.Pinned(begin, end);
}

absl::StatusOr<std::size_t> ExpandableSegments::Release(PoolId scope) {
  // Quarantined chunks first: unmapped here, or made accessible and so free memory the sweep can unmap.
  absl::Status first_error = RepairQuarantinedChunks();
  std::vector<ReleaseJob> jobs;
  std::vector<ChunkPlacement> to_release;  // the cached handles, then those of the chunks unmapped
  CarveIdleChunks(scope, &jobs, &to_release);
  if (absl::Status s = UnmapJobs(jobs, &to_release); !s.ok() && first_error.ok()) first_error = s;
  const std::vector<ChunkPlacement> kept = ReleaseHandles(to_release, &first_error);
  std::vector<Segment*> empty;
  const std::size_t unmapped = SettleReleased(scope, jobs, kept, &empty);
  if (absl::Status s = FreeReservations(empty); !s.ok() && first_error.ok()) first_error = s;
  if (!first_error.ok()) return first_error;
  return unmapped;
}

void ExpandableSegments::CarveIdleChunks(PoolId scope, std::vector<ReleaseJob>* jobs,
                                         std::vector<ChunkPlacement>* cached) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const std::unique_ptr<ExpandableHost::AllShards> lock = host_.LockAllShards();
  lock->ForEach([&](StreamShard& shard) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!PoolRegistry::Releasable(shard.pool, scope)) return;
    host_.FlushQuickCache(shard);
    for (BlockPool* pool : {&shard.large_pool, &shard.small_pool}) {
      std::vector<Block*> candidates;
      for (auto it = pool->LowerBound(granularity_); it != pool->blocks.end(); ++it) {
        // A sleeping pool's chunks are its sleep's and wake's to unmap and map (pool_sleep.h).
        if (it->block->segment->expandable && !it->block->segment->vmm->asleep())
          candidates.push_back(it->block);
      }
      for (Block* b : candidates) {
        // Runs of chunks that may go (a pinned one stays), carved highest first so that `b` keeps the
        // lower part holding the rest.
        std::vector<std::vector<ChunkPlacement>> runs(1);
        for (const ChunkPlacement& c : b->segment->vmm->ChunksWithin(b->ptr, b->end())) {
          if (MustStayMapped(*b->segment, c.ptr, c.ptr + c.size)) {
            if (!runs.back().empty()) runs.emplace_back();
            continue;
          }
          runs.back().push_back(c);
        }
        for (auto run = runs.rbegin(); run != runs.rend(); ++run) {
          if (run->empty()) continue;
          Block* mid = host_.CarveRange(shard, b, run->front().ptr, run->back().ptr + run->back().size);
          jobs->push_back({&shard, mid, std::move(*run), {}});
        }
      }
    }
  });
  *cached = handles_.TakeAll();
}

absl::Status ExpandableSegments::UnmapJobs(std::vector<ReleaseJob>& jobs,
                                           std::vector<ChunkPlacement>* to_release) {
  // Work queued before the blocks were freed may still use them: an unmap is not stream-ordered, so the
  // device finishes that work first (as PyTorch does before it unmaps). Without that, nothing is unmapped;
  // nor when a capture began since the caller checked (synchronizing would break it).
  absl::Status first_error;
  const std::unique_ptr<ExpandableHost::UnmapGate> gate = host_.EnterUnmapGate();
  bool device_idle = true;
  if (!jobs.empty()) {
    absl::Status s = gate->WaitForWorkBeforeUnmap(std::nullopt);
    device_idle = s.ok();
    if (!s.ok() && !absl::IsAborted(s)) first_error = s;
  }
  for (ReleaseJob& job : jobs) {
    job.still_mapped.assign(job.chunks.size(), true);
    const PoolId pool = PoolOf(*job.block->segment);
    for (std::size_t i = 0; device_idle && i < job.chunks.size(); ++i) {
      const ChunkPlacement& c = job.chunks[i];
      hooks_.Unmap(pool, c.ptr, c.size, c.handle, true);
      absl::Status s = driver_.MemUnmap(c.ptr, c.size);
      if (s.ok()) {
        job.still_mapped[i] = false;
        to_release->push_back(c);
        continue;
      }
      hooks_.Map(pool, c.ptr, c.size, c.handle, true);  // the driver kept it mapped
      if (first_error.ok()) first_error = s;
    }
  }
  return first_error;
}

std::size_t ExpandableSegments::SettleReleased(PoolId scope, std::vector<ReleaseJob>& jobs,
                                               const std::vector<ChunkPlacement>& kept,
                                               std::vector<Segment*>* empty) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::size_t unmapped = 0;
  const std::unique_ptr<ExpandableHost::AllShards> lock = host_.LockAllShards();
  for (const ChunkPlacement& h : kept) handles_.Put(h.size, h.handle);
  for (ReleaseJob& job : jobs) {
    for (std::size_t i = 0; i < job.chunks.size(); ++i) {
      if (job.still_mapped[i]) continue;
      host_.ChunkUnmapped(job.block->segment, job.chunks[i]);
      unmapped += job.chunks[i].size;
    }
    SettleInFlight(*job.shard, job.block, job.chunks, job.still_mapped);
  }
  // Reservations left wholly unmapped go back to the device.
  for (Segment* segment : host_.Segments()) {
    const Block* head = segment->head;
    if (segment->vmm == nullptr || head->next != nullptr || head->mapped || head->in_flight) continue;
    if (!PoolRegistry::Releasable(segment->shard->pool, scope)) continue;
    empty->push_back(segment);
  }
  for (Segment* segment : *empty) {
    segment->pool->unmapped.erase(segment->head->ptr);
    host_.RemoveReservation(segment);
    ++segment->shard->blocks_in_release;
  }
  return unmapped;
}

absl::Status ExpandableSegments::FreeReservations(const std::vector<Segment*>& empty)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  absl::Status first_error;
  for (Segment* segment : empty) {
    absl::Status s = driver_.AddressFree(segment->base, segment->size);
    StreamShard& shard = *segment->shard;
    const std::unique_ptr<ExpandableHost::Lock> shard_lock = host_.LockShard(shard);
    --shard.blocks_in_release;
    if (s.ok()) {
      shard.arena.Delete(segment->head);
      delete segment;
      continue;
    }
    if (first_error.ok()) first_error = s;
    const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    host_.AddReservation(segment);
    segment->pool->unmapped.emplace(segment->head->ptr, segment->head);
  }
  return first_error;
}

absl::Status ExpandableSegments::ReleaseCachedHandles() {
  std::vector<ChunkPlacement> handles;
  {
    const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    handles = handles_.TakeAll();
  }
  absl::Status first_error;
  const std::vector<ChunkPlacement> kept = ReleaseHandles(handles, &first_error);
  if (!kept.empty()) {
    const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    for (const ChunkPlacement& h : kept) handles_.Put(h.size, h.handle);
  }
  return first_error;
}

std::vector<ChunkPlacement> ExpandableSegments::ReleaseHandles(const std::vector<ChunkPlacement>& handles,
                                                               absl::Status* first_error) {
  std::vector<ChunkPlacement> kept;  // handles the device refused to release: cached again
  for (const ChunkPlacement& h : handles) {
    absl::Status s = driver_.MemRelease(h.handle);
    if (s.ok()) continue;
    if (first_error->ok()) *first_error = s;
    kept.push_back(h);
  }
  return kept;
}

void ExpandableSegments::ReleaseCachedHandlesAtExit() {
  const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  for (const ChunkPlacement& h : handles_.TakeAll()) (void)driver_.MemRelease(h.handle);
}

}  // namespace graphalloc
