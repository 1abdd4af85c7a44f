// Every segment of one allocator, by base address, and the device-wide figures that follow them: PyTorch's
// segment statistics (segments, reserved bytes, device allocations and frees; stats.h), each private pool's
// reserved bytes, and the history events of mapped, unmapped, sleeping and woken chunks.
//
// A regular segment is reserved memory as a whole (Link/Unlink). An expandable segment's reservation is
// listed as soon as it exists (AddReservation) but reserves nothing: its mapped chunks do (ChunkMapped /
// ChunkUnmapped). Every segment's address range is also listed with the process's AddressOwners while it
// is here, so that a pointer's device can be found without this allocator's locks. Not thread-safe: the
// allocator keeps it under its device lock.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_LEDGER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_LEDGER_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/expandable_segment.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc {

class SegmentLedger {
 public:
  using Map = absl::btree_map<DevicePtr, Segment*>;

  // `device`: the ordinal its segments are listed under in AddressOwners.
  SegmentLedger(std::size_t max_split_size, HistoryRing& history, int device);

  // Every segment, in address order.
  Map::const_iterator begin() const { return segments_.begin(); }
  Map::const_iterator end() const { return segments_.end(); }
  std::size_t size() const { return segments_.size(); }
  // The segment based at `base`, or nullptr.
  Segment* Find(DevicePtr base) const;
  // The segment whose range holds `ptr`, or nullptr.
  Segment* Containing(DevicePtr ptr) const;

  // A regular segment joins (or leaves) the reserved memory.
  void Link(Segment* segment);
  void Unlink(Segment* segment);
  // An expandable segment's reservation is listed (or no longer): no statistics, its chunks have them.
  void AddReservation(Segment* segment);
  void RemoveReservation(Segment* segment);
  // The allocator is going and frees `segment` itself: no longer in AddressOwners (nothing else changes).
  void Forget(const Segment& segment) const;
  // A chunk was mapped into (or unmapped from) an expandable segment: its chunk map, the statistics, the
  // pool's reserved bytes and the history.
  void ChunkMapped(Segment* segment, const ChunkPlacement& chunk);
  void ChunkUnmapped(Segment* segment, const ChunkPlacement& chunk);
  // A chunk of a sleeping pool gave its memory back (it stays in the segment, asleep), or a wake mapped it
  // again: the reserved statistics move as for an unmap and a map (the memory is the device's meanwhile),
  // and the history records a sleep or a wake rather than an unmap or a map, since the blocks of the range
  // stay as they are. Called once per chunk, only when the pool's sleep or wake stands: a history of
  // sleeps and wakes then always ends in the state the pool is in.
  void ChunkAsleep(Segment* segment, const ChunkPlacement& chunk);
  void ChunkAwake(Segment* segment, const ChunkPlacement& chunk);

  // Segment statistics and device counters (the block statistics live with the shards).
  DeviceStats& stats() { return stats_; }
  const DeviceStats& stats() const { return stats_; }
  std::size_t reserved_bytes() const { return static_cast<std::size_t>(stats_.reserved_bytes.all().current); }

 private:
  void AddPoolReserved(const Segment* segment, std::int64_t bytes);

  const std::size_t max_split_size_;
  HistoryRing& history_;
  const int device_;
  Map segments_;
  DeviceStats stats_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_LEDGER_H_
