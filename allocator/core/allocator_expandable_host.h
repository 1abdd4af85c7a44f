// The allocator's side of ExpandableHost (expandable_host.h): what CachingAllocator lends its expandable
// segments, built beside them and holding the allocator's parts by reference, privately, so that growth,
// release and quarantine repair reach them only through the interface.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_EXPANDABLE_HOST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_EXPANDABLE_HOST_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/capture_tracker.h"
#include "graphalloc/allocator/core/expandable_host.h"
#include "graphalloc/allocator/core/memory_budget.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/shard_table.h"

namespace graphalloc {

class AllocatorExpandableHost final : public ExpandableHost {
 public:
  // The allocator's parts; all outlive this. `segments` and `budget` are guarded by `device_mu`.
  struct Parts {
    ShardTable& shards;
    BlockCache& blocks;
    Mutex& device_mu;
    SegmentLedger& segments;
    MemoryBudget& budget;
    CaptureTracker& captures;
  };
  explicit AllocatorExpandableHost(const Parts& parts);

  std::unique_ptr<Lock> LockShard(StreamShard& shard) override;
  std::unique_ptr<Lock> LockDevice() override;
  std::unique_ptr<AllShards> LockAllShards() override;
  std::unique_ptr<UnmapGate> EnterUnmapGate() override;
  void AssertDeviceLockHeld() const override ABSL_ASSERT_EXCLUSIVE_LOCK(device_mu_) {
    device_mu_.AssertHeld();
  }

  DevicePtr AllocateBestFit(StreamShard& shard, const AllocationRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override;
  GrowthPlanner Planner(StreamShard& shard, BlockPool& pool, std::size_t size, std::size_t granularity,
                        GrowthPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override;
  Block* SplitOff(StreamShard& shard, Block* b, DevicePtr at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override;
  Block* CarveRange(StreamShard& shard, Block* b, DevicePtr begin, DevicePtr end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override;
  void ReturnToIndex(StreamShard& shard, Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override;
  void FlushQuickCache(StreamShard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override;

  void AddReservation(Segment* segment) override;
  void RemoveReservation(Segment* segment) override;
  void ChunkMapped(Segment* segment, const ChunkPlacement& chunk) override;
  void ChunkUnmapped(Segment* segment, const ChunkPlacement& chunk) override;
  std::vector<Segment*> Segments() const override;
  Segment* FindSegment(DevicePtr base) const override;

  std::size_t Committed(std::size_t cached, std::size_t extra) const override;
  std::size_t Capacity() const override;
  bool OverLimit(std::size_t cached, std::size_t extra) const override;
  bool AdmitNewHandles(std::size_t cached, std::size_t bytes) override;
  void BeginGrowth(std::size_t bytes) override;
  void EndGrowth(std::size_t bytes) override;
  std::size_t GrowthInFlight() const override;

  bool CaptureUnderway() const override;

 private:
  class ShardLock;
  class DeviceLock;
  class AllLock;
  class Gate;

  ShardTable& shards_;
  BlockCache& blocks_;
  Mutex& device_mu_;
  SegmentLedger& segments_ ABSL_GUARDED_BY(device_mu_);
  MemoryBudget& budget_ ABSL_GUARDED_BY(device_mu_);
  CaptureTracker& captures_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_EXPANDABLE_HOST_H_
