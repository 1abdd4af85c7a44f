// Internal to the snapshot readers and writers: the DeviceStats fields by their PyTorch names (so that the
// JSON writer, the JSON reader and the pickle converters walk the same list), and UTF-8 repair.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc::snapshot_internal {

inline constexpr std::array<std::pair<absl::string_view, StatArray DeviceStats::*>, 11> kStatArrays = {{
    {"allocation", &DeviceStats::allocation},
    {"segment", &DeviceStats::segment},
    {"active", &DeviceStats::active},
    {"inactive_split", &DeviceStats::inactive_split},
    {"allocated_bytes", &DeviceStats::allocated_bytes},
    {"reserved_bytes", &DeviceStats::reserved_bytes},
    {"active_bytes", &DeviceStats::active_bytes},
    {"inactive_split_bytes", &DeviceStats::inactive_split_bytes},
    {"requested_bytes", &DeviceStats::requested_bytes},
    {"oversize_allocations", &DeviceStats::oversize_allocations},
    {"oversize_segments", &DeviceStats::oversize_segments},
}};

inline constexpr std::array<absl::string_view, kNumStatTypes> kStatTypeNames = {"all", "small_pool",
                                                                                "large_pool"};

inline constexpr std::array<std::pair<absl::string_view, std::int64_t Stat::*>, 4> kStatFields = {{
    {"current", &Stat::current},
    {"peak", &Stat::peak},
    {"allocated", &Stat::allocated},
    {"freed", &Stat::freed},
}};

inline constexpr std::array<std::pair<absl::string_view, std::int64_t DeviceStats::*>, 6> kStatCounters = {{
    {"num_alloc_retries", &DeviceStats::num_alloc_retries},
    {"num_ooms", &DeviceStats::num_ooms},
    {"num_sync_all_streams", &DeviceStats::num_sync_all_streams},
    {"num_device_alloc", &DeviceStats::num_device_alloc},
    {"num_device_free", &DeviceStats::num_device_free},
    {"max_split_size", &DeviceStats::max_split_size},
}};

// Length of the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when it is not one.
std::size_t Utf8SequenceLength(absl::string_view s, std::size_t i);
// `s` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string ToValidUtf8(absl::string_view s);

}  // namespace graphalloc::snapshot_internal

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_
