// The one table of DeviceStats' fields and their PyTorch names, which every reader and writer of statistics
// walks: DeviceStats::ToJson (PyTorch's flat memory_stats() keys), the snapshot JSON writer and reader (the
// nested "stats" object of docs/snapshot_format.md), the PyTorch backend's copy into c10's DeviceStats, and
// the resets and sums of stats.cc. docs/pytorch_parity.md says what each statistic counts.
//
// The fields are listed once, as X-macros (GRAPHALLOC_STAT_ARRAYS, GRAPHALLOC_STAT_COUNTERS), because one
// user copies them into another struct with the same field names (PyTorch's DeviceStats, in
// python/csrc/torch_stats.cc); everyone else walks the constexpr tables built from them (kStatArrays,
// kStatCounters). The order is the order of every output.
#ifndef GRAPHALLOC_ALLOCATOR_STATS_STAT_NAMES_H_
#define GRAPHALLOC_ALLOCATOR_STATS_STAT_NAMES_H_

#include <array>
#include <cstdint>
#include <utility>

#include "absl/strings/string_view.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc {

// What moves a StatArray: blocks (allocations and frees; a pool's block statistics add up into the
// device's) or segments (device allocations and releases).
enum class StatScope : std::uint8_t { kBlock, kSegment };

// X(field, scope, pytorch_aggregate_only) for each StatArray of DeviceStats. pytorch_aggregate_only: PyTorch
// keeps a single Stat for it, not one per pool kind, so its flat key has no ".all" level
// ("oversize_allocations.current").
#define GRAPHALLOC_STAT_ARRAYS(X)        \
  X(allocation, kBlock, false)           \
  X(segment, kSegment, false)            \
  X(active, kBlock, false)               \
  X(inactive_split, kBlock, false)       \
  X(allocated_bytes, kBlock, false)      \
  X(reserved_bytes, kSegment, false)     \
  X(active_bytes, kBlock, false)         \
  X(inactive_split_bytes, kBlock, false) \
  X(requested_bytes, kBlock, false)      \
  X(oversize_allocations, kBlock, true)  \
  X(oversize_segments, kSegment, true)

// X(field, accumulated) for each plain counter of DeviceStats. accumulated: a running total that
// ResetAccumulated() zeroes (max_split_size is the configuration, not a count).
#define GRAPHALLOC_STAT_COUNTERS(X) \
  X(num_alloc_retries, true)        \
  X(num_ooms, true)                 \
  X(num_sync_all_streams, true)     \
  X(num_device_alloc, true)         \
  X(num_device_free, true)          \
  X(max_split_size, false)

struct StatArrayName {
  absl::string_view name;
  StatArray DeviceStats::*member;
  StatScope scope;
  bool pytorch_aggregate_only;
};

struct StatCounterName {
  absl::string_view name;
  std::int64_t DeviceStats::*member;
  bool accumulated;
};

#define GRAPHALLOC_STAT_ARRAY_ENTRY_(field, scope, aggregate_only) \
  StatArrayName{#field, &DeviceStats::field, StatScope::scope, aggregate_only},
#define GRAPHALLOC_STAT_COUNTER_ENTRY_(field, accumulated) \
  StatCounterName{#field, &DeviceStats::field, accumulated},

inline constexpr std::array kStatArrays = {GRAPHALLOC_STAT_ARRAYS(GRAPHALLOC_STAT_ARRAY_ENTRY_)};
inline constexpr std::array kStatCounters = {GRAPHALLOC_STAT_COUNTERS(GRAPHALLOC_STAT_COUNTER_ENTRY_)};

#undef GRAPHALLOC_STAT_ARRAY_ENTRY_
#undef GRAPHALLOC_STAT_COUNTER_ENTRY_

// StatArray's entries by StatType: PyTorch's "all", "small_pool", "large_pool".
inline constexpr std::array<absl::string_view, kNumStatTypes> kStatTypeNames = {"all", "small_pool",
                                                                                "large_pool"};

// A Stat's fields, in PyTorch's order.
inline constexpr std::array<std::pair<absl::string_view, std::int64_t Stat::*>, 4> kStatFields = {{
    {"current", &Stat::current},
    {"peak", &Stat::peak},
    {"allocated", &Stat::allocated},
    {"freed", &Stat::freed},
}};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_STATS_STAT_NAMES_H_
