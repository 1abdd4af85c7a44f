// TakeSnapshot(): the allocator's segments, blocks, statistics and history as a MemorySnapshot.
#include <algorithm>
#include <chrono>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {
namespace {

BlockState StateOf(const Block* b) {
  if (b->OwnerFreed()) return BlockState::kPendingFree;  // as PyTorch shows a block freed with stream uses
  if (b->allocated) return BlockState::kAllocated;
  return b->event_count > 0 ? BlockState::kPendingFree : BlockState::kFree;
}

// The blocks of `segment` as a snapshot shows them.
void AddBlocks(const Segment& segment, SegmentSnapshot* out) {
  for (const Block* b = segment.head; b != nullptr; b = b->next) {
    // Adjacent free blocks exist only while one of them is parked in the quick cache; they are shown
    // merged, as coalescing leaves them and as the statistics count them. (Merging them here would change
    // later allocation decisions: a snapshot must not.)
    if (StateOf(b) == BlockState::kFree && !out->blocks.empty() &&
        out->blocks.back().state == BlockState::kFree) {
      out->blocks.back().size += b->size;
      continue;
    }
    BlockSnapshot& block = out->blocks.emplace_back();
    block.address = b->ptr;
    block.size = b->size;
    block.state = StateOf(b);
    block.requested_size = block.state == BlockState::kAllocated ? b->requested_size : 0;
    block.stream = static_cast<std::uint64_t>(b->stream());
  }
}

// Pool 0 carries the device's totals (private pools included, as PyTorch's memory_stats does).
PoolSnapshot DevicePool(const DeviceStats& stats) {
  PoolSnapshot pool;
  pool.id = 0;
  pool.reserved_bytes = static_cast<std::uint64_t>(stats.reserved_bytes.all().current);
  pool.allocated_bytes = static_cast<std::uint64_t>(stats.allocated_bytes.all().current);
  pool.peak_reserved_bytes = static_cast<std::uint64_t>(stats.reserved_bytes.all().peak);
  pool.peak_allocated_bytes = static_cast<std::uint64_t>(stats.allocated_bytes.all().peak);
  return pool;
}

PoolSnapshot PrivatePoolOf(PoolId id, const PoolState& state) {
  PoolSnapshot p;
  p.id = id;
  p.use_count = state.users.load(std::memory_order_relaxed) + state.pins.load(std::memory_order_relaxed);
  p.reserved_bytes = static_cast<std::uint64_t>(state.reserved_bytes);
  p.peak_reserved_bytes = static_cast<std::uint64_t>(state.peak_reserved_bytes);
  p.allocated_bytes = static_cast<std::uint64_t>(state.allocated_bytes.load(std::memory_order_relaxed));
  p.peak_allocated_bytes =
      static_cast<std::uint64_t>(state.peak_allocated_bytes.load(std::memory_order_relaxed));
  p.owner = state.options.owner;
  if (p.owner.empty() && !state.options.tag.empty()) p.owner = absl::StrCat("tag '", state.options.tag, "'");
  p.graph_pins = state.pins.load(std::memory_order_relaxed);
  return p;
}

// A live block's stack and annotation are those of the last recorded allocation at its address. A
// segment's stack is that of the last segment_alloc at its address or, for an expandable segment (whose
// reservation is not an event), of the oldest segment_map still in the history inside it.
void AttributeStacks(MemorySnapshot* snapshot) {
  absl::flat_hash_map<std::uint64_t, const HistoryEvent*> last_alloc;
  absl::flat_hash_map<std::uint64_t, const HistoryEvent*> last_segment_alloc;
  std::map<std::uint64_t, const HistoryEvent*> first_map;  // by address, for the range lookup below
  for (const HistoryEvent& e : snapshot->history) {
    if (e.action == HistoryAction::kAlloc) last_alloc[e.address] = &e;
    if (e.action == HistoryAction::kSegmentAlloc) last_segment_alloc[e.address] = &e;
    if (e.action == HistoryAction::kSegmentMap) first_map.emplace(e.address, &e);
  }
  for (SegmentSnapshot& segment : snapshot->segments) {
    const HistoryEvent* made = nullptr;
    if (auto it = last_segment_alloc.find(segment.address); it != last_segment_alloc.end()) {
      made = it->second;
    } else if (segment.expandable) {
      for (auto it = first_map.lower_bound(segment.address);
           it != first_map.end() && it->first < segment.address + segment.total_size; ++it) {
        if (made == nullptr || it->second->time_us < made->time_us) made = it->second;
      }
    }
    if (made != nullptr) segment.frames = made->frames;
  }
  if (last_alloc.empty()) return;
  for (SegmentSnapshot& segment : snapshot->segments) {
    for (BlockSnapshot& block : segment.blocks) {
      if (block.state == BlockState::kFree) continue;
      auto it = last_alloc.find(block.address);
      if (it == last_alloc.end()) continue;
      block.frames = it->second->frames;
      block.annotation = it->second->annotation;
    }
  }
}

}  // namespace

MemorySnapshot CachingAllocator::StateSnapshot() const {
  MemorySnapshot snapshot;
  snapshot.source = "graphalloc";
  snapshot.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  const DeviceInfo& info = driver_->Info();
  snapshot.device = DeviceDescription{info.ordinal, info.name, info.total_memory, info.granularity};
  snapshot.config = config_.ToString();
  SnapshotState(&snapshot);
  return snapshot;
}

MemorySnapshot CachingAllocator::TakeSnapshot(absl::string_view label, bool record_event) const {
  MemorySnapshot snapshot = StateSnapshot();
  snapshot.label = std::string(label);
  history_.ExportTo(&snapshot);
  // The snapshot's own event, with the active bytes it saw, goes after the history it holds, so that its
  // last event is the allocator's last action (as in PyTorch's snapshots); later snapshots show where it was
  // taken.
  if (record_event) {
    history_.Record(HistoryAction::kSnapshot, 0,
                    static_cast<std::uint64_t>(snapshot.stats.active_bytes.all().current), 0, 0);
  }
  AttributeStacks(&snapshot);
  return snapshot;
}

void CachingAllocator::SnapshotState(MemorySnapshot* snapshot) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AllShardsLock lock(shards_, device_mu_);
  ReadStats(lock, snapshot->stats);
  snapshot->segments.reserve(segments_.size());
  for (const auto& [base, segment] : segments_) {
    SegmentSnapshot& out = snapshot->segments.emplace_back();
    out.address = segment->base;
    out.total_size = segment->size;
    out.stream = static_cast<std::uint64_t>(segment->stream);
    out.pool_id = segment->shard->pool != nullptr ? segment->shard->pool->id : kDefaultPool;
    out.kind = segment->pool->is_small ? SegmentKind::kSmall : SegmentKind::kLarge;
    out.expandable = segment->expandable;
    if (segment->vmm != nullptr) {
      for (const auto& [ptr, chunk] : segment->vmm->chunks()) {
        const std::uint64_t offset = ptr - segment->base;
        const bool accessible = expandable_.Accessible(ptr);
        if (!out.mapped.empty() && out.mapped.back().offset + out.mapped.back().size == offset &&
            out.mapped.back().accessible == accessible) {
          out.mapped.back().size += chunk.size;
        } else {
          out.mapped.push_back({offset, chunk.size, accessible});
        }
      }
      for (const auto& [ptr, chunk] : segment->vmm->sleeping_chunks()) {
        const std::uint64_t offset = ptr - segment->base;
        if (!out.asleep.empty() && out.asleep.back().offset + out.asleep.back().size == offset) {
          out.asleep.back().size += chunk.size;
        } else {
          out.asleep.push_back({offset, chunk.size, true});
        }
      }
    }
    AddBlocks(*segment, &out);
  }
  // Each private pool follows the device's totals with its own figures.
  snapshot->pools.push_back(DevicePool(snapshot->stats));
  pools_.ForEach(
      [&](PoolId id, const PoolState& state) { snapshot->pools.push_back(PrivatePoolOf(id, state)); });
}

}  // namespace graphalloc
