// CachingAllocator::CheckInvariants: recomputes everything the allocator tracks incrementally and compares.
//
// One walk over every segment's block chain gathers what each shard's bookkeeping should be; what is
// checked, each in its own function:
//   the segment map      keys, overlaps, owning shard and pool kind (CheckSegment);
//   expandable chunks    placement, their bytes, mapped blocks = mapped chunks (CheckChunks, CheckChain);
//   each block chain     links, tiling, sizes, adjacent free blocks merged (CheckLinks, CheckChain), no
//                        mapped block of a handle-aligned segment across a chunk edge (CheckWithinOneChunk);
//   where blocks are     in flight, unmapped index, free index, quick cache, pointer map (CheckInFlight,
//                        CheckUnmapped, CheckIndexes);
//   the statistics       block statistics per shard, segment statistics for the device (CompareStats);
//   each shard's counts  pointer map, indexes, block objects, stream events (CheckShard);
//   the expandable side  handle cache, quarantine, growths in flight (ExpandableSegments::CheckInvariants);
//   private pools        reserved, allocated and live figures (CheckPools);
//   sleeping pools       sleeping chunks, records and backups (PoolSleep::CheckInvariants).
// The first violation found is returned as an Internal error (invariant_violation.h).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_INVARIANT_CHECKER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_INVARIANT_CHECKER_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/pool_registry.h"
#include "graphalloc/allocator/core/pool_sleep.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/shard_table.h"

namespace graphalloc {

class InvariantChecker {
 public:
  // Everything it reads; the caller holds `lock` (every shard and the device lock) throughout.
  struct Parts {
    const AllShardsLock& lock;
    const SegmentLedger& segments;
    const PoolRegistry& pools;
    const ExpandableSegments& expandable;
    std::size_t max_split_size;
    std::size_t granularity;
    const PoolSleep* sleep = nullptr;  // null: no pool sleeps (tests of the checker alone)
  };
  explicit InvariantChecker(const Parts& parts) : parts_(parts) {}

  absl::Status Run();

 private:
  // What the blocks of one shard say its bookkeeping should be.
  struct ShardExpectation {
    DeviceStats stats;
    std::size_t allocated_blocks = 0;
    std::size_t pointer_map_entries = 0;  // allocated blocks and parked blocks that kept their entry
    std::size_t indexed_blocks = 0;
    std::size_t quick_blocks = 0;
    std::size_t blocks = 0;
    std::size_t event_waits = 0;
    std::size_t unmapped_blocks = 0;  // indexed unmapped blocks (not in flight)
    std::size_t in_flight_blocks = 0;
  };
  // Merged [begin, end) intervals.
  using Intervals = std::vector<std::pair<DevicePtr, DevicePtr>>;
  // The walk of one chain (invariant_chain.cc).
  struct ChainWalk;

  absl::Status CheckSegment(DevicePtr base, const Segment* segment, DevicePtr* previous_end) const;
  absl::Status CheckChunks(const Segment* segment, Intervals* chunk_mapped);
  absl::Status CheckChain(const Segment* segment, const Intervals& chunk_mapped);
  absl::Status CheckLinks(const ChainWalk& w, const Block* b) const;
  absl::Status CheckInFlight(ChainWalk& w, const Block* b) const;
  absl::Status CheckUnmapped(ChainWalk& w, const Block* b) const;
  absl::Status CheckWithinOneChunk(const ChainWalk& w, const Block* b) const;
  absl::Status CheckIndexes(ChainWalk& w, const Block* b) const;
  absl::Status CheckShard(const StreamShard* shard, const ShardExpectation& e) const;
  absl::Status CheckPools() const;

  static void AddInterval(Intervals& v, DevicePtr begin, DevicePtr end);

  const Parts parts_;
  absl::flat_hash_map<const StreamShard*, ShardExpectation> expected_;
  DeviceStats device_expected_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_INVARIANT_CHECKER_H_
