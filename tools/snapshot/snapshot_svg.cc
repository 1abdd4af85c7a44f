// RenderSvg and ComputeTimeline of snapshot_views.h.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

constexpr double kWidth = 1200;
constexpr double kLabelWidth = 190;
constexpr double kBarWidth = kWidth - kLabelWidth - 20;
constexpr double kRowHeight = 18;
constexpr double kRowGap = 8;
constexpr double kTimelineHeight = 220;

std::string Escape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

const char* PoolColor(std::uint64_t pool) {
  static constexpr const char* kPalette[] = {"#4e79a7", "#59a14f", "#b07aa1", "#edc948",
                                             "#76b7b2", "#e15759", "#9c755f", "#ff9da7"};
  return kPalette[pool % 8];
}

const char* BlockColor(const BlockSnapshot& b, std::uint64_t pool) {
  switch (b.state) {
    case BlockState::kAllocated:
      return PoolColor(pool);
    case BlockState::kPendingFree:
      return "#f28e2b";
    case BlockState::kFree:
      return "#e4e4e4";
  }
  return "#e4e4e4";
}

void AppendTimeline(std::string& out, const MemorySnapshot& s, double top) {
  const Timeline t = ComputeTimeline(s);
  if (t.points.empty()) return;
  const double left = kLabelWidth, width = kBarWidth, height = kTimelineHeight - 50;
  const bool by_time = t.points.back().time_us > t.points.front().time_us;
  auto x_of = [&](const TimelinePoint& p) {
    const double lo = by_time ? static_cast<double>(t.points.front().time_us) : 0.0;
    const double hi = by_time ? static_cast<double>(t.points.back().time_us)
                              : static_cast<double>(std::max<std::uint64_t>(1, t.points.back().event));
    const double v = by_time ? static_cast<double>(p.time_us) : static_cast<double>(p.event);
    return left + (hi > lo ? (v - lo) / (hi - lo) : 0.0) * width;
  };
  std::int64_t max_bytes = 1;
  for (const TimelinePoint& p : t.points) max_bytes = std::max({max_bytes, p.allocated, p.reserved});
  auto y_of = [&](std::int64_t bytes) {
    return top + 20 + height - static_cast<double>(bytes) / static_cast<double>(max_bytes) * height;
  };
  absl::StrAppend(&out, "<g id=\"timeline\">\n<text x=\"10\" y=\"", top + 14,
                  "\" class=\"heading\">Memory over the history (", s.history.size(), " events, by ",
                  by_time ? "time" : "event", ")</text>\n");
  absl::StrAppend(
      &out, absl::StrFormat("<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                            "fill=\"none\" stroke=\"#999\"/>\n",
                            left, top + 20, width, height));
  for (int tick = 0; tick <= 4; ++tick) {
    const std::int64_t bytes = max_bytes * tick / 4;
    absl::StrAppend(
        &out,
        absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" class=\"axis\" text-anchor=\"end\">%s</text>\n",
                        left - 6, y_of(bytes) + 4, Escape(FormatBytes(static_cast<std::uint64_t>(bytes)))));
  }
  std::string reserved, allocated;
  for (const TimelinePoint& p : t.points) {
    absl::StrAppend(&reserved, absl::StrFormat("%.1f,%.1f ", x_of(p), y_of(p.reserved)));
    absl::StrAppend(&allocated, absl::StrFormat("%.1f,%.1f ", x_of(p), y_of(p.allocated)));
  }
  absl::StrAppend(&out,
                  "<polyline class=\"reserved\" fill=\"none\" stroke=\"#555\" stroke-width=\"1.5\" points=\"",
                  reserved, "\"/>\n");
  absl::StrAppend(
      &out, "<polyline class=\"allocated\" fill=\"none\" stroke=\"#4e79a7\" stroke-width=\"1.5\" points=\"",
      allocated, "\"/>\n");
  const double px = x_of(t.peak), py = y_of(t.peak.allocated);
  absl::StrAppend(&out,
                  absl::StrFormat("<circle class=\"peak\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#e15759\">"
                                  "<title>peak allocated %s at event %d</title></circle>\n",
                                  px, py, Escape(FormatBytes(static_cast<std::uint64_t>(t.peak.allocated))),
                                  t.peak.event));
  absl::StrAppend(&out, absl::StrFormat("<text class=\"peak-label\" x=\"%.1f\" y=\"%.1f\">peak %s</text>\n",
                                        std::min(px + 6, kWidth - 120), std::max(py - 6, top + 30),
                                        Escape(FormatBytes(static_cast<std::uint64_t>(t.peak.allocated)))));
  absl::StrAppend(
      &out, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" class=\"axis\">", left, top + 20 + height + 16),
      "<tspan fill=\"#555\">&#9644; reserved</tspan>  <tspan fill=\"#4e79a7\">&#9644; allocated</tspan>"
      "</text>\n</g>\n");
}

}  // namespace

Timeline ComputeTimeline(const MemorySnapshot& s, std::size_t max_points) {
  Timeline t;
  if (s.history.empty()) return t;
  bool has_free_requested = false;
  for (const HistoryEvent& e : s.history) has_free_requested |= e.action == HistoryAction::kFreeRequested;
  const HistoryAction free_action =
      has_free_requested ? HistoryAction::kFreeRequested : HistoryAction::kFreeCompleted;
  auto deltas = [&](const HistoryEvent& e, std::int64_t* allocated, std::int64_t* reserved) {
    const auto size = static_cast<std::int64_t>(e.size);
    if (e.action == HistoryAction::kAlloc) *allocated += size;
    if (e.action == free_action) *allocated -= size;
    // A sleeping chunk holds no device memory (its blocks stay allocated): reserved, not allocated, moves.
    if (e.action == HistoryAction::kSegmentAlloc || e.action == HistoryAction::kSegmentMap ||
        e.action == HistoryAction::kWake)
      *reserved += size;
    if (e.action == HistoryAction::kSegmentFree || e.action == HistoryAction::kSegmentUnmap ||
        e.action == HistoryAction::kSleep)
      *reserved -= size;
  };
  // Anchor the end of the history at the snapshot's own totals; shift up if that leaves a negative value
  // (the snapshot was taken before the history ended, or the history is all there is).
  std::int64_t net_allocated = 0, net_reserved = 0, min_allocated = 0, min_reserved = 0;
  for (const HistoryEvent& e : s.history) {
    deltas(e, &net_allocated, &net_reserved);
    min_allocated = std::min(min_allocated, net_allocated);
    min_reserved = std::min(min_reserved, net_reserved);
  }
  const SnapshotTotals totals = ComputeTotals(s);
  std::int64_t allocated = static_cast<std::int64_t>(totals.allocated_bytes) - net_allocated;
  std::int64_t reserved = static_cast<std::int64_t>(totals.reserved_bytes) - net_reserved;
  allocated = std::max(allocated, -min_allocated);
  reserved = std::max(reserved, -min_reserved);

  const std::size_t n = s.history.size();
  const std::size_t buckets = std::max<std::size_t>(1, std::min(n, max_points));
  TimelinePoint bucket;
  std::size_t bucket_index = 0;
  bool bucket_open = false;
  t.peak = {s.history.front().time_us, 0, allocated, reserved};
  for (std::size_t i = 0; i < n; ++i) {
    const HistoryEvent& e = s.history[i];
    deltas(e, &allocated, &reserved);
    if (allocated > t.peak.allocated) t.peak = {e.time_us, i, allocated, reserved};
    const std::size_t b = i * buckets / n;
    if (bucket_open && b != bucket_index) {
      t.points.push_back(bucket);
      bucket_open = false;
    }
    if (!bucket_open) {
      bucket = {e.time_us, i, allocated, reserved};
      bucket_index = b;
      bucket_open = true;
    } else {
      bucket.allocated = std::max(bucket.allocated, allocated);
      bucket.reserved = std::max(bucket.reserved, reserved);
      bucket.time_us = e.time_us;
      bucket.event = i;
    }
  }
  if (bucket_open) t.points.push_back(bucket);
  return t;
}

std::string RenderSvg(const MemorySnapshot& s, absl::string_view title) {
  std::uint64_t largest = 1;
  for (const SegmentSnapshot& seg : s.segments) largest = std::max(largest, seg.total_size);
  const double scale = kBarWidth / static_cast<double>(largest);
  const double timeline = s.history.empty() ? 0 : kTimelineHeight;
  const double map_top = 60 + timeline;
  const double height = map_top + 40 + static_cast<double>(s.segments.size()) * (kRowHeight + kRowGap) + 20;
  const SnapshotTotals totals = ComputeTotals(s);

  std::string out;
  out.reserve(4096 + s.segments.size() * 400);
  absl::StrAppend(&out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
                  absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                                  "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
                                  kWidth, height, kWidth, height));
  absl::StrAppend(&out,
                  "<style>.heading{font-size:13px;font-weight:bold}.axis{fill:#444}"
                  ".block{stroke:#fff;stroke-width:0.5}.block:hover{stroke:#000;stroke-width:1.5}"
                  ".unmapped{fill:none;stroke:#bbb;stroke-dasharray:3,2}</style>\n");
  absl::StrAppend(&out, "<text x=\"10\" y=\"20\" class=\"heading\">", Escape(title), "</text>\n");
  absl::StrAppend(&out, "<text x=\"10\" y=\"38\">",
                  Escape(absl::StrCat("reserved ", FormatBytes(totals.reserved_bytes), ", allocated ",
                                      FormatBytes(totals.allocated_bytes), ", fragmentation ",
                                      FormatBytes(totals.reserved_bytes -
                                                  std::min(totals.reserved_bytes, totals.allocated_bytes)),
                                      ", largest free block ", FormatBytes(totals.largest_free_block), "; ",
                                      s.segments.size(), " segments")),
                  "</text>\n");
  if (!s.history.empty()) AppendTimeline(out, s, 50);

  // Legend.
  absl::StrAppend(
      &out, "<g id=\"legend\">\n<text x=\"10\" y=\"", map_top + 14,
      "\" class=\"heading\">Segments (bar length to scale; blocks coloured by state and pool)</text>\n");
  struct Entry {
    const char* color;
    std::string label;
  };
  std::vector<Entry> legend = {{"#f28e2b", "pending free"}, {"#e4e4e4", "free"}};
  std::vector<std::uint64_t> pools;
  for (const SegmentSnapshot& seg : s.segments) {
    if (std::find(pools.begin(), pools.end(), seg.pool_id) == pools.end()) pools.push_back(seg.pool_id);
  }
  std::sort(pools.begin(), pools.end());
  for (std::uint64_t p : pools) {
    legend.insert(legend.end() - 2, {PoolColor(p), p == 0 ? std::string("allocated (default pool)")
                                                          : absl::StrCat("allocated (pool ", p, ")")});
  }
  double lx = kLabelWidth;
  for (const Entry& e : legend) {
    absl::StrAppend(&out,
                    absl::StrFormat("<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" "
                                    "fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                                    lx, map_top + 22, e.color, lx + 14, map_top + 31, Escape(e.label)));
    lx += 24 + 6.5 * static_cast<double>(e.label.size());
  }
  absl::StrAppend(&out, "</g>\n<g id=\"segments\">\n");

  double y = map_top + 44;
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const SegmentSnapshot& seg = s.segments[i];
    absl::StrAppend(&out, absl::StrFormat("<g class=\"segment\" data-index=\"%d\" data-address=\"%s\">", i,
                                          HexAddress(seg.address)));
    absl::StrAppend(
        &out, absl::StrFormat("<text x=\"10\" y=\"%.1f\">%s %s%s</text>\n", y + 13, HexAddress(seg.address),
                              Escape(FormatBytes(seg.total_size)), seg.expandable ? " (exp)" : ""));
    if (seg.expandable) {
      absl::StrAppend(
          &out, absl::StrFormat("<rect class=\"unmapped\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                                "height=\"%.1f\"/>\n",
                                kLabelWidth, y, static_cast<double>(seg.total_size) * scale, kRowHeight));
    }
    for (const BlockSnapshot& b : seg.blocks) {
      const double x = kLabelWidth + static_cast<double>(b.address - seg.address) * scale;
      const double w = std::max(0.3, static_cast<double>(b.size) * scale);
      std::string tip =
          absl::StrCat(BlockStateName(b.state), " ", FormatBytes(b.size), " at ", HexAddress(b.address));
      if (b.state != BlockState::kFree) absl::StrAppend(&tip, ", requested ", b.requested_size);
      absl::StrAppend(&tip, ", stream ", HexAddress(b.stream), ", pool ", seg.pool_id);
      if (!b.annotation.empty()) absl::StrAppend(&tip, ", [", b.annotation, "]");
      if (!b.frames.empty()) absl::StrAppend(&tip, "\n", CallSite(b.frames));
      absl::StrAppend(
          &out, absl::StrFormat("<rect class=\"block\" data-state=\"%s\" data-pool=\"%d\" "
                                "data-address=\"%s\" data-size=\"%d\" x=\"%.2f\" y=\"%.1f\" "
                                "width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>%s</title></rect>\n",
                                BlockStateName(b.state), seg.pool_id, HexAddress(b.address), b.size, x, y, w,
                                kRowHeight, BlockColor(b, seg.pool_id), Escape(tip)));
    }
    absl::StrAppend(&out, "</g>\n");
    y += kRowHeight + kRowGap;
  }
  absl::StrAppend(&out, "</g>\n</svg>\n");
  return out;
}

}  // namespace graphalloc::tools
