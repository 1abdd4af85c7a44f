// Private pools, the allocator's side: handles, creation, users and pins (kept by PoolRegistry), routes
// (kept by RouteTable) and frees deferred until captures end, use_on_oom, per-pool statistics and cache
// release, and the release of a pool nobody uses any more.
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {

// ---- Handles. ----

PrivatePool::PrivatePool(const PrivatePool& other) : use_(other.allocator(), other.id()) {
  // The source holds a use, so the pool exists and the count cannot fail to rise.
  if (CachingAllocator* allocator = use_.allocator()) (void)allocator->AddPoolUser(use_.target());
}

PrivatePool& PrivatePool::operator=(const PrivatePool& other) {
  if (this != &other) {
    PrivatePool copy(other);
    *this = std::move(copy);
  }
  return *this;
}

void PrivatePool::DropUser(CachingAllocator& allocator, const PoolId& id) { allocator.DropPoolUser(id); }

void GraphPin::Unpin(CachingAllocator& allocator, const PoolId& pool) { allocator.DropPin(pool); }

// ---- Registry. ----

absl::StatusOr<PrivatePool> CachingAllocator::CreatePool(PoolOptions options,
                                                         std::shared_ptr<SegmentSource> segment_source) {
  MutexLock lock(&device_mu_);
  return PrivatePool(this, pools_.Create(options, std::move(segment_source)));
}

absl::StatusOr<PrivatePool> CachingAllocator::AcquirePool(PoolId id) {
  if (absl::Status s = AddPoolUser(id); !s.ok()) return s;
  return PrivatePool(this, id);
}

absl::Status CachingAllocator::AddPoolUser(PoolId id) {
  MutexLock lock(&device_mu_);
  return pools_.AddUser(id);
}

void CachingAllocator::DropPoolUser(PoolId id) {
  bool last = false;
  {
    MutexLock lock(&device_mu_);
    last = pools_.DropUser(id);
  }
  // Nobody is left to hear about a failure here: the pool's memory stays cached and EmptyCache retries.
  if (last) (void)MaybeReleasePool(id);
}

absl::StatusOr<GraphPin> CachingAllocator::PinForGraph(const PrivatePool& pool) {
  if (pool.allocator() != this) {
    return absl::InvalidArgumentError("PinForGraph: the pool belongs to another allocator (or is empty)");
  }
  MutexLock lock(&device_mu_);
  if (absl::Status s = pools_.AddPin(pool.id()); !s.ok()) return s;
  return GraphPin(this, pool.id());
}

void CachingAllocator::DropPin(PoolId id) {
  bool last = false;
  {
    MutexLock lock(&device_mu_);
    last = pools_.DropPin(id);
  }
  if (last) (void)MaybeReleasePool(id);
}

absl::StatusOr<PoolStats> CachingAllocator::GetPoolStats(PoolId id) const {
  MutexLock lock(&device_mu_);
  const PoolState* found = pools_.Find(id);
  if (found == nullptr) return absl::NotFoundError(absl::StrFormat("private pool %d does not exist", id));
  const PoolState& pool = *found;
  PoolStats stats;
  stats.reserved_bytes = static_cast<std::size_t>(pool.reserved_bytes);
  stats.peak_reserved_bytes = static_cast<std::size_t>(pool.peak_reserved_bytes);
  stats.allocated_bytes = static_cast<std::size_t>(pool.allocated_bytes.load(std::memory_order_relaxed));
  stats.peak_allocated_bytes =
      static_cast<std::size_t>(pool.peak_allocated_bytes.load(std::memory_order_relaxed));
  stats.live_blocks = static_cast<std::size_t>(pool.live_blocks.load(std::memory_order_relaxed));
  stats.use_count = pool.users.load(std::memory_order_relaxed);
  stats.graph_pins = pool.pins.load(std::memory_order_relaxed);
  for (const auto& [base, segment] : segments_) {
    if (segment->shard->pool != &pool) continue;
    ++stats.segments;
    if (segment->vmm == nullptr) {
      if (expandable_.MustStayMapped(*segment, segment->base, segment->base + segment->size))
        stats.pinned_bytes += segment->size;
      continue;
    }
    for (const auto& [ptr, chunk] : segment->vmm->chunks()) {
      if (expandable_.MustStayMapped(*segment, ptr, ptr + chunk.size)) stats.pinned_bytes += chunk.size;
    }
  }
  const SleepState sleep = sleep_.StateOf(id, segments_);
  stats.asleep = sleep.asleep;
  stats.sleeping_bytes = sleep.sleeping_bytes;
  stats.backup_bytes = sleep.backup_bytes;
  return stats;
}

absl::StatusOr<SleepResult> CachingAllocator::Sleep(const SleepRequest& request) {
  return sleep_.Sleep(request);
}

absl::StatusOr<WakeResult> CachingAllocator::Wake(const WakeRequest& request) { return sleep_.Wake(request); }

absl::StatusOr<SleepState> CachingAllocator::GetSleepState(PoolId pool) const {
  MutexLock lock(&device_mu_);
  if (pool != kDefaultPool && pools_.Find(pool) == nullptr) {
    return absl::NotFoundError(absl::StrFormat("private pool %d does not exist", pool));
  }
  return sleep_.StateOf(pool, segments_);
}

absl::Status CachingAllocator::SetPoolUseOnOom(PoolId id, bool use_on_oom) {
  MutexLock lock(&device_mu_);
  return pools_.SetUseOnOom(id, use_on_oom);
}

absl::Status CachingAllocator::EmptyPoolCache(PoolId id) {
  {
    MutexLock lock(&device_mu_);
    if (pools_.Find(id) == nullptr) {
      return absl::NotFoundError(absl::StrFormat("private pool %d does not exist", id));
    }
  }
  if (captures_.underway()) {
    return absl::FailedPreconditionError(
        "EmptyPoolCache during a CUDA graph capture: freeing device memory is illegal while capturing; call "
        "it "
        "after the capture ends");
  }
  if (absl::Status s = SynchronizeAndFreeEvents(); !s.ok()) return s;
  return ReleaseCachedSegments(/*only_oversize=*/false, 0, id).status();
}

absl::Status CachingAllocator::MaybeReleasePool(PoolId id) {
  {
    MutexLock lock(&device_mu_);
    const PoolState* pool = pools_.Find(id);
    if (pool == nullptr || !pool->orphaned.load(std::memory_order_acquire)) return absl::OkStatus();
    if (pool->live_blocks.load(std::memory_order_acquire) != 0) return absl::OkStatus();
  }
  // A replay of a graph that used the pool may still run on some stream even though its handles are gone,
  // and freed blocks may still wait on events: the device finishes first, as PyTorch does before it frees
  // a graph pool. (Not while capturing: the memory then stays until EmptyCache.)
  {
    MutexLock gate(&captures_.gate());  // no capture begins while the device synchronizes
    if (absl::Status s = captures_.WaitForWorkBeforeUnmap(std::nullopt); !s.ok()) {
      return absl::IsAborted(s) ? absl::OkStatus() : s;
    }
  }
  if (absl::Status s = SynchronizeAndFreeEvents(); !s.ok()) return s;
  absl::StatusOr<std::size_t> freed = ReleaseCachedSegments(/*only_oversize=*/false, 0, id);
  if (!freed.ok()) return freed.status();
  ForgetPoolIfEmpty(id);
  return absl::OkStatus();
}

void CachingAllocator::ForgetPoolIfEmpty(PoolId id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AllShardsLock lock(shards_, device_mu_);
  const PoolState* pool = pools_.Find(id);
  if (pool == nullptr || !pool->orphaned.load(std::memory_order_acquire) ||
      pool->live_blocks.load(std::memory_order_acquire) != 0) {
    return;
  }
  for (const auto& [base, segment] : segments_) {
    if (segment->shard->pool == pool) return;  // a segment stays: a later EmptyCache finishes the job
  }
  bool busy = false;
  lock.ForEach([&](StreamShard* shard) {
    if (shard->pool != pool) return;
    busy = busy || shard->arena.live() != 0 ||
           shard->pending_event_count.load(std::memory_order_relaxed) != 0 || shard->blocks_in_release != 0;
  });
  if (busy) return;
  lock.ForEach([&](StreamShard* shard) {
    if (shard->pool == pool) shards_.Retire(shard);
  });
  pools_.Forget(id);
}

// ---- Routes. ----
absl::Status PoolRoute::End() {
  CachingAllocator* allocator = route_.Release();
  if (allocator == nullptr) return absl::OkStatus();
  return allocator->EndRoute(route_.target().route_id);
}

void PoolRoute::EndIgnoringErrors(CachingAllocator& allocator, const Target& route) {
  (void)allocator.EndRoute(route.route_id);
}

absl::StatusOr<PoolRoute> CachingAllocator::BeginAllocateToPool(const PrivatePool& pool,
                                                                PoolRouteFilter filter) {
  if (pool.allocator() != this) {
    return absl::InvalidArgumentError(
        "BeginAllocateToPool: the pool handle is empty or belongs to another allocator");
  }
  if (filter.kind == PoolRouteFilter::Kind::kCapture) {
    absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(filter.stream);
    if (!info.ok()) return info.status();
    if (info->status != CaptureStatus::kActive) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "BeginAllocateToPool: stream 0x%x is not capturing; begin the capture first, then route it",
          static_cast<std::uintptr_t>(filter.stream)));
    }
    filter.capture_id = info->id;
  }
  if (filter.kind == PoolRouteFilter::Kind::kPredicate && !filter.predicate) {
    return absl::InvalidArgumentError(
        "BeginAllocateToPool: a predicate route needs a predicate (it is empty)");
  }
  if (absl::Status s = AddPoolUser(pool.id()); !s.ok()) return s;
  // A release that found no capture underway finishes its synchronization and unmaps first.
  if (filter.IsCaptureRoute()) captures_.Begin();
  return PoolRoute(this, routes_.Open(pool.id(), std::move(filter)), pool.id());
}

absl::Status CachingAllocator::EndRoute(std::uint64_t route_id) {
  std::optional<RouteTable::Closed> closed = routes_.Close(route_id, captures_);
  if (!closed.has_value()) return absl::OkStatus();
  absl::Status status;
  if (closed->captures_over) status = RunDeferredFrees();
  DropPoolUser(closed->pool);
  return status;
}

absl::Status CachingAllocator::RunDeferredFrees() {
  absl::Status first_error;
  for (auto& [shard, block] : routes_.TakeDeferredFrees(captures_)) {
    absl::Status s = FreeWithStreamUses(*shard, block);
    if (s.ok()) continue;
    // The block stays in the pointer map (FreeWithStreamUses' guarantee) and counted freed (its owner let go
    // of it when it was deferred), and waits for the next attempt rather than leaking.
    if (first_error.ok()) first_error = s;
    routes_.Defer(shard, block);  // still freeing
  }
  SettleAllPeaks();
  return first_error;
}

DevicePtr CachingAllocator::AllocateFromOomPools(const AllocationRequest& request) {
  std::vector<PoolId> candidates;
  {
    MutexLock lock(&device_mu_);
    candidates = pools_.UseOnOomPools();
  }
  for (PoolId id : candidates) {
    if (sleep_.IsAsleep(id)) continue;  // its free blocks have no memory behind them
    StreamShard* shard = shards_.Find(id, request.stream);
    if (shard == nullptr) continue;
    SpinLockHolder lock(&shard->mu);
    if (shard->pool == nullptr || shard->pool->id != id) continue;  // released meanwhile
    if (DevicePtr p = blocks_.AllocateBestFit(*shard, request)) return p;
  }
  return 0;
}

}  // namespace graphalloc
