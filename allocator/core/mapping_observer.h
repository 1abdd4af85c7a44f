// Mapping observers: how a communication library (NCCL, an RDMA stack) learns when the allocator maps and
// unmaps device memory, so that it registers each mapping once and keeps it registered while it exists.
//
// The rules (CachingAllocator::AddMappingObserver):
// - OnMap is called exactly once per mapping: after the memory is mapped and accessible, before any block
//   in it is handed out. OnUnmap is called exactly once per mapping: before the driver unmaps (or frees)
//   it; if the driver then refuses, the memory stays mapped and OnMap is called for it again.
// - A mapping is an expandable segment's chunk (one physical handle at one address; `expandable` true) or
//   a regular segment (cuMemAlloc; `handle` 0, `expandable` false). Segments a pool's SegmentSource gives
//   are not the allocator's mappings and are not reported.
// - Calls come with no allocator lock held, from whichever thread maps or unmaps (an allocation's slow
//   path, EmptyCache, a sleep or wake, a restore, the allocator's destruction), possibly from several at
//   once. An observer must not throw and must not call the allocator's API that maps or unmaps memory
//   (Allocate, Free, EmptyCache, Sleep, ...): it would deadlock or recurse. An exception that escapes
//   anyway is caught, counted and kept (CachingAllocator::MappingObserverErrors); the allocator goes on.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_MAPPING_OBSERVER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_MAPPING_OBSERVER_H_

#include <cstddef>

#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

// One mapping, as reported to observers.
struct MappingEvent {
  int device = 0;              // the device's ordinal
  PoolId pool = kDefaultPool;  // the pool whose segment holds it
  DevicePtr ptr = 0;
  std::size_t size = 0;
  PhysicalHandle handle{};  // 0 for a regular segment
  bool expandable = false;  // a chunk of an expandable segment (else a regular segment)
};

// Told of every mapping the allocator makes and removes (see the rules above).
class MappingObserver {
 public:
  virtual ~MappingObserver() = default;
  virtual void OnMap(const MappingEvent& event) = 0;
  virtual void OnUnmap(const MappingEvent& event) = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_MAPPING_OBSERVER_H_
