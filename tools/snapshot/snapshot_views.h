// The views the `graphalloc snapshot` subcommands print or write, each a pure function of MemorySnapshot(s):
// a summary (text or JSON), a block-by-block segment map, an SVG picture (segment map and memory timeline),
// a self-contained HTML page around it, and a diff of two snapshots.
#ifndef GRAPHALLOC_TOOLS_SNAPSHOT_SNAPSHOT_VIEWS_H_
#define GRAPHALLOC_TOOLS_SNAPSHOT_SNAPSHOT_VIEWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc::tools {

// Where a block or event was allocated: the first frame outside graphalloc itself ("train_step
// (model.cc:42)"), or "(no stack)".
std::string CallSite(const std::vector<Frame>& frames);

// Totals, per pool, per stream, fragmentation, largest free block, statistics, top allocations by size and
// top call sites by bytes, history counts. `top` bounds the two top lists.
// `brief`: the totals, the top allocations and one history line only (the main job's output).
std::string RenderSummaryText(const MemorySnapshot& snapshot, absl::string_view name, int top = 10,
                              bool brief = false);
// The same numbers as one JSON object (keys documented in docs/snapshot_format.md).
std::string RenderSummaryJson(const MemorySnapshot& snapshot, int top = 10);

// Each segment with its blocks, one a line, and a one-line character map of the segment.
std::string RenderSegmentsText(const MemorySnapshot& snapshot);
// The same as JSON: {"segments": [{address, total_size, pool_id, stream, expandable, blocks: [{address,
// size, requested_size, state}]}]}.
std::string RenderSegmentsJson(const MemorySnapshot& snapshot);

// An SVG document: the segment map (one <rect class="block"> per block, coloured by state and pool, with a
// <title> tooltip) and, when there is history, the allocated and reserved bytes over time with the peak
// marked.
std::string RenderSvg(const MemorySnapshot& snapshot, absl::string_view title);

// One self-contained HTML page, the interactive viewer (tools/snapshot/viewer.html; inline CSS and
// JavaScript, no network) with the snapshot embedded as compact JSON: a timeline with one band per
// allocation over the history's events, the segment map by mapped ranges at a slider's event, pool and
// stream filters, fragmentation at the slider, hover and click details; `#find=0x...` in the URL selects
// the block at an address.
std::string RenderHtml(const MemorySnapshot& snapshot, absl::string_view title);

// What changed from `before` to `after`: totals, segments and allocated blocks added and removed, bytes per
// pool and per call site.
std::string RenderDiffText(const MemorySnapshot& before, const MemorySnapshot& after,
                           absl::string_view before_name, absl::string_view after_name, int top = 20);
// The same numbers as one JSON object: totals before and after, the counts and bytes of segments and
// allocated blocks added and removed, bytes per pool.
std::string RenderDiffJson(const MemorySnapshot& before, const MemorySnapshot& after);

// Memory over the history: one point per event (decimated to at most `max_points`, keeping each bucket's
// maxima), anchored so that the last point equals the snapshot's own totals.
struct TimelinePoint {
  std::int64_t time_us = 0;
  std::uint64_t event = 0;  // index into the history
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
};
struct Timeline {
  std::vector<TimelinePoint> points;
  TimelinePoint peak;  // the highest allocated point (exact, before decimation)
};
Timeline ComputeTimeline(const MemorySnapshot& snapshot, std::size_t max_points = 2000);

}  // namespace graphalloc::tools

#endif  // GRAPHALLOC_TOOLS_SNAPSHOT_SNAPSHOT_VIEWS_H_
