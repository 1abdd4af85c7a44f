// Private pools: routing allocations to them (by stream, capture or thread), capture mode, frees
// deferred until captures end, and use_on_oom.
#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/caching_allocator.h"

namespace graphalloc {

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
  std::shared_ptr<RoutePredicate> predicate;
  if (filter.kind == PoolRouteFilter::Kind::kPredicate) {
    if (!filter.predicate) {
      return absl::InvalidArgumentError(
          "BeginAllocateToPool: a predicate route needs a predicate (it is empty)");
    }
    predicate = std::make_shared<RoutePredicate>(std::move(filter.predicate));
    filter.predicate = nullptr;
  }
  const bool capture_route = filter.IsCaptureRoute();
  if (absl::Status s = AddPoolUser(pool.id()); !s.ok()) return s;
  if (capture_route) {
    // A release that found no capture underway finishes its synchronization and unmaps first.
    MutexLock gate(&unmap_gate_);
    captures_underway_.fetch_add(1, std::memory_order_release);
  }
  MutexLock lock(&routes_mu_);
  const std::uint64_t id = next_route_id_++;
  routes_.push_back(OpenRoute{id, pool.id(), std::move(filter), std::move(predicate)});
  open_routes_.fetch_add(1, std::memory_order_release);
  return PoolRoute(this, id, pool.id());
}

absl::Status CachingAllocator::EndRoute(std::uint64_t route_id) {
  PoolId pool = kDefaultPool;
  bool captures_over = false;
  std::shared_ptr<RoutePredicate> predicate;
  {
    MutexLock lock(&routes_mu_);
    auto it =
        std::find_if(routes_.begin(), routes_.end(), [&](const OpenRoute& r) { return r.id == route_id; });
    if (it == routes_.end()) return absl::OkStatus();
    pool = it->pool;
    if (it->filter.IsCaptureRoute()) {
      captures_over = captures_underway_.fetch_sub(1, std::memory_order_acq_rel) == 1;
    }
    predicate = std::move(it->predicate);
    routes_.erase(it);
    open_routes_.fetch_sub(1, std::memory_order_release);
  }
  // No new copy of the predicate can be taken now; wait for the evaluations already under way (each is
  // one call, no lock held), so that the caller may destroy what the predicate refers to.
  if (predicate != nullptr) {
    while (predicate->evaluating.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }
  absl::Status status;
  if (captures_over) status = RunDeferredFrees();
  DropPoolUser(pool);
  return status;
}

absl::Status CachingAllocator::RunDeferredFrees() {
  std::vector<std::pair<StreamShard*, Block*>> frees;
  {
    MutexLock lock(&routes_mu_);
    if (captures_underway_.load(std::memory_order_relaxed) > 0) return absl::OkStatus();
    frees.swap(deferred_frees_);
  }
  absl::Status first_error;
  for (auto& [shard, block] : frees) {
    absl::Status s = FreeWithStreamUses(*shard, block->ptr, block);
    if (s.ok()) continue;
    // The block stays allocated (FreeWithStreamUses' guarantee); its owner already let go of it, so it
    // waits for the next attempt rather than leaking.
    if (first_error.ok()) first_error = s;
    SpinLockHolder shard_lock(&shard->mu);
    block->freeing = true;
    MutexLock lock(&routes_mu_);
    deferred_frees_.emplace_back(shard, block);
  }
  return first_error;
}

PoolId CachingAllocator::RoutedPool(Stream stream) {
  absl::InlinedVector<OpenRoute, 4> routes;
  {
    MutexLock lock(&routes_mu_);
    routes.assign(routes_.begin(), routes_.end());
    for (const OpenRoute& r : routes) {
      if (r.predicate != nullptr) r.predicate->evaluating.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const std::thread::id me = std::this_thread::get_id();
  std::uint64_t capture_id = 0;
  bool capture_known = false;
  PoolId found = kDefaultPool;
  for (auto it = routes.rbegin(); it != routes.rend() && found == kDefaultPool; ++it) {
    switch (it->filter.kind) {
      case PoolRouteFilter::Kind::kThread:
        if (it->filter.thread == me) found = it->pool;
        break;
      case PoolRouteFilter::Kind::kStream:
        if (it->filter.stream == stream) found = it->pool;
        break;
      case PoolRouteFilter::Kind::kCapture:
        if (!capture_known) {
          // No lock is held here: the driver call may take its own.
          absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(stream);
          capture_id = info.ok() && info->status != CaptureStatus::kNone ? info->id : 0;
          capture_known = true;
        }
        if (capture_id != 0 && capture_id == it->filter.capture_id) found = it->pool;
        break;
      case PoolRouteFilter::Kind::kPredicate: {
        // No lock is held here either: a predicate typically asks the driver about the stream's capture.
        bool match = false;
        try {
          match = it->predicate->fn(stream);
        } catch (...) {  // the contract says it must not throw; an allocation is no place to propagate it
          match = false;
        }
        if (match) found = it->pool;
        break;
      }
    }
  }
  for (const OpenRoute& r : routes) {
    if (r.predicate != nullptr) r.predicate->evaluating.fetch_sub(1, std::memory_order_release);
  }
  return found;
}

DevicePtr CachingAllocator::AllocateFromOomPools(const AllocationRequest& request) {
  std::vector<PoolId> candidates;
  {
    MutexLock lock(&device_mu_);
    candidates = pools_.UseOnOomPools();
  }
  for (PoolId id : candidates) {
    StreamShard* shard = shards_.Find(id, request.stream);
    if (shard == nullptr) continue;
    SpinLockHolder lock(&shard->mu);
    if (shard->pool == nullptr || shard->pool->id != id) continue;  // released meanwhile
    if (DevicePtr p = blocks_.AllocateBestFit(*shard, request)) return p;
  }
  return 0;
}

}  // namespace graphalloc
