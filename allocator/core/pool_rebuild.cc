// PoolRestorer, phase 2: every block chain of the pool replaced by the checkpoint's (pool_restorer.h).
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "graphalloc/allocator/core/pool_restorer.h"

namespace graphalloc {
// Named rather than anonymous: PoolRestorer::Rebuild, a type with linkage, holds these (a unity build would
// otherwise warn that its fields' types have internal linkage).
namespace pool_rebuild {

// One block of a new chain.
struct Piece {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  bool allocated = false;
  bool mapped = true;
  std::size_t requested = 0;
};

// A live block, before or after the restore.
struct Live {
  DevicePtr ptr;
  std::size_t size;
  Stream stream;
  std::size_t requested;  // what the history's events carry
};

}  // namespace pool_rebuild

namespace {

using pool_rebuild::Live;
using pool_rebuild::Piece;

// True when the segment's chain is exactly the checkpointed one: nothing to rebuild.
bool ChainMatches(const Segment* segment, const CheckpointSegment& s) {
  std::size_t i = 0;
  for (const Block* b = segment->head; b != nullptr; b = b->next, ++i) {
    if (i == s.blocks.size()) return false;
    const CheckpointBlock& c = s.blocks[i];
    if (b->ptr != s.base + c.offset || b->size != c.size || b->allocated != c.allocated ||
        b->mapped != c.mapped || (b->allocated && b->requested_size != c.requested_size)) {
      return false;
    }
  }
  return i == s.blocks.size();
}

// Free pieces for [begin, end) of `segment`: one mapped piece in a regular segment; in an expandable one,
// pieces that follow its chunk map (what is mapped now is what the blocks must say).
void AddFreePieces(const Segment* segment, DevicePtr begin, DevicePtr end, std::vector<Piece>* pieces) {
  if (!segment->expandable) {
    pieces->push_back({begin, end - begin, false, true, 0});
    return;
  }
  DevicePtr at = begin;
  const auto& chunks = segment->vmm->chunks();
  auto it = chunks.upper_bound(begin);
  if (it != chunks.begin()) --it;
  for (; at < end; ++it) {
    const bool have = it != chunks.end() && it->first < end;
    const DevicePtr chunk_begin = have ? std::max(it->first, at) : end;
    if (have && it->first + it->second.size <= at) continue;
    if (chunk_begin > at) pieces->push_back({at, chunk_begin - at, false, false, 0});
    if (!have) break;
    const DevicePtr chunk_end = std::min(it->first + it->second.size, end);
    pieces->push_back({chunk_begin, chunk_end - chunk_begin, false, true, 0});
    at = chunk_end;
  }
}

}  // namespace

// What the rebuild of the pool's chains gathers as it goes.
struct PoolRestorer::Rebuild {
  using Live = pool_rebuild::Live;
  using Piece = pool_rebuild::Piece;
  // Statistics of the blocks taken out of and put into one shard's pool kind, applied once: a 10,000-block
  // restore would otherwise spend much of its time on per-block counter updates.
  struct ShardDelta {
    StreamShard* shard;
    bool small;
    stat_events::BlockTotals out, in;
  };
  ShardDelta& DeltaFor(StreamShard* shard, bool small) {
    for (ShardDelta& d : deltas) {
      if (d.shard == shard && d.small == small) return d;
    }
    deltas.push_back({shard, small, {}, {}});
    return deltas.back();
  }

  absl::flat_hash_map<DevicePtr, const CheckpointSegment*> wanted;
  // Both in address order (segments are, and so is each chain): the differences are a linear merge.
  std::vector<Live> live_before;
  std::vector<Live> allocated_after;
  std::vector<ShardDelta> deltas;
  ShardDelta* delta = nullptr;  // the segment being rebuilt's
  std::vector<Piece> pieces;    // its new chain, then with neighbouring free pieces merged
  std::vector<Piece> merged;
};

absl::Status PoolRestorer::RebuildChains(std::vector<UnmapJob>* unmap_jobs) {
  const std::unique_ptr<PoolLock> lock = host_.LockPool(pool_);
  if (absl::Status s = ValidateAgainstPool(*lock); !s.ok()) return s;
  Rebuild r;
  for (const CheckpointSegment& s : checkpoint_.segments) r.wanted.emplace(s.base, &s);
  host_.FlushQuickCaches(*lock);
  for (Segment* segment : host_.SegmentsOf(*lock)) {
    auto w = r.wanted.find(segment->base);
    const CheckpointSegment* wanted = w != r.wanted.end() ? w->second : nullptr;
    if (wanted != nullptr && ChainMatches(segment, *wanted)) continue;  // already the checkpoint's
    RebuildSegment(segment, wanted, r);
  }
  Account(r);
  PlanUnmaps(*lock, unmap_jobs);
  return absl::OkStatus();
}

void PoolRestorer::RebuildSegment(Segment* segment, const CheckpointSegment* wanted, Rebuild& r) {
  r.delta = &r.DeltaFor(segment->shard, segment->pool->is_small);
  TearDownChain(segment, r);
  LayOutChain(segment, wanted, r);
  BuildChain(segment, r);
}

void PoolRestorer::TearDownChain(Segment* segment, Rebuild& r) {
  StreamShard& shard = *segment->shard;
  BlockPool& bp = *segment->pool;
  // Inactive split blocks are counted for regular segments that are split.
  const bool split_counted = !segment->expandable && segment->head->next != nullptr;
  for (Block* b = segment->head; b != nullptr;) {
    Block* next = b->next;
    if (b->allocated) {
      r.live_before.push_back({b->ptr, b->size, b->stream(), b->requested_size});
      shard.RemoveFromPointerMap(b);
      r.delta->out.AddAllocated(host_.FiguresOf(b, bp.is_small));
    } else {
      if (b->mapped) {
        bp.Erase(b);
      } else {
        bp.unmapped.erase(b->ptr);
      }
      if (split_counted) r.delta->out.AddInactiveSplit(static_cast<std::int64_t>(b->size));
    }
    shard.arena.Delete(b);
    b = next;
  }
}

void PoolRestorer::LayOutChain(const Segment* segment, const CheckpointSegment* wanted, Rebuild& r) {
  // The checkpoint's blocks, or (a segment created since) one free range.
  r.pieces.clear();
  if (wanted != nullptr) {
    for (const CheckpointBlock& bs : wanted->blocks) {
      const DevicePtr p = segment->base + bs.offset;
      if (bs.allocated) {
        r.pieces.push_back({p, bs.size, true, true, bs.requested_size});
        r.allocated_after.push_back({p, bs.size, segment->stream, bs.requested_size});
      } else {
        AddFreePieces(segment, p, p + bs.size, &r.pieces);
      }
    }
  } else {
    AddFreePieces(segment, segment->base, segment->base + segment->size, &r.pieces);
  }
  // Neighbouring free pieces of one mapped state are one block (in a handle-aligned segment, mapped ones
  // only within one chunk: block.h).
  r.merged.clear();
  for (const Piece& p : r.pieces) {
    const bool chunk_edge = segment->handle_aligned && p.mapped && segment->vmm->ChunkStartsAt(p.ptr);
    if (!r.merged.empty() && !p.allocated && !r.merged.back().allocated &&
        r.merged.back().mapped == p.mapped && !chunk_edge) {
      r.merged.back().size += p.size;
    } else {
      r.merged.push_back(p);
    }
  }
}

void PoolRestorer::BuildChain(Segment* segment, Rebuild& r) {
  StreamShard& shard = *segment->shard;
  BlockPool& bp = *segment->pool;
  const bool split_counted = !segment->expandable && r.merged.size() > 1;
  Block* prev = nullptr;
  for (const Piece& p : r.merged) {
    Block* b = shard.arena.New();
    b->ptr = p.ptr;
    b->size = p.size;
    b->segment = segment;
    b->mapped = p.mapped;
    b->prev = prev;
    if (prev != nullptr) {
      prev->next = b;
    } else {
      segment->head = b;
    }
    prev = b;
    if (p.allocated) {
      b->allocated = true;
      b->requested_size = p.requested;
      shard.AddToPointerMap(b);
      r.delta->in.AddAllocated(host_.FiguresOf(b, bp.is_small));
    } else if (p.mapped) {
      b->gc_count_base = bp.free_block_lookups;
      bp.Insert(b);
      if (split_counted) r.delta->in.AddInactiveSplit(static_cast<std::int64_t>(b->size));
    } else {
      bp.unmapped.emplace(b->ptr, b);
    }
  }
}

void PoolRestorer::Account(const Rebuild& r) {
  for (const Rebuild::ShardDelta& d : r.deltas) {
    d.shard->NotePeak(stat_events::BlocksReplaced(d.shard->stats, d.small, d.out, d.in));
    d.shard->pool->AddAllocated(d.in.bytes - d.out.bytes, d.in.blocks - d.out.blocks);
  }
  // What was live only before is freed, what is allocated only now is created; the history says so.
  auto key = [](const Live& l) { return std::make_pair(l.ptr, l.size); };
  const std::vector<Live>& before = r.live_before;
  const std::vector<Live>& after = r.allocated_after;
  std::size_t i = 0, j = 0;
  while (i < before.size() || j < after.size()) {
    if (j == after.size() || (i < before.size() && key(before[i]) < key(after[j]))) {
      const Live& l = before[i++];
      result_.freed.push_back(l.ptr);
      host_.RecordFreed(l.ptr, l.requested, l.stream);
    } else if (i == before.size() || key(after[j]) < key(before[i])) {
      const Live& l = after[j++];
      result_.created.push_back({l.ptr, l.size, l.stream});
      host_.RecordAllocated(l.ptr, l.requested, l.stream);
    } else {
      ++i;  // live in both
      ++j;
    }
  }
}

}  // namespace graphalloc
