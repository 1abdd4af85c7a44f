// The allocator's retry policy: what it tries, in order, once the fast path finds nothing cached that fits,
// and when it gives up. Only the decisions live here; each mechanism stays in its own file (new segments,
// cache release and the out-of-memory report: allocation_slow_path.cc; growth: expandable_growth.cc; the
// handle cache: expandable_release.cc), so that the whole ladder reads in one place (retry_policy.cc says
// why each step is where it is).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_RETRY_POLICY_H_
#define GRAPHALLOC_ALLOCATOR_CORE_RETRY_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "graphalloc/allocator/core/config.h"

namespace graphalloc {

// A step of the slow path, named for what it does.
enum class RetryStep : std::uint8_t {
  kCollectGarbage,         // release cached unsplit large blocks, the longest unused first
  kNewSegment,             // the cache again, then a new segment (or an expandable growth)
  kReleaseOversizeCached,  // release just enough cached oversize segments
  kReleaseAllCached,       // wait for every outstanding event, then release everything cached
  kOomPools,               // the cached free blocks of pools marked use_on_oom
  kReleaseHandleCache,     // release the expandable segments' idle physical handles
  kReportOutOfMemory,      // the out-of-memory error, explained: the request ends here
};

// Whether a step that released memory is followed by another try at the cache and a new segment.
enum class RetryAfter : std::uint8_t { kNever, kIfFreed, kAlways };

// One rung of the ladder: the step, what follows it, and whether that try counts in num_alloc_retries.
struct RetryRung {
  RetryStep step;
  RetryAfter then = RetryAfter::kNever;
  bool counted = false;
};

class RetryPolicy {
 public:
  // The slow path's rungs, in order, outside a capture or during one; the last one reports out of memory.
  static std::span<const RetryRung> SlowPath(bool capturing);
  // Whether `step` is taken for a request of the default pool (`default_pool`) or of a private pool under
  // `config`; a step not taken makes no driver call.
  static bool Takes(RetryStep step, const Config& config, bool default_pool);
  // Whether `rung`, having released `freed` bytes, is followed by another try at a new segment.
  static bool RetriesAfter(const RetryRung& rung, std::size_t freed);

  // ---- The expandable growth: the kNewSegment step on expandable segments. ----
  // Passes of best fit, plan and growth one request makes before it gives up (0: no room).
  static constexpr int kGrowthPasses = 8;
  // Address ranges one request may reserve when no unmapped range of the existing ones fits.
  static constexpr int kReservationsPerRequest = 1;
  // After a physical handle's creation failed with `status`: whether the handle cache is released and the
  // creation tried again (once).
  static bool ReleaseHandleCacheAndRetry(const absl::Status& status);
};

// One request's way through the growth's passes (ExpandableSegments::Allocate).
class GrowthAttempts {
 public:
  // Whether another pass is allowed; counts it.
  bool NextPass() { return passes_++ < RetryPolicy::kGrowthPasses; }
  // Whether this request may still reserve another address range; counts it.
  bool TakeReservation() { return reservations_++ < RetryPolicy::kReservationsPerRequest; }

 private:
  int passes_ = 0;
  int reservations_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_RETRY_POLICY_H_
