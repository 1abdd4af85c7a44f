// Replays an allocation trace (trace_reader.h) through a CachingAllocator: the project's yardstick for
// fragmentation (peak reserved against peak live bytes) and for the allocator's speed on real workloads.
//
// `alloc` rows become Allocate(size, stream); `free_completed` rows free the block the trace allocated at
// that address; `free_requested` and the segment_* rows (the recording allocator's own device calls) are
// ignored. Trace stream 0 is the default stream; every other trace stream id gets a stream created through
// the allocator's driver on first use, destroyed at the end.
#ifndef GRAPHALLOC_ALLOCATOR_TRACE_TRACE_REPLAY_H_
#define GRAPHALLOC_ALLOCATOR_TRACE_TRACE_REPLAY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/trace/trace_reader.h"

namespace graphalloc {

struct ReplayOptions {
  // Run CheckInvariants() after every Nth allocator operation (0: never). A violation ends the replay
  // with an Internal error naming the event.
  std::size_t check_invariants_every = 0;
  // Write to each allocated block (its first and last 4 KiB, through the driver on the block's stream),
  // so memory that is not really usable faults. Off by default: it costs a driver call per allocation.
  bool touch_memory = false;
  // Called with the allocator as it is at the trace's peak of live bytes ("peak", right after the event
  // that first reaches it) and when the replay ends ("end", or "oom" when an allocation failed), before
  // the blocks still live are freed. For snapshots (CachingAllocator::TakeSnapshot).
  std::function<void(absl::string_view label, CachingAllocator& allocator)> snapshot_hook = nullptr;
};

// Where and why a replay stopped: an allocation the allocator refused (out of memory).
struct ReplayFailure {
  std::size_t event_index = 0;  // index into Trace::events
  std::string where;            // "trace.csv:17"
  std::string message;          // the allocator's out-of-memory message
};

struct ReplayResult {
  std::size_t events = 0;  // trace events processed (ignored kinds included), up to a failure
  std::size_t allocs = 0;  // Allocate() calls made
  std::size_t frees = 0;   // Free() calls made for free_completed rows
  // Peak of the sum of the live block sizes of the events replayed: the whole trace's when the replay
  // completed, up to the stop when it did not (so the ratio compares what the allocator got to serve).
  std::uint64_t peak_live_bytes = 0;
  // The whole trace's peak of live bytes (from the trace itself), also when the replay stopped early.
  std::uint64_t trace_peak_live_bytes = 0;
  // The allocator's peak reserved bytes during the replay (its peak stat is reset at the start).
  std::uint64_t peak_reserved_bytes = 0;
  double ratio = 0.0;  // peak_reserved_bytes / peak_live_bytes (0 when nothing was live)
  bool completed = false;
  std::optional<ReplayFailure> failure;  // set when !completed
  double wall_seconds = 0.0;             // the replay loop, invariant checks excluded
  double ns_per_op = 0.0;                // mean time inside Allocate()/Free() per call
};

// What a trace needs, from the trace alone. InvalidArgument naming the line for a bad trace: a free of an
// address never allocated (or already freed), or an alloc at an address that is still live.
struct TraceSummary {
  std::size_t allocs = 0;
  std::size_t frees = 0;  // free_completed rows
  std::uint64_t peak_live_bytes = 0;
  std::size_t peak_live_event = 0;  // index of the event that first reaches peak_live_bytes
};
absl::StatusOr<TraceSummary> SummarizeTrace(const Trace& trace);

// Replays `trace` through `allocator`. Out of memory is not an error: the result says completed=false
// and where it stopped. Errors: InvalidArgument for a bad trace (nothing is allocated then), Internal
// for an allocator failure other than out-of-memory or a failed invariant check, with the event named.
// Blocks still live at the end (or at a failure) are freed before returning.
absl::StatusOr<ReplayResult> ReplayTrace(const Trace& trace, CachingAllocator& allocator,
                                         const ReplayOptions& options = {});

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_TRACE_TRACE_REPLAY_H_
