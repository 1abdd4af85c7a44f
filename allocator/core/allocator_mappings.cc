// The allocator's mapping observers and pins (mapping_observer.h): registering observers, telling a late one
// what is mapped already, and checking the ranges callers pin. The calls themselves are made where memory is
// mapped and unmapped (growth, release, sleep, restore, regular segments); the lists live in MappingHooks.
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {

absl::Status CachingAllocator::AddMappingObserver(std::shared_ptr<MappingObserver> observer,
                                                  bool replay_existing) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (observer == nullptr) return absl::InvalidArgumentError("AddMappingObserver: the observer is null");
  std::vector<MappingEvent> existing;
  {
    // What is mapped and accessible now, taken with the registration under every lock so that a mapping
    // settled before it is replayed and one settled after it is reported.
    AllShardsLock lock(shards_, device_mu_);
    for (const auto& [base, segment] : segments_) {
      if (!replay_existing) break;
      const PoolId pool = PoolOf(*segment);
      if (segment->vmm == nullptr) {
        if (segment->source == nullptr)
          existing.push_back(hooks_.Event(pool, segment->base, segment->size, PhysicalHandle{}, false));
        continue;
      }
      for (const auto& [ptr, chunk] : segment->vmm->chunks()) {
        if (expandable_.Accessible(ptr))
          existing.push_back(hooks_.Event(pool, ptr, chunk.size, chunk.handle, true));
      }
      // A sleeping pool's chunk holds memory only when an unmap or a wake failed; it was reported then.
      for (const auto& [ptr, chunk] : segment->vmm->sleeping_chunks()) {
        if (chunk.mapped) existing.push_back(hooks_.Event(pool, ptr, chunk.size, chunk.handle, true));
      }
    }
    if (absl::Status s = hooks_.Add(observer); !s.ok()) return s;
  }
  hooks_.Replay(*observer, existing);
  return absl::OkStatus();
}

absl::Status CachingAllocator::RemoveMappingObserver(const MappingObserver* observer) {
  return hooks_.Remove(observer);
}

absl::Status CachingAllocator::PinMapping(DevicePtr ptr, std::size_t size) {
  if (size == 0 || ptr + size < ptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PinMapping(0x%x, %d): the range is empty or wraps around", ptr, size));
  }
  MutexLock lock(&device_mu_);
  const Segment* segment = segments_.Containing(ptr);
  if (segment == nullptr || ptr + size > segment->base + segment->size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PinMapping(0x%x, %d): the range does not lie inside one segment of this allocator (device %d)", ptr,
        size, driver_->Info().ordinal));
  }
  hooks_.Pin(ptr, size);
  return absl::OkStatus();
}

absl::Status CachingAllocator::UnpinMapping(DevicePtr ptr, std::size_t size) {
  return hooks_.Unpin(ptr, size);
}

}  // namespace graphalloc
