// The memory snapshot data model: what one device's caching allocator held at one moment (segments and
// their blocks, pools, statistics, configuration) plus the allocation history that led there.
//
// It is plain data, independent of the allocator's internals: the allocator fills it
// (CachingAllocator::TakeSnapshot()), the JSON reader (snapshot_json.h) and the PyTorch pickle importer
// (torch_pickle.h) produce it, and the CLI's views read it. ValidateSnapshot() checks the structural
// invariants a view relies on (sorted, non-overlapping segments; blocks contiguous and covering each
// segment); CheckStatsConsistency() compares the block totals with the recorded statistics.
// docs/snapshot_format.md describes every field as it appears in a snapshot file.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_MEMORY_SNAPSHOT_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_MEMORY_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/stats/stats.h"

namespace graphalloc {

// The snapshot format version this code writes and reads (the "version" field of a snapshot file).
inline constexpr int kSnapshotFormatVersion = 1;

// One stack frame, symbolized. `line` is 0 when unknown (C++ frames symbolized with dladdr only know their
// function and shared object).
struct Frame {
  std::string function;
  std::string file;
  int line = 0;
  friend bool operator==(const Frame&, const Frame&) = default;
};

enum class BlockState : std::uint8_t {
  kAllocated,    // handed out to the user
  kPendingFree,  // freed by the user, waiting on events of other streams (PyTorch: active_pending_free)
  kFree,         // cached, available
};

enum class SegmentKind : std::uint8_t { kSmall, kLarge };

// The allocator events the history records: PyTorch's TraceEntry actions, then graphalloc's own. New
// actions go last, so that the values and IsTraceAction (trace_reader.h) stay as they are.
enum class HistoryAction : std::uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kOom,
  kSnapshot,
  // A chunk of a sleeping pool gave its memory back (CachingAllocator::Sleep), or a wake mapped it again:
  // reserved bytes move as for segment_unmap / segment_map, but the blocks of the range stay as they were.
  // PyTorch has no such actions: its formats show them as segment_unmap / segment_map.
  kSleep,
  kWake,
};
inline constexpr int kNumHistoryActions = 11;

// Names as written in snapshot files ("allocated", "large", "free_requested", ...).
absl::string_view BlockStateName(BlockState state);
absl::string_view SegmentKindName(SegmentKind kind);
absl::string_view HistoryActionName(HistoryAction action);
std::optional<BlockState> ParseBlockState(absl::string_view name);
std::optional<SegmentKind> ParseSegmentKind(absl::string_view name);
std::optional<HistoryAction> ParseHistoryAction(absl::string_view name);

struct BlockSnapshot {
  std::uint64_t address = 0;
  std::uint64_t size = 0;            // rounded size the block spans
  std::uint64_t requested_size = 0;  // what the caller asked for (0 for free blocks)
  BlockState state = BlockState::kFree;
  std::uint64_t stream = 0;
  std::vector<Frame> frames;  // where it was allocated, innermost first; empty when not recorded
  std::string annotation;     // the user annotation active when it was allocated
  friend bool operator==(const BlockSnapshot&, const BlockSnapshot&) = default;
};

// A mapped byte range of an expandable segment, relative to the segment's address.
struct MappedRange {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  // False for memory the device mapped but refused access to and then refused to unmap (the allocator
  // quarantines it: never handed out, retried at the next growth or release). Reserved, but not usable.
  bool accessible = true;
  friend bool operator==(const MappedRange&, const MappedRange&) = default;
};

struct SegmentSnapshot {
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;  // the whole range; for an expandable segment its reserved virtual size
  std::uint64_t stream = 0;
  std::uint64_t pool_id = 0;  // 0: the default pool; otherwise a private pool's id
  SegmentKind kind = SegmentKind::kLarge;
  bool expandable = false;
  std::vector<MappedRange> mapped;    // expandable segments only: the physically backed ranges, sorted
  std::vector<BlockSnapshot> blocks;  // by address, contiguous, covering [address, address + total_size)
  std::vector<Frame> frames;          // where the segment was allocated; empty when not recorded
  // Expandable segments only: ranges whose pool sleeps (CachingAllocator::Sleep), sorted, disjoint from
  // `mapped`. Their blocks keep their state and addresses; they hold no device memory until the wake. Last
  // and defaulted, so that positional initializers of the members above stay as they were.
  std::vector<MappedRange> asleep{};

  // Device memory the segment holds: total_size, or the mapped bytes of an expandable segment.
  std::uint64_t ReservedBytes() const;
  friend bool operator==(const SegmentSnapshot&, const SegmentSnapshot&) = default;
};

struct PoolSnapshot {
  std::uint64_t id = 0;        // 0: the default pool
  std::int64_t use_count = 0;  // owners (handles, graphs) keeping a private pool alive; 0 for the default
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t peak_allocated_bytes = 0;
  // Who made a private pool, for people ("torch.cuda.MemPool (0, 3)", "CUDA graph pool (1, 0)", "graph
  // tree"; PoolOptions::owner), and how many graphs that replay into it pin its memory. Last and
  // defaulted, so that positional initializers of the members above stay as they were.
  std::string owner{};
  std::int64_t graph_pins = 0;
  friend bool operator==(const PoolSnapshot&, const PoolSnapshot&) = default;
};

struct HistoryEvent {
  HistoryAction action = HistoryAction::kAlloc;
  std::uint64_t address = 0;  // 0 for kSnapshot; for kOom the device's free bytes (PyTorch's device_free)
  std::uint64_t size = 0;     // for kOom the failed request
  std::uint64_t stream = 0;
  std::uint64_t pool_id = 0;
  std::int64_t time_us = 0;  // microseconds since the Unix epoch
  std::vector<Frame> frames;
  std::string annotation;
  friend bool operator==(const HistoryEvent&, const HistoryEvent&) = default;
};

struct DeviceDescription {
  int ordinal = 0;
  std::string name;
  std::uint64_t total_memory = 0;
  std::uint64_t granularity = 0;  // the VMM allocation granularity (2 MiB on an H100)
  friend bool operator==(const DeviceDescription&, const DeviceDescription&) = default;
};

struct MemorySnapshot {
  int format_version = kSnapshotFormatVersion;
  std::string label;         // when it was taken: "peak", "end", "oom", or anything the caller chose
  std::string source;        // what produced it: "graphalloc", "pytorch" (imported), ...
  std::int64_t time_us = 0;  // when it was taken, microseconds since the Unix epoch (0: unknown)
  DeviceDescription device;
  std::string config;  // the allocator configuration, GRAPHALLOC_CONF syntax
  DeviceStats stats;
  std::vector<SegmentSnapshot> segments;  // sorted by address
  std::vector<PoolSnapshot> pools;
  // Oldest first, ending with the allocator's last action (as PyTorch's snapshots do). Each snapshot's own
  // `snapshot` event (size: the active bytes it saw) is recorded after it, so later snapshots show it;
  // LastAction() skips such events.
  std::vector<HistoryEvent> history;
  bool history_overflowed = false;      // older events were dropped from the ring
  std::size_t history_max_entries = 0;  // the ring's capacity (0: history was not recorded)
  friend bool operator==(const MemorySnapshot&, const MemorySnapshot&) = default;
};

// Structural invariants: segments sorted by address and disjoint, each with a non-zero size and at least
// one block; blocks non-empty, contiguous from the segment's address and covering it exactly; mapped
// ranges only on expandable segments, sorted, disjoint and inside the segment; allocated and pending-free
// blocks of an expandable segment inside accessible mapped ranges; requested_size <= size. InvalidArgument
// naming the first violation by path ("segments[3].blocks[7].address: ...").
absl::Status ValidateSnapshot(const MemorySnapshot& snapshot);

// The newest history event that is not a `snapshot` event (the allocator's last action before the
// snapshot was taken), or nullptr when there is none.
const HistoryEvent* LastAction(const MemorySnapshot& snapshot);

// Totals computed from the segments and blocks.
// Bytes of `block` (one of `segment`'s) usable without mapping more memory: its size in a regular segment,
// the part inside accessible mapped ranges in an expandable one (whose free blocks also span unmapped
// address space).
std::uint64_t UsableBytes(const SegmentSnapshot& segment, const BlockSnapshot& block);
// The largest contiguous part of `block` usable without mapping more memory: its size in a regular
// segment, its largest piece inside one run of accessible mapped ranges in an expandable one. What a
// single request could get from it; UsableBytes adds up pieces that no request can use together.
std::uint64_t LargestUsableRun(const SegmentSnapshot& segment, const BlockSnapshot& block);

struct SnapshotTotals {
  std::uint64_t reserved_bytes = 0;      // sum of SegmentSnapshot::ReservedBytes()
  std::uint64_t allocated_bytes = 0;     // blocks in state kAllocated
  std::uint64_t active_bytes = 0;        // allocated + pending free
  std::uint64_t requested_bytes = 0;     // requested_size of active blocks
  std::uint64_t free_bytes = 0;          // free blocks (inside accessible mapped ranges for expandable ones)
  std::uint64_t largest_free_block = 0;  // the largest contiguous free run usable as is (LargestUsableRun)
  std::int64_t allocations = 0;          // blocks in state kAllocated
  std::int64_t active_blocks = 0;
  std::int64_t segments = 0;
};
SnapshotTotals ComputeTotals(const MemorySnapshot& snapshot);

// Compares ComputeTotals() with the "all" current values of the statistics (reserved, allocated, active,
// requested bytes; allocation and active counts). FailedPrecondition listing every mismatch.
absl::Status CheckStatsConsistency(const MemorySnapshot& snapshot);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_MEMORY_SNAPSHOT_H_
