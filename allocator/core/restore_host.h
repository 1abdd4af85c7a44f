// What a restore of a private pool to a checkpoint (PoolRestorer, pool_restorer.h) needs from the allocator
// that owns the pool, and nothing else. The allocator lends it through an implementation of this interface
// (AllocatorRestoreHost, allocator_restore_host.h) rather than through its members, so that what a restore
// may touch, and under which lock, is written down in one place; a test can lend a fake.
//
// The blocks, segments and shards themselves (block.h, stream_shard.h) are the restore's to edit while it
// holds the pool's lock. The parts of the allocator that own them or guard them (the shard table, the
// segment ledger, the block cache, the expandable segments, the driver, the capture gate, the history) are
// never lent: only the few of their operations that a restore calls, below.
//
// Locks. A restore makes no driver call, and tells no mapping observer, with a lock held (the phases of
// pool_restorer.h). What it plans and settles on the pool's blocks it does under one PoolLock, which holds
// the pool's shard locks and the device lock for its whole scope, so that each plan or settle is one atomic
// step however many calls it makes. A method that needs that lock takes the PoolLock as its first argument,
// as proof that it is held; a method without it takes whatever lock it needs itself, or none.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_RESTORE_HOST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_RESTORE_HOST_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/expandable_segment.h"
#include "graphalloc/allocator/core/stream_shard.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/stats/stat_events.h"

namespace graphalloc {

class RestoreHost {
 public:
  // The pool's shard locks and the device lock, held from LockPool() until this goes.
  class PoolLock {
   public:
    virtual ~PoolLock() = default;
    // Whether `shard` is one of the pool's shards (all locked by this).
    virtual bool Holds(const StreamShard* shard) const = 0;
  };

  virtual ~RestoreHost() = default;

  // ---- Locks. ----
  // Locks `pool`'s shards in creation order, then the device lock (the allocator's lock order); they stay
  // locked until the returned lock goes. Takes no other lock; the caller holds none.
  virtual std::unique_ptr<PoolLock> LockPool(PoolId pool) = 0;
  // Takes the capture gate (no capture begins while it is held), waits for the work queued on the device to
  // complete (an unmap is not stream-ordered), then runs `unmaps(device_idle)` under the gate: device_idle
  // is false when the device could not say that the work had completed, or a capture is underway. Takes no
  // other lock; the caller holds none.
  virtual void WithUnmapGate(absl::FunctionRef<void(bool device_idle)> unmaps) = 0;

  // ---- The pool's segments (pool lock held). ----
  // OK when the pool is quiet: no freed block waiting on stream events, no memory being released, no block
  // in flight, quarantined or being freed; else FailedPrecondition saying what is busy.
  virtual absl::Status CheckQuiet(const PoolLock& lock) const = 0;
  // The pool's segments (those of the shards `lock` holds), in address order.
  virtual std::vector<Segment*> SegmentsOf(const PoolLock& lock) const = 0;
  // The segment based at `base`, of any pool, or nullptr.
  virtual Segment* FindSegment(const PoolLock& lock, DevicePtr base) const = 0;

  // ---- The pool's blocks (pool lock held). ----
  // Merges every block parked in the quick caches of the pool's shards into its free index.
  virtual void FlushQuickCaches(const PoolLock& lock) = 0;
  // Splits `b` at `at`: `b` keeps [ptr, at), the returned new block gets [at, end) with b's state.
  virtual Block* SplitOff(const PoolLock& lock, StreamShard& shard, Block* b, DevicePtr at) = 0;
  // Takes [begin, end) out of the free block `b` as an in-flight block; the rest stays free.
  virtual Block* CarveRange(const PoolLock& lock, StreamShard& shard, Block* b, DevicePtr begin,
                            DevicePtr end) = 0;
  // The block as the statistics see it (stat_events.h). No lock.
  virtual stat_events::BlockFigures FiguresOf(const Block* block, bool small) const = 0;

  // ---- Chunks of expandable segments: their handles, mappings and observers. ----
  // The device's mapping granularity, which unmapped ranges are aligned to. No lock.
  virtual std::size_t Granularity() const = 0;
  // Grants access to, or unmaps, each quarantined chunk (a quarantined chunk makes the pool look busy);
  // returns the first error. Takes the locks it needs; the caller holds none.
  virtual absl::Status RepairQuarantinedChunks() = 0;
  // The peer devices every mapping grants access to.
  virtual std::vector<int> Peers(const PoolLock& lock) const = 0;
  // A new physical handle of `size` for `pool`'s segments; when the device refuses, the handle cache is
  // released and the creation tried again. The caller holds no lock.
  virtual absl::StatusOr<PhysicalHandle> CreateHandle(const PoolState* pool, std::size_t size) = 0;
  // Maps `chunk` and grants `peers` access to it; on failure undoes what it can, and lists in `no_access`
  // a chunk left mapped without access. The caller holds no lock.
  virtual absl::Status MapChunk(const ChunkPlacement& chunk, const std::vector<int>& peers,
                                std::vector<ChunkPlacement>* no_access) = 0;
  // Unmaps `chunk` (its handle stays). The caller holds no lock.
  virtual absl::Status UnmapChunk(const ChunkPlacement& chunk) = 0;
  // Gives a handle mapped nowhere back to the device. The caller holds no lock.
  virtual absl::Status ReleaseHandle(PhysicalHandle handle) = 0;
  // Keeps a handle mapped nowhere in the handle cache, for the next growth: under `lock`, or taking the
  // device lock itself (the caller then holds none).
  virtual void CacheHandle(const PoolLock& lock, const ChunkPlacement& chunk) = 0;
  virtual void LockAndCacheHandle(const ChunkPlacement& chunk) = 0;
  // Whether the chunk [begin, end) of `segment` must stay mapped (pinned, or a communication pool's). Takes
  // only the mapping hooks' lock, a leaf: callable under the unmap gate.
  virtual bool MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const = 0;
  // Tells the mapping observers that `chunk` of `segment` was mapped (with access), or is being unmapped.
  // The caller holds no lock of the allocator's.
  virtual void ReportMapped(const Segment& segment, const ChunkPlacement& chunk) = 0;
  virtual void ReportUnmapped(const Segment& segment, const ChunkPlacement& chunk) = 0;
  // The in-flight block `b`, exactly `chunk`, goes back mapped or not; with `no_access` (mapped without
  // access) it stays in flight, quarantined.
  virtual void SettleInFlight(const PoolLock& lock, StreamShard& shard, Block* b, const ChunkPlacement& chunk,
                              bool mapped, bool no_access) = 0;
  // `chunk` was mapped into (or unmapped from) `segment`: its chunk map, the statistics, the pool's reserved
  // bytes and the history.
  virtual void AccountMapped(const PoolLock& lock, Segment* segment, const ChunkPlacement& chunk) = 0;
  virtual void AccountUnmapped(const PoolLock& lock, Segment* segment, const ChunkPlacement& chunk) = 0;

  // ---- History. Any lock, or none. ----
  // The block at `ptr` (`requested` bytes asked for, on `stream`) was freed, or allocated, by the restore.
  virtual void RecordFreed(DevicePtr ptr, std::size_t requested, Stream stream) = 0;
  virtual void RecordAllocated(DevicePtr ptr, std::size_t requested, Stream stream) = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_RESTORE_HOST_H_
