// Expandable segments: blocks in flight going back (settled), and the quarantine of chunks mapped without
// access (expandable_segments.h says what that is and why).
#include <algorithm>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/invariant_violation.h"

namespace graphalloc {

absl::Status ExpandableSegments::RepairQuarantinedChunks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (quarantined_.load(std::memory_order_relaxed) == 0) return absl::OkStatus();
  std::vector<QuarantinedChunk> work;
  std::vector<int> peers;
  {
    const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    work.swap(quarantine_);  // the blocks stay in flight: this call owns them now
    quarantined_.store(0, std::memory_order_relaxed);
    peers = peers_;
  }
  enum Outcome { kAccessible, kUnmapped, kStillQuarantined };
  std::vector<Outcome> outcomes(work.size(), kStillQuarantined);
  absl::Status first_error;
  // No unmap during a capture, which it would break. Asked inside the unmap gate, entered at the first
  // unmap: captures begin under the gate, so the answer holds until it is left (asked before it, a capture
  // beginning in another thread could slip in between). No wait for the device: a quarantined chunk was
  // never handed out, so no work uses it.
  std::unique_ptr<ExpandableHost::UnmapGate> gate;
  bool may_unmap = true;
  for (std::size_t i = 0; i < work.size(); ++i) {
    const ChunkPlacement& c = work[i].chunk;
    absl::Status s = driver_.MemSetAccess(c.ptr, c.size, peers);
    if (s.ok()) {
      outcomes[i] = kAccessible;
      // Accessible now, and about to be handed out: its first report.
      hooks_.Map(PoolOf(*work[i].block->segment), c.ptr, c.size, c.handle, true);
      continue;
    }
    if (may_unmap && gate == nullptr) {
      gate = host_.EnterUnmapGate();
      may_unmap = !host_.CaptureUnderway();
    }
    if (may_unmap) {
      s = driver_.MemUnmap(c.ptr, c.size);
      if (s.ok()) {
        outcomes[i] = kUnmapped;
        continue;
      }
    }
    if (first_error.ok()) first_error = s;
  }
  gate.reset();
  for (std::size_t i = 0; i < work.size(); ++i) {
    Block* b = work[i].block;
    const ChunkPlacement& c = work[i].chunk;
    StreamShard& shard = *b->segment->shard;
    const std::unique_ptr<ExpandableHost::Lock> shard_lock = host_.LockShard(shard);
    const std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    if (outcomes[i] == kUnmapped) {
      host_.ChunkUnmapped(b->segment, c);
      handles_.Put(c.size, c.handle);  // reused by the next growth, or released with the cache
    }
    SettleInFlight(shard, b, std::span<const ChunkPlacement>(&c, 1),
                   std::vector<bool>{outcomes[i] != kUnmapped},
                   std::vector<bool>{outcomes[i] == kStillQuarantined});
  }
  return first_error;
}

void ExpandableSegments::SettleInFlight(StreamShard& shard, Block* b, std::span<const ChunkPlacement> chunks,
                                        const std::vector<bool>& mapped, const std::vector<bool>& no_access) {
  host_.AssertDeviceLockHeld();
  auto quarantined = [&](std::size_t i) { return !no_access.empty() && no_access[i]; };
  // Split where the mapped state changes and around each quarantined chunk (in a handle-aligned segment,
  // between any two mapped chunks too), then return each piece.
  const bool aligned = b->segment->handle_aligned;
  std::vector<Block*> pieces{b};
  std::vector<std::size_t> first_chunk{0};
  b->mapped = mapped[0];
  for (std::size_t i = 1; i < chunks.size(); ++i) {
    if (mapped[i] == mapped[i - 1] && !quarantined(i) && !quarantined(i - 1) && !(aligned && mapped[i]))
      continue;
    Block* piece = host_.SplitOff(shard, pieces.back(), chunks[i].ptr);
    piece->mapped = mapped[i];
    pieces.push_back(piece);
    first_chunk.push_back(i);
  }
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    if (quarantined(first_chunk[p])) {
      quarantine_.push_back({pieces[p], chunks[first_chunk[p]]});  // stays in flight
      quarantined_.store(quarantine_.size(), std::memory_order_relaxed);
    } else {
      pieces[p]->in_flight = false;
    }
  }
  for (Block* piece : pieces) {
    if (!piece->in_flight) host_.ReturnToIndex(shard, piece);
  }
}

void ExpandableSegments::CacheHandle(const ChunkPlacement& handle) {
  host_.AssertDeviceLockHeld();
  handles_.Put(handle.size, handle.handle);
}

bool ExpandableSegments::TakeCachedHandle(const PoolState* pool, std::size_t size, PhysicalHandle* handle) {
  host_.AssertDeviceLockHeld();
  if (!shareable_all_ && Shareable(pool)) return false;  // the cache may hold handles that do not export
  return handles_.TakeExact(size, handle);
}

std::vector<int> ExpandableSegments::peers() const {
  host_.AssertDeviceLockHeld();
  return peers_;
}

bool ExpandableSegments::IsQuarantined(const Block* block) const {
  host_.AssertDeviceLockHeld();
  return block->in_flight && std::any_of(quarantine_.begin(), quarantine_.end(),
                                         [block](const QuarantinedChunk& q) { return q.block == block; });
}

bool ExpandableSegments::Accessible(DevicePtr chunk) const {
  host_.AssertDeviceLockHeld();
  return std::none_of(quarantine_.begin(), quarantine_.end(),
                      [chunk](const QuarantinedChunk& q) { return q.chunk.ptr == chunk; });
}

absl::Status ExpandableSegments::CheckInvariants(std::size_t in_flight_blocks) const {
  host_.AssertDeviceLockHeld();
  if (handles_.bytes() != handles_.RecomputeBytes()) {
    return InvariantViolation(absl::StrFormat("handle cache counts %d bytes, its handles add up to %d",
                                              handles_.bytes(), handles_.RecomputeBytes()));
  }
  // A quarantined chunk (mapped without access) is exactly an in-flight mapped block of its segment and
  // one of the segment's chunks, listed once.
  if (quarantined_.load(std::memory_order_relaxed) != quarantine_.size()) {
    return InvariantViolation(absl::StrFormat("%d chunks are quarantined, the counter says %d",
                                              quarantine_.size(),
                                              quarantined_.load(std::memory_order_relaxed)));
  }
  for (std::size_t i = 0; i < quarantine_.size(); ++i) {
    const QuarantinedChunk& q = quarantine_[i];
    const Block* b = q.block;
    const bool listed = b->segment != nullptr && host_.FindSegment(b->segment->base) == b->segment;
    if (!listed || !b->segment->expandable || !b->in_flight || !b->mapped || b->allocated ||
        b->ptr != q.chunk.ptr || b->size != q.chunk.size) {
      return InvariantViolation(absl::StrFormat(
          "quarantined chunk 0x%x (%d bytes) is not an in-flight mapped block of an expandable segment",
          q.chunk.ptr, q.chunk.size));
    }
    auto chunk = b->segment->vmm->chunks().find(q.chunk.ptr);
    if (chunk == b->segment->vmm->chunks().end() || chunk->second.size != q.chunk.size ||
        chunk->second.handle != q.chunk.handle) {
      return InvariantViolation(
          absl::StrFormat("quarantined chunk 0x%x is not a chunk of its segment", q.chunk.ptr));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (quarantine_[j].block == b) {
        return InvariantViolation(absl::StrFormat("quarantined chunk 0x%x is listed twice", q.chunk.ptr));
      }
    }
  }
  // Quarantined blocks stay in flight with no growth under way.
  if (in_flight_blocks - quarantine_.size() == 0 && host_.GrowthInFlight() != 0) {
    return InvariantViolation(
        absl::StrFormat("%d bytes counted as growing with no growth under way", host_.GrowthInFlight()));
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
