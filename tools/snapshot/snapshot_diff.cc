// RenderDiffText of snapshot_views.h.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

std::string Signed(std::int64_t delta) {
  const std::string magnitude = FormatBytes(static_cast<std::uint64_t>(delta < 0 ? -delta : delta));
  return absl::StrCat(delta < 0 ? "-" : "+", magnitude);
}

struct PoolBytes {
  std::int64_t reserved = 0;
  std::int64_t allocated = 0;
};

std::map<std::uint64_t, PoolBytes> BytesPerPool(const MemorySnapshot& s) {
  std::map<std::uint64_t, PoolBytes> pools;
  for (const SegmentSnapshot& seg : s.segments) {
    PoolBytes& p = pools[seg.pool_id];
    p.reserved += static_cast<std::int64_t>(seg.ReservedBytes());
    for (const BlockSnapshot& b : seg.blocks) {
      if (b.state == BlockState::kAllocated) p.allocated += static_cast<std::int64_t>(b.size);
    }
  }
  return pools;
}

std::map<std::string, std::int64_t> BytesPerSite(const MemorySnapshot& s) {
  std::map<std::string, std::int64_t> sites;
  for (const SegmentSnapshot& seg : s.segments) {
    for (const BlockSnapshot& b : seg.blocks) {
      if (b.state == BlockState::kAllocated) sites[CallSite(b.frames)] += static_cast<std::int64_t>(b.size);
    }
  }
  return sites;
}

// Calls f(pool id, bytes before, bytes after) for each pool in either snapshot, by id.
template <typename F>
void ForEachPool(const MemorySnapshot& before, const MemorySnapshot& after, F f) {
  const auto pools_a = BytesPerPool(before), pools_b = BytesPerPool(after);
  std::set<std::uint64_t> pool_ids;
  for (const auto& [id, p] : pools_a) pool_ids.insert(id);
  for (const auto& [id, p] : pools_b) pool_ids.insert(id);
  for (std::uint64_t id : pool_ids) {
    f(id, pools_a.contains(id) ? pools_a.at(id) : PoolBytes{},
      pools_b.contains(id) ? pools_b.at(id) : PoolBytes{});
  }
}

using SegmentKey = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  // address, size, pool
using BlockKey = std::tuple<std::uint64_t, std::uint64_t>;                   // address, size

std::map<SegmentKey, const SegmentSnapshot*> Segments(const MemorySnapshot& s) {
  std::map<SegmentKey, const SegmentSnapshot*> out;
  for (const SegmentSnapshot& seg : s.segments) out[{seg.address, seg.total_size, seg.pool_id}] = &seg;
  return out;
}

std::map<BlockKey, const BlockSnapshot*> AllocatedBlocks(const MemorySnapshot& s) {
  std::map<BlockKey, const BlockSnapshot*> out;
  for (const SegmentSnapshot& seg : s.segments) {
    for (const BlockSnapshot& b : seg.blocks) {
      if (b.state == BlockState::kAllocated) out[{b.address, b.size}] = &b;
    }
  }
  return out;
}

// Elements of `a` whose key `b` lacks.
template <typename Map>
std::vector<typename Map::mapped_type> Missing(const Map& a, const Map& b) {
  std::vector<typename Map::mapped_type> out;
  for (const auto& [key, value] : a) {
    if (!b.contains(key)) out.push_back(value);
  }
  return out;
}

}  // namespace

std::string RenderDiffText(const MemorySnapshot& before, const MemorySnapshot& after,
                           absl::string_view before_name, absl::string_view after_name, int top) {
  std::string out;
  const SnapshotTotals a = ComputeTotals(before), b = ComputeTotals(after);
  absl::StrAppend(&out, "Before: ", before_name,
                  before.label.empty() ? "" : absl::StrCat(" (", before.label, ")"), "\nAfter:  ", after_name,
                  after.label.empty() ? "" : absl::StrCat(" (", after.label, ")"), "\n\n");
  absl::StrAppend(&out, absl::StrFormat("%-16s %22s %22s %14s\n", "", "before", "after", "change"));
  auto row = [&](absl::string_view name, std::uint64_t x, std::uint64_t y) {
    absl::StrAppend(&out,
                    absl::StrFormat("%-16s %22s %22s %14s\n", name, FormatBytes(x), FormatBytes(y),
                                    Signed(static_cast<std::int64_t>(y) - static_cast<std::int64_t>(x))));
  };
  row("reserved", a.reserved_bytes, b.reserved_bytes);
  row("allocated", a.allocated_bytes, b.allocated_bytes);
  row("active", a.active_bytes, b.active_bytes);
  row("free (cached)", a.free_bytes, b.free_bytes);
  row("fragmentation", a.reserved_bytes - std::min(a.reserved_bytes, a.allocated_bytes),
      b.reserved_bytes - std::min(b.reserved_bytes, b.allocated_bytes));
  absl::StrAppend(&out, absl::StrFormat("%-16s %22d %22d %+14d\n", "segments", a.segments, b.segments,
                                        b.segments - a.segments));
  absl::StrAppend(&out, absl::StrFormat("%-16s %22d %22d %+14d\n", "allocations", a.allocations,
                                        b.allocations, b.allocations - a.allocations));

  const auto segs_a = Segments(before), segs_b = Segments(after);
  const auto removed_segs = Missing(segs_a, segs_b), added_segs = Missing(segs_b, segs_a);
  absl::StrAppend(&out, "\nSegments added: ", added_segs.size(), ", removed: ", removed_segs.size(), "\n");
  auto list_segments = [&](const std::vector<const SegmentSnapshot*>& list, char sign) {
    for (std::size_t i = 0; i < list.size() && i < static_cast<std::size_t>(top); ++i) {
      const SegmentSnapshot& seg = *list[i];
      absl::StrAppend(&out, "  ", std::string(1, sign), " ", HexAddress(seg.address), " ",
                      FormatBytes(seg.total_size), " pool ", seg.pool_id, seg.expandable ? " expandable" : "",
                      "\n");
    }
    if (list.size() > static_cast<std::size_t>(top))
      absl::StrAppend(&out, "  ... ", list.size() - top, " more\n");
  };
  list_segments(added_segs, '+');
  list_segments(removed_segs, '-');

  const auto blocks_a = AllocatedBlocks(before), blocks_b = AllocatedBlocks(after);
  auto removed_blocks = Missing(blocks_a, blocks_b), added_blocks = Missing(blocks_b, blocks_a);
  auto by_size = [](const BlockSnapshot* x, const BlockSnapshot* y) { return x->size > y->size; };
  std::stable_sort(added_blocks.begin(), added_blocks.end(), by_size);
  std::stable_sort(removed_blocks.begin(), removed_blocks.end(), by_size);
  std::uint64_t added_bytes = 0, removed_bytes = 0;
  for (const BlockSnapshot* x : added_blocks) added_bytes += x->size;
  for (const BlockSnapshot* x : removed_blocks) removed_bytes += x->size;
  absl::StrAppend(&out, "\nAllocated blocks added: ", added_blocks.size(), " (", FormatBytes(added_bytes),
                  "), removed: ", removed_blocks.size(), " (", FormatBytes(removed_bytes), ")\n");
  auto list_blocks = [&](const std::vector<const BlockSnapshot*>& list, char sign) {
    for (std::size_t i = 0; i < list.size() && i < static_cast<std::size_t>(top); ++i) {
      const BlockSnapshot& blk = *list[i];
      absl::StrAppend(&out, "  ", std::string(1, sign), " ", HexAddress(blk.address), " ",
                      FormatBytes(blk.size), "  ", CallSite(blk.frames),
                      blk.annotation.empty() ? "" : absl::StrCat(" [", blk.annotation, "]"), "\n");
    }
    if (list.size() > static_cast<std::size_t>(top))
      absl::StrAppend(&out, "  ... ", list.size() - top, " more\n");
  };
  list_blocks(added_blocks, '+');
  list_blocks(removed_blocks, '-');

  absl::StrAppend(
      &out, "\nBytes per pool\n",
      absl::StrFormat("  %-10s %14s %14s %14s %14s\n", "pool", "reserved", "change", "allocated", "change"));
  ForEachPool(before, after, [&](std::uint64_t id, const PoolBytes& pa, const PoolBytes& pb) {
    absl::StrAppend(&out, absl::StrFormat("  %-10s %14s %14s %14s %14s\n",
                                          id == 0 ? std::string("default") : absl::StrCat(id),
                                          FormatBytes(static_cast<std::uint64_t>(pb.reserved)),
                                          Signed(pb.reserved - pa.reserved),
                                          FormatBytes(static_cast<std::uint64_t>(pb.allocated)),
                                          Signed(pb.allocated - pa.allocated)));
  });

  const auto sites_a = BytesPerSite(before), sites_b = BytesPerSite(after);
  std::map<std::string, std::int64_t> change;
  for (const auto& [site, bytes] : sites_a) change[site] -= bytes;
  for (const auto& [site, bytes] : sites_b) change[site] += bytes;
  std::vector<std::pair<std::string, std::int64_t>> sorted(change.begin(), change.end());
  std::erase_if(sorted, [](const auto& p) { return p.second == 0; });
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& x, const auto& y) { return std::llabs(x.second) > std::llabs(y.second); });
  absl::StrAppend(&out, "\nAllocated bytes per call site (changed only)\n");
  if (sorted.empty()) absl::StrAppend(&out, "  (no change)\n");
  for (std::size_t i = 0; i < sorted.size() && i < static_cast<std::size_t>(top); ++i) {
    absl::StrAppend(&out, absl::StrFormat("  %14s  %s\n", Signed(sorted[i].second), sorted[i].first));
  }
  return out;
}

std::string RenderDiffJson(const MemorySnapshot& before, const MemorySnapshot& after) {
  auto totals = [](const SnapshotTotals& t) {
    return nlohmann::json{{"reserved_bytes", t.reserved_bytes},
                          {"allocated_bytes", t.allocated_bytes},
                          {"active_bytes", t.active_bytes},
                          {"free_bytes", t.free_bytes},
                          {"segments", t.segments},
                          {"allocations", t.allocations}};
  };
  auto bytes = [](const std::vector<const BlockSnapshot*>& blocks) {
    std::uint64_t sum = 0;
    for (const BlockSnapshot* b : blocks) sum += b->size;
    return sum;
  };
  const auto segs_a = Segments(before), segs_b = Segments(after);
  const auto blocks_a = AllocatedBlocks(before), blocks_b = AllocatedBlocks(after);
  const auto added_blocks = Missing(blocks_b, blocks_a), removed_blocks = Missing(blocks_a, blocks_b);
  nlohmann::json pools = nlohmann::json::array();
  ForEachPool(before, after, [&](std::uint64_t id, const PoolBytes& pa, const PoolBytes& pb) {
    pools.push_back({{"pool_id", id},
                     {"reserved_bytes_before", pa.reserved},
                     {"reserved_bytes_after", pb.reserved},
                     {"allocated_bytes_before", pa.allocated},
                     {"allocated_bytes_after", pb.allocated}});
  });
  const nlohmann::json out = {
      {"before", totals(ComputeTotals(before))},
      {"after", totals(ComputeTotals(after))},
      {"segments_added", Missing(segs_b, segs_a).size()},
      {"segments_removed", Missing(segs_a, segs_b).size()},
      {"blocks_added", added_blocks.size()},
      {"blocks_added_bytes", bytes(added_blocks)},
      {"blocks_removed", removed_blocks.size()},
      {"blocks_removed_bytes", bytes(removed_blocks)},
      {"pools", std::move(pools)},
  };
  return out.dump(2) + "\n";
}

}  // namespace graphalloc::tools
