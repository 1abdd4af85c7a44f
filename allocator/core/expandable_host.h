// What the growth, release and quarantine repair of expandable segments (ExpandableSegments,
// expandable_segments.h) need from the allocator that owns the segments, and nothing else. The allocator
// lends it through an implementation of this interface (AllocatorExpandableHost,
// allocator_expandable_host.h) rather than through its members, so that what those processes may touch of
// the coordinator's state, and under which lock, is written down in one place; a test can lend a fake.
//
// The coordinator's state is lent only as the few operations below: the shard table and the device lock
// (as locks), the block cache (a locked shard's block surgery), the segment ledger (reservations and chunk
// accounting), the memory budget (admission of a growth) and the capture tracker (the capture gate). The
// blocks, segments and shards themselves (block.h, stream_shard.h) are the caller's to edit while it holds
// the lock that guards them, as for a restore (restore_host.h).
//
// Two dependencies stay direct, by design. The driver is the device, not coordinator state: it holds no
// lock of the allocator's and guards nothing of it, and ExpandableSegments is the one that sequences its
// calls (a wrapper would repeat its interface call for call). The mapping hooks are the allocator's
// observers and pins, behind a leaf lock of their own (mapping_hooks.h); ExpandableSegments::hooks() hands
// them to the allocator's other parts, so they are given to ExpandableSegments directly with the driver.
//
// Locks. Every lock ExpandableSegments takes, it takes here, as a scoped object held until it goes; the
// lock order is the allocator's (shards in creation order, then the device lock), and the capture gate is
// taken with no other lock. A growth or a release makes no driver call, and tells no mapping observer,
// with a shard or device lock held (the capture gate may be held: an unmap waits for the device under it);
// only at the allocator's end (ExpandableSegments::ReleaseCachedHandlesAtExit), when nothing else runs,
// are the cached handles released under the device lock.
// The operations on the coordinator's state do not take the lock as an argument, because the allocator's
// other parts (PoolSleep, the restore host, the invariant checker) call ExpandableSegments' "device lock
// held" methods, which reach them, under locks they took themselves; each says which lock it expects.
// Two operations that are only valid under a particular lock are methods of that lock's object instead:
// walking the shards of an AllShards lock, and waiting for the device under the unmap gate.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_HOST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_HOST_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/core/allocation_request.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/expandable_segment.h"
#include "graphalloc/allocator/core/growth_plan.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {

class ExpandableHost {
 public:
  // A lock the host took; released when this goes.
  class Lock {
   public:
    virtual ~Lock() = default;
  };
  // Every shard's lock, then the device lock; no shard is created meanwhile.
  class AllShards : public Lock {
   public:
    // Calls `f` on every shard, in creation order.
    virtual void ForEach(absl::FunctionRef<void(StreamShard&)> f) const = 0;
  };
  // The capture gate: no capture begins while it is held.
  class UnmapGate : public Lock {
   public:
    // Waits for the work queued on `stream` (every stream: nullopt) to complete, which an unmap needs (it
    // is not stream-ordered); Aborted when a capture is underway (synchronizing would break it).
    virtual absl::Status WaitForWorkBeforeUnmap(std::optional<Stream> stream) = 0;
  };

  virtual ~ExpandableHost() = default;

  // ---- Locks. ----
  // Takes `shard`'s lock. The caller holds no lock.
  virtual std::unique_ptr<Lock> LockShard(StreamShard& shard) = 0;
  // Takes the device lock. The caller holds no lock, or shard locks only (they come first).
  virtual std::unique_ptr<Lock> LockDevice() = 0;
  // Takes every shard's lock, then the device lock. The caller holds no lock.
  virtual std::unique_ptr<AllShards> LockAllShards() = 0;
  // Takes the capture gate. The caller holds no lock.
  virtual std::unique_ptr<UnmapGate> EnterUnmapGate() = 0;
  // States that the caller holds the device lock (for the thread-safety analysis; a fake checks it).
  virtual void AssertDeviceLockHeld() const = 0;

  // ---- A locked shard's blocks (the block cache; shard lock held). ----
  // A free block of `request`'s size class on `shard`, best fit, split and allocated; 0 when none fits.
  virtual DevicePtr AllocateBestFit(StreamShard& shard, const AllocationRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) = 0;
  // A planner of one growth of `size` bytes in `pool`, one of `shard`'s (growth_plan.h): it takes the
  // range's blocks in flight and carves idle chunks, through the block cache.
  virtual GrowthPlanner Planner(StreamShard& shard, BlockPool& pool, std::size_t size,
                                std::size_t granularity, GrowthPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) = 0;
  // Splits `b` at `at`: `b` keeps [ptr, at), the returned new block gets [at, end) with b's state.
  virtual Block* SplitOff(StreamShard& shard, Block* b, DevicePtr at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) = 0;
  // Takes [begin, end) out of the free block `b` as an in-flight block; the rest stays free.
  virtual Block* CarveRange(StreamShard& shard, Block* b, DevicePtr begin, DevicePtr end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) = 0;
  // The block `b`, no longer in flight, goes back into its pool's index (free or unmapped), merged.
  virtual void ReturnToIndex(StreamShard& shard, Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) = 0;
  // Merges every block parked in `shard`'s quick cache into its free index.
  virtual void FlushQuickCache(StreamShard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) = 0;

  // ---- Segments (the segment ledger; device lock held). ----
  // `segment` is listed (reserving nothing yet), or no longer.
  virtual void AddReservation(Segment* segment) = 0;
  virtual void RemoveReservation(Segment* segment) = 0;
  // `chunk` was mapped into (or unmapped from) `segment`: its chunk map, the statistics, the pool's
  // reserved bytes and the history.
  virtual void ChunkMapped(Segment* segment, const ChunkPlacement& chunk) = 0;
  virtual void ChunkUnmapped(Segment* segment, const ChunkPlacement& chunk) = 0;
  // Every segment, in address order; the one based at `base`, or nullptr.
  virtual std::vector<Segment*> Segments() const = 0;
  virtual Segment* FindSegment(DevicePtr base) const = 0;

  // ---- Admission of growth (the memory budget over the ledger's reserved bytes; device lock held). ----
  // `cached`: the handle cache's bytes. The reserved, cached and growing bytes plus `extra`.
  virtual std::size_t Committed(std::size_t cached, std::size_t extra) const = 0;
  // The memory cap, or the device's memory.
  virtual std::size_t Capacity() const = 0;
  // Whether `extra` more bytes pass the cap unless cached handles go back first.
  virtual bool OverLimit(std::size_t cached, std::size_t extra) const = 0;
  // Counts `bytes` of new handles as growing if they fit under the cap; false (nothing counted) if not.
  virtual bool AdmitNewHandles(std::size_t cached, std::size_t bytes) = 0;
  // `bytes` start (end) counting as growing: taken from the handle cache, or admitted new.
  virtual void BeginGrowth(std::size_t bytes) = 0;
  virtual void EndGrowth(std::size_t bytes) = 0;
  virtual std::size_t GrowthInFlight() const = 0;

  // ---- Captures. No lock. ----
  // Whether a capture is underway: no idle chunk moves and no quarantined chunk is unmapped meanwhile.
  virtual bool CaptureUnderway() const = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_HOST_H_
