// graphalloc's statistics in PyTorch's DeviceStats, for the PyTorch backend: the two share names and
// meanings field for field (allocator/stats/stats.h), so this is a copy, not an estimate.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_STATS_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_STATS_H_

#include <c10/core/CachingDeviceAllocator.h>

#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc_torch {

c10::CachingDeviceAllocator::DeviceStats ToTorchStats(const graphalloc::DeviceStats& stats);

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_STATS_H_
