#include "python/csrc/torch_stats.h"

#include <cstddef>

namespace graphalloc_torch {
namespace {

using TorchStat = c10::CachingAllocator::Stat;
using TorchStatArray = c10::CachingAllocator::StatArray;

TorchStat ToTorch(const graphalloc::Stat& s) {
  TorchStat out;
  out.current = s.current;
  out.peak = s.peak;
  out.allocated = s.allocated;
  out.freed = s.freed;
  return out;
}

// PyTorch's StatArray is indexed by StatType (AGGREGATE, SMALL_POOL, LARGE_POOL), in graphalloc's order.
TorchStatArray ToTorch(const graphalloc::StatArray& a) {
  TorchStatArray out;
  static_assert(static_cast<int>(c10::CachingAllocator::StatType::AGGREGATE) ==
                static_cast<int>(graphalloc::StatType::kAggregate));
  static_assert(static_cast<int>(c10::CachingAllocator::StatType::SMALL_POOL) ==
                static_cast<int>(graphalloc::StatType::kSmallPool));
  static_assert(static_cast<int>(c10::CachingAllocator::StatType::LARGE_POOL) ==
                static_cast<int>(graphalloc::StatType::kLargePool));
  for (std::size_t i = 0; i < a.by_type.size(); ++i) out[i] = ToTorch(a.by_type[i]);
  return out;
}

}  // namespace

c10::CachingDeviceAllocator::DeviceStats ToTorchStats(const graphalloc::DeviceStats& stats) {
  c10::CachingDeviceAllocator::DeviceStats out;
  out.allocation = ToTorch(stats.allocation);
  out.segment = ToTorch(stats.segment);
  out.active = ToTorch(stats.active);
  out.inactive_split = ToTorch(stats.inactive_split);
  out.allocated_bytes = ToTorch(stats.allocated_bytes);
  out.reserved_bytes = ToTorch(stats.reserved_bytes);
  out.active_bytes = ToTorch(stats.active_bytes);
  out.inactive_split_bytes = ToTorch(stats.inactive_split_bytes);
  out.requested_bytes = ToTorch(stats.requested_bytes);
  out.num_alloc_retries = stats.num_alloc_retries;
  out.num_ooms = stats.num_ooms;
  // PyTorch keeps one aggregate Stat for these two.
  out.oversize_allocations = ToTorch(stats.oversize_allocations.all());
  out.oversize_segments = ToTorch(stats.oversize_segments.all());
  out.num_sync_all_streams = stats.num_sync_all_streams;
  out.num_device_alloc = stats.num_device_alloc;
  out.num_device_free = stats.num_device_free;
  out.max_split_size = stats.max_split_size;
  return out;
}

}  // namespace graphalloc_torch
