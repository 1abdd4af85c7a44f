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
// The restorer reaches the allocator only through a RestoreHost (restore_host.h). Each step marked locked
// above holds one RestoreHost::PoolLock, the pool's shard locks and the device lock, for its whole extent.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_RESTORER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_RESTORER_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/pool_checkpoint.h"
#include "graphalloc/allocator/core/restore_host.h"

namespace graphalloc {

class PoolRestorer {
 public:
  // Restores `checkpoint` into `pool`, reaching the allocator only through `host` (restore_host.h), which
  // outlives it; the caller has checked that the checkpoint is of that pool and that no capture is underway.
  PoolRestorer(RestoreHost& host, PoolId pool, const PoolCheckpoint& checkpoint);

  absl::StatusOr<RestoreResult> Run();

 private:
  struct MapJob;
  struct UnmapJob;
  struct Rebuild;
  using PoolLock = RestoreHost::PoolLock;

  // Validation (pool_restorer.cc).
  absl::Status ValidateShape() const;
  absl::Status ValidateAgainstPool(const PoolLock& lock) const;
  // A handle-aligned segment's checkpointed live blocks must each fit one chunk, mapped now or by phase 1.
  absl::Status CheckHandleAligned(const PoolLock& lock) const;

  // Phase 1 (pool_restorer.cc).
  absl::Status MapMissingRanges();
  absl::Status PlanMaps(std::vector<MapJob>* jobs, std::vector<int>* peers);
  void PlanSegmentMaps(const PoolLock& lock, const CheckpointSegment& s, std::vector<MapJob>* jobs);
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
  void PlanUnmaps(const PoolLock& lock, std::vector<UnmapJob>* jobs);
  void Unmap(std::vector<UnmapJob>& jobs);
  void SettleUnmaps(std::vector<UnmapJob>& jobs);

  RestoreHost& host_;
  const PoolId pool_;
  const PoolCheckpoint& checkpoint_;
  RestoreResult result_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_RESTORER_H_
