// The caching allocator of one device: hands out device memory from cached segments, PyTorch-style.
//
// Requests are rounded (size_policy.h), served best-fit from free blocks of the requesting stream, split
// and coalesced within segments; a freed block is reused only by its own stream, or by others once the
// events recorded for RecordStream() streams complete. New segments come from the Driver only when the
// cache has nothing that fits; under pressure the cache is released and the request retried before an
// out-of-memory error is returned.
//
// Thread-safe, and built so that threads on different streams do not contend: each stream's blocks live
// in their own StreamShard behind their own lock. A cache hit takes that one lock once, touches no other
// shared state and allocates nothing on the heap in steady state; no driver call is ever made with a lock
// held. Statistics of blocks are kept per stream and summed on read; their peaks are exact device-wide,
// kept by escrow (PeakLedger); segment statistics (reserved bytes, segment counts) are the device's own.
//
// The class coordinates parts that each own one concern:
//   ShardTable / AllShardsLock  the stream shards, and locking all of them at once   (shard_table.h)
//   BlockCache                  a locked shard's blocks: the cache hit, best fit,     (block_cache.h)
//                               splitting, coalescing; statistics as stat events
//   SegmentLedger               every segment and the segment statistics              (segment_ledger.h)
//   MemoryBudget                the memory cap and what may still fit under it        (memory_budget.h)
//   PoolRegistry                private pools, their users and pins                   (pool_registry.h)
//   RouteTable, CaptureTracker  routes to pools, deferred frees, capture mode          (route_table.h,
//                                                                                      capture_tracker.h)
//   ExpandableSegments          growth and release of expandable segments, through    (expandable_segments.h,
//                               the ExpandableHost the coordinator lends them         expandable_host.h)
//   PoolRestorer                restoring a pool's checkpoint, in phases, through     (pool_restorer.h,
//                               the RestoreHost the coordinator lends it              restore_host.h)
//   PoolSleep                   sleep and wake of pools, in phases, through the       (pool_sleep.h,
//                               SleepHost the coordinator lends it                    sleep_host.h)
//   SegmentReleaser             freeing regular segments a release took out           (segment_releaser.h)
//   InvariantChecker            CheckInvariants                                       (invariant_checker.h)
//   PeakLedger                  exact device-wide peaks of the per-shard statistics   (peak_ledger.h)
// What stays here: finding a request's shard and a pointer's owner, the slow path's order of retries
// (allocation_slow_path.cc), stream events (stream_events.cc), the pool lifecycle (private_pools.cc),
// snapshots (allocator_snapshot.cc) and holds on blocks shared with other processes (block_holds.cc).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_CACHING_ALLOCATOR_H_
#define GRAPHALLOC_ALLOCATOR_CORE_CACHING_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/allocation_request.h"
#include "graphalloc/allocator/core/allocator_expandable_host.h"
#include "graphalloc/allocator/core/allocator_sleep_host.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/capture_tracker.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/mapping_hooks.h"
#include "graphalloc/allocator/core/mapping_observer.h"
#include "graphalloc/allocator/core/memory_budget.h"
#include "graphalloc/allocator/core/peak_ledger.h"
#include "graphalloc/allocator/core/pool_checkpoint.h"
#include "graphalloc/allocator/core/pool_registry.h"
#include "graphalloc/allocator/core/pool_sleep.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/core/route_table.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/segment_releaser.h"
#include "graphalloc/allocator/core/segment_source.h"
#include "graphalloc/allocator/core/shard_table.h"
#include "graphalloc/allocator/core/stream_shard.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "graphalloc/allocator/stats/stat_events.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc {

// What a hold (CachingAllocator::HoldBlock) tells its caller about the block it keeps: enough to share the
// block's memory with another process.
struct HeldBlock {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  DevicePtr segment_base = 0;
  bool expandable = false;
  // Expandable segments: whether the pool's handles export (Config::shareable_handles,
  // PoolOptions::shareable), and the chunks that cover the block, in address order (the first may begin
  // before it, the last end after it).
  bool shareable = false;
  std::vector<ChunkPlacement> chunks;
};

class CachingAllocator {
 public:
  // `driver` must outlive nothing: the allocator shares its ownership.
  static absl::StatusOr<std::unique_ptr<CachingAllocator>> Create(std::shared_ptr<Driver> driver,
                                                                  Config config = {});
  // Returns every segment to the device, including those of allocations never freed.
  ~CachingAllocator();

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Device memory of at least `bytes`, usable on `stream`. Zero bytes gives the null address (0), which
  // Free() accepts. ResourceExhausted when the device (or the memory fraction) cannot hold it; the
  // message says how much was asked, what the device has and what to try.
  absl::StatusOr<DevicePtr> Allocate(std::size_t bytes, Stream stream = kDefaultStream);

  // Returns a block to the cache. InvalidArgument for a pointer this allocator did not hand out or that
  // was already freed; nothing else changes then.
  absl::Status Free(DevicePtr ptr);

  // Marks `ptr` as used on `stream` too: when freed, it is reused only after the work enqueued on
  // `stream` up to the Free() has completed.
  absl::Status RecordStream(DevicePtr ptr, Stream stream);

  // The pool of the live allocation that Allocate() returned at `ptr` (kDefaultPool for the default
  // cache); NotFound when no live allocation starts there. For front ends that must tell memory their
  // function allocated in a graph's pool from memory it only read.
  absl::StatusOr<PoolId> PoolOfAllocation(DevicePtr ptr);

  // ---- Holds (block_holds.cc): another process maps a block (allocator/ipc/). ----
  // Keeps the block that Allocate() returned at `ptr` from being reused or unmapped until the hold is
  // released. A Free() of a held block returns at once, but the block stays allocated (in the statistics
  // too) until the last hold goes; that release completes the free. Holds nest. InvalidArgument for a
  // pointer not allocated; FailedPrecondition for a block being freed or a sleeping pool's.
  absl::StatusOr<HeldBlock> HoldBlock(DevicePtr ptr);
  // Drops one hold of the block at `ptr`; the last one completes a Free() made meanwhile.
  absl::Status ReleaseHold(DevicePtr ptr);
  // How many holds the block at `ptr` has (0 for none, or no such block).
  int HoldCount(DevicePtr ptr) const;

  // Waits for outstanding stream events and returns every unused cached segment to the device, and frees
  // the pinned host memory wakes kept for the next backed-up sleep (pool_sleep.h).
  absl::Status EmptyCache();

  DeviceStats GetStats() const;
  void ResetPeakStats();
  void ResetAccumulatedStats();

  // Caps reserved memory at `fraction` of the device's total memory (1.0 removes the cap).
  absl::Status SetMemoryFraction(double fraction);
  double GetMemoryFraction() const;
  // Caps reserved memory at `bytes` (0 removes the cap); for replays that emulate a smaller device.
  void SetMemoryLimit(std::size_t bytes);

  // Enables peer access from device `peer_ordinal` to this device's memory (Driver::EnablePeerAccess):
  // every mapped chunk of an expandable segment, and every one mapped later, grants it access too.
  absl::Status EnablePeerAccess(int peer_ordinal);

  // Turns the allocation history on or off (see HistoryOptions); GRAPHALLOC_CONF's record_history,
  // history_max_entries and history_stacks set it at creation.
  absl::Status RecordHistory(const HistoryOptions& options);

  // The allocator's state now: every segment with its blocks, the statistics, the configuration and the
  // recorded history (see docs/snapshot_format.md). `label` says when it was taken ("peak", "end", ...).
  // With `record_event` false the snapshot leaves no `snapshot` event in the history: for internal queries
  // (a backend answering "largest free block?"), which are not the user's snapshots.
  MemorySnapshot TakeSnapshot(absl::string_view label = "", bool record_event = true) const;
  // The state alone (segments, blocks, pools, statistics), without reading the history or recording an
  // event: for frequent internal queries (PyTorch's cacheInfo, live-allocation checks).
  MemorySnapshot StateSnapshot() const;

  // Verifies every internal invariant (block chains, free index, pointer map, statistics); an Internal
  // error describes the first violation. Tests call it after every step.
  absl::Status CheckInvariants() const;

  // ---- Private pools (private_pool.h; private_pools.cc, pool_checkpoint.cc). ----
  // A new pool with one user, the returned handle.
  // With a `segment_source`, the pool's segments come from it instead of the driver (segment_source.h),
  // and are regular segments whatever the configuration says about expandable ones.
  absl::StatusOr<PrivatePool> CreatePool(PoolOptions options = {},
                                         std::shared_ptr<SegmentSource> segment_source = nullptr);
  // Another user of a live pool; NotFound once the pool is gone.
  absl::StatusOr<PrivatePool> AcquirePool(PoolId id);
  absl::StatusOr<PoolStats> GetPoolStats(PoolId id) const;
  // Whether default-pool allocations that would fail may take the pool's cached blocks (PoolOptions::
  // use_on_oom), from now on. NotFound once the pool is gone.
  absl::Status SetPoolUseOnOom(PoolId id, bool use_on_oom);
  // Returns the pool's cached free memory to the device, unless a graph pins it (then nothing, and OK).
  absl::Status EmptyPoolCache(PoolId id);
  // Routes matching allocations to `pool` until the returned route ends (private_pool.h). A kCapture route
  // needs its stream to be capturing. While any capture route (kCapture, or a filter with capture_mode) is
  // open the allocator is in capture mode:
  // no event is queried or synchronized, frees of blocks used on other streams are deferred until the last
  // capture route ends, new segments are allocated in relaxed capture mode and nothing is freed to the
  // device (an allocation that does not fit fails with ResourceExhausted instead).
  absl::StatusOr<PoolRoute> BeginAllocateToPool(const PrivatePool& pool, PoolRouteFilter filter);
  // Keeps the pool's memory reserved while a graph recorded into it may replay (private_pool.h).
  absl::StatusOr<GraphPin> PinForGraph(const PrivatePool& pool);
  // The exact layout of every segment of `pool`. FailedPrecondition while blocks of the pool wait on
  // stream events or deferred frees, or are being changed by another thread.
  absl::StatusOr<PoolCheckpoint> Checkpoint(const PrivatePool& pool);
  // Rebuilds the checkpoint's layout in `pool` (pool_checkpoint.h says what the result means). Segments
  // created since stay in the pool, free. InvalidArgument for a checkpoint of another pool or allocator;
  // FailedPrecondition when the pool has pending events or deferred frees, or a segment of the checkpoint
  // is gone; on any error the pool is as before. The caller must not use the pool from other threads
  // meanwhile.
  absl::StatusOr<RestoreResult> Restore(const PrivatePool& pool, const PoolCheckpoint& checkpoint);

  // ---- Sleep and wake (pool_sleep.h says the rules and what a failure leaves). ----
  // Gives the physical memory of the pools of `request.scope` back to the device, keeping every
  // reservation and every block's address; each pool's contents are discarded or backed up to pinned host
  // memory as asked. Waits for the device first. While a pool sleeps, allocations routed to it fail with
  // FailedPrecondition and frees into it are allowed. FailedPrecondition during a capture, for a pool with
  // regular segments (unless they are wholly free and the request releases them) or with blocks being
  // changed by another thread; NotFound for a pool or tag that names none. Pools asleep already are left
  // as they are.
  absl::StatusOr<SleepResult> Sleep(const SleepRequest& request);
  // Maps fresh physical memory at the addresses of the sleeping pools of `request.scope` and restores their
  // backed-up blocks still allocated; after it returns the memory is ready for any stream.
  absl::StatusOr<WakeResult> Wake(const WakeRequest& request);
  // Whether `pool` (kDefaultPool: the default pool) sleeps, and its figures. NotFound for no such pool.
  absl::StatusOr<SleepState> GetSleepState(PoolId pool) const;

  // ---- Mapping observers and pins (mapping_observer.h says the rules). ----
  // Tells `observer` of every map and unmap from now on; with `replay_existing`, first of every mapping
  // that exists now (OnMap each), so that a library attaching late registers what is mapped already. The
  // replay is exact when no other thread maps or unmaps meanwhile (a growth underway may be told twice or
  // missed). AlreadyExists when it is registered already.
  absl::Status AddMappingObserver(std::shared_ptr<MappingObserver> observer, bool replay_existing = false);
  // No more calls to `observer` once this returns (a call underway on another thread may still finish).
  // NotFound when it is not registered.
  absl::Status RemoveMappingObserver(const MappingObserver* observer);
  // Exceptions observers let escape (they must not throw).
  MappingObserverErrors GetMappingObserverErrors() const { return hooks_.errors(); }
  // Keeps every chunk (or regular segment) holding a byte of [ptr, ptr + size) mapped until unpinned: no
  // EmptyCache, release before out-of-memory, garbage collection or growth unmaps or moves it, and a pool
  // holding one cannot sleep. Counted: as many UnpinMapping calls of the same range undo it. The range must
  // lie inside one segment of this allocator (InvalidArgument otherwise); it may cover memory not mapped
  // yet, which is then kept once mapped.
  absl::Status PinMapping(DevicePtr ptr, std::size_t size);
  // NotFound when [ptr, ptr + size) is not pinned (exactly this range).
  absl::Status UnpinMapping(DevicePtr ptr, std::size_t size);

  const Config& config() const { return config_; }
  Driver& driver() const { return *driver_; }

 private:
  friend class PrivatePool;
  friend class PoolRoute;
  friend class GraphPin;
  CachingAllocator(std::shared_ptr<Driver> driver, Config config);

  // ---- Shards (caching_allocator.cc). ----
  // The shard of (`pool`, `stream`), created on first use; nullptr past ShardTable::kMaxShards or when the
  // pool is gone.
  StreamShard* ShardFor(PoolId pool, Stream stream);

  // ---- Peaks (peak_ledger.h). ----
  // After `shard`'s lock is released: folds the device's peaks when a statistic of it went past its grant.
  void SettlePeaks(const StreamShard& shard) {
    if (shard.peak_over.load(std::memory_order_relaxed)) [[unlikely]]
      FoldPeaks();
  }
  // The same for whichever shards a slow operation touched (with no shard lock held).
  void SettleAllPeaks();
  void FoldPeaks();

  // ---- Hot path (caching_allocator.cc; the cache itself is block_cache.h). ----
  // The id of the shard's pool when that pool waits only for its last live block to go (now gone), else
  // kDefaultPool: the caller then releases it (MaybeReleasePool) with the lock dropped.
  PoolId LastBlockOfOrphan(const StreamShard& shard) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // After a free that succeeded: releases `pool` (kDefaultPool: none), ignoring device failures.
  void ReleaseOrphanAfterFree(PoolId pool);

  // ---- Slow path (allocation_slow_path.cc). ----
  // After the fast path found nothing: the retry ladder (retry_policy.h), in relaxed capture mode while a
  // capture is underway (see BeginAllocateToPool).
  absl::StatusOr<DevicePtr> AllocateSlow(StreamShard& shard, const AllocationRequest& request);
  // Takes the ladder's steps in order until one serves `request`, fails, or reports out of memory.
  absl::StatusOr<DevicePtr> RunRetryLadder(StreamShard& shard, const AllocationRequest& request,
                                           bool capturing);
  // A new segment (or expandable growth) for the shard's pool kind, serving `request`; 0 when there is no
  // room.
  absl::StatusOr<DevicePtr> NewSegmentFor(StreamShard& shard, const AllocationRequest& request);
  // Allocates a new segment for `request` and hands out its first block; 0 when the device or the memory
  // limit has no room; an error for any other driver failure.
  absl::StatusOr<DevicePtr> AllocateSegment(StreamShard& shard, const AllocationRequest& request);
  // Frees unsplit cached segments (all of them, or just enough oversize ones); returns bytes freed.
  // `scope` kDefaultPool: the default pool and private pools without users or pins; a private pool's id:
  // that pool only, unless pinned by a graph.
  absl::StatusOr<std::size_t> ReleaseCachedSegments(bool only_oversize, std::size_t wanted,
                                                    PoolId scope = kDefaultPool);
  absl::StatusOr<std::size_t> GarbageCollect();

  // The out-of-memory error for `request` of `pool`, explained (oom_report.h); counted and recorded.
  absl::Status OutOfMemory(const AllocationRequest& request, PoolId pool);

  // ---- Private pools (private_pools.cc). ----
  absl::Status AddPoolUser(PoolId id);
  void DropPoolUser(PoolId id);
  void DropPin(PoolId id);
  absl::Status EndRoute(std::uint64_t route_id);
  // Frees deferred during captures record their events, once no capture route is open.
  absl::Status RunDeferredFrees();
  // Returns every byte of a pool without users or pins once it has no live block, and forgets it.
  absl::Status MaybeReleasePool(PoolId id);
  // Forgets an orphaned pool whose memory is all gone, retiring its shards; nothing when some is left.
  void ForgetPoolIfEmpty(PoolId id);
  // A default-pool allocation that failed tries the cached free blocks of use_on_oom pools.
  DevicePtr AllocateFromOomPools(const AllocationRequest& request);

  // ---- Stream events (stream_events.cc). ----
  // Free() of a block recorded on other streams or held (its shard locked; unlocked on return): a held one
  // waits for its last hold (ReleaseHold); else deferred while a capture is underway, else an event on
  // each of those streams holds it until their work is done.
  absl::Status FreeUsedOnOtherStreams(StreamShard& shard, Block* block) ABSL_UNLOCK_FUNCTION(shard.mu);
  // Records an event on each stream `block` was used on, with the shard unlocked; the block then waits for
  // them. On failure it stays in the pointer map, still `freeing`, for the caller to give back or retry.
  absl::Status FreeWithStreamUses(StreamShard& shard, Block* block);
  void ProcessEvents(StreamShard& shard);
  absl::Status SynchronizeAndFreeEvents();
  void CompleteEvent(StreamShard& shard, const PendingEvent& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);

  // The statistics, segments and pools of a snapshot, all taken under every lock (allocator_snapshot.cc).
  void SnapshotState(MemorySnapshot* snapshot) const;
  // The statistics, every shard and the device lock held by `lock`: block statistics summed over shards,
  // their exact peaks (folded first), the device's segment statistics.
  void ReadStats(const AllShardsLock& lock, DeviceStats& out) const;

  // ---- Lookup. ----
  // The shard whose allocated map holds `ptr`, locked; nullptr (nothing locked) if none.
  StreamShard* LockOwnerOf(DevicePtr ptr, Block** block) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status UnknownPointerError(absl::string_view operation, DevicePtr ptr) const;
  // Holds (block_holds.cc): every held block is allocated, has its `held` bit and a positive count, and no
  // other block has the bit. Every lock held.
  absl::Status CheckHolds() const ABSL_NO_THREAD_SAFETY_ANALYSIS;

  const std::shared_ptr<Driver> driver_;
  const Config config_;
  const std::uint64_t id_;  // distinguishes allocators in thread-local shard caches
  // Allocation history; recording is lock-free and may happen with any lock held.
  mutable HistoryRing history_;

  // Every stream shard; AllShardsLock locks them all (shard_table.h).
  ShardTable shards_;
  // The device's exact peaks of the shards' statistics, and their grants (peak_ledger.h); changed with
  // every shard locked.
  mutable PeakLedger peaks_ ABSL_GUARDED_BY(shards_.set_mu());
  // What is done to a locked shard's blocks (block_cache.h).
  BlockCache blocks_;
  // Device-wide state, touched only on the slow path. Lock order: the shard set, shards (in creation
  // order), then this.
  mutable Mutex device_mu_;
  // Every segment, and the segment statistics (segment_ledger.h).
  SegmentLedger segments_ ABSL_GUARDED_BY(device_mu_);
  MemoryBudget budget_ ABSL_GUARDED_BY(device_mu_);
  // Private pools (pool_registry.h).
  PoolRegistry pools_ ABSL_GUARDED_BY(device_mu_);
  // Whether a capture is underway, and the gate between captures and synchronizations (capture_tracker.h).
  CaptureTracker captures_;
  // Open routes and frees deferred until no capture route is open (route_table.h).
  RouteTable routes_;
  // Mapping observers and pinned ranges (mapping_hooks.h); its lock is a leaf.
  MappingHooks hooks_;
  // What growth, release and quarantine repair of expandable segments may do to the parts above
  // (expandable_host.h), lent to them instead of the parts.
  AllocatorExpandableHost expandable_host_;
  // Growth and release of expandable segments, their handle cache, peers and quarantine
  // (expandable_segments.h).
  ExpandableSegments expandable_;
  // Frees regular segments taken out of the cache (segment_releaser.h).
  SegmentReleaser releaser_;
  // What the sleep and wake reach the allocator's parts through (sleep_host.h); declared before `sleep_`,
  // which uses it until its end.
  AllocatorSleepHost sleep_host_;
  // Sleeping pools and the sleep and wake sequences (pool_sleep.h).
  PoolSleep sleep_;
  // Holds per held block (HoldBlock); a block is here iff its `held` bit is set.
  absl::flat_hash_map<const Block*, int> holds_ ABSL_GUARDED_BY(device_mu_);
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_CACHING_ALLOCATOR_H_
