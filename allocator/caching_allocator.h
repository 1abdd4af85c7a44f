// The caching allocator of one device: hands out device memory from cached segments, PyTorch-style.
//
// Requests are rounded (size_policy.h), served best-fit from free blocks of the requesting stream, split
// and coalesced within segments; a freed block is reused only by its own stream, or by others once the
// events recorded for RecordStream() streams complete. New segments come from the Driver only when the
// cache has nothing that fits; under pressure the cache is released and the request retried before an
// out-of-memory error is returned.
//
// Thread-safe. The hot path (a cache hit) takes one lock once and allocates nothing on the heap in steady
// state; no driver call is ever made while the lock is held.
#ifndef GRAPHALLOC_ALLOCATOR_CACHING_ALLOCATOR_H_
#define GRAPHALLOC_ALLOCATOR_CACHING_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/block.h"
#include "allocator/block_pool.h"
#include "allocator/config.h"
#include "allocator/device/driver.h"
#include "allocator/stats.h"

namespace graphalloc {

class CachingAllocator {
 public:
  // `driver` must outlive nothing: the allocator shares its ownership.
  static absl::StatusOr<std::unique_ptr<CachingAllocator>> Create(std::shared_ptr<Driver> driver,
                                                                  Config config = {});
  // Returns every segment to the device, including those of allocations never freed.
  ~CachingAllocator();

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Device memory of at least `bytes`, usable on `stream`. Zero bytes gives the null address (0), which
  // Free() accepts. ResourceExhausted when the device (or the memory fraction) cannot hold it; the
  // message says how much was asked, what the device has and what to try.
  absl::StatusOr<DevicePtr> Allocate(std::size_t bytes, Stream stream = kDefaultStream);

  // Returns a block to the cache. InvalidArgument for a pointer this allocator did not hand out or that
  // was already freed; nothing else changes then.
  absl::Status Free(DevicePtr ptr);

  // Marks `ptr` as used on `stream` too: when freed, it is reused only after the work enqueued on
  // `stream` up to the Free() has completed.
  absl::Status RecordStream(DevicePtr ptr, Stream stream);

  // Waits for outstanding stream events and returns every unused cached segment to the device.
  absl::Status EmptyCache();

  DeviceStats GetStats() const;
  void ResetPeakStats();
  void ResetAccumulatedStats();

  // Caps reserved memory at `fraction` of the device's total memory (1.0 removes the cap).
  absl::Status SetMemoryFraction(double fraction);
  double GetMemoryFraction() const;
  // Caps reserved memory at `bytes` (0 removes the cap); for replays that emulate a smaller device.
  void SetMemoryLimit(std::size_t bytes);

  // Verifies every internal invariant (block chains, free index, pointer map, statistics); an Internal
  // error describes the first violation. Tests call it after every step.
  absl::Status CheckInvariants() const;

  const Config& config() const { return config_; }
  Driver& driver() const { return *driver_; }

 private:
  struct PendingEvent {
    Event event;
    Block* block;
    std::uint64_t id;  // unique per record: events are recycled, so (event, block) can repeat
  };

  CachingAllocator(std::shared_ptr<Driver> driver, Config config);

  // ---- Hot path helpers (caching_allocator.cc). ----
  BlockPool& PoolFor(std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* TakeFreeBlock(BlockPool& pool, Stream stream, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DevicePtr FinishAllocation(BlockPool& pool, Block* block, std::size_t size, std::size_t requested)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseToPool(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool TryMerge(Block* dst, Block* src, BlockPool& pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateAllocationStats(const Block* block, bool small, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Slow path (allocation_slow_path.cc). ----
  absl::StatusOr<DevicePtr> AllocateSlow(std::size_t size, std::size_t requested, Stream stream);
  // Allocates a new segment for `size` and hands out its first block; 0 when the device or the memory
  // limit has no room; an error for any other driver failure.
  absl::StatusOr<DevicePtr> AllocateSegment(std::size_t size, std::size_t requested, Stream stream)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Frees unsplit cached segments (all of them, or just enough oversize ones); returns bytes freed.
  absl::StatusOr<std::size_t> ReleaseCachedSegments(bool only_oversize, std::size_t wanted)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseSegments(std::vector<Segment*> segments) ABSL_LOCKS_EXCLUDED(mu_);
  void UnlinkSegment(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LinkSegment(Segment* segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::size_t> GarbageCollect() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status OutOfMemory(std::size_t size, Stream stream) ABSL_LOCKS_EXCLUDED(mu_);

  // ---- Stream events (stream_events.cc). ----
  absl::Status FreeWithStreamUses(DevicePtr ptr, Block* block) ABSL_LOCKS_EXCLUDED(mu_);
  void ProcessEvents() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SynchronizeAndFreeEvents() ABSL_LOCKS_EXCLUDED(mu_);
  void CompleteEvent(const PendingEvent& pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- Lookup helpers. ----
  Segment* SegmentContaining(DevicePtr ptr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UnknownPointerError(absl::string_view operation, DevicePtr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<Driver> driver_;
  const Config config_;

  mutable absl::Mutex mu_;
  BlockPool small_pool_ ABSL_GUARDED_BY(mu_){true, nullptr};
  BlockPool large_pool_ ABSL_GUARDED_BY(mu_){false, nullptr};
  BlockArena arena_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DevicePtr, Block*> allocated_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<DevicePtr, Segment*> segments_ ABSL_GUARDED_BY(mu_);
  DeviceStats stats_ ABSL_GUARDED_BY(mu_);
  std::size_t reserved_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // segment bytes being allocated unlocked
  std::size_t blocks_in_release_ ABSL_GUARDED_BY(mu_) = 0;   // heads of segments being freed unlocked
  std::size_t memory_limit_ ABSL_GUARDED_BY(mu_) = 0;        // 0: no cap
  double memory_fraction_ ABSL_GUARDED_BY(mu_) = 1.0;

  // Stream events: per stream, in record order, so one slow stream does not hold up the others.
  absl::flat_hash_map<Stream, std::deque<PendingEvent>> pending_events_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> idle_events_ ABSL_GUARDED_BY(mu_);
  std::uint64_t next_pending_event_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<std::int64_t> pending_event_count_{0};
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CACHING_ALLOCATOR_H_
