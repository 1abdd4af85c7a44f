#include "graphalloc/allocator/snapshot/memory_snapshot.h"

#include <algorithm>
#include <array>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/snapshot/snapshot_internal.h"

namespace graphalloc {
namespace {

constexpr std::array<absl::string_view, 3> kBlockStateNames = {"allocated", "pending_free", "free"};
constexpr std::array<absl::string_view, 2> kSegmentKindNames = {"small", "large"};
constexpr std::array<absl::string_view, kNumHistoryActions> kActionNames = {
    "alloc",        "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map",    "segment_unmap",  "oom",
    "snapshot",     "sleep",          "wake",
};
// An action added without its name would be named "" (the array's default) and never parse.
static_assert(!kActionNames.back().empty(), "every HistoryAction needs a name in kActionNames");

template <typename Enum, std::size_t N>
std::optional<Enum> ParseName(const std::array<absl::string_view, N>& names, absl::string_view name) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

// Bytes of [begin, end) (segment-relative) inside accessible mapped ranges.
std::uint64_t MappedOverlap(const std::vector<MappedRange>& mapped, std::uint64_t begin, std::uint64_t end) {
  std::uint64_t bytes = 0;
  for (const MappedRange& r : mapped) {
    if (!r.accessible) continue;
    const std::uint64_t lo = std::max(begin, r.offset);
    const std::uint64_t hi = std::min(end, r.offset + r.size);
    if (lo < hi) bytes += hi - lo;
  }
  return bytes;
}

// Bytes of [begin, end) (segment-relative) inside `ranges`, accessible or not.
std::uint64_t Overlap(const std::vector<MappedRange>& ranges, std::uint64_t begin, std::uint64_t end) {
  std::uint64_t bytes = 0;
  for (const MappedRange& r : ranges) {
    const std::uint64_t lo = std::max(begin, r.offset);
    const std::uint64_t hi = std::min(end, r.offset + r.size);
    if (lo < hi) bytes += hi - lo;
  }
  return bytes;
}

}  // namespace

absl::string_view BlockStateName(BlockState state) { return kBlockStateNames[static_cast<int>(state)]; }
absl::string_view SegmentKindName(SegmentKind kind) { return kSegmentKindNames[static_cast<int>(kind)]; }
absl::string_view HistoryActionName(HistoryAction action) { return kActionNames[static_cast<int>(action)]; }
std::optional<BlockState> ParseBlockState(absl::string_view name) {
  return ParseName<BlockState>(kBlockStateNames, name);
}
std::optional<SegmentKind> ParseSegmentKind(absl::string_view name) {
  return ParseName<SegmentKind>(kSegmentKindNames, name);
}
std::optional<HistoryAction> ParseHistoryAction(absl::string_view name) {
  return ParseName<HistoryAction>(kActionNames, name);
}

std::uint64_t SegmentSnapshot::ReservedBytes() const {
  if (!expandable) return total_size;
  std::uint64_t bytes = 0;
  for (const MappedRange& r : mapped) bytes += r.size;
  return bytes;
}

const HistoryEvent* LastAction(const MemorySnapshot& snapshot) {
  for (auto it = snapshot.history.rbegin(); it != snapshot.history.rend(); ++it) {
    if (it->action != HistoryAction::kSnapshot) return &*it;
  }
  return nullptr;
}

absl::Status ValidateSnapshot(const MemorySnapshot& snapshot) {
  auto error = [](const std::string& path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  for (std::size_t s = 0; s < snapshot.segments.size(); ++s) {
    const SegmentSnapshot& seg = snapshot.segments[s];
    const std::string path = absl::StrCat("segments[", s, "]");
    if (seg.total_size == 0) return error(path + ".total_size", "a segment cannot be empty");
    if (seg.address + seg.total_size < seg.address) {
      return error(path + ".total_size", "the segment wraps around the address space");
    }
    if (s > 0) {
      const SegmentSnapshot& prev = snapshot.segments[s - 1];
      if (seg.address < prev.address + prev.total_size) {
        return error(
            path + ".address",
            absl::StrCat("segment at ", HexAddress(seg.address), " is not after segments[", s - 1, "] [",
                         HexAddress(prev.address), ", ", HexAddress(prev.address + prev.total_size),
                         "): segments must be sorted by address and disjoint"));
      }
    }
    if (!seg.expandable && !seg.mapped.empty()) {
      return error(path + ".mapped", "only expandable segments have mapped ranges");
    }
    for (std::size_t m = 0; m < seg.mapped.size(); ++m) {
      const MappedRange& r = seg.mapped[m];
      const std::string mpath = absl::StrCat(path, ".mapped[", m, "]");
      if (r.size == 0) return error(mpath + ".size", "a mapped range cannot be empty");
      if (r.offset > seg.total_size || r.size > seg.total_size - r.offset) {
        return error(mpath, absl::StrCat("range [", r.offset, ", ", r.offset + r.size,
                                         ") is outside the segment's ", seg.total_size, " bytes"));
      }
      if (m > 0 && r.offset < seg.mapped[m - 1].offset + seg.mapped[m - 1].size) {
        return error(mpath + ".offset", "mapped ranges must be sorted and disjoint");
      }
    }
    if (!seg.expandable && !seg.asleep.empty()) {
      return error(path + ".asleep", "only expandable segments have sleeping ranges");
    }
    for (std::size_t m = 0; m < seg.asleep.size(); ++m) {
      const MappedRange& r = seg.asleep[m];
      const std::string mpath = absl::StrCat(path, ".asleep[", m, "]");
      if (r.size == 0) return error(mpath + ".size", "a sleeping range cannot be empty");
      if (r.offset > seg.total_size || r.size > seg.total_size - r.offset) {
        return error(mpath, absl::StrCat("range [", r.offset, ", ", r.offset + r.size,
                                         ") is outside the segment's ", seg.total_size, " bytes"));
      }
      if (m > 0 && r.offset < seg.asleep[m - 1].offset + seg.asleep[m - 1].size) {
        return error(mpath + ".offset", "sleeping ranges must be sorted and disjoint");
      }
      if (Overlap(seg.mapped, r.offset, r.offset + r.size) != 0) {
        return error(mpath, "a sleeping range cannot be mapped too");
      }
    }
    if (seg.blocks.empty()) return error(path + ".blocks", "a segment must have at least one block");
    std::uint64_t expected = seg.address;
    for (std::size_t b = 0; b < seg.blocks.size(); ++b) {
      const BlockSnapshot& block = seg.blocks[b];
      const std::string bpath = absl::StrCat(path, ".blocks[", b, "]");
      if (block.address != expected) {
        return error(bpath + ".address",
                     absl::StrCat("block at ", HexAddress(block.address), " where ", HexAddress(expected),
                                  " was expected: blocks must be contiguous from the segment's address"));
      }
      if (block.size == 0) return error(bpath + ".size", "a block cannot be empty");
      if (block.size > seg.address + seg.total_size - block.address) {
        return error(bpath + ".size",
                     absl::StrCat("block of ", block.size, " bytes at ", HexAddress(block.address),
                                  " runs past the segment's end ", HexAddress(seg.address + seg.total_size)));
      }
      if (block.requested_size > block.size) {
        return error(bpath + ".requested_size", absl::StrCat("requested ", block.requested_size,
                                                             " bytes, more than the block's ", block.size));
      }
      if (seg.expandable && block.state != BlockState::kFree) {
        const std::uint64_t offset = block.address - seg.address;
        // A sleeping pool's live blocks stay live where their memory sleeps.
        if (MappedOverlap(seg.mapped, offset, offset + block.size) +
                Overlap(seg.asleep, offset, offset + block.size) !=
            block.size) {
          return error(
              bpath,
              "an allocated or pending-free block of an expandable segment must be mapped with access "
              "(or asleep)");
        }
      }
      expected = block.address + block.size;
    }
    if (expected != seg.address + seg.total_size) {
      return error(path + ".blocks", absl::StrCat("blocks cover ", expected - seg.address,
                                                  " of the segment's ", seg.total_size, " bytes"));
    }
  }
  for (std::size_t p = 1; p < snapshot.pools.size(); ++p) {
    for (std::size_t q = 0; q < p; ++q) {
      if (snapshot.pools[p].id == snapshot.pools[q].id) {
        return error(absl::StrCat("pools[", p, "].id"),
                     absl::StrCat("pool ", snapshot.pools[p].id, " is listed twice (also pools[", q, "])"));
      }
    }
  }
  return absl::OkStatus();
}

std::uint64_t UsableBytes(const SegmentSnapshot& segment, const BlockSnapshot& block) {
  if (!segment.expandable) return block.size;
  const std::uint64_t offset = block.address - segment.address;
  return MappedOverlap(segment.mapped, offset, offset + block.size);
}

std::uint64_t LargestUsableRun(const SegmentSnapshot& segment, const BlockSnapshot& block) {
  if (!segment.expandable) return block.size;
  const std::uint64_t begin = block.address - segment.address;
  const std::uint64_t end = begin + block.size;
  std::uint64_t best = 0, run = 0, run_end = 0;
  for (const MappedRange& r : segment.mapped) {  // sorted; adjacent accessible ranges make one run
    if (!r.accessible) {
      run = 0;
      continue;
    }
    const std::uint64_t lo = std::max(begin, r.offset);
    const std::uint64_t hi = std::min(end, r.offset + r.size);
    if (lo >= hi) continue;
    run = (run > 0 && lo == run_end) ? run + (hi - lo) : hi - lo;
    run_end = hi;
    best = std::max(best, run);
  }
  return best;
}

SnapshotTotals ComputeTotals(const MemorySnapshot& snapshot) {
  SnapshotTotals t;
  for (const SegmentSnapshot& seg : snapshot.segments) {
    ++t.segments;
    t.reserved_bytes += seg.ReservedBytes();
    for (const BlockSnapshot& block : seg.blocks) {
      switch (block.state) {
        case BlockState::kAllocated:
          t.allocated_bytes += block.size;
          ++t.allocations;
          [[fallthrough]];
        case BlockState::kPendingFree:
          t.active_bytes += block.size;
          t.requested_bytes += block.requested_size;
          ++t.active_blocks;
          break;
        case BlockState::kFree: {
          t.free_bytes += UsableBytes(seg, block);
          t.largest_free_block = std::max(t.largest_free_block, LargestUsableRun(seg, block));
          break;
        }
      }
    }
  }
  return t;
}

absl::Status CheckStatsConsistency(const MemorySnapshot& snapshot) {
  const SnapshotTotals t = ComputeTotals(snapshot);
  const DeviceStats& s = snapshot.stats;
  std::vector<std::string> mismatches;
  auto check = [&](absl::string_view name, std::int64_t from_stats, std::int64_t from_blocks) {
    if (from_stats != from_blocks) {
      mismatches.push_back(
          absl::StrCat(name, ".all.current is ", from_stats, " but the segments add up to ", from_blocks));
    }
  };
  check("reserved_bytes", s.reserved_bytes.all().current, static_cast<std::int64_t>(t.reserved_bytes));
  check("allocated_bytes", s.allocated_bytes.all().current, static_cast<std::int64_t>(t.allocated_bytes));
  check("active_bytes", s.active_bytes.all().current, static_cast<std::int64_t>(t.active_bytes));
  check("requested_bytes", s.requested_bytes.all().current, static_cast<std::int64_t>(t.requested_bytes));
  check("allocation", s.allocation.all().current, t.allocations);
  check("active", s.active.all().current, t.active_blocks);
  if (mismatches.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("statistics disagree with the segments: ", absl::StrJoin(mismatches, "; ")));
}

namespace snapshot_internal {

std::size_t Utf8SequenceLength(absl::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t min = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  std::uint32_t cp = c & (0x7F >> n);
  for (std::size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

std::string ToValidUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (const std::size_t n = Utf8SequenceLength(s, i); n != 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace snapshot_internal
}  // namespace graphalloc
