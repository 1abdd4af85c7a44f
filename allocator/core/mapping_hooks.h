// The allocator's side of mapping observers and pins (mapping_observer.h): the observers it tells of every
// map and unmap, and the ranges callers pinned (CachingAllocator::PinMapping), whose chunks no release
// path may unmap.
//
// Its lock is a leaf: it is taken with or without the allocator's locks held (the release and growth paths
// ask whether a chunk is pinned under the shard locks), and observers are called after it is released, with
// a copy of the list, so that no lock of the allocator's is held while they run.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_MAPPING_HOOKS_H_
#define GRAPHALLOC_ALLOCATOR_CORE_MAPPING_HOOKS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/mapping_observer.h"

namespace graphalloc {

struct Segment;

// The pool whose segment `segment` is (kDefaultPool for the default pool's).
PoolId PoolOf(const Segment& segment);

// Exceptions observers let escape: how many, and the last one's message.
struct MappingObserverErrors {
  std::uint64_t count = 0;
  std::string last;
};

class MappingHooks {
 public:
  explicit MappingHooks(int device) : device_(device) {}

  // ---- Observers. ----
  absl::Status Add(std::shared_ptr<MappingObserver> observer);
  absl::Status Remove(const MappingObserver* observer);
  // Tells every observer; with no lock of the allocator's held.
  void Map(PoolId pool, DevicePtr ptr, std::size_t size, PhysicalHandle handle, bool expandable);
  void Unmap(PoolId pool, DevicePtr ptr, std::size_t size, PhysicalHandle handle, bool expandable);
  // Tells `observer` alone of `events` (OnMap each): a late observer learns what is mapped already.
  void Replay(MappingObserver& observer, const std::vector<MappingEvent>& events);
  MappingEvent Event(PoolId pool, DevicePtr ptr, std::size_t size, PhysicalHandle handle,
                     bool expandable) const {
    return MappingEvent{device_, pool, ptr, size, handle, expandable};
  }
  MappingObserverErrors errors() const;

  // ---- Pins. ----
  // Pins [ptr, ptr + size) once more; counted per exact range.
  void Pin(DevicePtr ptr, std::size_t size);
  // NotFound when the range is not pinned.
  absl::Status Unpin(DevicePtr ptr, std::size_t size);
  // Whether any byte of [begin, end) is pinned.
  bool Pinned(DevicePtr begin, DevicePtr end) const;
  // Every pin's count is positive and its range non-empty.
  absl::Status CheckInvariants() const;

 private:
  void Notify(bool map, const MappingEvent& event);
  void Report(const char* what, const MappingEvent& event, const std::string& message);

  const int device_;
  mutable Mutex mu_;
  std::vector<std::shared_ptr<MappingObserver>> observers_ ABSL_GUARDED_BY(mu_);
  std::atomic<std::size_t> observer_count_{0};  // observers_.size(), read without the lock
  // Pinned ranges (ptr, size) and how many times each is pinned.
  absl::btree_map<std::pair<DevicePtr, std::size_t>, int> pins_ ABSL_GUARDED_BY(mu_);
  std::size_t largest_pin_ ABSL_GUARDED_BY(mu_) = 0;  // bounds the search for a pin overlapping a range
  std::atomic<std::size_t> pin_count_{0};             // pins_.size(), read without the lock
  MappingObserverErrors errors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_MAPPING_HOOKS_H_
