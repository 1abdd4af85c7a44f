// Allocation traces in PyTorch's CSV format: reading them (plain or gzip'd) into a compact in-memory Trace,
// and writing one back out.
//
// The format (traces/README.md): header `action,addr,size,stream,time_us`, then one allocator event a row,
// in order. `alloc` hands out `size` bytes at `addr`; `free_requested` / `free_completed` release it (a
// replay frees at `free_completed`); the segment_* rows are the recording allocator's own device calls.
// Gzip is detected by its magic bytes, not by the file name. Bad input is an error naming the file and the
// line ("trace.csv:17: unknown action 'alloc2'; ..."), never a crash.
#ifndef GRAPHALLOC_ALLOCATOR_TRACE_TRACE_READER_H_
#define GRAPHALLOC_ALLOCATOR_TRACE_TRACE_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc {

// A row's action. A trace's actions are the history's (memory_snapshot.h) and have the same names: a trace
// holds the allocator's seven block and segment events, alloc through segment_unmap; kOom, kSnapshot, kSleep
// and kWake are history events only and never a trace row (PyTorch's trace format has no sleep, and a replay
// does not sleep pools). HistoryActionName() names them.
using TraceAction = HistoryAction;

// Whether a trace can hold `action` (alloc through segment_unmap: not kOom, kSnapshot, kSleep, kWake).
constexpr bool IsTraceAction(HistoryAction action) { return action <= HistoryAction::kSegmentUnmap; }
// The action named `name` ("alloc", "free_completed", ...), or nullopt when no trace row can have it.
std::optional<TraceAction> ParseTraceAction(absl::string_view name);

// One row. `line` is the row's 1-based line number in the file it was read from (0 when built in code);
// error messages name it.
struct TraceEvent {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;  // 0: the default stream
  std::int64_t time_us = 0;
  std::uint32_t line = 0;
  TraceAction action = TraceAction::kAlloc;

  friend bool operator==(const TraceEvent&, const TraceEvent&) = default;
};

struct Trace {
  std::string name;  // the file's base name, or what the caller chose
  std::vector<TraceEvent> events;
  // Why the trace is only part of the run it comes from ("" when whole): a snapshot's history that
  // overflowed or began late, replayed with TraceReadOptions::allow_partial_history. A replay says so.
  std::string partial;

  // "name:line" for event `index` (just "name, event N" when the event has no line number).
  std::string Where(std::size_t index) const;
};

inline constexpr absl::string_view kTraceHeader = "action,addr,size,stream,time_us";

// Parses CSV text (already decompressed). `source` names the input in error messages. InvalidArgument for
// a missing or wrong header, a row without exactly five fields, an unknown action or a non-numeric field.
absl::StatusOr<Trace> ParseTrace(absl::string_view csv, absl::string_view source);

// Decompresses gzip data (one or more members). DataLoss for truncated or corrupt data.
absl::StatusOr<std::string> GunzipBytes(absl::string_view gz, absl::string_view source);

struct TraceReadOptions {
  // A snapshot's history that does not hold the whole run (its ring overflowed, or it began after blocks
  // were allocated) replays only part of it, whose peaks can be far below the run's: refused
  // (FailedPrecondition saying what is missing) unless this is set; then Trace::partial says why.
  bool allow_partial_history = false;
};

// Reads a trace file: PyTorch's CSV, plain or gzip'd, or a graphalloc snapshot (JSON, see
// docs/snapshot_format.md) whose recorded history becomes the trace (TraceFromHistory). NotFound when it
// cannot be opened; DataLoss for a truncated or corrupt gzip stream; InvalidArgument for bad CSV or a bad
// snapshot. Errors start with `path`.
absl::StatusOr<Trace> ReadTrace(const std::string& path, const TraceReadOptions& options = {});
// The same from the file's bytes (stdin, say); `source` names it in errors.
absl::StatusOr<Trace> TraceFromBytes(std::string bytes, absl::string_view source,
                                     const TraceReadOptions& options = {});

// The allocation history of a snapshot as a trace (trace_from_history.cc). OOM, snapshot, sleep and wake
// events are not trace events. InvalidArgument when the snapshot recorded no history or none of the
// allocator's events; FailedPrecondition for a partial history (see TraceReadOptions) unless allowed, when
// frees of blocks allocated before the history's first event are dropped (the trace starts mid-run).
absl::StatusOr<Trace> TraceFromHistory(const MemorySnapshot& snapshot, absl::string_view name,
                                       const TraceReadOptions& options = {});

// The trace as CSV text, header included; ParseTrace() reads it back to an equal trace (line numbers aside).
std::string FormatTraceCsv(const Trace& trace);

// Writes the trace to `path` as CSV, gzip'd when `gzip` is true.
absl::Status WriteTrace(const Trace& trace, const std::string& path, bool gzip);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_TRACE_TRACE_READER_H_
