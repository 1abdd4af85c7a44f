// Allocator statistics, with PyTorch's names and meanings (docs/pytorch_parity.md, "Statistics"; the names
// are listed once, in stat_names.h).
#ifndef GRAPHALLOC_ALLOCATOR_STATS_STATS_H_
#define GRAPHALLOC_ALLOCATOR_STATS_STATS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace graphalloc {

// One counter: its current value, the highest it reached, and the running totals of increases and
// decreases since the last ResetAccumulatedStats().
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  // True when `current` rose above `peak` (which then follows it): a new peak. A stream shard keeps its
  // escrow grant in `peak` and is told this way that it went past it (peak_ledger.h).
  bool Increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    const bool raised = current > peak;
    if (raised) peak = current;
    return raised;
  }
  void Decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  // Takes back a Decrease of an operation that failed: as if it had never happened (the peak cannot move).
  void UndoDecrease(std::int64_t amount) {
    current += amount;
    freed -= amount;
  }
  void ResetAccumulated() { allocated = freed = 0; }
  void ResetPeak() { peak = current; }
  friend bool operator==(const Stat&, const Stat&) = default;
};

enum class StatType : int { kAggregate = 0, kSmallPool = 1, kLargePool = 2 };
inline constexpr int kNumStatTypes = 3;

// One Stat per pool kind: [all, small_pool, large_pool].
struct StatArray {
  std::array<Stat, kNumStatTypes> by_type;

  Stat& operator[](StatType t) { return by_type[static_cast<int>(t)]; }
  const Stat& operator[](StatType t) const { return by_type[static_cast<int>(t)]; }
  const Stat& all() const { return by_type[0]; }
  // Updates the aggregate and the small or large entry together; true when either made a new peak.
  bool Increase(bool small, std::int64_t amount) {
    const bool all = by_type[0].Increase(amount);
    return by_type[small ? 1 : 2].Increase(amount) | all;
  }
  void Decrease(bool small, std::int64_t amount) {
    by_type[0].Decrease(amount);
    by_type[small ? 1 : 2].Decrease(amount);
  }
  void UndoDecrease(bool small, std::int64_t amount) {
    by_type[0].UndoDecrease(amount);
    by_type[small ? 1 : 2].UndoDecrease(amount);
  }
  friend bool operator==(const StatArray&, const StatArray&) = default;
};

struct DeviceStats {
  StatArray allocation;                   // number of allocated blocks
  StatArray segment;                      // number of device allocations (regular segments)
  StatArray active;                       // blocks allocated or waiting on stream events
  StatArray inactive_split;               // free blocks that are part of a split segment
  StatArray allocated_bytes;              // bytes of allocated blocks (rounded sizes)
  StatArray reserved_bytes;               // bytes of device memory held (segments plus mapped pages)
  StatArray active_bytes;                 // bytes of active blocks
  StatArray inactive_split_bytes;         // bytes of inactive split blocks
  StatArray requested_bytes;              // bytes requested by the caller for active blocks (unrounded)
  StatArray oversize_allocations;         // allocated blocks of at least max_split_size
  StatArray oversize_segments;            // segments of at least max_split_size
  std::int64_t num_alloc_retries = 0;     // allocations that succeeded only after freeing the cache
  std::int64_t num_ooms = 0;              // out-of-memory errors returned
  std::int64_t num_sync_all_streams = 0;  // times every outstanding event was synchronized
  std::int64_t num_device_alloc = 0;      // driver allocations and page mappings
  std::int64_t num_device_free = 0;       // driver frees and page unmappings
  std::int64_t max_split_size = 0;        // configured, for reference (-1: unlimited)

  void ResetAccumulated();
  void ResetPeak();
  // PyTorch's memory_stats() shape: {"allocated_bytes.all.current": ..., ...} as a JSON object.
  std::string ToJson() const;
  friend bool operator==(const DeviceStats&, const DeviceStats&) = default;
};

// Adds the per-block statistics of `from` (allocation, active, inactive_split, their bytes, requested and
// oversize allocations) into `into`: current, allocated and freed. Not the peaks: a peak of a sum is not the
// sum of the peaks (the allocator's exact device-wide peaks come from its PeakLedger).
void AddBlockStats(DeviceStats& into, const DeviceStats& from);
// Copies the per-segment statistics and counters (segment, reserved_bytes, oversize_segments, num_*,
// max_split_size) of `from` into `into`.
void CopySegmentStats(DeviceStats& into, const DeviceStats& from);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_STATS_STATS_H_
