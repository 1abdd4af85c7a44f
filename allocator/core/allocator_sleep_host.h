// The allocator's side of SleepHost (sleep_host.h): what CachingAllocator lends the sleep and wake of its
// pools, built with the allocator (which owns it beside its PoolSleep) and holding the allocator's parts by
// reference, privately, so that PoolSleep reaches them only through the interface.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_SLEEP_HOST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_SLEEP_HOST_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/capture_tracker.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/pool_registry.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/segment_releaser.h"
#include "graphalloc/allocator/core/shard_table.h"
#include "graphalloc/allocator/core/sleep_host.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class AllocatorSleepHost final : public SleepHost {
 public:
  // The allocator's parts; all outlive this. `segments` and `pools` are guarded by `device_mu`.
  struct Parts {
    Driver& driver;
    ShardTable& shards;
    BlockCache& blocks;
    Mutex& device_mu;
    SegmentLedger& segments;
    PoolRegistry& pools;
    ExpandableSegments& expandable;
    CaptureTracker& captures;
    SegmentReleaser& releaser;
  };
  explicit AllocatorSleepHost(const Parts& parts);

  std::unique_ptr<GateLock> LockCaptureGate() override;
  std::unique_ptr<DeviceLock> LockDevice() override;
  std::unique_ptr<ShardsLock> LockAllShards() override;

  bool CaptureUnderway(const GateLock& gate) const override;
  absl::Status WaitForDevice(const GateLock& gate) override;

  std::vector<Pool> PrivatePools(const DeviceLock& lock) const override;
  std::optional<std::string> PoolTag(const DeviceLock& lock, PoolId id) const override;
  std::vector<Segment*> SegmentsOf(const DeviceLock& lock, PoolId pool) const override;
  Segment* SegmentContaining(const DeviceLock& lock, DevicePtr ptr) const override;

  void FlushQuickCaches(const ShardsLock& lock, const std::vector<PoolId>& pools) override;
  void Unlink(const ShardsLock& lock, Segment* segment) override;
  void Link(const ShardsLock& lock, Segment* segment) override;
  absl::Status ReleaseSegments(std::vector<Segment*> segments) override;

  bool MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const override;
  std::vector<int> Peers(const DeviceLock& lock) const override;
  bool TakeCachedHandle(const DeviceLock& lock, const Segment& segment, std::size_t size,
                        PhysicalHandle* handle) override;
  void CacheHandle(const DeviceLock& lock, const ChunkPlacement& chunk) override;
  absl::StatusOr<PhysicalHandle> CreateHandle(const Segment& segment, std::size_t size) override;
  absl::Status MapChunk(const ChunkPlacement& chunk) override;
  absl::Status SetAccess(const ChunkPlacement& chunk, const std::vector<int>& peers) override;
  absl::Status UnmapChunk(const ChunkPlacement& chunk) override;
  absl::Status ReleaseHandle(PhysicalHandle handle) override;
  void ReportMapped(const Segment& segment, const ChunkPlacement& chunk) override;
  void ReportUnmapped(const Segment& segment, const ChunkPlacement& chunk) override;
  void AccountAsleep(const ShardsLock& lock, Segment* segment, const ChunkPlacement& chunk) override;
  void AccountAwake(const ShardsLock& lock, Segment* segment, const ChunkPlacement& chunk) override;

  absl::StatusOr<void*> HostAlloc(std::size_t size) override;
  absl::Status HostFree(void* host) override;
  absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t size) override;
  absl::Status SynchronizeCopies() override;

 private:
  class Gate;
  class Device;
  class Shards;

  Driver& driver_;
  ShardTable& shards_;
  BlockCache& blocks_;
  Mutex& device_mu_;
  SegmentLedger& segments_ ABSL_GUARDED_BY(device_mu_);
  PoolRegistry& pools_ ABSL_GUARDED_BY(device_mu_);
  ExpandableSegments& expandable_;
  CaptureTracker& captures_;
  SegmentReleaser& releaser_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_ALLOCATOR_SLEEP_HOST_H_
