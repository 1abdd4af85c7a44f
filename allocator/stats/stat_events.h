// Statistics updates as events: the allocator says what happened to a block or a segment, in plain values,
// and each event updates every counter PyTorch keeps for it (stats.h), so that the allocator's paths say
// what happened and never which counters that touches.
//
// Block events return true when a counter went past its peak (Stat::Increase): in a stream shard, whose
// peaks are escrow grants, that is the signal to fold the device's exact peaks (peak_ledger.h).
//
// Inactive split blocks are PyTorch's: a run of free blocks inside a segment counts as one block (its
// bytes the run's) unless it covers the whole segment; expandable segments count none, so the allocator
// sends inactive-split events only for regular segments. A counter that moves both ways in one event moves
// by the net amount once (its accumulated totals count that, as PyTorch's do).
#ifndef GRAPHALLOC_ALLOCATOR_STATS_STAT_EVENTS_H_
#define GRAPHALLOC_ALLOCATOR_STATS_STAT_EVENTS_H_

#include <cstdint>

#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc::stat_events {

// A block as the statistics see it.
struct BlockFigures {
  bool small = false;          // in the small pool
  std::int64_t bytes = 0;      // its size
  std::int64_t requested = 0;  // the caller's size (while allocated)
  bool oversize = false;       // at least max_split_size
};

// Moves `array` by `delta`, up or down; true when it went past its peak.
inline bool Move(StatArray& array, bool small, std::int64_t delta) {
  if (delta < 0) array.Decrease(small, -delta);
  return delta > 0 && array.Increase(small, delta);
}

// ---- Blocks. ----

// Handed out: allocated and active. (`|`, not `||`: every counter moves.)
inline bool BlockAllocated(DeviceStats& s, const BlockFigures& b) {
  bool raised = s.allocation.Increase(b.small, 1);
  raised |= s.allocated_bytes.Increase(b.small, b.bytes);
  raised |= s.requested_bytes.Increase(b.small, b.requested);
  if (b.oversize) raised |= s.oversize_allocations.Increase(b.small, 1);
  raised |= s.active.Increase(b.small, 1);
  return s.active_bytes.Increase(b.small, b.bytes) | raised;
}

// Freed by its owner: no longer allocated, still active until BlockReleased (stream events may keep it).
inline void BlockFreed(DeviceStats& s, const BlockFigures& b) {
  s.allocation.Decrease(b.small, 1);
  s.allocated_bytes.Decrease(b.small, b.bytes);
  s.requested_bytes.Decrease(b.small, b.requested);
  if (b.oversize) s.oversize_allocations.Decrease(b.small, 1);
}

// A BlockFreed whose free failed: the owner keeps the block, as if it had never been freed (it stayed
// active throughout, and no total counts the round trip).
inline void BlockFreeUndone(DeviceStats& s, const BlockFigures& b) {
  s.allocation.UndoDecrease(b.small, 1);
  s.allocated_bytes.UndoDecrease(b.small, b.bytes);
  s.requested_bytes.UndoDecrease(b.small, b.requested);
  if (b.oversize) s.oversize_allocations.UndoDecrease(b.small, 1);
}

// Free for reuse: no longer active.
inline void BlockReleased(DeviceStats& s, bool small, std::int64_t bytes) {
  s.active.Decrease(small, 1);
  s.active_bytes.Decrease(small, bytes);
}

// A free block of a regular segment is allocated: `taken` bytes of it, leaving a free rest of `rest` bytes
// (0: taken whole). `was_split`: it was part of a split segment before (so counted as inactive split).
inline bool FreeBlockTaken(DeviceStats& s, bool small, bool was_split, std::int64_t taken,
                           std::int64_t rest) {
  if (rest > 0 && was_split) {
    s.inactive_split_bytes.Decrease(small, taken);  // the rest stays counted, smaller
  } else if (rest > 0) {
    // The segment splits now: its rest is an inactive split block. Both counters move, whatever the first
    // says (so not ||).
    const bool blocks_peaked = s.inactive_split.Increase(small, 1);
    const bool bytes_peaked = s.inactive_split_bytes.Increase(small, rest);
    return blocks_peaked || bytes_peaked;
  } else if (was_split) {
    s.inactive_split.Decrease(small, 1);
    s.inactive_split_bytes.Decrease(small, taken);
  }
  return false;
}

// A block of a regular segment became free and absorbed `merged` free neighbours of `merged_bytes` (each
// an inactive split block until now); `now_split`: the result is still part of a split segment, of
// `bytes_after` bytes.
inline bool FreeBlockCoalesced(DeviceStats& s, bool small, std::int64_t merged, std::int64_t merged_bytes,
                               bool now_split, std::int64_t bytes_after) {
  const bool blocks_peaked = Move(s.inactive_split, small, (now_split ? 1 : 0) - merged);
  const bool bytes_peaked = Move(s.inactive_split_bytes, small, (now_split ? bytes_after : 0) - merged_bytes);
  return blocks_peaked || bytes_peaked;
}

// The free neighbours of a block in a regular segment, as coalescing would merge them.
struct FreeRunFigures {
  std::int64_t left_bytes = 0;   // free bytes just before the block
  std::int64_t block_bytes = 0;  // the block's
  std::int64_t right_bytes = 0;  // free bytes just after it
  bool whole_segment = false;    // the run with the block covers its segment
};

// A free block joins (`joining`) or leaves the run of its free neighbours without merging with them (a
// block parked in, or taken from, the quick cache): counted as if merged.
inline bool FreeRunChanged(DeviceStats& s, bool small, const FreeRunFigures& run, bool joining) {
  const std::int64_t apart_blocks = (run.left_bytes > 0 ? 1 : 0) + (run.right_bytes > 0 ? 1 : 0);
  const std::int64_t apart_bytes = run.left_bytes + run.right_bytes;
  const std::int64_t joined_blocks = run.whole_segment ? 0 : 1;
  const std::int64_t joined_bytes =
      run.whole_segment ? 0 : run.left_bytes + run.block_bytes + run.right_bytes;
  const std::int64_t sign = joining ? 1 : -1;
  const bool blocks_peaked = Move(s.inactive_split, small, sign * (joined_blocks - apart_blocks));
  const bool bytes_peaked = Move(s.inactive_split_bytes, small, sign * (joined_bytes - apart_bytes));
  return blocks_peaked || bytes_peaked;
}

// Blocks of one pool kind, added up for a bulk change (a pool restore replaces whole block chains).
struct BlockTotals {
  std::int64_t blocks = 0;  // allocated
  std::int64_t bytes = 0;
  std::int64_t requested = 0;
  std::int64_t oversize = 0;
  std::int64_t split_blocks = 0;  // inactive split
  std::int64_t split_bytes = 0;

  void AddAllocated(const BlockFigures& b) {
    ++blocks;
    bytes += b.bytes;
    requested += b.requested;
    if (b.oversize) ++oversize;
  }
  void AddInactiveSplit(std::int64_t block_bytes) {
    ++split_blocks;
    split_bytes += block_bytes;
  }
};

// The blocks counted in `out` are gone and those in `in` are there instead (allocated ones active).
inline bool BlocksReplaced(DeviceStats& s, bool small, const BlockTotals& out, const BlockTotals& in) {
  bool raised = false;
  auto replace = [small, &raised](StatArray& a, std::int64_t gone, std::int64_t added) {
    if (gone != 0) a.Decrease(small, gone);
    if (added != 0) raised |= a.Increase(small, added);
  };
  replace(s.allocation, out.blocks, in.blocks);
  replace(s.allocated_bytes, out.bytes, in.bytes);
  replace(s.requested_bytes, out.requested, in.requested);
  replace(s.oversize_allocations, out.oversize, in.oversize);
  replace(s.active, out.blocks, in.blocks);
  replace(s.active_bytes, out.bytes, in.bytes);
  replace(s.inactive_split, out.split_blocks, in.split_blocks);
  replace(s.inactive_split_bytes, out.split_bytes, in.split_bytes);
  return raised;
}

// ---- Segments and expandable chunks. ----

// A regular segment joins (or leaves) the allocator's reserved memory.
inline void SegmentLinked(DeviceStats& s, bool small, std::int64_t bytes, bool oversize) {
  s.segment.Increase(small, 1);
  s.reserved_bytes.Increase(small, bytes);
  if (oversize) s.oversize_segments.Increase(small, 1);
}
inline void SegmentUnlinked(DeviceStats& s, bool small, std::int64_t bytes, bool oversize) {
  s.segment.Decrease(small, 1);
  s.reserved_bytes.Decrease(small, bytes);
  if (oversize) s.oversize_segments.Decrease(small, 1);
}

// Physical memory mapped into (or unmapped from) an expandable segment: reserved, and one device call.
inline void ChunkMapped(DeviceStats& s, bool small, std::int64_t bytes) {
  s.reserved_bytes.Increase(small, bytes);
  ++s.num_device_alloc;
}
inline void ChunkUnmapped(DeviceStats& s, bool small, std::int64_t bytes) {
  s.reserved_bytes.Decrease(small, bytes);
  ++s.num_device_free;
}

}  // namespace graphalloc::stat_events

#endif  // GRAPHALLOC_ALLOCATOR_STATS_STAT_EVENTS_H_
