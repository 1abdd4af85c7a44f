// One allocation on its way through the allocator: what the caller asked for, the block size that rounds
// to, and the stream it is for. Every step of the slow path (new segments, expandable growth, capture mode,
// use_on_oom pools, the out-of-memory report) takes it whole, so that the caller's size and the rounded
// one cannot be swapped on the way.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_ALLOCATION_REQUEST_H_
#define GRAPHALLOC_ALLOCATOR_CORE_ALLOCATION_REQUEST_H_

#include <cstddef>

#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

struct AllocationRequest {
  AllocationRequest(std::size_t bytes, Stream s, const Config& config)
      : requested(bytes), size(RoundSize(bytes, config)), stream(s) {}

  // Whether the block comes from the small pool.
  bool small() const { return IsSmall(size); }

  std::size_t requested;  // the caller's bytes: what history events and requested_bytes count
  std::size_t size;       // the block size that serves it (size_policy.h)
  Stream stream;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_ALLOCATION_REQUEST_H_
