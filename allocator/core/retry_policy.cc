// The retry ladder (retry_policy.h): the order of the slow path's steps and the reasons for it, the
// bounds of the expandable growth, and when a handle's creation is retried.
//
// The slow path's order is PyTorch's (docs/pytorch_parity.md, "Out of memory"), so that the same requests
// release the same memory and move the same statistics. Within it, cheap before dear: the cache and new
// memory before giving any back, a release that needs no synchronization before one that waits for the
// device, the memory of this pool before that of others, and the report only when every step has failed.
//
// The expandable growth (ExpandableSegments::Allocate) is the kNewSegment step on expandable segments. Its
// pass: a chunk left without access by an earlier failure is repaired first (it may serve the request);
// then best fit under the shard's lock; else plan a growth, or, when no unmapped range fits, reserve
// another address range (kReservationsPerRequest); then carry the growth out, which, when over the memory
// limit, gives back the handle cache before it is admitted, and, when the device refuses a new handle,
// releases the handle cache and tries once more (ReleaseHandleCacheAndRetry); a growth undone because a
// capture began meanwhile is planned again. A growth the device or the limit cannot take ends the step
// with no room, and the slow path goes on down its ladder.
#include "graphalloc/allocator/core/retry_policy.h"

#include <limits>

namespace graphalloc {
namespace {

constexpr RetryRung kOutsideCapture[] = {
    // Only with garbage_collection_threshold (and a memory limit, or it frees nothing): keeps reserved
    // memory below that fraction of the limit by releasing blocks nothing has used for long, so that the
    // dear release of everything cached below is seldom needed.
    {RetryStep::kCollectGarbage},
    // Another thread may have freed a fitting block since the fast path looked, and the quick cache may
    // hold blocks that merge into one that fits; only then is the device asked for more. Every later retry
    // is this step again.
    {RetryStep::kNewSegment},
    // Only with max_split_size: an oversize block is never split, so it serves few requests; just enough of
    // them go back (the smallest that covers the request, else the largest first), with no synchronization.
    {RetryStep::kReleaseOversizeCached, RetryAfter::kIfFreed},
    // The dear one: every outstanding event is waited for, so that blocks freed on other streams come back
    // too, and every cached segment and every idle expandable page goes back. PyTorch counts this retry.
    {RetryStep::kReleaseAllCached, RetryAfter::kAlways, /*counted=*/true},
    // Only for the default pool: when the device can give nothing more, pools that agreed to it lend their
    // cached free blocks. A private pool's request never takes another pool's memory.
    {RetryStep::kOomPools},
    // Only with expandable segments: a failed growth may have cached the handles it could not map, and out
    // of memory leaves nothing idle. Its errors are ignored: the request fails with the report below.
    {RetryStep::kReleaseHandleCache},
    // Counted in num_ooms, recorded in the history, explained from a snapshot of the state.
    {RetryStep::kReportOutOfMemory},
};

// During a capture no event is queried or synchronized and nothing goes back to the device (the capture may
// use it, and freeing is illegal while capturing): only the cache, new memory and the oom pools can serve.
constexpr RetryRung kDuringCapture[] = {
    {RetryStep::kNewSegment},
    {RetryStep::kOomPools},
    {RetryStep::kReportOutOfMemory},
};

constexpr bool EndsWithTheReport(std::span<const RetryRung> ladder) {
  for (std::size_t i = 0; i < ladder.size(); ++i) {
    if ((ladder[i].step == RetryStep::kReportOutOfMemory) != (i + 1 == ladder.size())) return false;
  }
  return !ladder.empty();
}
static_assert(EndsWithTheReport(kOutsideCapture) && EndsWithTheReport(kDuringCapture),
              "a ladder ends with the out-of-memory report, and only there");

}  // namespace

std::span<const RetryRung> RetryPolicy::SlowPath(bool capturing) {
  if (capturing) return kDuringCapture;
  return kOutsideCapture;
}

bool RetryPolicy::Takes(RetryStep step, const Config& config, bool default_pool) {
  switch (step) {
    case RetryStep::kCollectGarbage:
      return config.garbage_collection_threshold > 0.0;
    case RetryStep::kReleaseOversizeCached:
      return config.max_split_size != std::numeric_limits<std::size_t>::max();
    case RetryStep::kOomPools:
      return default_pool;
    case RetryStep::kReleaseHandleCache:
      return config.expandable_segments;
    case RetryStep::kNewSegment:
    case RetryStep::kReleaseAllCached:
    case RetryStep::kReportOutOfMemory:
      return true;
  }
  return true;
}

bool RetryPolicy::RetriesAfter(const RetryRung& rung, std::size_t freed) {
  switch (rung.then) {
    case RetryAfter::kNever:
      return false;
    case RetryAfter::kIfFreed:
      return freed > 0;
    case RetryAfter::kAlways:
      return true;
  }
  return false;
}

bool RetryPolicy::ReleaseHandleCacheAndRetry(const absl::Status& status) {
  // The cache holds physical memory nothing maps: given back, the device may have room for the handle. A
  // second refusal finds the cache empty, so it is the device that is full, and the slow path's releases
  // follow.
  return absl::IsResourceExhausted(status);
}

}  // namespace graphalloc
