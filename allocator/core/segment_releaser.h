// Freeing regular segments the release paths took out of the cache: the last step of EmptyCache, garbage
// collection and the release before an out-of-memory retry, and of a sleep that frees its pools' wholly free
// regular segments (pool_sleep.h). A part of its own, so that the sleep's host (allocator_sleep_host.h) frees
// them without calling back into the coordinator.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_RELEASER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_RELEASER_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/mapping_hooks.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/history/history_ring.h"

namespace graphalloc {

class SegmentReleaser {
 public:
  // What the allocator shares with it; all outlive it. `segments` is guarded by `device_mu`.
  struct Parts {
    Driver& driver;
    HistoryRing& history;
    Mutex& device_mu;
    SegmentLedger& segments;
    MappingHooks& hooks;
  };
  explicit SegmentReleaser(const Parts& parts);

  // Frees `segments`, each unlinked from the ledger, out of every index and counted in its shard's
  // blocks_in_release: one freed is deleted (a segment_free event, the observers told); one the device
  // refuses to free is linked and cached again, exactly as before. Returns the first error. Takes each
  // shard's lock and the device lock in turn; the caller holds none.
  absl::Status Release(std::vector<Segment*> segments);
  // Returns a regular segment's memory to where it came from: the driver, or the pool's segment source.
  absl::Status FreeMemory(const Segment& segment);

 private:
  Driver& driver_;
  HistoryRing& history_;
  Mutex& device_mu_;
  SegmentLedger& segments_ ABSL_GUARDED_BY(device_mu_);
  MappingHooks& hooks_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_SEGMENT_RELEASER_H_
