// The device memory one allocator may hold, and every "would this fit under the cap" decision.
//
// The cap is a fraction of the device's memory (SetMemoryFraction, PyTorch's per-process memory fraction)
// or a byte limit (replays that emulate a smaller device); without one, only the device says no. Driver
// calls run with no lock held, so bytes a new segment or an expandable growth is about to add are counted
// here while their calls run ("in flight"), and a second request cannot pass the cap in the meantime.
// Reserved bytes (and cached physical handles) are the allocator's figures, passed in as plain values.
// Not thread-safe: the allocator keeps it under its device lock.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_MEMORY_BUDGET_H_
#define GRAPHALLOC_ALLOCATOR_CORE_MEMORY_BUDGET_H_

#include <cstddef>

namespace graphalloc {

class MemoryBudget {
 public:
  explicit MemoryBudget(std::size_t device_memory) : device_memory_(device_memory) {}

  // Caps at `fraction` (in [0, 1]; the caller checks) of the device's memory; 1 removes the cap, 0 allows
  // nothing.
  void SetFraction(double fraction);
  // Caps at `bytes`; 0 removes the cap.
  void SetLimit(std::size_t bytes);
  double fraction() const { return fraction_; }
  // The cap in bytes; 0: none.
  std::size_t limit() const { return limit_; }
  // What the memory may grow to: the cap, or the device's memory when that is smaller or there is none.
  std::size_t capacity() const;

  // ---- Regular segments. ----
  // Whether a new segment of `bytes` fits next to `reserved` bytes and the segments in flight; if so it
  // is in flight until EndSegment(bytes), whether its allocation succeeds or not.
  bool BeginSegment(std::size_t reserved, std::size_t bytes);
  void EndSegment(std::size_t bytes) { segments_in_flight_ -= bytes; }

  // ---- Expandable growth. ----
  // Physical bytes a growth has taken (from the handle cache) or is creating, not yet reserved.
  std::size_t growth_in_flight() const { return growth_in_flight_; }
  // Everything committed with `reserved` bytes and `cached` bytes of cached handles, plus the growths in
  // flight and `extra`: what the chunk-size policy measures against capacity().
  std::size_t Committed(std::size_t reserved, std::size_t cached, std::size_t extra) const {
    return reserved + cached + growth_in_flight_ + extra;
  }
  // Whether `extra` more bytes than Committed(reserved, cached, 0) would pass the cap.
  bool OverLimit(std::size_t reserved, std::size_t cached, std::size_t extra) const {
    return limit_ != 0 && Committed(reserved, cached, extra) > limit_;
  }
  // Admits a growth's new handles of `bytes` when they fit (or there is no cap, or nothing new): they
  // are then in flight, and the caller ends them with EndGrowth.
  bool AdmitNewHandles(std::size_t reserved, std::size_t cached, std::size_t bytes);
  void BeginGrowth(std::size_t bytes) { growth_in_flight_ += bytes; }
  void EndGrowth(std::size_t bytes) { growth_in_flight_ -= bytes; }

  // ---- Garbage collection. ----
  // The bytes to free so that `reserved` falls to `threshold` of the cap; 0 without a cap or below it.
  std::size_t GarbageCollectionTarget(std::size_t reserved, double threshold) const;

 private:
  const std::size_t device_memory_;
  std::size_t limit_ = 0;
  double fraction_ = 1.0;
  std::size_t segments_in_flight_ = 0;  // regular segments being allocated unlocked
  std::size_t growth_in_flight_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_MEMORY_BUDGET_H_
