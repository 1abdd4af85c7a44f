// Expandable segments (GRAPHALLOC_CONF expandable_segments:True): one reserved address range per shard and
// pool kind that grows by mapping physical memory where a request needs it and gives back, page by page,
// whatever is wholly free. This class is their growth and release, and owns what those keep between
// calls: the cache of unmapped physical handles, the peers every mapping grants access to, and the
// quarantine of chunks mapped without access.
//
// A growth (expandable_growth.cc) is planned under the shard's lock (growth_plan.h), carried out with no
// lock held (unmap the idle chunks that move, create handles, map, grant access) and settled under the
// locks again; any failure undoes what it did and settles the blocks as they are. A release
// (expandable_release.cc) unmaps every chunk wholly covered by free blocks, anywhere, once the device has
// finished the work queued before those blocks were freed, and frees reservations left wholly unmapped.
//
// A quarantined chunk (expandable_quarantine.cc): a mapping sequence failed and the device then refused to
// unmap what it had mapped. Such a chunk must never be handed out (touching it faults), yet the device
// holds it: it stays mapped and reserved, as a block of its own that stays in flight (out of every index,
// merged with nothing) until RepairQuarantinedChunks() grants access or unmaps it (at the next growth,
// release, checkpoint or restore). Snapshots show its range as mapped without access.
//
// The allocator's state (its shards, blocks, segment ledger, memory budget, device lock and capture gate)
// is reached only through the ExpandableHost it lends (expandable_host.h), which says for each operation
// which lock it expects; every lock this class takes it takes there, as a scoped object (so the
// thread-safety analysis cannot follow them: the functions that take them are not analysed). Its own
// state (the handle cache, the peers, the quarantine) is guarded by the host's device lock. Methods marked
// "device lock held" are called by the allocator's other parts with it held.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_SEGMENTS_H_
#define GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_SEGMENTS_H_

#include <atomic>
#include <cstddef>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/allocation_request.h"
#include "graphalloc/allocator/core/expandable_host.h"
#include "graphalloc/allocator/core/growth_plan.h"
#include "graphalloc/allocator/core/handle_cache.h"
#include "graphalloc/allocator/core/mapping_hooks.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class ExpandableSegments {
 public:
  // What the allocator lends it; all outlive it. The coordinator's state only through `host`
  // (expandable_host.h says why the driver and the mapping hooks are lent directly).
  struct Parts {
    ExpandableHost& host;
    Driver& driver;
    MappingHooks& hooks;
    bool handle_aligned = false;     // Config::handle_aligned: every segment keeps blocks inside one handle
    bool shareable_handles = false;  // Config::shareable_handles
  };
  explicit ExpandableSegments(const Parts& parts);

  // The observers every map and unmap is reported to, and the pins no release may unmap (mapping_hooks.h).
  MappingHooks& hooks() const { return hooks_; }
  // Whether the chunk [begin, end) of `segment` must stay mapped: a byte of it is pinned
  // (CachingAllocator::PinMapping), or its pool is a communication pool that is not being destroyed.
  bool MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const;

  // ---- Growth (expandable_growth.cc). ----
  // Serves `request` from the shard's expandable segment of its pool kind, mapping physical memory where
  // the request needs it (and moving idle chunks of the shard there first); 0 when there is no room.
  absl::StatusOr<DevicePtr> Allocate(StreamShard& shard, const AllocationRequest& request);
  // Adds `peer_ordinal` to the devices every chunk grants access to, and grants it on every chunk mapped
  // now (the driver has enabled peer access already).
  absl::Status AddPeer(int peer_ordinal);
  // Whether the physical memory of `pool`'s expandable segments (nullptr: the default pool) is created
  // exportable to other processes (Config::shareable_handles, PoolOptions::shareable).
  bool Shareable(const PoolState* pool) const;
  // A new physical handle of `size` for `pool`'s segments, exportable when Shareable(pool): every growth,
  // wake and restore creates its handles here. No lock held.
  absl::StatusOr<PhysicalHandle> CreateHandle(const PoolState* pool, std::size_t size);
  // CreateHandle; when the device refuses, the handle cache is released and the creation tried again as
  // the retry policy says (retry_policy.h). What a growth and a restore create. No lock held.
  absl::StatusOr<PhysicalHandle> CreateHandleOrReleaseCache(const PoolState* pool, std::size_t size);

  // ---- Release (expandable_release.cc). ----
  // Unmaps every chunk of `scope` (PoolRegistry::Releasable) wholly covered by free blocks, releases every
  // cached handle and every reservation left wholly unmapped; returns the bytes unmapped.
  absl::StatusOr<std::size_t> Release(PoolId scope);
  // Releases every cached physical handle to the device.
  absl::Status ReleaseCachedHandles();
  // At the allocator's end: every cached handle goes back, errors ignored.
  void ReleaseCachedHandlesAtExit();

  // ---- Quarantine and in-flight blocks (expandable_quarantine.cc). ----
  // Retries the quarantined chunks: grants access to each, or else, unless a capture is underway (asked
  // under the unmap gate), unmaps it (its handle goes to the handle cache); a chunk neither call fixes stays
  // quarantined, and the first error is returned. A fixed chunk becomes a free mapped (or unmapped) block.
  // The caller holds no lock.
  absl::Status RepairQuarantinedChunks();
  // The in-flight block `b`, tiled exactly by `chunks`, goes back with chunk i mapped iff mapped[i]. A
  // chunk with no_access[i] (mapped, but without access) becomes a block of its own that stays in flight,
  // quarantined. Device lock held.
  void SettleInFlight(StreamShard& shard, Block* b, std::span<const ChunkPlacement> chunks,
                      const std::vector<bool>& mapped, const std::vector<bool>& no_access = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // A handle that is not mapped anywhere, kept for the next growth. Device lock held.
  void CacheHandle(const ChunkPlacement& handle);
  // A cached handle of exactly `size` for `pool`'s segments, taken out of the cache (a wake reuses it).
  // Device lock held.
  bool TakeCachedHandle(const PoolState* pool, std::size_t size, PhysicalHandle* handle);
  // The peers every mapping grants access to. Device lock held.
  std::vector<int> peers() const;
  // Whether `block` is a quarantined chunk's; whether the chunk at `ptr` is accessible. Device lock held.
  bool IsQuarantined(const Block* block) const;
  bool Accessible(DevicePtr chunk) const;
  // The handle cache, the quarantine and the growth in flight agree with the blocks (`in_flight_blocks`:
  // every block in flight now). Device lock held.
  absl::Status CheckInvariants(std::size_t in_flight_blocks) const;

 private:
  struct QuarantinedChunk {
    Block* block;  // in flight, exactly the chunk
    ChunkPlacement chunk;
  };

  // Growth steps (expandable_growth.cc).
  absl::Status CreateSegment(StreamShard& shard, bool small);
  // Plans a growth of `size` in `pool` (its shard locked); false when no unmapped range fits.
  bool PlanGrowth(StreamShard& shard, BlockPool& pool, std::size_t size, GrowthPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu);
  // Runs the plan's driver calls (no lock held) and settles its blocks; false when it could not map.
  absl::StatusOr<bool> ExecuteGrowth(StreamShard& shard, GrowthPlan& plan);
  struct Execution;
  absl::Status AdmitGrowth(const GrowthPlan& plan, bool* admitted);
  void UnmapStolenChunks(StreamShard& shard, const GrowthPlan& plan, Execution& x);
  void ReleaseRetiredChunks(const GrowthPlan& plan, const Execution& x);
  void CreateHandles(const PoolState* pool, GrowthPlan& plan, Execution& x);
  void MapHoles(const GrowthPlan& plan, Execution& x);
  void NotifyMappedHoles(const GrowthPlan& plan, const Execution& x);
  void SettleGrowth(StreamShard& shard, const GrowthPlan& plan, bool admitted, const Execution& x);

  // Release steps (expandable_release.cc).
  struct ReleaseJob;
  void CarveIdleChunks(PoolId scope, std::vector<ReleaseJob>* jobs, std::vector<ChunkPlacement>* cached);
  absl::Status UnmapJobs(std::vector<ReleaseJob>& jobs, std::vector<ChunkPlacement>* to_release);
  std::size_t SettleReleased(PoolId scope, std::vector<ReleaseJob>& jobs,
                             const std::vector<ChunkPlacement>& kept, std::vector<Segment*>* empty);
  absl::Status FreeReservations(const std::vector<Segment*>& empty);
  // Releases `handles` to the device; those it refuses are returned.
  std::vector<ChunkPlacement> ReleaseHandles(const std::vector<ChunkPlacement>& handles,
                                             absl::Status* first_error);

  ExpandableHost& host_;
  Driver& driver_;
  MappingHooks& hooks_;
  const std::size_t reservation_;  // the size of every reserved range: the device's memory, rounded up
  const std::size_t granularity_;
  const bool handle_aligned_;
  const bool shareable_all_;  // Config::shareable_handles: every handle, cached ones too, is exportable
  // Guarded by the host's device lock (which this class takes through the host, and its callers hold
  // where a method says "device lock held"): unmapped physical handles kept for reuse (handle_cache.h),
  // the peers, the quarantine.
  HandleCache handles_;
  std::vector<int> peers_;
  std::vector<QuarantinedChunk> quarantine_;
  std::atomic<std::size_t> quarantined_{0};  // quarantine_.size(), read without the lock
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_SEGMENTS_H_
