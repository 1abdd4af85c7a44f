// A snapshot's recorded history as a trace (trace_reader.h), and whether that history holds the whole run.
//
// A history is partial when its ring overflowed (the oldest events are gone), or when it began after blocks
// were allocated (history turned on mid-run): frees of blocks it never saw allocated, or blocks live in the
// snapshot without an allocation in it. Replaying such a history replays a run that never happened, with
// peaks that can be far too low ("Completed: yes" with ratio 1.006 where the run's is 1.014), so it is
// refused unless asked for, and then the trace says it is partial.
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graphalloc/allocator/trace/trace_reader.h"

namespace graphalloc {
namespace {

// Why the history of `snapshot` is not the whole run, given the trace made of it and the frees it had to
// drop; "" when it is whole.
std::string PartialReason(const MemorySnapshot& snapshot, const absl::flat_hash_set<std::uint64_t>& live,
                          std::size_t dropped_frees) {
  std::vector<std::string> reasons;
  if (snapshot.history_overflowed) {
    reasons.push_back(absl::StrCat("its history overflowed: it kept the newest ", snapshot.history.size(),
                                   " events (history_max_entries ", snapshot.history_max_entries, ")"));
  }
  if (dropped_frees > 0) {
    reasons.push_back(absl::StrCat(dropped_frees, " frees are of blocks allocated before its first event"));
  }
  std::size_t unseen = 0;
  for (const SegmentSnapshot& segment : snapshot.segments) {
    for (const BlockSnapshot& block : segment.blocks) {
      if (block.state == BlockState::kAllocated && !live.contains(block.address)) ++unseen;
    }
  }
  if (unseen > 0) {
    reasons.push_back(
        absl::StrCat(unseen, " blocks live in the snapshot were allocated before its first event"));
  }
  return absl::StrJoin(reasons, "; ");
}

}  // namespace

absl::StatusOr<Trace> TraceFromHistory(const MemorySnapshot& snapshot, absl::string_view name,
                                       const TraceReadOptions& options) {
  if (snapshot.history_max_entries == 0 && snapshot.history.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     ": the snapshot has no allocation history to replay; record one with "
                     "GRAPHALLOC_CONF=record_history:True (or graphalloc replay --snapshot)"));
  }
  Trace trace;
  trace.name = std::string(name);
  const std::size_t slash = trace.name.find_last_of('/');
  if (slash != std::string::npos) trace.name = trace.name.substr(slash + 1);
  absl::flat_hash_set<std::uint64_t> live;  // allocated, not yet free_completed
  std::size_t dropped_frees = 0;
  for (const HistoryEvent& e : snapshot.history) {
    if (!IsTraceAction(e.action)) continue;  // oom, snapshot, sleep and wake: no trace row
    switch (e.action) {
      case HistoryAction::kAlloc:
        if (!live.insert(e.address).second) continue;
        break;
      case HistoryAction::kFreeRequested:
        if (!live.contains(e.address)) continue;
        break;
      case HistoryAction::kFreeCompleted:
        // Blocks allocated before the history's oldest event cannot be freed by the replay.
        if (live.erase(e.address) == 0) {
          ++dropped_frees;
          continue;
        }
        break;
      default:  // the segment events
        break;
    }
    trace.events.push_back(TraceEvent{e.address, e.size, e.stream, e.time_us, 0, e.action});
  }
  trace.partial = PartialReason(snapshot, live, dropped_frees);
  if (trace.events.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the snapshot's history holds none of the allocator's events (",
                     snapshot.history.size(), " events of other kinds",
                     trace.partial.empty() ? "" : absl::StrCat("; ", trace.partial), "): nothing to replay"));
  }
  if (!trace.partial.empty() && !options.allow_partial_history) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": the snapshot's history is not the whole run: ", trace.partial,
        ". A replay of it would replay part of the run, with peaks that can be far too low. Record the whole "
        "run (a larger --history-max or history_max_entries, history on from the start), or pass "
        "--allow-partial-history (TraceReadOptions::allow_partial_history) to replay what it holds"));
  }
  return trace;
}

}  // namespace graphalloc
