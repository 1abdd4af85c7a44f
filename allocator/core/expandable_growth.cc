// Expandable segments, growth: serve a request by mapping physical memory into the shard's reserved range
// where the request needs it (expandable_segments.h; the plan: growth_plan.h).
//
// One expandable segment per (shard, pool kind), reserved lazily at the device's total memory (rounded up
// to the granularity); another is reserved only when no unmapped range of the existing ones fits. A
// growth is planned under the shard's lock, then, with no lock held: the idle chunks that move are
// unmapped, new handles created, every hole mapped and granted access; then, under the locks again, the
// chunks are accounted and the blocks turn back into free (or unmapped) blocks, merged, and the request is
// served from the result. Any failure undoes what the unlocked part did (mapped chunks unmapped, handles
// into the cache) and settles the blocks as they are; the request then goes on down the slow path. How
// often a request plans, reserves and retries is the retry policy's (retry_policy.h).
#include <algorithm>
#include <utility>

#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/pool_state.h"
#include "graphalloc/allocator/core/retry_policy.h"

namespace graphalloc {

ExpandableSegments::ExpandableSegments(const Parts& parts)
    : host_(parts.host),
      driver_(parts.driver),
      hooks_(parts.hooks),
      reservation_(RoundUp(parts.driver.Info().total_memory, parts.driver.Info().granularity)),
      granularity_(parts.driver.Info().granularity),
      handle_aligned_(parts.handle_aligned),
      shareable_all_(parts.shareable_handles) {}

bool ExpandableSegments::Shareable(const PoolState* pool) const {
  return shareable_all_ || (pool != nullptr && pool->options.shareable);
}

absl::StatusOr<PhysicalHandle> ExpandableSegments::CreateHandle(const PoolState* pool, std::size_t size) {
  return Shareable(pool) ? driver_.MemCreateShareable(size) : driver_.MemCreate(size);
}

absl::StatusOr<PhysicalHandle> ExpandableSegments::CreateHandleOrReleaseCache(const PoolState* pool,
                                                                              std::size_t size) {
  absl::StatusOr<PhysicalHandle> h = CreateHandle(pool, size);
  if (RetryPolicy::ReleaseHandleCacheAndRetry(h.status()) && ReleaseCachedHandles().ok()) {
    h = CreateHandle(pool, size);
  }
  return h;
}

absl::StatusOr<DevicePtr> ExpandableSegments::Allocate(StreamShard& shard, const AllocationRequest& request)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (request.size > reservation_) return DevicePtr{0};
  // A chunk left mapped without access by an earlier failure is fixed before more memory is mapped (it
  // may serve this request then).
  (void)RepairQuarantinedChunks();
  GrowthAttempts attempts;
  while (attempts.NextPass()) {
    GrowthPlan plan;
    bool planned = false;
    {
      const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockShard(shard);
      if (DevicePtr p = host_.AllocateBestFit(shard, request)) return p;
      planned = PlanGrowth(shard, shard.PoolFor(request.size), request.size, &plan);
    }
    if (!planned) {
      // No unmapped range fits: reserve a(nother) segment, as often as the policy allows one request.
      if (!attempts.TakeReservation()) return DevicePtr{0};
      absl::Status s = CreateSegment(shard, request.small());
      if (absl::IsResourceExhausted(s)) return DevicePtr{0};
      if (!s.ok()) return s;
      continue;
    }
    absl::StatusOr<bool> grown = ExecuteGrowth(shard, plan);
    if (!grown.ok()) return grown.status();
    if (!*grown) return DevicePtr{0};
    // Mapped: the next pass finds the merged block (unless another thread took it meanwhile).
  }
  return DevicePtr{0};
}

absl::Status ExpandableSegments::CreateSegment(StreamShard& shard,
                                               bool small) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  absl::StatusOr<DevicePtr> base = driver_.AddressReserve(reservation_, 0);
  if (!base.ok()) return base.status();  // nothing was reserved: nothing to undo
  const std::unique_ptr<ExpandableHost::Lock> shard_lock = host_.LockShard(shard);
  BlockPool& pool = small ? shard.small_pool : shard.large_pool;
  auto* segment = new Segment;
  segment->base = *base;
  segment->size = reservation_;
  segment->stream = shard.stream;
  segment->shard = &shard;
  segment->pool = &pool;
  segment->expandable = true;
  segment->handle_aligned = handle_aligned_ || (shard.pool != nullptr && shard.pool->options.handle_aligned);
  segment->vmm = std::make_unique<ExpandableSegment>(*base, reservation_);
  Block* block = shard.arena.New();
  block->ptr = *base;
  block->size = reservation_;
  block->segment = segment;
  block->mapped = false;
  segment->head = block;
  pool.unmapped.emplace(block->ptr, block);
  const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  host_.AddReservation(segment);  // no segment/reserved stats: those follow mapped chunks
  return absl::OkStatus();
}

bool ExpandableSegments::PlanGrowth(StreamShard& shard, BlockPool& pool, std::size_t size, GrowthPlan* plan) {
  GrowthPlanner planner = host_.Planner(shard, pool, size, granularity_, plan);
  if (!planner.TakeRange()) return false;
  // A pinned pool's free memory must stay where it is: graphs that replay into the pool write their
  // temporaries (free between replays) at the addresses they were captured with. And a move waits for the
  // stream's work (ExecuteGrowth), which a capture cannot do.
  const bool pinned = shard.pool != nullptr && shard.pool->pins.load(std::memory_order_acquire) > 0;
  const bool capturing = host_.CaptureUnderway();
  const bool communication = shard.pool != nullptr && shard.pool->options.communication;
  planner.FindIdleChunks(/*may_move=*/!pinned && !capturing && !communication, &hooks_);
  const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  const std::size_t committed = host_.Committed(handles_.bytes(), size);
  // The cache mixes every pool's handles: unless all are exportable, a shareable pool creates its own.
  HandleCache none;
  const bool may_reuse = shareable_all_ || !Shareable(shard.pool);
  planner.SourceHoles(may_reuse ? handles_ : none,
                      MaxNewChunkSize(size, planner.stranded(), committed, host_.Capacity(), granularity_));
  planner.CarveStolenChunks();
  plan->over_limit = host_.OverLimit(handles_.bytes(), plan->cached_bytes + plan->new_bytes);
  host_.BeginGrowth(plan->cached_bytes);
  plan->peers = peers_;
  return true;
}

// What the unlocked part of a growth did, for the settlement.
struct ExpandableSegments::Execution {
  absl::Status error;
  std::vector<bool> stolen_unmapped;                // per stolen chunk
  std::vector<std::vector<ChunkPlacement>> placed;  // per hole, its sources at their addresses
  std::vector<std::vector<bool>> mapped;            // per hole and source: mapped now
  std::vector<std::vector<bool>> no_access;         // mapped, but without access: quarantined
};

absl::StatusOr<bool> ExpandableSegments::ExecuteGrowth(StreamShard& shard, GrowthPlan& plan) {
  Execution x;
  bool admitted = false;  // new_bytes counted as growth in flight
  x.error = AdmitGrowth(plan, &admitted);
  UnmapStolenChunks(shard, plan, x);
  ReleaseRetiredChunks(plan, x);
  CreateHandles(shard.pool, plan, x);
  MapHoles(plan, x);
  SettleGrowth(shard, plan, admitted, x);
  if (x.error.ok()) return true;
  if (absl::IsResourceExhausted(x.error)) return false;
  if (absl::IsAborted(x.error)) return true;  // undone, nothing lost: the caller plans again
  return x.error;
}

absl::Status ExpandableSegments::AdmitGrowth(const GrowthPlan& plan, bool* admitted) {
  absl::Status error;
  if (plan.over_limit) {
    // Idle cached handles are the first thing to give back when the limit is near.
    if (absl::Status s = ReleaseCachedHandles(); !s.ok()) error = s;
  }
  const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  *admitted = host_.AdmitNewHandles(handles_.bytes(), plan.new_bytes);
  if (!*admitted && error.ok()) error = absl::ResourceExhaustedError("memory limit");
  return error;
}

void ExpandableSegments::UnmapStolenChunks(StreamShard& shard, const GrowthPlan& plan, Execution& x) {
  // A chunk is idle once its blocks are free, but work queued on the shard's stream before those frees
  // may still be running on it (a free is stream-ordered, an unmap is not: the GPU would fault on an
  // address that is gone). So the stream's work completes first. A capture that began since the plan
  // forbids the synchronization: the growth is undone and planned again, and the next plan moves nothing
  // (it sees the capture).
  x.stolen_unmapped.assign(plan.stolen_chunks.size(), false);
  if (!x.error.ok() || plan.stolen_chunks.empty()) return;
  const std::unique_ptr<ExpandableHost::UnmapGate> gate = host_.EnterUnmapGate();
  x.error = gate->WaitForWorkBeforeUnmap(shard.stream);
  for (std::size_t i = 0; x.error.ok() && i < plan.stolen_chunks.size(); ++i) {
    const ChunkPlacement& c = plan.stolen_chunks[i];
    const PoolId pool = PoolOf(*plan.stolen[i]->segment);
    hooks_.Unmap(pool, c.ptr, c.size, c.handle, true);
    absl::Status s = driver_.MemUnmap(c.ptr, c.size);
    if (s.ok()) {
      x.stolen_unmapped[i] = true;
    } else {
      hooks_.Map(pool, c.ptr, c.size, c.handle, true);  // still mapped where it was
      x.error = s;
    }
  }
}

void ExpandableSegments::ReleaseRetiredChunks(const GrowthPlan& plan, const Execution& x) {
  // Before the new handle is created, so that the device has their memory back for it. A handle the
  // device will not release waits in the cache (released with it, or reused at its size).
  if (!plan.release_stolen) return;
  for (std::size_t i = 0; i < plan.stolen_chunks.size(); ++i) {
    if (!x.stolen_unmapped[i] || driver_.MemRelease(plan.stolen_chunks[i].handle).ok()) continue;
    const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    handles_.Put(plan.stolen_chunks[i].size, plan.stolen_chunks[i].handle);
  }
}

void ExpandableSegments::CreateHandles(const PoolState* pool, GrowthPlan& plan, Execution& x) {
  for (GrowthPlan::Hole& hole : plan.holes) {
    for (GrowthPlan::Source& src : hole.sources) {
      if (!x.error.ok() || !src.created) continue;
      absl::StatusOr<PhysicalHandle> h = CreateHandleOrReleaseCache(pool, src.size);
      if (!h.ok()) {
        x.error = h.status();
        break;
      }
      src.handle = *h;
      src.created = false;  // now a handle like the others
    }
  }
}

void ExpandableSegments::MapHoles(const GrowthPlan& plan, Execution& x) {
  const std::size_t n = plan.holes.size();
  x.placed.resize(n);
  x.mapped.resize(n);
  x.no_access.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    DevicePtr at = plan.holes[i].block->ptr;
    for (const GrowthPlan::Source& src : plan.holes[i].sources) {
      x.placed[i].push_back({at, src.size, src.handle});
      at += src.size;
    }
    x.mapped[i].assign(x.placed[i].size(), false);
    x.no_access[i].assign(x.placed[i].size(), false);
  }
  std::vector<ChunkPlacement> no_access;
  std::size_t done = 0;
  for (; x.error.ok() && done < n; ++done) {
    absl::Status s = MapChunks(driver_, x.placed[done], plan.peers, &no_access);
    if (!s.ok()) {
      x.error = s;
      break;
    }
    x.mapped[done].assign(x.placed[done].size(), true);
  }
  if (x.error.ok()) {
    NotifyMappedHoles(plan, x);
    return;
  }
  // Undo the holes mapped before the failure; a chunk whose unmap fails stays mapped, with its access, as
  // a free block (and accounted).
  for (std::size_t i = 0; i < done; ++i) {
    for (std::size_t k = 0; k < x.placed[i].size(); ++k) {
      x.mapped[i][k] = !driver_.MemUnmap(x.placed[i][k].ptr, x.placed[i][k].size).ok();
    }
  }
  // The failed hole's chunks that MapChunks could not unmap stay mapped without access: quarantined.
  for (const ChunkPlacement& c : no_access) {
    for (std::size_t k = 0; k < x.placed[done].size(); ++k) {
      if (x.placed[done][k].ptr != c.ptr) continue;
      x.mapped[done][k] = true;
      x.no_access[done][k] = true;
    }
  }
  NotifyMappedHoles(plan, x);
}

void ExpandableSegments::NotifyMappedHoles(const GrowthPlan& plan, const Execution& x) {
  // Before the settlement hands any of it out; a quarantined chunk (no access) is told of once repaired.
  for (std::size_t i = 0; i < x.placed.size(); ++i) {
    const PoolId pool = PoolOf(*plan.holes[i].block->segment);
    for (std::size_t k = 0; k < x.placed[i].size(); ++k) {
      if (!x.mapped[i][k] || x.no_access[i][k]) continue;
      const ChunkPlacement& c = x.placed[i][k];
      hooks_.Map(pool, c.ptr, c.size, c.handle, true);
    }
  }
}

void ExpandableSegments::SettleGrowth(StreamShard& shard, const GrowthPlan& plan, bool admitted,
                                      const Execution& x) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Bookkeeping for unmaps first, then maps (so that the reserved peak never double counts).
  const std::unique_ptr<ExpandableHost::Lock> shard_lock = host_.LockShard(shard);
  const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  host_.EndGrowth(plan.cached_bytes + (admitted ? plan.new_bytes : 0));
  for (std::size_t i = 0; i < plan.stolen.size(); ++i) {
    Block* b = plan.stolen[i];
    if (x.stolen_unmapped[i]) host_.ChunkUnmapped(b->segment, plan.stolen_chunks[i]);
    SettleInFlight(shard, b, std::span<const ChunkPlacement>(&plan.stolen_chunks[i], 1),
                   std::vector<bool>{!x.stolen_unmapped[i]});
  }
  for (std::size_t i = 0; i < plan.holes.size(); ++i) {
    Block* b = plan.holes[i].block;
    for (std::size_t k = 0; k < x.placed[i].size(); ++k) {
      const ChunkPlacement& c = x.placed[i][k];
      if (x.mapped[i][k]) {
        host_.ChunkMapped(b->segment, c);
        continue;
      }
      // A handle that is not mapped (anymore) waits in the cache; a stolen one whose unmap failed is
      // still mapped where it was, and one never created has nothing to keep.
      const GrowthPlan::Source& src = plan.holes[i].sources[k];
      if (src.created) continue;
      if (src.stolen >= 0 && !x.stolen_unmapped[static_cast<std::size_t>(src.stolen)]) continue;
      handles_.Put(c.size, c.handle);
    }
    SettleInFlight(shard, b, x.placed[i], x.mapped[i], x.no_access[i]);
  }
  for (Block* b : plan.run) {
    b->in_flight = false;
    host_.ReturnToIndex(shard, b);
  }
}

absl::Status ExpandableSegments::AddPeer(int peer_ordinal) {
  std::vector<ChunkPlacement> chunks;
  std::vector<int> peers;
  {
    const std::unique_ptr<ExpandableHost::AllShards> lock = host_.LockAllShards();
    if (std::find(peers_.begin(), peers_.end(), peer_ordinal) == peers_.end()) peers_.push_back(peer_ordinal);
    peers = peers_;
    for (Segment* segment : host_.Segments()) {
      if (segment->vmm == nullptr) continue;
      for (const auto& [ptr, chunk] : segment->vmm->chunks())
        chunks.push_back({ptr, chunk.size, chunk.handle});
    }
  }
  for (const ChunkPlacement& c : chunks) {
    if (absl::Status s = driver_.MemSetAccess(c.ptr, c.size, peers); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
