// Restoring a private pool to a checkpoint of its layout (CachingAllocator::Restore; pool_checkpoint.h says
// what the result means). PyTorch's setCheckpointPoolState, which graph trees use to rewind a shared pool
// before recording a new branch.
//
// The restore rebuilds each segment's block chain from the checkpoint rather than replaying allocations,
// so it is exact for any layout, regular or expandable. Driver calls never happen under a lock, hence the
// phases, each with its own function:
//   validate  the checkpoint's shape (no lock), then against the live pool (locked, before phases 1 and 2):
//             quiet, every segment still there, no block to free in use on another stream;
//   1. map    what the checkpoint had mapped and is unmapped now: plan (locked), map (unlocked), settle
//             (locked). Can fail: the pool is then unchanged, apart from the new mappings, undone where the
//             driver lets us;
//   2. rebuild every block chain of the pool (locked; cannot fail): the old chain out, the checkpoint's in,
//             then account (statistics, the history's alloc/free events, what the result lists);
//   3. unmap  the chunks lying in ranges the checkpoint had unmapped: plan (locked, with phase 2), unmap
//             (unlocked), settle (locked). A failure leaves the chunk mapped and free, reported in
//             RestoreResult::bytes_left_mapped.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_RESTORER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_RESTORER_H_

#include <cstddef>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/capture_tracker.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/pool_checkpoint.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/shard_table.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "graphalloc/allocator/stats/stat_events.h"

namespace graphalloc {

// FailedPrecondition unless the pool of `lock`'s shards is quiet: no freed block waiting on stream events,
// no memory being released, no block in flight, quarantined or being freed. Checkpoint and restore need it.
absl::Status CheckPoolQuiet(const PoolShardsLock& lock, const SegmentLedger& segments,
                            const ExpandableSegments& expandable);

class PoolRestorer {
 public:
  // What the allocator shares with it; all outlive it. `segments` is guarded by `device_mu`.
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
  // Restores `checkpoint` into `pool`; the caller has checked that the checkpoint is of that pool and that
  // no capture is underway.
  PoolRestorer(const Parts& parts, PoolId pool, const PoolCheckpoint& checkpoint);

  absl::StatusOr<RestoreResult> Run();

 private:
  struct MapJob;
  struct UnmapJob;
  struct Rebuild;

  // Validation (pool_restorer.cc).
  absl::Status ValidateShape() const;
  absl::Status ValidateAgainstPool(const PoolShardsLock& lock) const;
  // A handle-aligned segment's checkpointed live blocks must each fit one chunk, mapped now or by phase 1.
  absl::Status CheckHandleAligned() const;

  // Phase 1 (pool_restorer.cc).
  absl::Status MapMissingRanges();
  absl::Status PlanMaps(std::vector<MapJob>* jobs, std::vector<int>* peers);
  void PlanSegmentMaps(const CheckpointSegment& s, std::vector<MapJob>* jobs);
  absl::Status Map(std::vector<MapJob>& jobs, const std::vector<int>& peers);
  void UndoMaps(std::vector<MapJob>& jobs);
  void SettleMaps(std::vector<MapJob>& jobs);

  // Phase 2 (pool_rebuild.cc), with phase 3's plan under the same locks.
  absl::Status RebuildChains(std::vector<UnmapJob>* unmap_jobs);
  void RebuildSegment(Segment* segment, const CheckpointSegment* wanted, Rebuild& r);
  void TearDownChain(Segment* segment, Rebuild& r);
  void LayOutChain(const Segment* segment, const CheckpointSegment* wanted, Rebuild& r);
  void BuildChain(Segment* segment, Rebuild& r);
  void Account(const Rebuild& r);

  // Phase 3 (pool_restorer.cc).
  void PlanUnmaps(std::vector<UnmapJob>* jobs);
  void Unmap(std::vector<UnmapJob>& jobs);
  void SettleUnmaps(std::vector<UnmapJob>& jobs);

  Driver& driver_;
  HistoryRing& history_;
  ShardTable& shards_;
  BlockCache& blocks_;
  Mutex& device_mu_;
  SegmentLedger& segments_;
  ExpandableSegments& expandable_;
  CaptureTracker& captures_;
  const PoolId pool_;
  const PoolCheckpoint& checkpoint_;
  RestoreResult result_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_RESTORER_H_
