#include "python/csrc/torch_stats.h"

#include <cstddef>
#include <cstdint>

#include "graphalloc/allocator/stats/stat_names.h"

namespace graphalloc_torch {
namespace {

using TorchStat = c10::CachingAllocator::Stat;
using TorchStatArray = c10::CachingAllocator::StatArray;

void Copy(const graphalloc::Stat& from, TorchStat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

// PyTorch's StatArray is indexed by StatType (AGGREGATE, SMALL_POOL, LARGE_POOL), in graphalloc's order.
void Copy(const graphalloc::StatArray& from, TorchStatArray& to) {
  static_assert(static_cast<int>(c10::CachingAllocator::StatType::AGGREGATE) ==
                static_cast<int>(graphalloc::StatType::kAggregate));
  static_assert(static_cast<int>(c10::CachingAllocator::StatType::SMALL_POOL) ==
                static_cast<int>(graphalloc::StatType::kSmallPool));
  static_assert(static_cast<int>(c10::CachingAllocator::StatType::LARGE_POOL) ==
                static_cast<int>(graphalloc::StatType::kLargePool));
  for (std::size_t i = 0; i < from.by_type.size(); ++i) Copy(from.by_type[i], to[i]);
}

// PyTorch keeps one aggregate Stat for the oversize arrays (stat_names.h: pytorch_aggregate_only).
void Copy(const graphalloc::StatArray& from, TorchStat& to) { Copy(from.all(), to); }

void Copy(std::int64_t from, std::int64_t& to) { to = from; }

}  // namespace

c10::CachingDeviceAllocator::DeviceStats ToTorchStats(const graphalloc::DeviceStats& stats) {
  c10::CachingDeviceAllocator::DeviceStats out;
  // Field by field through stat_names.h's list: the two structs share every field name.
#define GRAPHALLOC_COPY_STAT(field, ...) Copy(stats.field, out.field);
  GRAPHALLOC_STAT_ARRAYS(GRAPHALLOC_COPY_STAT)
  GRAPHALLOC_STAT_COUNTERS(GRAPHALLOC_COPY_STAT)
#undef GRAPHALLOC_COPY_STAT
  return out;
}

}  // namespace graphalloc_torch
