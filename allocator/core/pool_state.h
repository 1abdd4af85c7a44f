// The allocator's record of one private pool (private_pool.h is the user's side): options, users, pins,
// and the pool-wide figures that its per-stream shards add to.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_STATE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/core/segment_source.h"

namespace graphalloc {

// Retired shards (of released pools) carry this id, which no pool has.
inline constexpr PoolId kRetiredPool = ~PoolId{0};

struct PoolState {
  PoolState(PoolId i, PoolOptions o, std::shared_ptr<SegmentSource> source)
      : id(i), options(o), segment_source(std::move(source)), use_on_oom(o.use_on_oom) {}

  // Counts bytes allocated (+) or freed (-) in the pool's blocks; called with the block's shard locked.
  void AddAllocated(std::int64_t bytes, std::int64_t blocks) {
    const std::int64_t now = allocated_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    live_blocks.fetch_add(blocks, std::memory_order_relaxed);
    std::int64_t peak = peak_allocated_bytes.load(std::memory_order_relaxed);
    while (now > peak && !peak_allocated_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  const PoolId id;
  const PoolOptions options;  // as created; use_on_oom below is the one in force
  // Where the pool's segments come from instead of the driver (segment_source.h); null: the driver.
  const std::shared_ptr<SegmentSource> segment_source;
  // Changed by SetPoolUseOnOom (PyTorch's MemPool turns it off before it lets the pool go).
  std::atomic<bool> use_on_oom;
  // Users (PrivatePool handles and open routes) and GraphPins. Read without the allocator's lock by the
  // release paths: a pool only gains users from someone who already holds one.
  std::atomic<int> users{0};
  std::atomic<int> pins{0};
  std::atomic<std::int64_t> allocated_bytes{0};
  std::atomic<std::int64_t> peak_allocated_bytes{0};
  std::atomic<std::int64_t> live_blocks{0};
  // Guarded by the allocator's device_mu_ (as the pool's segments are).
  std::int64_t reserved_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
  // No users or pins left: the pool goes as soon as its last live block does.
  std::atomic<bool> orphaned{false};
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_STATE_H_
