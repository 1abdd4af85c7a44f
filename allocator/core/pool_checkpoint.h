// The saved layout of a private pool (CachingAllocator::Checkpoint) and what restoring it changed
// (CachingAllocator::Restore): values, independent of the allocator's live state.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_CHECKPOINT_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

// One block of a segment, in address order.
struct CheckpointBlock {
  std::size_t offset = 0;  // from the segment's base
  std::size_t size = 0;
  bool allocated = false;
  bool mapped = true;  // false only for unmapped ranges of an expandable segment
  std::size_t requested_size = 0;

  friend bool operator==(const CheckpointBlock&, const CheckpointBlock&) = default;
};

struct CheckpointSegment {
  DevicePtr base = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;
  bool small = false;  // the small-block pool's segment
  bool expandable = false;
  std::vector<CheckpointBlock> blocks;  // tiles [base, base + size) exactly

  friend bool operator==(const CheckpointSegment&, const CheckpointSegment&) = default;
};

struct PoolCheckpoint {
  PoolId pool = kDefaultPool;
  std::uint64_t allocator_id = 0;           // which allocator took it
  std::vector<CheckpointSegment> segments;  // in address order
};

// An allocation that Restore() brought back to life: allocated in the checkpoint, free just before.
struct RestoredAllocation {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;

  friend bool operator==(const RestoredAllocation&, const RestoredAllocation&) = default;
};

struct RestoreResult {
  // Live before the restore and not allocated (at that address and size) in the checkpoint: these blocks
  // are free now, and whoever held them must not use or free them.
  std::vector<DevicePtr> freed;
  // Allocated in the checkpoint and not live before: allocated now, owned by the caller (free them with
  // CachingAllocator::Free, or hand them to whoever the checkpoint's owner was).
  std::vector<RestoredAllocation> created;
  // Chunks of expandable segments that the checkpoint had unmapped but could not be unmapped now (a
  // driver failure, or a chunk mapped since that straddles a mapped range of the checkpoint): they stay
  // mapped and free; the block layout is the checkpoint's regardless.
  std::size_t bytes_left_mapped = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_CHECKPOINT_H_
