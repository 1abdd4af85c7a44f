// The allocator's side of RestoreHost (restore_host.h): what CachingAllocator lends a restore of one of its
// pools, built where the restorer is (CachingAllocator::Restore) and holding the allocator's parts by
// reference, privately, so that the restorer reaches them only through the interface.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_RESTORE_HOST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_RESTORE_HOST_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/capture_tracker.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/restore_host.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/shard_table.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/history/history_ring.h"

namespace graphalloc {

// FailedPrecondition unless the pool of `lock`'s shards is quiet: no freed block waiting on stream events,
// no memory being released, no block in flight, quarantined or being freed. Checkpoint and restore need it
// (defined in pool_checkpoint.cc, beside Checkpoint).
absl::Status CheckPoolQuiet(const PoolShardsLock& lock, const SegmentLedger& segments,
                            const ExpandableSegments& expandable);

class AllocatorRestoreHost final : public RestoreHost {
 public:
  // The allocator's parts; all outlive this. `segments` is guarded by `device_mu`.
  struct Parts {
    Driver& driver;
    HistoryRing& history;
    ShardTable& shards;
    BlockCache& blocks;
    Mutex& device_mu;
    SegmentLedger& segments;
    ExpandableSegments& expandable;
    CaptureTracker& captures;
  };
  explicit AllocatorRestoreHost(const Parts& parts);

  std::unique_ptr<PoolLock> LockPool(PoolId pool) override;
  void WithUnmapGate(absl::FunctionRef<void(bool device_idle)> unmaps) override;

  absl::Status CheckQuiet(const PoolLock& lock) const override;
  std::vector<Segment*> SegmentsOf(const PoolLock& lock) const override;
  Segment* FindSegment(const PoolLock& lock, DevicePtr base) const override;

  void FlushQuickCaches(const PoolLock& lock) override;
  Block* SplitOff(const PoolLock& lock, StreamShard& shard, Block* b, DevicePtr at) override;
  Block* CarveRange(const PoolLock& lock, StreamShard& shard, Block* b, DevicePtr begin,
                    DevicePtr end) override;
  stat_events::BlockFigures FiguresOf(const Block* block, bool small) const override;

  std::size_t Granularity() const override;
  absl::Status RepairQuarantinedChunks() override;
  std::vector<int> Peers(const PoolLock& lock) const override;
  absl::StatusOr<PhysicalHandle> CreateHandle(const PoolState* pool, std::size_t size) override;
  absl::Status MapChunk(const ChunkPlacement& chunk, const std::vector<int>& peers,
                        std::vector<ChunkPlacement>* no_access) override;
  absl::Status UnmapChunk(const ChunkPlacement& chunk) override;
  absl::Status ReleaseHandle(PhysicalHandle handle) override;
  void CacheHandle(const PoolLock& lock, const ChunkPlacement& chunk) override;
  void LockAndCacheHandle(const ChunkPlacement& chunk) override;
  bool MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const override;
  void ReportMapped(const Segment& segment, const ChunkPlacement& chunk) override;
  void ReportUnmapped(const Segment& segment, const ChunkPlacement& chunk) override;
  void SettleInFlight(const PoolLock& lock, StreamShard& shard, Block* b, const ChunkPlacement& chunk,
                      bool mapped, bool no_access) override;
  void AccountMapped(const PoolLock& lock, Segment* segment, const ChunkPlacement& chunk) override;
  void AccountUnmapped(const PoolLock& lock, Segment* segment, const ChunkPlacement& chunk) override;

  void RecordFreed(DevicePtr ptr, std::size_t requested, Stream stream) override;
  void RecordAllocated(DevicePtr ptr, std::size_t requested, Stream stream) override;

 private:
  class Lock;
  // The PoolShardsLock behind `lock`, which this host handed out (LockPool).
  static const PoolShardsLock& ShardsOf(const PoolLock& lock);

  Driver& driver_;
  HistoryRing& history_;
  ShardTable& shards_;
  BlockCache& blocks_;
  Mutex& device_mu_;
  SegmentLedger& segments_;
  ExpandableSegments& expandable_;
  CaptureTracker& captures_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_RESTORE_HOST_H_
