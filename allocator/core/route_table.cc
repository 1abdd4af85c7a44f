#include "graphalloc/allocator/core/route_table.h"

#include <algorithm>
#include <thread>

#include "absl/container/inlined_vector.h"

namespace graphalloc {

std::uint64_t RouteTable::Open(PoolId pool, PoolRouteFilter filter) {
  std::shared_ptr<RoutePredicate> predicate;
  if (filter.kind == PoolRouteFilter::Kind::kPredicate) {
    predicate = std::make_shared<RoutePredicate>(std::move(filter.predicate));
    filter.predicate = nullptr;
  }
  MutexLock lock(&mu_);
  const std::uint64_t id = next_id_++;
  routes_.push_back(OpenRoute{id, pool, std::move(filter), std::move(predicate)});
  open_.fetch_add(1, std::memory_order_release);
  return id;
}

std::optional<RouteTable::Closed> RouteTable::Close(std::uint64_t id, CaptureTracker& captures) {
  Closed closed{kDefaultPool, false};
  std::shared_ptr<RoutePredicate> predicate;
  {
    MutexLock lock(&mu_);
    auto it = std::find_if(routes_.begin(), routes_.end(), [&](const OpenRoute& r) { return r.id == id; });
    if (it == routes_.end()) return std::nullopt;
    closed.pool = it->pool;
    if (it->filter.IsCaptureRoute()) closed.captures_over = captures.End();
    predicate = std::move(it->predicate);
    routes_.erase(it);
    open_.fetch_sub(1, std::memory_order_release);
  }
  // No new copy of the predicate can be taken now; wait for the evaluations already under way (each is
  // one call, no lock held), so that the caller may destroy what the predicate refers to.
  if (predicate != nullptr) {
    while (predicate->evaluating.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }
  return closed;
}

PoolId RouteTable::Route(Stream stream, Driver& driver) {
  absl::InlinedVector<OpenRoute, 4> routes;
  {
    MutexLock lock(&mu_);
    routes.assign(routes_.begin(), routes_.end());
    for (const OpenRoute& r : routes) {
      if (r.predicate != nullptr) r.predicate->evaluating.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const std::thread::id me = std::this_thread::get_id();
  std::optional<std::uint64_t> capture_id;
  PoolId found = kDefaultPool;
  for (auto it = routes.rbegin(); it != routes.rend() && found == kDefaultPool; ++it) {
    if (Matches(*it, stream, me, driver, &capture_id)) found = it->pool;
  }
  for (const OpenRoute& r : routes) {
    if (r.predicate != nullptr) r.predicate->evaluating.fetch_sub(1, std::memory_order_release);
  }
  return found;
}

bool RouteTable::Matches(const OpenRoute& route, Stream stream, std::thread::id me, Driver& driver,
                         std::optional<std::uint64_t>* capture_id) {
  switch (route.filter.kind) {
    case PoolRouteFilter::Kind::kThread:
      return route.filter.thread == me;
    case PoolRouteFilter::Kind::kStream:
      return route.filter.stream == stream;
    case PoolRouteFilter::Kind::kCapture:
      if (!capture_id->has_value()) {
        // No lock is held here: the driver call may take its own.
        absl::StatusOr<CaptureInfo> info = driver.GetCaptureInfo(stream);
        *capture_id = info.ok() && info->status != CaptureStatus::kNone ? info->id : 0;
      }
      return **capture_id != 0 && **capture_id == route.filter.capture_id;
    case PoolRouteFilter::Kind::kPredicate:
      // No lock is held here either: a predicate typically asks the driver about the stream's capture.
      try {
        return route.predicate->fn(stream);
      } catch (...) {  // the contract says it must not throw; an allocation is no place to propagate it
        return false;
      }
  }
  return false;
}

bool RouteTable::DeferWhileCapturing(StreamShard* shard, Block* block, const CaptureTracker& captures) {
  MutexLock lock(&mu_);
  if (!captures.underway(std::memory_order_relaxed)) return false;
  deferred_frees_.emplace_back(shard, block);
  return true;
}

void RouteTable::Defer(StreamShard* shard, Block* block) {
  MutexLock lock(&mu_);
  deferred_frees_.emplace_back(shard, block);
}

std::vector<RouteTable::DeferredFree> RouteTable::TakeDeferredFrees(const CaptureTracker& captures) {
  std::vector<DeferredFree> frees;
  MutexLock lock(&mu_);
  if (!captures.underway(std::memory_order_relaxed)) frees.swap(deferred_frees_);
  return frees;
}

}  // namespace graphalloc
