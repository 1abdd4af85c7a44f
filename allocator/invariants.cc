// CheckInvariants(): recomputes everything the allocator tracks incrementally and compares.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"

namespace graphalloc {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError(absl::StrCat("allocator invariant violated: ", what));
}

struct Expected {
  DeviceStats stats;
  std::size_t allocated_blocks = 0;
  std::size_t free_blocks = 0;
  std::size_t blocks = 0;
  std::size_t event_waits = 0;
};

}  // namespace

absl::Status CachingAllocator::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  Expected e;
  DevicePtr previous_end = 0;
  for (const auto& [base, segment] : segments_) {
    if (segment->base != base)
      return Violation(absl::StrFormat("segment keyed 0x%x has base 0x%x", base, segment->base));
    if (base < previous_end)
      return Violation(absl::StrFormat("segment 0x%x overlaps the previous one", base));
    previous_end = base + segment->size;
    const bool small = segment->pool->is_small;
    e.stats.segment.Increase(small, 1);
    e.stats.reserved_bytes.Increase(small, static_cast<std::int64_t>(segment->size));
    if (segment->head == nullptr || segment->head->prev != nullptr) {
      return Violation(absl::StrFormat("segment 0x%x has no head block", base));
    }
    DevicePtr expected_ptr = base;
    const Block* prev = nullptr;
    bool prev_free = false;
    for (const Block* b = segment->head; b != nullptr; prev = b, b = b->next) {
      ++e.blocks;
      if (b->ptr != expected_ptr) {
        return Violation(absl::StrFormat("block at 0x%x in segment 0x%x should start at 0x%x", b->ptr, base,
                                         expected_ptr));
      }
      if (b->prev != prev) return Violation(absl::StrFormat("block 0x%x has a broken prev link", b->ptr));
      if (b->segment != segment || b->stream != segment->stream) {
        return Violation(
            absl::StrFormat("block 0x%x disagrees with its segment about segment or stream", b->ptr));
      }
      if (b->size == 0 || b->size % 512 != 0) {
        return Violation(
            absl::StrFormat("block 0x%x has size %d, not a positive multiple of 512", b->ptr, b->size));
      }
      expected_ptr += b->size;
      const bool in_free_index = segment->pool->Contains(b);
      auto it = allocated_.find(b->ptr);
      const bool in_map = it != allocated_.end() && it->second == b;
      const bool is_free = !b->allocated && b->event_count == 0;
      if (b->allocated) {
        ++e.allocated_blocks;
        if (!in_map)
          return Violation(absl::StrFormat("allocated block 0x%x is missing from the pointer map", b->ptr));
        if (in_free_index)
          return Violation(absl::StrFormat("allocated block 0x%x is in the free index", b->ptr));
        e.stats.allocation.Increase(small, 1);
        e.stats.allocated_bytes.Increase(small, static_cast<std::int64_t>(b->size));
        e.stats.requested_bytes.Increase(small, static_cast<std::int64_t>(b->requested_size));
        if (b->size >= config_.max_split_size) e.stats.oversize_allocations.Increase(small, 1);
      } else {
        if (in_map) return Violation(absl::StrFormat("free block 0x%x is in the pointer map", b->ptr));
        if (!b->stream_uses.empty()) {
          return Violation(absl::StrFormat("free block 0x%x still lists stream uses", b->ptr));
        }
      }
      if (!b->allocated && b->event_count > 0) {
        e.event_waits += static_cast<std::size_t>(b->event_count);
        if (in_free_index)
          return Violation(absl::StrFormat("block 0x%x awaiting events is in the free index", b->ptr));
      }
      if (is_free) {
        ++e.free_blocks;
        if (!in_free_index)
          return Violation(absl::StrFormat("free block 0x%x is missing from the free index", b->ptr));
        if (prev_free && prev->mapped == b->mapped) {
          return Violation(
              absl::StrFormat("adjacent free blocks 0x%x and 0x%x were not merged", prev->ptr, b->ptr));
        }
        if (b->IsSplit()) {
          e.stats.inactive_split.Increase(small, 1);
          e.stats.inactive_split_bytes.Increase(small, static_cast<std::int64_t>(b->size));
        }
      } else {
        e.stats.active.Increase(small, 1);
        e.stats.active_bytes.Increase(small, static_cast<std::int64_t>(b->size));
      }
      prev_free = is_free;
    }
    if (expected_ptr != base + segment->size) {
      return Violation(absl::StrFormat("blocks of segment 0x%x cover %d bytes, not its %d", base,
                                       expected_ptr - base, segment->size));
    }
    if (segment->size >= config_.max_split_size) e.stats.oversize_segments.Increase(small, 1);
  }

  if (e.allocated_blocks != allocated_.size()) {
    return Violation(absl::StrFormat("pointer map holds %d entries for %d allocated blocks",
                                     allocated_.size(), e.allocated_blocks));
  }
  const std::size_t indexed = small_pool_.blocks.size() + large_pool_.blocks.size();
  if (e.free_blocks != indexed) {
    return Violation(
        absl::StrFormat("free index holds %d entries for %d free blocks", indexed, e.free_blocks));
  }
  if (e.blocks + blocks_in_release_ != arena_.live()) {
    return Violation(
        absl::StrFormat("%d block objects are live but segments hold %d", arena_.live(), e.blocks));
  }
  std::size_t queued = 0;
  for (const auto& [stream, queue] : pending_events_) queued += queue.size();
  if (queued != e.event_waits || static_cast<std::int64_t>(queued) != pending_event_count_.load()) {
    return Violation(absl::StrFormat("%d events queued, blocks wait on %d, counter says %d", queued,
                                     e.event_waits, pending_event_count_.load()));
  }

  const std::pair<const char*, std::pair<const StatArray*, const StatArray*>> checks[] = {
      {"allocation", {&stats_.allocation, &e.stats.allocation}},
      {"allocated_bytes", {&stats_.allocated_bytes, &e.stats.allocated_bytes}},
      {"requested_bytes", {&stats_.requested_bytes, &e.stats.requested_bytes}},
      {"active", {&stats_.active, &e.stats.active}},
      {"active_bytes", {&stats_.active_bytes, &e.stats.active_bytes}},
      {"inactive_split", {&stats_.inactive_split, &e.stats.inactive_split}},
      {"inactive_split_bytes", {&stats_.inactive_split_bytes, &e.stats.inactive_split_bytes}},
      {"segment", {&stats_.segment, &e.stats.segment}},
      {"reserved_bytes", {&stats_.reserved_bytes, &e.stats.reserved_bytes}},
      {"oversize_allocations", {&stats_.oversize_allocations, &e.stats.oversize_allocations}},
      {"oversize_segments", {&stats_.oversize_segments, &e.stats.oversize_segments}},
  };
  constexpr const char* kTypes[] = {"all", "small_pool", "large_pool"};
  for (const auto& [name, arrays] : checks) {
    for (int t = 0; t < kNumStatTypes; ++t) {
      const std::int64_t tracked = arrays.first->by_type[t].current;
      const std::int64_t actual = arrays.second->by_type[t].current;
      if (tracked != actual) {
        return Violation(absl::StrFormat("stat %s.%s.current is %d but the blocks say %d", name, kTypes[t],
                                         tracked, actual));
      }
      if (arrays.first->by_type[t].peak < tracked) {
        return Violation(absl::StrFormat("stat %s.%s.peak is below current", name, kTypes[t]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
