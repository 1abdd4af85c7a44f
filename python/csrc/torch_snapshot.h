// PyTorch's snapshot() from graphalloc's: the MemorySnapshot of every device, with the contexts and trace
// entries of a TorchHistory, as the SnapshotInfo that torch.cuda.memory._snapshot() and memory_viz read.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_SNAPSHOT_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_SNAPSHOT_H_

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "python/csrc/torch_history.h"

namespace graphalloc_torch {

struct DeviceSnapshotInput {
  c10::DeviceIndex device;
  graphalloc::MemorySnapshot snapshot;  // CachingAllocator::TakeSnapshot() of that device
  std::function<c10::MempoolId_t(std::uint64_t)> torch_pool_of;  // graphalloc pool id -> PyTorch MempoolId
                                                                 // ({0,0} for the default pool)
};

// PyTorch's snapshot(): segments of every device (only those of pool `filter` when filter != {0,0}), each
// block with its requested size and recorded context, and with include_traces one trace per device
// (device_traces[i] for device i; devices without an allocator get an empty trace) and the annotations.
//
// A trace follows graphalloc's own history (`snapshot.history`), which has every event of the device in the
// order it happened: segment_alloc/free/map/unmap, free_completed and snapshot as graphalloc recorded them
// (its sleep and wake, which PyTorch has no action for, as segment_unmap and segment_map, with no context),
// and alloc/free_requested/oom replaced by the TorchHistory's entries they pair with (same action and
// address, nearest in time), which carry the requested size, context, compile context and user metadata.
// Any suffix of that order is consistent (memory_viz replays it backwards from the segments), which merging
// two separately clocked histories by time would not guarantee. When graphalloc recorded no history the
// TorchHistory's entries alone are the trace. The trace is cut to the TorchHistory's span (empty while it is
// off), its skipped actions and its max_entries.
//
// config_metadata comes from graphalloc's configuration (MemorySnapshot::config, GRAPHALLOC_CONF syntax),
// with last_allocator_settings = that string.
c10::cuda::CUDACachingAllocator::SnapshotInfo BuildTorchSnapshot(
    const std::vector<DeviceSnapshotInput>& devices, const TorchHistory& history, c10::MempoolId_t filter,
    bool include_traces, int device_count);

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_SNAPSHOT_H_
