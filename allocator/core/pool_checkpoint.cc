// Checkpoint and restore of a private pool's layout (PyTorch's getCheckpointState/setCheckpointPoolState,
// which graph trees use to rewind a shared pool before recording a new branch). The restore itself is
// PoolRestorer (pool_restorer.h).
#include <utility>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/allocator_restore_host.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/pool_restorer.h"

namespace graphalloc {
namespace {

// The checkpoint of one segment: its blocks, as they are.
CheckpointSegment CheckpointOf(const Segment& segment) {
  CheckpointSegment s{.base = segment.base,
                      .size = segment.size,
                      .stream = segment.stream,
                      .small = segment.pool->is_small,
                      .expandable = segment.expandable,
                      .blocks = {}};
  for (const Block* b = segment.head; b != nullptr; b = b->next) {
    s.blocks.push_back(CheckpointBlock{.offset = b->ptr - segment.base,
                                       .size = b->size,
                                       .allocated = b->allocated,
                                       .mapped = b->mapped,
                                       .requested_size = b->allocated ? b->requested_size : 0});
  }
  return s;
}

// Why a block keeps its pool from being quiet; OK when nothing does.
absl::Status BlockBusy(const Segment& segment, const Block* b, const ExpandableSegments& expandable) {
  const PoolId pool = segment.shard->pool->id;
  if (expandable.IsQuarantined(b)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("pool %d holds a chunk at 0x%x (%d bytes) that the device mapped but would neither "
                        "grant access to nor "
                        "unmap; retry (EmptyCache() retries it too)",
                        pool, b->ptr, b->size));
  }
  if (b->in_flight) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "pool %d is being changed by another thread (block 0x%x); the pool must be quiet", pool, b->ptr));
  }
  if (b->freeing) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "pool %d has a free of block 0x%x pending (deferred until the capture routes end, or in progress)",
        pool, b->ptr));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPoolQuiet(const PoolShardsLock& lock, const SegmentLedger& segments,
                            const ExpandableSegments& expandable) {
  for (const StreamShard* shard : lock.shards()) {
    if (shard->pending_event_count.load(std::memory_order_relaxed) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "pool %d has freed blocks waiting on stream events; synchronize the streams and call EmptyCache() "
          "(or wait) before a checkpoint or restore",
          shard->pool->id));
    }
    if (shard->blocks_in_release != 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("pool %d is releasing memory on another thread; retry", shard->pool->id));
    }
  }
  for (const auto& [base, segment] : segments) {
    if (!lock.Holds(segment->shard)) continue;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      if (absl::Status s = BlockBusy(*segment, b, expandable); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolCheckpoint> CachingAllocator::Checkpoint(const PrivatePool& pool) {
  if (pool.allocator() != this) {
    return absl::InvalidArgumentError("Checkpoint: the pool handle is empty or belongs to another allocator");
  }
  if (sleep_.IsAsleep(pool.id())) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Checkpoint: pool %d is asleep; Wake() it first", pool.id()));
  }
  // A quarantined chunk would make the pool look busy (CheckPoolQuiet): fix what can be fixed first.
  (void)expandable_.RepairQuarantinedChunks();
  PoolShardsLock lock(shards_, pool.id(), device_mu_);
  if (absl::Status s = CheckPoolQuiet(lock, segments_, expandable_); !s.ok()) return s;
  PoolCheckpoint checkpoint{.pool = pool.id(), .allocator_id = id_, .segments = {}};
  for (StreamShard* shard : lock.shards()) blocks_.FlushQuickCache(*shard);
  for (const auto& [base, segment] : segments_) {
    if (lock.Holds(segment->shard)) checkpoint.segments.push_back(CheckpointOf(*segment));
  }
  return checkpoint;
}

absl::StatusOr<RestoreResult> CachingAllocator::Restore(const PrivatePool& pool,
                                                        const PoolCheckpoint& checkpoint) {
  if (pool.allocator() != this) {
    return absl::InvalidArgumentError("Restore: the pool handle is empty or belongs to another allocator");
  }
  if (checkpoint.allocator_id != id_ || checkpoint.pool != pool.id()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Restore: the checkpoint is of pool %d%s, not of pool %d of this allocator", checkpoint.pool,
        checkpoint.allocator_id != id_ ? " of another allocator" : "", pool.id()));
  }
  if (sleep_.IsAsleep(pool.id())) {
    return absl::FailedPreconditionError(
        absl::StrFormat("Restore: pool %d is asleep; Wake() it first", pool.id()));
  }
  if (captures_.underway()) {
    return absl::FailedPreconditionError(
        "Restore during a CUDA graph capture: it may unmap memory, which is illegal while capturing");
  }
  AllocatorRestoreHost host(
      {*driver_, history_, shards_, blocks_, device_mu_, segments_, expandable_, captures_});
  PoolRestorer restorer(host, pool.id(), checkpoint);
  absl::StatusOr<RestoreResult> result = restorer.Run();
  SettleAllPeaks();
  return result;
}

}  // namespace graphalloc
