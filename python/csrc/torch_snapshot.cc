// BuildTorchSnapshot of torch_snapshot.h.
#include "python/csrc/torch_snapshot.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/config.h"

namespace graphalloc_torch {
namespace {

using TraceEntry = cca::TraceEntry;
using Action = TraceEntry::Action;
using graphalloc::BlockSnapshot;
using graphalloc::BlockState;
using graphalloc::HistoryAction;
using graphalloc::HistoryEvent;
using graphalloc::SegmentSnapshot;

// How far apart, once the two clocks' offset is removed, graphalloc's record of an event and the
// TorchHistory's may be to pair. Both are taken on one thread within microseconds of each other (more only
// when the thread was preempted in between, and then the event keeps graphalloc's own fields).
constexpr std::int64_t kPairToleranceUs = 500;
// A clock offset estimate beyond this pairs different events, not the same one seen by two clocks.
constexpr std::int64_t kMaxClockOffsetUs = 1'000'000;

c10::MempoolId_t TorchPoolOf(const DeviceSnapshotInput& in, std::uint64_t pool_id) {
  if (in.torch_pool_of) return in.torch_pool_of(pool_id);
  // Without a mapping: the id's halves, as graphalloc's pickle export writes them ({0, 0} for the default).
  return {pool_id >> 32, pool_id & 0xffffffffu};
}

// Streams and addresses travel as integers in graphalloc's snapshots and as pointers in PyTorch's.
void* AsPointer(std::uint64_t value) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(value)); }

Action TorchAction(HistoryAction action) {
  switch (action) {
    case HistoryAction::kAlloc:
      return TraceEntry::ALLOC;
    case HistoryAction::kFreeRequested:
      return TraceEntry::FREE_REQUESTED;
    case HistoryAction::kFreeCompleted:
      return TraceEntry::FREE_COMPLETED;
    case HistoryAction::kSegmentAlloc:
      return TraceEntry::SEGMENT_ALLOC;
    case HistoryAction::kSegmentFree:
      return TraceEntry::SEGMENT_FREE;
    case HistoryAction::kSegmentMap:
      return TraceEntry::SEGMENT_MAP;
    case HistoryAction::kSegmentUnmap:
      return TraceEntry::SEGMENT_UNMAP;
    case HistoryAction::kOom:
      return TraceEntry::OOM;
    case HistoryAction::kSnapshot:
      return TraceEntry::SNAPSHOT;
    // PyTorch has no sleep: for memory_viz the memory leaves and comes back, which is what it draws for
    // these.
    case HistoryAction::kSleep:
      return TraceEntry::SEGMENT_UNMAP;
    case HistoryAction::kWake:
      return TraceEntry::SEGMENT_MAP;
  }
  return TraceEntry::SNAPSHOT;
}

// ---- Segments

// The requested size PyTorch shows on a free block: its Block object keeps that of the last allocation whose
// free merged into it. graphalloc forgets requested sizes on free, so while history is recorded the newest
// freed allocation inside the block stands in (the same one but for splits since); 0 without history.
class FreedRequests {
 public:
  FreedRequests(const TorchHistory& history, c10::DeviceIndex device) {
    if (!history.IsEnabled() || device < 0) return;
    std::uint64_t order = 0;
    for (const TraceEntry& e : history.Trace(device)) {
      if (e.action_ == TraceEntry::FREE_COMPLETED) newest_[e.addr_] = Freed{++order, e.size_};
    }
  }

  std::uint64_t In(std::uint64_t lo, std::uint64_t hi) const {
    Freed best{};
    for (auto it = newest_.lower_bound(lo); it != newest_.end() && it->first < hi; ++it) {
      if (it->second.order > best.order) best = it->second;
    }
    return best.requested;
  }

 private:
  struct Freed {
    std::uint64_t order = 0;
    std::uint64_t requested = 0;
  };
  std::map<std::uint64_t, Freed> newest_;  // by address: the newest free there
};

// One PyTorch segment: [begin, end) of `seg` (the whole segment, or one contiguous mapped run of an
// expandable one), with the blocks clipped to it so that they tile it exactly, as memory_viz requires.
cca::SegmentInfo MakeSegment(const DeviceSnapshotInput& in, const SegmentSnapshot& seg, c10::MempoolId_t pool,
                             std::uint64_t begin, std::uint64_t end, const TorchHistory& history,
                             const FreedRequests& freed) {
  cca::SegmentInfo info;
  info.device = in.device;
  info.address = begin;
  info.total_size = end - begin;
  info.stream = AsPointer(seg.stream);
  info.is_large = seg.kind == graphalloc::SegmentKind::kLarge;
  info.is_expandable = seg.expandable;
  info.owner_private_pool_id = pool;
  for (const BlockSnapshot& b : seg.blocks) {
    const std::uint64_t lo = std::max(begin, b.address);
    const std::uint64_t hi = std::min(end, b.address + b.size);
    if (lo >= hi) continue;
    cca::BlockInfo& block = info.blocks.emplace_back();
    block.size = hi - lo;
    block.allocated = b.state == BlockState::kAllocated;
    block.active = b.state != BlockState::kFree;
    if (block.active) {
      // graphalloc forgets the requested size when the free is requested; a block pending free then shows
      // its whole size (memory_viz draws a block as wide as its requested size).
      const std::uint64_t requested = b.requested_size != 0 ? b.requested_size : block.size;
      block.requested_size = std::min<std::uint64_t>(requested, block.size);
    } else {
      block.requested_size = std::min<std::uint64_t>(freed.In(lo, hi), block.size);
    }
    if (block.allocated) block.context_when_allocated = history.ContextOf(AsPointer(b.address));
    if (block.allocated) info.allocated_size += block.size;
    if (block.active) {
      info.active_size += block.size;
      info.requested_size += block.requested_size;
    }
  }
  return info;
}

void AddSegments(const DeviceSnapshotInput& in, const TorchHistory& history, c10::MempoolId_t filter,
                 std::vector<cca::SegmentInfo>* out) {
  const bool all_pools = filter.first == 0 && filter.second == 0;
  const FreedRequests freed(history, in.device);
  for (const SegmentSnapshot& seg : in.snapshot.segments) {
    const c10::MempoolId_t pool = TorchPoolOf(in, seg.pool_id);
    if (!all_pools && pool != filter) continue;
    if (!seg.expandable) {
      out->push_back(MakeSegment(in, seg, pool, seg.address, seg.address + seg.total_size, history, freed));
      continue;
    }
    // Only the mapped runs hold memory; adjacent mapped ranges form one run.
    for (std::size_t i = 0; i < seg.mapped.size();) {
      const std::uint64_t begin = seg.address + seg.mapped[i].offset;
      std::uint64_t end = begin + seg.mapped[i].size;
      for (++i; i < seg.mapped.size() && seg.address + seg.mapped[i].offset == end; ++i) {
        end += seg.mapped[i].size;
      }
      out->push_back(MakeSegment(in, seg, pool, begin, end, history, freed));
    }
  }
}

// ---- Traces

// How much later the TorchHistory's clock reads than graphalloc's: the median difference over the
// allocations both recorded. An address allocated once in each pairs unambiguously; only when there is no
// such address does the nearest allocation at the same address stand in.
std::int64_t ClockOffsetUs(const std::vector<TraceEntry>& torch, const std::vector<HistoryEvent>& events) {
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> graphalloc_times;
  for (const HistoryEvent& e : events) {
    if (e.action == HistoryAction::kAlloc) graphalloc_times[e.address].push_back(e.time_us);
  }
  for (auto& [address, times] : graphalloc_times) std::sort(times.begin(), times.end());
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> torch_times;
  for (const TraceEntry& t : torch) {
    if (t.action_ == TraceEntry::ALLOC) torch_times[t.addr_].push_back(t.time_.t_);
  }
  std::vector<std::int64_t> unique;
  std::vector<std::int64_t> nearest;
  for (const auto& [address, times] : torch_times) {
    auto it = graphalloc_times.find(address);
    if (it == graphalloc_times.end()) continue;
    const std::vector<std::int64_t>& g = it->second;
    if (times.size() == 1 && g.size() == 1) {
      unique.push_back(times[0] - g[0]);
      continue;
    }
    for (const std::int64_t t : times) {
      auto at = std::lower_bound(g.begin(), g.end(), t);
      std::int64_t best = at != g.end() ? *at - t : kMaxClockOffsetUs + 1;
      if (at != g.begin() && t - *std::prev(at) < std::llabs(best)) best = *std::prev(at) - t;
      nearest.push_back(-best);  // t - (the graphalloc time)
    }
  }
  std::vector<std::int64_t>& diffs = unique.empty() ? nearest : unique;
  diffs.erase(std::remove_if(diffs.begin(), diffs.end(),
                             [](std::int64_t d) { return std::llabs(d) > kMaxClockOffsetUs; }),
              diffs.end());
  if (diffs.empty()) return 0;
  auto middle = diffs.begin() + static_cast<std::ptrdiff_t>(diffs.size() / 2);
  std::nth_element(diffs.begin(), middle, diffs.end());
  return *middle;
}

// The TorchHistory's entries of one action and address, oldest first, with the first not yet paired.
struct Candidates {
  std::vector<std::size_t> indices;
  std::size_t next = 0;
};

// The actions both histories record: the TorchHistory's entries replace graphalloc's records of them.
int PairedSlot(Action action) {
  switch (action) {
    case TraceEntry::ALLOC:
      return 0;
    case TraceEntry::FREE_REQUESTED:
      return 1;
    case TraceEntry::OOM:
      return 2;
    default:
      return -1;
  }
}

class Pairing {
 public:
  Pairing(const std::vector<TraceEntry>& torch, std::int64_t offset_us)
      : torch_(torch), offset_us_(offset_us) {
    for (std::size_t i = 0; i < torch.size(); ++i) {
      const int slot = PairedSlot(torch[i].action_);
      if (slot < 0) continue;
      by_address_[static_cast<std::size_t>(slot)][Address(torch[i].action_, torch[i].addr_)]
          .indices.push_back(i);
    }
  }

  // The TorchHistory entry recording the same event as `e`, if any. Called for graphalloc's events oldest
  // first, so each address's entries are paired in order and none twice.
  const TraceEntry* Pair(const HistoryEvent& e) {
    const Action action = TorchAction(e.action);
    const int slot = PairedSlot(action);
    if (slot < 0) return nullptr;
    auto& map = by_address_[static_cast<std::size_t>(slot)];
    auto it = map.find(Address(action, e.address));
    if (it == map.end()) return nullptr;
    Candidates& c = it->second;
    const std::int64_t target = e.time_us + offset_us_;
    // Entries too old to pair with this event or any later one recorded events graphalloc did not keep.
    while (c.next < c.indices.size() && torch_[c.indices[c.next]].time_.t_ < target - kPairToleranceUs)
      ++c.next;
    if (c.next == c.indices.size() || torch_[c.indices[c.next]].time_.t_ > target + kPairToleranceUs) {
      return nullptr;
    }
    return &torch_[c.indices[c.next++]];
  }

 private:
  // An OOM's addr_ is the device's free memory, measured separately by each history: OOMs pair by order.
  static std::uint64_t Address(Action action, std::uint64_t addr) {
    return action == TraceEntry::OOM ? 0 : addr;
  }

  const std::vector<TraceEntry>& torch_;
  const std::int64_t offset_us_;
  std::array<std::unordered_map<std::uint64_t, Candidates>, 3> by_address_;
};

TraceEntry FromGraphalloc(const HistoryEvent& e, const DeviceSnapshotInput& in) {
  TraceEntry entry(TorchAction(e.action), in.device, e.address, e.size, AsPointer(e.stream),
                   TorchPoolOf(in, e.pool_id), c10::approx_time_t{0}, nullptr, "N/A", e.annotation);
  entry.time_.t_ = e.time_us;
  return entry;
}

// The segment events whose context SegmentContexts guesses. Not a sleep's or a wake's, though PyTorch's
// trace shows them as segment_unmap / segment_map: they come from a sleep or wake call, neither from an
// allocation (a wake maps memory for blocks that exist already) nor from an empty_cache that might overlap
// them, so either guess would point at code that did not cause them.
bool IsSegmentEvent(HistoryAction action) {
  return action == HistoryAction::kSegmentAlloc || action == HistoryAction::kSegmentMap ||
         action == HistoryAction::kSegmentFree || action == HistoryAction::kSegmentUnmap;
}

// The contexts PyTorch gives segment events, which only graphalloc records: a segment made (or mapped) for
// an allocation takes the context of that allocation, the next one on its stream in graphalloc's order
// (within a second: a later one is another request's); a segment released by an empty_cache takes the
// context of that call. Null where neither applies, and for sleeps and wakes (IsSegmentEvent).
std::vector<std::shared_ptr<c10::GatheredContext>> SegmentContexts(
    const std::vector<HistoryEvent>& events, std::size_t first, const std::vector<const TraceEntry*>& paired,
    const std::vector<TorchHistory::CacheRelease>& releases, std::int64_t offset_us) {
  constexpr std::int64_t kSameRequestUs = 1'000'000;
  std::vector<std::shared_ptr<c10::GatheredContext>> out(events.size());
  struct NextAlloc {
    std::int64_t time_us;
    std::shared_ptr<c10::GatheredContext> context;
  };
  std::unordered_map<std::uint64_t, NextAlloc> next_alloc;  // by stream, walking newest first
  for (std::size_t i = events.size(); i-- > first;) {
    const HistoryEvent& e = events[i];
    if (e.action == HistoryAction::kAlloc) {
      next_alloc[e.stream] = NextAlloc{e.time_us, paired[i] != nullptr ? paired[i]->context_ : nullptr};
      continue;
    }
    if (!IsSegmentEvent(e.action)) continue;
    const std::int64_t t = e.time_us + offset_us;
    for (const TorchHistory::CacheRelease& r : releases) {
      if (t >= r.begin_us - kPairToleranceUs && t <= r.end_us + kPairToleranceUs) out[i] = r.context;
    }
    const bool made = e.action == HistoryAction::kSegmentAlloc || e.action == HistoryAction::kSegmentMap;
    if (out[i] != nullptr || !made) continue;
    auto it = next_alloc.find(e.stream);
    if (it != next_alloc.end() && it->second.time_us - e.time_us <= kSameRequestUs)
      out[i] = it->second.context;
  }
  return out;
}

std::vector<TraceEntry> BuildTrace(const DeviceSnapshotInput& in, const TorchHistory& history,
                                   const TorchHistory::Window& window) {
  if (!window.recording) return {};  // PyTorch drops its trace when history is turned off
  std::vector<TraceEntry> torch = history.Trace(in.device);
  if (in.snapshot.history_max_entries == 0) return torch;  // graphalloc recorded nothing to follow

  const std::vector<HistoryEvent>& events = in.snapshot.history;
  const std::int64_t offset_us = ClockOffsetUs(torch, events);
  Pairing pairing(torch, offset_us);
  // A block's requested size and context, from the entry of its allocation (or of its free request), for
  // graphalloc's records that have no TorchHistory entry (free_completed always).
  struct Held {
    std::size_t requested;
    std::shared_ptr<c10::GatheredContext> context;
  };
  std::unordered_map<std::uint64_t, Held> held;
  // Any suffix of graphalloc's order is consistent, so the cut may be approximate.
  std::size_t first = 0;
  while (first < events.size() && events[first].time_us + offset_us < window.since_us) ++first;
  std::vector<const TraceEntry*> paired_with(events.size(), nullptr);
  for (std::size_t i = first; i < events.size(); ++i) paired_with[i] = pairing.Pair(events[i]);
  const std::vector<std::shared_ptr<c10::GatheredContext>> segment_contexts =
      SegmentContexts(events, first, paired_with, history.CacheReleases(in.device), offset_us);
  std::vector<TraceEntry> out;
  for (std::size_t i = first; i < events.size(); ++i) {
    const HistoryEvent& e = events[i];
    TraceEntry entry = FromGraphalloc(e, in);
    const TraceEntry* paired = paired_with[i];
    if (paired != nullptr) {
      entry = *paired;
      entry.time_.t_ = e.time_us;  // graphalloc's clock throughout, so that the times follow the order
    } else if (segment_contexts[i] != nullptr) {
      entry.context_ = segment_contexts[i];
    }
    switch (e.action) {
      case HistoryAction::kAlloc:
        held[e.address] = Held{entry.size_, entry.context_};
        break;
      case HistoryAction::kFreeRequested:
      case HistoryAction::kFreeCompleted: {
        auto it = held.find(e.address);
        if (it != held.end() && paired == nullptr) {
          // Not paired (a free_completed never is): the allocation's requested size and context, as PyTorch
          // records a free (a paired entry has them already).
          entry.size_ = it->second.requested;
          entry.context_ = it->second.context;
        }
        if (e.action == HistoryAction::kFreeCompleted) {
          if (it != held.end()) held.erase(it);
        } else {
          held[e.address] = Held{entry.size_, entry.context_};
        }
        break;
      }
      default:
        break;
    }
    if (!window.Skips(entry.action_)) out.push_back(std::move(entry));
  }
  if (out.size() > window.max_entries) {
    out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(window.max_entries));
  }
  return out;
}

// ---- Configuration

cca::AllocatorConfigInfo ConfigInfo(const std::vector<DeviceSnapshotInput>& devices) {
  // Every device's allocator has the process's one configuration; a device may have no snapshot to say it.
  std::string text;
  for (const DeviceSnapshotInput& in : devices) {
    if (!in.snapshot.config.empty()) {
      text = in.snapshot.config;
      break;
    }
  }
  absl::StatusOr<graphalloc::Config> parsed = graphalloc::Config::Parse(text);
  const graphalloc::Config config = parsed.ok() ? *parsed : graphalloc::Config{};
  cca::AllocatorConfigInfo info{};
  info.garbage_collection_threshold = config.garbage_collection_threshold;
  info.max_split_size = config.max_split_size;
  // PyTorch's defaults for settings graphalloc does not have (pinned host memory, lock release, capture
  // reuse).
  info.pinned_num_register_threads = 1;
  info.expandable_segments = config.expandable_segments;
  info.release_lock_on_malloc = false;
  info.pinned_use_host_register = false;
  info.graph_capture_record_stream_reuse = false;
  info.last_allocator_settings = text;
  info.roundup_power2_divisions.assign(config.roundup_power2_divisions.begin(),
                                       config.roundup_power2_divisions.end());
  return info;
}

}  // namespace

cca::SnapshotInfo BuildTorchSnapshot(const std::vector<DeviceSnapshotInput>& devices,
                                     const TorchHistory& history, c10::MempoolId_t filter,
                                     bool include_traces, int device_count) {
  // Devices in order, as PyTorch lists its device allocators; each device's segments by address.
  std::vector<const DeviceSnapshotInput*> ordered;
  for (const DeviceSnapshotInput& in : devices) ordered.push_back(&in);
  std::stable_sort(
      ordered.begin(), ordered.end(),
      [](const DeviceSnapshotInput* a, const DeviceSnapshotInput* b) { return a->device < b->device; });

  cca::SnapshotInfo result{};
  for (const DeviceSnapshotInput* in : ordered) AddSegments(*in, history, filter, &result.segments);

  if (include_traces) {
    std::size_t traces = static_cast<std::size_t>(std::max(device_count, 0));
    for (const DeviceSnapshotInput* in : ordered) {
      if (in->device >= 0) traces = std::max(traces, static_cast<std::size_t>(in->device) + 1);
    }
    result.device_traces.resize(traces);
    const TorchHistory::Window window = history.TraceWindow();
    for (const DeviceSnapshotInput* in : ordered) {
      if (in->device < 0) continue;
      result.device_traces[static_cast<std::size_t>(in->device)] = BuildTrace(*in, history, window);
    }
    result.external_annotations = history.Annotations();
  }
  result.config_metadata = ConfigInfo(devices);
  return result;
}

}  // namespace graphalloc_torch
