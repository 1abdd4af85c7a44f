// Exact device-wide peaks of the block statistics, although every stream shard counts its own blocks with
// no counter shared on the hot path.
//
// A peak of a sum is not the sum of the parts' peaks: two streams that each peak at 1 GiB at different
// times never held 2 GiB together. Keeping one device-wide counter would put a shared cache line (or a lock)
// on every allocation and free, which the sharding exists to avoid. Instead the ledger hands out escrow:
//   - each shard's Stat::peak is its grant, the value its `current` may reach without telling anyone;
//   - the grants of all shards add up to at most the device's peak, so while every shard stays within its
//     grant the device's sum stays within its peak, and no new peak can go unseen;
//   - a shard that goes past its grant (Stat::Increase returns true) flags itself (StreamShard::peak_over)
//     and, once its lock is released, the allocator folds: with every shard locked it sees the exact sum,
//     raises the device's peak to it when it is higher, and hands the grants out again.
// A fold keeps every shard's grant where the device's peak allows it (a stream that cycles its own
// memory never needs another fold), and gives any room left to the shards that asked; when the grants no
// longer fit under the peak it takes unused room back from every shard in proportion to what it holds.
//
// Exactness: the device's peak is raised only to sums seen with every shard locked, and no sum can pass it
// unseen, so it is the highest sum the counters reached with every call ordered as the allocator ordered
// it. (A call that passed its grant is folded before it returns, so no later call can be ordered before
// it; calls of other threads meanwhile are concurrent with it.) Memory use: one DeviceStats.
//
// Cost: nothing on the hot path but the compare Stat::Increase made anyway; a fold locks every shard, as a
// snapshot does. Folds happen when the device reaches a new peak (each allocation that raises it), after
// ResetPeakStats until the cache has room again, and when memory moves from one stream to another near
// the peak.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_PEAK_LEDGER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_PEAK_LEDGER_H_

#include "absl/status/status.h"
#include "graphalloc/allocator/core/shard_table.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc {

class PeakLedger {
 public:
  // Raises the device's peaks to the shards' exact sums and hands the grants out again; clears every
  // shard's peak_over. Every shard is locked by `lock`.
  void Fold(const AllShardsLock& lock);
  // The peaks become the current sums, and every grant the shard's current value (PyTorch's
  // resetPeakStats).
  void Reset(const AllShardsLock& lock);
  // Sets the peaks of `out`'s block statistics to the device's (after a Fold, so that they are at least
  // the current sums).
  void CopyPeaks(DeviceStats& out) const;
  // The escrow's invariant, for CheckInvariants: unless a shard is flagged, the grants add up to at most
  // the device's peak, and the device's peak is at least the current sum. Internal error otherwise.
  absl::Status Check(const AllShardsLock& lock) const;

 private:
  DeviceStats peaks_;  // only the block arrays' `peak` fields are used
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_PEAK_LEDGER_H_
