// What a sleep or a wake of pools (PoolSleep, pool_sleep.h) needs from the allocator that owns the pools,
// and nothing else. The allocator lends it through an implementation of this interface (AllocatorSleepHost,
// allocator_sleep_host.h) rather than through its members, so that what a sleep may touch, and under which
// lock, is written down in one place; a test can lend a fake.
//
// The segments, blocks and shards themselves (block.h, stream_shard.h) are the sleep's to read and edit
// while it holds the shards' lock: an expandable segment's chunk map (asleep or not), the flags of its
// blocks, a regular segment's place in its pool's free index. The parts of the allocator that own them or
// guard them (the shard table, the segment ledger, the block cache, the pool registry, the expandable
// segments, the driver, the capture gate, the mapping observers, the history) are never lent: only the few
// of their operations that a sleep or a wake calls, below.
//
// The operations a restore's host has too (restore_host.h: MustStayMapped, UnmapChunk, ReleaseHandle,
// ReportMapped, ReportUnmapped) keep its names and meanings here. The two are not one shared interface: the
// locks that prove their calls differ (a pool's lock there, every shard's here), and so do a map and a
// handle's creation (a restore maps and grants access chunk by chunk and retries a refused creation after
// releasing the handle cache; a wake maps every chunk before it grants access to any, and does not retry).
//
// Locks, in the allocator's order. The capture gate comes first (no capture begins while it is held): a
// sleep or a wake holds it from its first step to its last. Then the shards (all of them, in creation
// order) and the device lock, together as one ShardsLock; or the device lock alone, as a DeviceLock. A
// ShardsLock is a DeviceLock too. No driver call is made, and no mapping observer is told, with a
// ShardsLock or a DeviceLock held (the phases of pool_sleep.h). A method that needs a lock takes it as its
// first argument, as proof that it is held; a method without it takes whatever lock it needs itself, or
// none, and the caller holds no lock of the allocator's but the gate.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_SLEEP_HOST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_SLEEP_HOST_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/expandable_segment.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class SleepHost {
 public:
  // The capture gate, held from LockCaptureGate() until this goes.
  class GateLock {
   public:
    virtual ~GateLock() = default;
  };
  // The device lock, held from LockDevice() (or LockAllShards()) until this goes.
  class DeviceLock {
   public:
    virtual ~DeviceLock() = default;
  };
  // Every shard's lock and the device lock, held from LockAllShards() until this goes.
  class ShardsLock : public DeviceLock {};

  // A private pool: its id and PoolOptions::tag.
  struct Pool {
    PoolId id = kDefaultPool;
    std::string tag;
  };

  virtual ~SleepHost() = default;

  // ---- Locks. ----
  // Takes the capture gate. The caller holds no lock of the allocator's.
  virtual std::unique_ptr<GateLock> LockCaptureGate() = 0;
  // Takes the device lock. The caller holds the gate, or no lock.
  virtual std::unique_ptr<DeviceLock> LockDevice() = 0;
  // Takes the shard set's lock, every shard's in creation order, then the device lock. The caller holds the
  // gate, or no lock.
  virtual std::unique_ptr<ShardsLock> LockAllShards() = 0;

  // ---- The capture gate (gate held). ----
  // Whether a CUDA graph capture is underway (none begins while the gate is held).
  virtual bool CaptureUnderway(const GateLock& gate) const = 0;
  // Waits for the work queued on the device, on any stream, to complete (an unmap is not stream-ordered);
  // Aborted, waiting for nothing, when a capture is underway. No other lock held.
  virtual absl::Status WaitForDevice(const GateLock& gate) = 0;

  // ---- Pools and their segments (device lock held). ----
  // Every private pool, in the registry's order.
  virtual std::vector<Pool> PrivatePools(const DeviceLock& lock) const = 0;
  // The tag of private pool `id`; nullopt when there is no such pool (never created, or gone).
  virtual std::optional<std::string> PoolTag(const DeviceLock& lock, PoolId id) const = 0;
  // `pool`'s segments (kDefaultPool: the default pool's), in address order.
  virtual std::vector<Segment*> SegmentsOf(const DeviceLock& lock, PoolId pool) const = 0;
  // The segment, of any pool, whose address range holds `ptr`, or nullptr.
  virtual Segment* SegmentContaining(const DeviceLock& lock, DevicePtr ptr) const = 0;

  // ---- Blocks and regular segments (shards' lock held, unless said). ----
  // Merges every block parked in the quick caches of `pools`' shards into its free index, shard by shard in
  // creation order.
  virtual void FlushQuickCaches(const ShardsLock& lock, const std::vector<PoolId>& pools) = 0;
  // Takes the regular `segment` (out of its pool's free index already) off the ledger: no longer reserved
  // memory, in the statistics and the pool's reserved bytes, nor listed among the process's addresses.
  virtual void Unlink(const ShardsLock& lock, Segment* segment) = 0;
  // Puts back on the ledger a segment Unlink() took off and nothing freed.
  virtual void Link(const ShardsLock& lock, Segment* segment) = 0;
  // Frees regular segments unlinked from the ledger, each marked as being released by its shard
  // (blocks_in_release) and out of every index: each one freed is gone (its shard's mark dropped, its
  // segment_free event recorded, the observers told); one the device refuses to free is linked and cached
  // again as before, and the first such error is returned. Takes the locks it needs; the caller holds none
  // but the gate.
  virtual absl::Status ReleaseSegments(std::vector<Segment*> segments) = 0;

  // ---- Chunks of expandable segments: their handles, mappings, observers and accounting. ----
  // Whether the chunk [begin, end) of `segment` must stay mapped (pinned, or a communication pool's). Takes
  // only the mapping hooks' lock, a leaf: callable under any lock.
  virtual bool MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const = 0;
  // The peer devices every mapping grants access to. Device lock held.
  virtual std::vector<int> Peers(const DeviceLock& lock) const = 0;
  // Takes out of the handle cache a handle of exactly `size` for `segment`'s pool (a wake reuses it);
  // false when there is none. Device lock held.
  virtual bool TakeCachedHandle(const DeviceLock& lock, const Segment& segment, std::size_t size,
                                PhysicalHandle* handle) = 0;
  // Keeps a handle mapped nowhere in the handle cache (EmptyCache releases it). Device lock held.
  virtual void CacheHandle(const DeviceLock& lock, const ChunkPlacement& chunk) = 0;
  // A new physical handle of `size` for `segment`'s pool (exportable when the pool's are). No lock held.
  virtual absl::StatusOr<PhysicalHandle> CreateHandle(const Segment& segment, std::size_t size) = 0;
  // Maps `chunk`'s handle at its address, without access yet. No lock held.
  virtual absl::Status MapChunk(const ChunkPlacement& chunk) = 0;
  // Grants this device and `peers` access to the mapped `chunk`. No lock held.
  virtual absl::Status SetAccess(const ChunkPlacement& chunk, const std::vector<int>& peers) = 0;
  // Unmaps `chunk` (its handle stays). No lock held.
  virtual absl::Status UnmapChunk(const ChunkPlacement& chunk) = 0;
  // Gives a handle mapped nowhere back to the device. No lock held.
  virtual absl::Status ReleaseHandle(PhysicalHandle handle) = 0;
  // Tells the mapping observers that `chunk` of `segment` was mapped (with access), or is being unmapped.
  // No lock of the allocator's held but the gate.
  virtual void ReportMapped(const Segment& segment, const ChunkPlacement& chunk) = 0;
  virtual void ReportUnmapped(const Segment& segment, const ChunkPlacement& chunk) = 0;
  // The mapped `chunk` of `segment` fell asleep (its memory was given back), or the sleeping one is mapped
  // again: its chunk map, the statistics, the pool's reserved bytes and the history (`sleep` / `wake`).
  // Shards' lock held.
  virtual void AccountAsleep(const ShardsLock& lock, Segment* segment, const ChunkPlacement& chunk) = 0;
  virtual void AccountAwake(const ShardsLock& lock, Segment* segment, const ChunkPlacement& chunk) = 0;

  // ---- Pinned host memory for backups, and the copies. ----
  // Pins `size` bytes of host memory for a backup. No lock held.
  virtual absl::StatusOr<void*> HostAlloc(std::size_t size) = 0;
  // Frees memory HostAlloc() pinned. No lock held.
  virtual absl::Status HostFree(void* host) = 0;
  // Queues a copy of `size` bytes from `src` to `dst` (device or pinned host addresses) on the default
  // stream. No lock held.
  virtual absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t size) = 0;
  // Waits for every copy queued by CopyAsync(). No lock held.
  virtual absl::Status SynchronizeCopies() = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_SLEEP_HOST_H_
