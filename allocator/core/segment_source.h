// Where a private pool's segments come from when not from the device driver: another allocator's memory
// (PyTorch's MemPool(allocator=...), e.g. NCCL's ncclMemAlloc for memory registered with communicators),
// which graphalloc then caches, splits and coalesces as its own. Such a pool uses regular segments only: a
// source hands out whole allocations, not pages to map.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_SOURCE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_SOURCE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // `bytes` of device memory usable on `stream`; ResourceExhausted when the source has no room (the
  // allocator then frees its cache and retries, as for the driver). Called with no allocator lock held.
  virtual absl::StatusOr<DevicePtr> Allocate(std::size_t bytes, Stream stream) = 0;
  // Returns a segment Allocate() gave, once no block of it is live. As with the driver's cuMemFree, work
  // queued before the blocks' (stream-ordered) frees may still run on it: the source must not reuse the
  // memory before that work completes (cudaFree and ncclMemFree wait for the device).
  virtual absl::Status Free(DevicePtr ptr, std::size_t bytes, Stream stream) = 0;
  // For messages and snapshots ("pluggable", "nccl", ...).
  virtual std::string Name() const = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_SOURCE_H_
