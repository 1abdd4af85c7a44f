// Physical handles that are not mapped anywhere, kept for reuse by the next growth of an expandable
// segment (creating a handle costs a driver call; mapping a cached one does not). Device-wide, guarded by
// the allocator's device lock. Handles leave the cache for the device (cuMemRelease) on EmptyCache(), when
// a cuMemCreate runs out of memory, when a growth would pass the memory limit, or when a request is about
// to fail out of memory (retry_policy.h).
//
// Reuse policy: a growth that needs N bytes takes cached handles whose sizes sum to at most N, largest
// first (never more than N: a bigger handle would map memory nobody asked for, and sizes are multiples of
// the granularity, so "waste below the granularity" means an exact fit), up to a bounded number of
// handles (each one costs a map and an access call); one new handle covers the rest.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_HANDLE_CACHE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_HANDLE_CACHE_H_

#include <cstddef>
#include <map>
#include <vector>

#include "graphalloc/allocator/core/expandable_segment.h"

namespace graphalloc {

class HandleCache {
 public:
  void Put(std::size_t size, PhysicalHandle handle) {
    handles_.emplace(size, handle);
    bytes_ += size;
  }
  // Handles of total size at most `need`, largest first, at most `max_count` of them (ptr left 0).
  std::vector<ChunkPlacement> TakeUpTo(std::size_t need, std::size_t max_count) {
    std::vector<ChunkPlacement> out;
    while (need > 0 && out.size() < max_count && !handles_.empty()) {
      auto it = handles_.upper_bound(need);  // first handle larger than need
      if (it == handles_.begin()) break;
      --it;
      out.push_back({0, it->first, it->second});
      need -= it->first;
      bytes_ -= it->first;
      handles_.erase(it);
    }
    return out;
  }
  // A handle of exactly `size`, if one is cached (a wake maps each chunk at the size it had).
  bool TakeExact(std::size_t size, PhysicalHandle* handle) {
    auto it = handles_.find(size);
    if (it == handles_.end()) return false;
    *handle = it->second;
    bytes_ -= size;
    handles_.erase(it);
    return true;
  }
  std::vector<ChunkPlacement> TakeAll() {
    std::vector<ChunkPlacement> out;
    for (const auto& [size, handle] : handles_) out.push_back({0, size, handle});
    handles_.clear();
    bytes_ = 0;
    return out;
  }
  std::size_t bytes() const { return bytes_; }
  std::size_t count() const { return handles_.size(); }
  // Sum of the sizes, recomputed (for the invariant checker).
  std::size_t RecomputeBytes() const {
    std::size_t total = 0;
    for (const auto& [size, handle] : handles_) total += size;
    return total;
  }

 private:
  std::multimap<std::size_t, PhysicalHandle> handles_;
  std::size_t bytes_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_HANDLE_CACHE_H_
