// Expandable segments, release: unmap every chunk wholly covered by free blocks (anywhere in a segment,
// also between live blocks), release the physical handles, and give back reservations left wholly
// unmapped. EmptyCache() and the slow path before out-of-memory call it; driver calls run with every lock
// released, the blocks concerned being in flight meanwhile. Also the repair of quarantined chunks (mapped
// without access), which a release tries first.
#include <algorithm>

#include "graphalloc/allocator/caching_allocator.h"

namespace graphalloc {

absl::Status CachingAllocator::RepairQuarantinedChunks(bool may_unmap) {
  if (quarantined_.load(std::memory_order_relaxed) == 0) return absl::OkStatus();
  std::vector<QuarantinedChunk> work;
  std::vector<int> peers;
  {
    MutexLock lock(&device_mu_);
    work.swap(quarantine_);  // the blocks stay in flight: this call owns them now
    quarantined_.store(0, std::memory_order_relaxed);
    peers = peers_;
  }
  enum Outcome { kAccessible, kUnmapped, kStillQuarantined };
  std::vector<Outcome> outcomes(work.size(), kStillQuarantined);
  absl::Status first_error;
  for (std::size_t i = 0; i < work.size(); ++i) {
    const ChunkPlacement& c = work[i].chunk;
    absl::Status s = driver_->MemSetAccess(c.ptr, c.size, peers);
    if (s.ok()) {
      outcomes[i] = kAccessible;
      continue;
    }
    if (may_unmap) {
      s = driver_->MemUnmap(c.ptr, c.size);
      if (s.ok()) {
        outcomes[i] = kUnmapped;
        continue;
      }
    }
    if (first_error.ok()) first_error = s;
  }
  for (std::size_t i = 0; i < work.size(); ++i) {
    Block* b = work[i].block;
    const ChunkPlacement& c = work[i].chunk;
    StreamShard& shard = *b->segment->shard;
    SpinLockHolder shard_lock(&shard.mu);
    MutexLock lock(&device_mu_);
    if (outcomes[i] == kUnmapped) {
      segments_.ChunkUnmapped(b->segment, c);
      handle_cache_.Put(c.size, c.handle);  // reused by the next growth, or released with the cache
    }
    SettleInFlight(shard, b, std::span<const ChunkPlacement>(&c, 1),
                   std::vector<bool>{outcomes[i] != kUnmapped},
                   std::vector<bool>{outcomes[i] == kStillQuarantined});
  }
  return first_error;
}

absl::StatusOr<std::size_t> CachingAllocator::ReleaseExpandableMemory(PoolId scope)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  struct Job {
    StreamShard* shard;
    Block* block;  // in flight, tiled exactly by `chunks`
    std::vector<ChunkPlacement> chunks;
    std::vector<bool> still_mapped;
  };
  // Quarantined chunks first: unmapped here, or made accessible and so free memory the sweep can unmap.
  absl::Status first_error = RepairQuarantinedChunks(/*may_unmap=*/true);
  const std::size_t gran = driver_->Info().granularity;
  std::vector<Job> jobs;
  std::vector<ChunkPlacement> cached;
  {
    AllShardsLock lock(shards_, device_mu_);
    lock.ForEach([&](StreamShard* shard) {
      if (!PoolRegistry::Releasable(shard->pool, scope)) return;
      blocks_.FlushQuickCache(*shard);
      for (BlockPool* pool : {&shard->large_pool, &shard->small_pool}) {
        std::vector<Block*> candidates;
        for (auto it = pool->LowerBound(gran); it != pool->blocks.end(); ++it) {
          if (it->block->segment->expandable) candidates.push_back(it->block);
        }
        for (Block* b : candidates) {
          std::vector<ChunkPlacement> chunks = b->segment->vmm->ChunksWithin(b->ptr, b->end());
          if (chunks.empty()) continue;
          Block* mid =
              blocks_.CarveRange(*shard, b, chunks.front().ptr, chunks.back().ptr + chunks.back().size);
          jobs.push_back({shard, mid, std::move(chunks), {}});
        }
      }
    });
    cached = handle_cache_.TakeAll();
  }

  // Work queued before the blocks were freed may still use them: an unmap is not stream-ordered, so the
  // device finishes that work first (as PyTorch does before it unmaps). Without that, nothing is unmapped;
  // nor when a capture began since the caller checked (synchronizing would break it).
  captures_.gate().Lock();
  bool device_idle = true;
  if (!jobs.empty()) {
    absl::Status s = captures_.WaitForWorkBeforeUnmap(std::nullopt);
    device_idle = s.ok();
    if (!s.ok() && !absl::IsAborted(s) && first_error.ok()) first_error = s;
  }
  std::vector<ChunkPlacement> to_release = std::move(cached);
  for (Job& job : jobs) {
    job.still_mapped.assign(job.chunks.size(), true);
    for (std::size_t i = 0; device_idle && i < job.chunks.size(); ++i) {
      absl::Status s = driver_->MemUnmap(job.chunks[i].ptr, job.chunks[i].size);
      if (s.ok()) {
        job.still_mapped[i] = false;
        to_release.push_back(job.chunks[i]);
      } else if (first_error.ok()) {
        first_error = s;
      }
    }
  }
  captures_.gate().Unlock();
  std::vector<ChunkPlacement> kept;  // handles the device refused to release: cached again
  for (const ChunkPlacement& h : to_release) {
    absl::Status s = driver_->MemRelease(h.handle);
    if (s.ok()) continue;
    if (first_error.ok()) first_error = s;
    kept.push_back(h);
  }

  std::size_t unmapped = 0;
  std::vector<Segment*> empty;
  {
    AllShardsLock lock(shards_, device_mu_);
    for (const ChunkPlacement& h : kept) handle_cache_.Put(h.size, h.handle);
    for (Job& job : jobs) {
      for (std::size_t i = 0; i < job.chunks.size(); ++i) {
        if (job.still_mapped[i]) continue;
        segments_.ChunkUnmapped(job.block->segment, job.chunks[i]);
        unmapped += job.chunks[i].size;
      }
      SettleInFlight(*job.shard, job.block, job.chunks, job.still_mapped);
    }
    // Reservations left wholly unmapped go back to the device.
    for (const auto& [base, segment] : segments_) {
      const Block* head = segment->head;
      if (segment->vmm == nullptr || head->next != nullptr || head->mapped || head->in_flight) continue;
      if (!PoolRegistry::Releasable(segment->shard->pool, scope)) continue;
      empty.push_back(segment);
    }
    for (Segment* segment : empty) {
      segment->pool->unmapped.erase(segment->head->ptr);
      segments_.RemoveReservation(segment);
      ++segment->shard->blocks_in_release;
    }
  }

  for (Segment* segment : empty) {
    absl::Status s = driver_->AddressFree(segment->base, segment->size);
    StreamShard& shard = *segment->shard;
    SpinLockHolder shard_lock(&shard.mu);
    --shard.blocks_in_release;
    if (s.ok()) {
      shard.arena.Delete(segment->head);
      delete segment;
      continue;
    }
    if (first_error.ok()) first_error = s;
    MutexLock lock(&device_mu_);
    segments_.AddReservation(segment);
    segment->pool->unmapped.emplace(segment->head->ptr, segment->head);
  }
  if (!first_error.ok()) return first_error;
  return unmapped;
}

}  // namespace graphalloc
