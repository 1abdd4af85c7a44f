// The private pools of one allocator: their records (pool_state.h) by id, ids handed out in creation
// order, and the users and pins that keep a pool alive. A pool left with neither is orphaned: it goes as
// soon as its last live block does (the allocator releases its memory, then Forget()s it).
//
// Not thread-safe: the allocator keeps it under its device lock. The counters inside a PoolState are
// atomics, read without that lock by the release paths (a pool only gains users from someone who already
// holds one).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_REGISTRY_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_REGISTRY_H_

#include <memory>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/core/pool_state.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/core/segment_source.h"

namespace graphalloc {

class PoolRegistry {
 public:
  // A new pool with one user; its id.
  PoolId Create(PoolOptions options, std::shared_ptr<SegmentSource> segment_source);
  // The pool's record; nullptr once it is gone.
  PoolState* Find(PoolId id) const;
  // One more user. NotFound once the pool is gone or orphaned.
  absl::Status AddUser(PoolId id);
  // One more pin (a graph that replays into the pool). NotFound once the pool is gone.
  absl::Status AddPin(PoolId id);
  // One user or pin less; true when that was the last of both: the pool is orphaned now and the caller
  // releases it.
  bool DropUser(PoolId id);
  bool DropPin(PoolId id);
  absl::Status SetUseOnOom(PoolId id, bool use_on_oom);
  // Pools a failing default-pool allocation may take cached blocks from (use_on_oom, not orphaned).
  std::vector<PoolId> UseOnOomPools() const;
  // Orphaned pools not released yet (their memory could not go when their last user left).
  std::vector<PoolId> Orphans() const;
  // Forgets a released pool.
  void Forget(PoolId id) { pools_.erase(id); }

  // Runs f(id, pool) on each pool, in id order.
  template <typename F>
  void ForEach(F f) const {
    for (const auto& [id, pool] : pools_) f(id, *pool);
  }

  // Whether the release paths of `scope` may return memory of `pool` (nullptr: the default pool) to the
  // device. `scope` kDefaultPool: the default pool and private pools without users or pins; a private
  // pool's id: that pool only, unless pinned by a graph.
  static bool Releasable(const PoolState* pool, PoolId scope);

 private:
  absl::btree_map<PoolId, std::unique_ptr<PoolState>> pools_;
  PoolId next_id_ = 1;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_REGISTRY_H_
