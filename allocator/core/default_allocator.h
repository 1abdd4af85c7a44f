// The process-wide allocators, one per device, created on first use.
//
// The device comes from GRAPHALLOC_DEVICE: "cuda" (the real GPU), "sim" (the simulated device) or "auto"
// (default: the real GPU when one is present, the simulated device otherwise); GRAPHALLOC_SIM_MEMORY_MB
// gives the simulated device's memory in MiB (80 GiB when unset). The configuration comes from
// GRAPHALLOC_CONF. The C ABI (graphalloc.h) and the PyTorch backend use these allocators.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_DEFAULT_ALLOCATOR_H_
#define GRAPHALLOC_ALLOCATOR_CORE_DEFAULT_ALLOCATOR_H_

#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {

inline constexpr int kMaxDevices = 64;

// Device `device`'s allocator, created on first call; the same pointer on every later call. Errors
// (bad device, bad GRAPHALLOC_CONF, no driver) are returned every time they happen, never cached.
absl::StatusOr<CachingAllocator*> DefaultAllocator(int device);

// The allocator of `device` if it was already created, else nullptr; never creates one.
CachingAllocator* ExistingDefaultAllocator(int device);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_DEFAULT_ALLOCATOR_H_
