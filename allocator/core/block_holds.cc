// CachingAllocator's holds: a block mapped by another process (allocator/ipc/) stays allocated, and its
// memory mapped, until the last hold is released, even when its owner frees it meanwhile.
//
// A hold is a count per block under the device lock plus the block's `held` bit, which Free() tests in the
// same branch as the block's stream uses, so the fast path pays nothing more. A Free() of a held block marks
// it freeing (a second Free() is a double free) and returns; the last ReleaseHold() completes that free as
// Free() would have. Chunks under an allocated block are never unmapped (release and growth move only
// chunks wholly covered by free blocks), and a pool with a held block refuses to sleep.
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {

absl::StatusOr<HeldBlock> CachingAllocator::HoldBlock(DevicePtr ptr) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* block = nullptr;
  StreamShard* shard = LockOwnerOf(ptr, &block);
  if (shard == nullptr) return UnknownPointerError("HoldBlock", ptr);
  if (block->freeing) {
    shard->mu.Unlock();
    return absl::FailedPreconditionError(
        absl::StrFormat("HoldBlock(0x%x): the block is being freed; hold it before freeing it", ptr));
  }
  const Segment& segment = *block->segment;
  HeldBlock held;
  held.ptr = block->ptr;
  held.size = block->size;
  held.segment_base = segment.base;
  held.expandable = segment.expandable;
  {
    MutexLock lock(&device_mu_);
    if (segment.expandable) {
      if (segment.vmm->asleep()) {
        shard->mu.Unlock();
        return absl::FailedPreconditionError(absl::StrFormat(
            "HoldBlock(0x%x): the block's pool sleeps (its memory is gone); wake it first", ptr));
      }
      held.shareable = expandable_.Shareable(shard->pool);
      const auto& chunks = segment.vmm->chunks();
      auto it = chunks.upper_bound(block->ptr);
      if (it != chunks.begin()) --it;
      for (; it != chunks.end() && it->first < block->end(); ++it) {
        if (it->first + it->second.size > block->ptr) {
          held.chunks.push_back({it->first, it->second.size, it->second.handle});
        }
      }
    }
    ++holds_[block];
  }
  block->held = true;
  shard->mu.Unlock();
  return held;
}

absl::Status CachingAllocator::ReleaseHold(DevicePtr ptr) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* block = nullptr;
  StreamShard* shard = LockOwnerOf(ptr, &block);
  if (shard == nullptr) return UnknownPointerError("ReleaseHold", ptr);
  bool last = false;
  {
    MutexLock lock(&device_mu_);
    auto it = holds_.find(block);
    if (it == holds_.end()) {
      shard->mu.Unlock();
      return absl::FailedPreconditionError(absl::StrFormat("ReleaseHold(0x%x): the block is not held", ptr));
    }
    last = --it->second == 0;
    if (last) holds_.erase(it);
  }
  if (!last) {
    shard->mu.Unlock();
    return absl::OkStatus();
  }
  block->held = false;
  if (!block->freeing) {
    shard->mu.Unlock();
    return absl::OkStatus();
  }
  // The owner freed it while held: that free completes now.
  block->freeing = false;
  if (!block->stream_uses.empty()) return FreeUsedOnOtherStreams(*shard, block);
  blocks_.Free(*shard, block);
  const PoolId last_of_orphan = LastBlockOfOrphan(*shard);
  shard->mu.Unlock();
  SettlePeaks(*shard);
  ReleaseOrphanAfterFree(last_of_orphan);
  return absl::OkStatus();
}

int CachingAllocator::HoldCount(DevicePtr ptr) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  MutexLock lock(&device_mu_);
  for (const auto& [block, count] : holds_) {
    if (block->ptr == ptr) return count;
  }
  return 0;
}

absl::Status CachingAllocator::CheckHolds() const {
  std::size_t held_bits = 0;
  for (const auto& [base, segment] : segments_) {
    for (const Block* b = segment->head; b != nullptr; b = b->next) held_bits += b->held ? 1 : 0;
  }
  for (const auto& [block, count] : holds_) {
    if (count <= 0 || !block->held || !block->allocated) {
      return absl::InternalError(absl::StrFormat(
          "invariant violated: block 0x%x has %d holds, held bit %d, allocated %d (a held block must be "
          "allocated, with its bit set and a positive count)",
          block->ptr, count, block->held ? 1 : 0, block->allocated ? 1 : 0));
    }
  }
  if (held_bits != holds_.size()) {
    return absl::InternalError(absl::StrFormat("invariant violated: %d blocks have the held bit, %d are held",
                                               held_bits, holds_.size()));
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
