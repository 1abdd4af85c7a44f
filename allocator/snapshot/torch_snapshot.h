// PyTorch interop: a MemorySnapshot as the pickle torch.cuda.memory._dump_snapshot() writes (what
// pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` read), and back.
//
// Export (docs/pytorch_parity.md, "History and snapshots"): {"segments": [...], "device_traces": [[...]],
// "allocator_settings": {...}, "external_annotations": []}. Block states become "active_allocated",
// "active_pending_free" and "inactive"; pool ids become PyTorch's (int, int) pair as (id >> 32, id &
// 0xffffffff), so (0, 0) is the default pool; history events become the one device's trace, annotations its
// "user_metadata"; "sleep" and "wake", which PyTorch has no name for, become "segment_unmap" and
// "segment_map", so a round trip through this format turns them into those. An expandable segment becomes
// one PyTorch segment per mapped range, as PyTorch reports them. Import accepts both "active_pending_free"
// and the older "active_awaiting_free", recomputes the statistics (current values) and the pools from the
// blocks, and keeps one device.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_TORCH_SNAPSHOT_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_TORCH_SNAPSHOT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc {

// The snapshot as a PyTorch memory snapshot pickle (protocol 2).
std::string SnapshotToTorchPickle(const MemorySnapshot& snapshot);

// Reads a PyTorch memory snapshot pickle. `device`: which device's segments and trace to keep; -1 picks the
// lowest device that has segments or trace entries. `devices`, when given, gets every device that has some
// (in order), so that a caller can say which one it shows. InvalidArgument (with the byte offset for a bad
// pickle, or the path, "segments[3].blocks[7].state", for an unexpected value) for bad input.
absl::StatusOr<MemorySnapshot> SnapshotFromTorchPickle(absl::string_view bytes, absl::string_view source,
                                                       int device = -1, std::vector<int>* devices = nullptr);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_TORCH_SNAPSHOT_H_
