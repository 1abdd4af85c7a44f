// The open routes of one allocator (which private pool an allocation goes to: private_pool.h) and the
// frees deferred while a capture is underway, until the last capture route ends.
//
// Routes nest: the innermost (latest opened) matching route wins. Finding the route of an allocation
// copies the routes under the lock and evaluates them with no lock held (a predicate, or the driver's
// capture query, may take locks of their own); closing a route waits until no copy of its predicate is
// being evaluated, so that a predicate is never called after its route ended. The lock is a leaf: nothing
// else is locked while it is held, except shard locks taken before it.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_ROUTE_TABLE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_ROUTE_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/capture_tracker.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class RouteTable {
 public:
  // A free deferred until no capture is underway: the block stays in its pointer map, `freeing` and counted
  // freed (Block::OwnerFreed), meanwhile.
  using DeferredFree = std::pair<StreamShard*, Block*>;
  struct Closed {
    PoolId pool;
    bool captures_over;  // it was the last open capture route
  };

  // Opens a route of `filter` (already checked: a capture route's capture id is known, a predicate route
  // has its predicate) to `pool`; the route's id. A capture route must be counted in `captures` before.
  std::uint64_t Open(PoolId pool, PoolRouteFilter filter);
  // Closes route `id` (ending its capture in `captures` when it is a capture route); nullopt when no such
  // route is open. Returns once no evaluation of its predicate is under way.
  std::optional<Closed> Close(std::uint64_t id, CaptureTracker& captures);
  // Whether any route is open; lock-free, for the hot path.
  bool any_open() const { return open_.load(std::memory_order_acquire) != 0; }
  // The pool an allocation on `stream` by this thread goes to: the innermost matching route's, else
  // kDefaultPool. `driver` says which capture a stream belongs to (for capture routes).
  PoolId Route(Stream stream, Driver& driver);

  // Defers the free of `block` (its shard's lock held by the caller) when a capture is underway; false
  // when none is (the caller frees it now).
  bool DeferWhileCapturing(StreamShard* shard, Block* block, const CaptureTracker& captures);
  // Defers it again, after a failed attempt.
  void Defer(StreamShard* shard, Block* block);
  // The deferred frees, taken out, once no capture is underway; none while one is.
  std::vector<DeferredFree> TakeDeferredFrees(const CaptureTracker& captures);

 private:
  // A kPredicate route's predicate, shared by the route and the copies Route() evaluates unlocked.
  struct RoutePredicate {
    explicit RoutePredicate(std::function<bool(Stream)> f) : fn(std::move(f)) {}
    const std::function<bool(Stream)> fn;
    // Copies taken (under the lock) and not yet done with: Close waits for 0, so that the predicate is
    // never called after the route has ended (it may refer to its caller's objects, which die then).
    std::atomic<int> evaluating{0};
  };
  struct OpenRoute {
    std::uint64_t id = 0;
    PoolId pool = kDefaultPool;
    PoolRouteFilter filter;  // without its predicate, which `predicate` holds: copies stay cheap
    std::shared_ptr<RoutePredicate> predicate;
  };
  // Whether `route` matches an allocation on `stream` by thread `me`; `capture_id` is asked of the driver
  // once, on first need (0: the stream is not capturing).
  static bool Matches(const OpenRoute& route, Stream stream, std::thread::id me, Driver& driver,
                      std::optional<std::uint64_t>* capture_id);

  mutable Mutex mu_;
  std::vector<OpenRoute> routes_ ABSL_GUARDED_BY(mu_);  // innermost last
  std::uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<DeferredFree> deferred_frees_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> open_{0};
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_ROUTE_TABLE_H_
