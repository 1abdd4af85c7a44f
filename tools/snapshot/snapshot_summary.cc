// RenderSummaryText / RenderSummaryJson / RenderSegmentsText and the shared helpers of snapshot_views.h.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/config.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

struct Group {
  std::uint64_t segments = 0;
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  std::uint64_t pending = 0;
  std::uint64_t free = 0;
  std::uint64_t blocks = 0;
};

struct Site {
  std::string site;
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
};

struct Analysis {
  SnapshotTotals totals;
  std::map<std::uint64_t, Group> pools;
  std::map<std::uint64_t, Group> streams;
  std::vector<const BlockSnapshot*> top_blocks;
  std::vector<Site> top_sites;
  std::uint64_t history_counts[kNumHistoryActions] = {};
};

Analysis Analyze(const MemorySnapshot& s, int top) {
  Analysis a;
  a.totals = ComputeTotals(s);
  std::map<std::string, Site> sites;
  std::vector<const BlockSnapshot*> allocated;
  for (const SegmentSnapshot& seg : s.segments) {
    for (Group* g : {&a.pools[seg.pool_id], &a.streams[seg.stream]}) {
      ++g->segments;
      g->reserved += seg.ReservedBytes();
    }
    for (const BlockSnapshot& b : seg.blocks) {
      for (Group* g : {&a.pools[seg.pool_id], &a.streams[seg.stream]}) {
        ++g->blocks;
        // Free space of an expandable segment counts only where it is mapped (as in the totals).
        if (b.state == BlockState::kAllocated) {
          g->allocated += b.size;
        } else if (b.state == BlockState::kPendingFree) {
          g->pending += b.size;
        } else {
          g->free += UsableBytes(seg, b);
        }
      }
      if (b.state != BlockState::kAllocated) continue;
      allocated.push_back(&b);
      Site& site = sites[CallSite(b.frames)];
      site.bytes += b.size;
      ++site.blocks;
    }
  }
  std::stable_sort(allocated.begin(), allocated.end(),
                   [](const BlockSnapshot* x, const BlockSnapshot* y) { return x->size > y->size; });
  allocated.resize(std::min<std::size_t>(allocated.size(), static_cast<std::size_t>(std::max(top, 0))));
  a.top_blocks = std::move(allocated);
  for (auto& [name, site] : sites) {
    site.site = name;
    a.top_sites.push_back(site);
  }
  std::stable_sort(a.top_sites.begin(), a.top_sites.end(),
                   [](const Site& x, const Site& y) { return x.bytes > y.bytes; });
  a.top_sites.resize(std::min<std::size_t>(a.top_sites.size(), static_cast<std::size_t>(std::max(top, 0))));
  for (const HistoryEvent& e : s.history) ++a.history_counts[static_cast<int>(e.action)];
  return a;
}

std::string Percent(std::uint64_t part, std::uint64_t whole) {
  return whole == 0
             ? "0.0%"
             : absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

// "Top allocations by size" and its lines; the call site only when some block has a stack.
void AppendTopAllocations(std::string& out, const Analysis& a, bool any_stack) {
  absl::StrAppend(&out, "Top allocations by size\n");
  for (std::size_t i = 0; i < a.top_blocks.size(); ++i) {
    const BlockSnapshot& b = *a.top_blocks[i];
    absl::StrAppend(&out,
                    absl::StrFormat("  %2d. %12s at %s, requested %d, stream %s", i + 1, FormatBytes(b.size),
                                    HexAddress(b.address), b.requested_size, HexAddress(b.stream)),
                    b.annotation.empty() ? "" : absl::StrCat(" [", b.annotation, "]"),
                    any_stack ? absl::StrCat("  ", CallSite(b.frames)) : "", "\n");
  }
}

// The snapshot's configuration as the differences from the defaults; the text as it is when it does not
// parse as graphalloc's (an imported snapshot's, say).
std::string DescribeSnapshotConfig(const std::string& text) {
  if (text.empty()) return "(not recorded)";
  std::vector<std::string> ignored;
  absl::StatusOr<Config> config = Config::Parse(text, &ignored);
  if (!config.ok()) return text;
  const std::string diff = config->DiffFromDefaults();
  return diff.empty() ? "defaults" : absl::StrCat("defaults but ", diff);
}

}  // namespace

std::string CallSite(const std::vector<Frame>& frames) {
  if (frames.empty()) return "(no stack)";
  const Frame* chosen = &frames.front();
  for (const Frame& f : frames) {
    if (!absl::StartsWith(f.function, "graphalloc::") && !absl::StartsWith(f.function, "backtrace")) {
      chosen = &f;
      break;
    }
  }
  if (chosen->file.empty()) return chosen->function;
  if (chosen->line == 0) return absl::StrCat(chosen->function, " (", chosen->file, ")");
  return absl::StrCat(chosen->function, " (", chosen->file, ":", chosen->line, ")");
}

std::string RenderSummaryText(const MemorySnapshot& s, absl::string_view name, int top, bool brief) {
  const Analysis a = Analyze(s, top);
  const SnapshotTotals& t = a.totals;
  // Without a single recorded stack, "(no stack)" on every line says nothing: say it once instead.
  bool any_stack = false;
  for (const SegmentSnapshot& seg : s.segments) {
    for (const BlockSnapshot& b : seg.blocks) any_stack = any_stack || !b.frames.empty();
  }
  std::string out;
  absl::StrAppend(&out, "Snapshot:      ", name, s.label.empty() ? "" : absl::StrCat(" (", s.label, ")"),
                  s.source.empty() ? "" : absl::StrCat(", from ", s.source), "\n");
  absl::StrAppend(&out, "Device:        ", s.device.ordinal, s.device.name.empty() ? "" : " ", s.device.name,
                  ", ", FormatBytes(s.device.total_memory), " total, granularity ",
                  FormatBytes(s.device.granularity), "\n");
  absl::StrAppend(&out, "Config:        ", DescribeSnapshotConfig(s.config), "\n\n");

  absl::StrAppend(&out, "Totals (from the segments)\n");
  absl::StrAppend(&out, "  reserved          ", FormatBytesExact(t.reserved_bytes), " in ", t.segments,
                  " segments\n");
  absl::StrAppend(&out, "  allocated         ", FormatBytesExact(t.allocated_bytes), " in ", t.allocations,
                  " blocks\n");
  if (!brief) {
    absl::StrAppend(&out, "  active            ", FormatBytesExact(t.active_bytes),
                    " (allocated + pending free)\n");
    absl::StrAppend(&out, "  requested         ", FormatBytesExact(t.requested_bytes), "\n");
  }
  absl::StrAppend(&out, "  free (cached)     ", FormatBytesExact(t.free_bytes), "\n");
  const std::uint64_t fragmentation = t.reserved_bytes - std::min(t.reserved_bytes, t.allocated_bytes);
  absl::StrAppend(&out, "  fragmentation     ", FormatBytesExact(fragmentation), " = reserved - allocated, ",
                  Percent(fragmentation, t.reserved_bytes), " of reserved\n");
  absl::StrAppend(&out, "  largest free      ", FormatBytesExact(t.largest_free_block), "\n\n");
  if (brief) {
    AppendTopAllocations(out, a, any_stack);
    absl::StrAppend(&out, "History:       ", s.history.size(), " events",
                    s.history_overflowed ? " (older events were dropped)" : "",
                    any_stack ? "" : "; no stacks recorded (history_stacks:True records them)", "\n");
    return out;
  }

  const DeviceStats& st = s.stats;
  absl::StrAppend(&out, "Statistics (recorded by the allocator; current / peak)\n");
  auto stat = [&](absl::string_view label, const StatArray& a2, bool bytes) {
    const Stat& x = a2.all();
    absl::StrAppend(&out, "  ", absl::StrFormat("%-17s ", label),
                    bytes ? FormatBytesExact(static_cast<std::uint64_t>(std::max<std::int64_t>(x.current, 0)))
                          : absl::StrCat(x.current),
                    " / ",
                    bytes ? FormatBytesExact(static_cast<std::uint64_t>(std::max<std::int64_t>(x.peak, 0)))
                          : absl::StrCat(x.peak),
                    "\n");
  };
  stat("reserved_bytes", st.reserved_bytes, true);
  stat("allocated_bytes", st.allocated_bytes, true);
  stat("active_bytes", st.active_bytes, true);
  stat("requested_bytes", st.requested_bytes, true);
  stat("allocation", st.allocation, false);
  stat("segment (regular)", st.segment, false);  // device allocations; expandable segments map instead
  absl::StrAppend(&out, "  num_ooms ", st.num_ooms, ", num_alloc_retries ", st.num_alloc_retries,
                  ", num_device_alloc ", st.num_device_alloc, ", num_device_free ", st.num_device_free, "\n");
  const absl::Status consistent = CheckStatsConsistency(s);
  absl::StrAppend(&out, "  consistency       ",
                  consistent.ok() ? "statistics match the segments" : consistent.message(), "\n\n");

  absl::StrAppend(&out, "Pools\n",
                  absl::StrFormat("  %-10s %9s %8s %22s %22s %22s %22s\n", "pool", "use_count", "segments",
                                  "reserved", "allocated", "free", "peak reserved"));
  for (const auto& [id, g] : a.pools) {
    const PoolSnapshot* p = nullptr;
    for (const PoolSnapshot& q : s.pools) {
      if (q.id == id) p = &q;
    }
    absl::StrAppend(
        &out,
        absl::StrFormat("  %-10s %9s %8d %22s %22s %22s %22s\n",
                        id == 0 ? std::string("default") : absl::StrCat(id),
                        p == nullptr ? std::string("-") : absl::StrCat(p->use_count), g.segments,
                        FormatBytesExact(g.reserved), FormatBytesExact(g.allocated), FormatBytesExact(g.free),
                        p == nullptr ? std::string("-") : FormatBytesExact(p->peak_reserved_bytes)));
  }
  absl::StrAppend(&out, "\nStreams\n",
                  absl::StrFormat("  %-18s %8s %8s %22s %22s %22s\n", "stream", "segments", "blocks",
                                  "reserved", "allocated", "pending free"));
  for (const auto& [id, g] : a.streams) {
    absl::StrAppend(&out, absl::StrFormat("  %-18s %8d %8d %22s %22s %22s\n", HexAddress(id), g.segments,
                                          g.blocks, FormatBytesExact(g.reserved),
                                          FormatBytesExact(g.allocated), FormatBytesExact(g.pending)));
  }
  absl::StrAppend(&out, "\n");
  AppendTopAllocations(out, a, any_stack);
  absl::StrAppend(&out, "\nTop call sites by allocated bytes\n");
  if (!any_stack) absl::StrAppend(&out, "  none: no stacks recorded (history_stacks:True records them)\n");
  for (std::size_t i = 0; any_stack && i < a.top_sites.size(); ++i) {
    const Site& site = a.top_sites[i];
    absl::StrAppend(&out, absl::StrFormat("  %2d. %12s in %d blocks  %s\n", i + 1, FormatBytes(site.bytes),
                                          site.blocks, site.site));
  }
  absl::StrAppend(&out, "\nHistory:       ", s.history.size(), " events (max_entries ", s.history_max_entries,
                  s.history_overflowed ? ", overflowed: older events were dropped" : "", ")\n");
  for (int i = 0; i < kNumHistoryActions; ++i) {
    if (a.history_counts[i] == 0) continue;
    absl::StrAppend(
        &out, "  ",
        absl::StrFormat("%-15s %d", HistoryActionName(static_cast<HistoryAction>(i)), a.history_counts[i]),
        "\n");
  }
  if (!s.history.empty()) {
    const Timeline timeline = ComputeTimeline(s, 2);
    absl::StrAppend(
        &out, "  peak allocated  ",
        FormatBytesExact(static_cast<std::uint64_t>(std::max<std::int64_t>(timeline.peak.allocated, 0))),
        " at event ", timeline.peak.event, "\n");
  }
  return out;
}

std::string RenderSummaryJson(const MemorySnapshot& s, int top) {
  const Analysis a = Analyze(s, top);
  const SnapshotTotals& t = a.totals;
  nlohmann::json out = {
      {"label", s.label},
      {"segments", t.segments},
      {"reserved_bytes", t.reserved_bytes},
      {"allocated_bytes", t.allocated_bytes},
      {"active_bytes", t.active_bytes},
      {"requested_bytes", t.requested_bytes},
      {"free_bytes", t.free_bytes},
      {"fragmentation_bytes", t.reserved_bytes - std::min(t.reserved_bytes, t.allocated_bytes)},
      {"largest_free_block", t.largest_free_block},
      {"allocations", t.allocations},
      {"active_blocks", t.active_blocks},
      {"stats_consistent", CheckStatsConsistency(s).ok()},
      {"history_events", s.history.size()},
      {"history_overflowed", s.history_overflowed},
  };
  const DeviceStats& st = s.stats;
  out["stats"] = {
      {"reserved_bytes",
       {{"current", st.reserved_bytes.all().current}, {"peak", st.reserved_bytes.all().peak}}},
      {"allocated_bytes",
       {{"current", st.allocated_bytes.all().current}, {"peak", st.allocated_bytes.all().peak}}},
      {"active_bytes", {{"current", st.active_bytes.all().current}, {"peak", st.active_bytes.all().peak}}},
      {"requested_bytes",
       {{"current", st.requested_bytes.all().current}, {"peak", st.requested_bytes.all().peak}}},
      {"allocation", {{"current", st.allocation.all().current}, {"peak", st.allocation.all().peak}}},
      {"segment", {{"current", st.segment.all().current}, {"peak", st.segment.all().peak}}},
      {"num_ooms", st.num_ooms},
      {"num_alloc_retries", st.num_alloc_retries},
  };
  out["pools"] = nlohmann::json::array();
  for (const auto& [id, g] : a.pools) {
    out["pools"].push_back({{"id", id},
                            {"segments", g.segments},
                            {"reserved_bytes", g.reserved},
                            {"allocated_bytes", g.allocated},
                            {"pending_free_bytes", g.pending},
                            {"free_bytes", g.free}});
  }
  out["streams"] = nlohmann::json::array();
  for (const auto& [id, g] : a.streams) {
    out["streams"].push_back({{"stream", id},
                              {"segments", g.segments},
                              {"blocks", g.blocks},
                              {"reserved_bytes", g.reserved},
                              {"allocated_bytes", g.allocated},
                              {"pending_free_bytes", g.pending}});
  }
  out["top_allocations"] = nlohmann::json::array();
  for (const BlockSnapshot* b : a.top_blocks) {
    out["top_allocations"].push_back({{"address", b->address},
                                      {"size", b->size},
                                      {"requested_size", b->requested_size},
                                      {"stream", b->stream},
                                      {"call_site", CallSite(b->frames)},
                                      {"annotation", b->annotation}});
  }
  out["top_call_sites"] = nlohmann::json::array();
  for (const Site& site : a.top_sites) {
    out["top_call_sites"].push_back(
        {{"call_site", site.site}, {"bytes", site.bytes}, {"blocks", site.blocks}});
  }
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string RenderSegmentsText(const MemorySnapshot& s) {
  std::string out;
  constexpr int kMapWidth = 64;
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const SegmentSnapshot& seg = s.segments[i];
    absl::StrAppend(&out, "segment ", i, ": [", HexAddress(seg.address), ", ",
                    HexAddress(seg.address + seg.total_size), ") ", FormatBytes(seg.total_size), ", ",
                    SegmentKindName(seg.kind), ", stream ", HexAddress(seg.stream), ", pool ",
                    seg.pool_id == 0 ? std::string("default") : absl::StrCat(seg.pool_id));
    if (seg.expandable) {
      absl::StrAppend(&out, ", expandable: ", FormatBytes(seg.ReservedBytes()), " mapped in ",
                      seg.mapped.size(), " ranges");
    }
    absl::StrAppend(&out, ", ", seg.blocks.size(), " blocks\n");
    // The character map: each cell shows the state covering most of its bytes.
    std::string map(kMapWidth, '.');
    for (int c = 0; c < kMapWidth; ++c) {
      const std::uint64_t lo = seg.total_size * static_cast<std::uint64_t>(c) / kMapWidth;
      const std::uint64_t hi =
          std::max(lo + 1, seg.total_size * static_cast<std::uint64_t>(c + 1) / kMapWidth);
      std::uint64_t by_state[3] = {};
      for (const BlockSnapshot& b : seg.blocks) {
        const std::uint64_t blo = std::max(lo, b.address - seg.address);
        const std::uint64_t bhi = std::min(hi, b.address - seg.address + b.size);
        if (blo < bhi) by_state[static_cast<int>(b.state)] += bhi - blo;
      }
      std::uint64_t mapped = hi - lo;
      if (seg.expandable) {
        mapped = 0;
        for (const MappedRange& r : seg.mapped) {
          const std::uint64_t mlo = std::max(lo, r.offset), mhi = std::min(hi, r.offset + r.size);
          if (mlo < mhi) mapped += mhi - mlo;
        }
      }
      // A cell mostly unmapped is blank; otherwise the state covering most of it.
      static constexpr char kGlyph[] = {'A', 'P', '.'};
      map[static_cast<std::size_t>(c)] =
          2 * mapped < hi - lo ? ' ' : kGlyph[std::max_element(by_state, by_state + 3) - by_state];
    }
    absl::StrAppend(&out, "  |", map, "|  A allocated, P pending free, . free, blank unmapped\n");
    for (const BlockSnapshot& b : seg.blocks) {
      absl::StrAppend(
          &out,
          absl::StrFormat(
              "  %s +%-12s %-12s %-12s", HexAddress(b.address), FormatBytes(b.size), BlockStateName(b.state),
              b.state == BlockState::kFree ? std::string("") : absl::StrCat("req ", b.requested_size)));
      if (b.stream != seg.stream) absl::StrAppend(&out, " stream ", HexAddress(b.stream));
      if (!b.annotation.empty()) absl::StrAppend(&out, " [", b.annotation, "]");
      if (!b.frames.empty()) absl::StrAppend(&out, " ", CallSite(b.frames));
      absl::StrAppend(&out, "\n");
    }
  }
  if (s.segments.empty()) out = "no segments\n";
  return out;
}

std::string RenderSegmentsJson(const MemorySnapshot& s) {
  nlohmann::json segments = nlohmann::json::array();
  for (const SegmentSnapshot& seg : s.segments) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const BlockSnapshot& b : seg.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.requested_size},
                        {"state", std::string(BlockStateName(b.state))},
                        {"call_site", CallSite(b.frames)}});
    }
    segments.push_back({{"address", seg.address},
                        {"total_size", seg.total_size},
                        {"mapped_bytes", seg.ReservedBytes()},
                        {"kind", std::string(SegmentKindName(seg.kind))},
                        {"stream", seg.stream},
                        {"pool_id", seg.pool_id},
                        {"expandable", seg.expandable},
                        {"blocks", std::move(blocks)}});
  }
  const nlohmann::json out = {{"segments", std::move(segments)}};
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace graphalloc::tools
