// AllocatorRestoreHost: each method one call into the allocator's part that owns the state, under the lock
// restore_host.h says.
#include "graphalloc/allocator/core/allocator_restore_host.h"

#include <optional>
#include <span>

#include "graphalloc/allocator/core/mapping_hooks.h"

namespace graphalloc {

// The PoolLock this host hands out: a PoolShardsLock, which CheckPoolQuiet needs as such.
class AllocatorRestoreHost::Lock final : public RestoreHost::PoolLock {
 public:
  Lock(const ShardTable& table, PoolId pool, Mutex& device_mu) : shards(table, pool, device_mu) {}
  bool Holds(const StreamShard* shard) const override { return shards.Holds(shard); }

  PoolShardsLock shards;
};

AllocatorRestoreHost::AllocatorRestoreHost(const Parts& parts)
    : driver_(parts.driver),
      history_(parts.history),
      shards_(parts.shards),
      blocks_(parts.blocks),
      device_mu_(parts.device_mu),
      segments_(parts.segments),
      expandable_(parts.expandable),
      captures_(parts.captures) {}

const PoolShardsLock& AllocatorRestoreHost::ShardsOf(const PoolLock& lock) {
  return static_cast<const Lock&>(lock).shards;
}

// ---- Locks. ----

std::unique_ptr<RestoreHost::PoolLock> AllocatorRestoreHost::LockPool(PoolId pool) {
  return std::make_unique<Lock>(shards_, pool, device_mu_);
}

void AllocatorRestoreHost::WithUnmapGate(absl::FunctionRef<void(bool device_idle)> unmaps) {
  MutexLock gate(&captures_.gate());
  const bool device_idle = captures_.WaitForWorkBeforeUnmap(std::nullopt).ok();
  unmaps(device_idle);
}

// ---- The pool's segments. ----

absl::Status AllocatorRestoreHost::CheckQuiet(const PoolLock& lock) const {
  return CheckPoolQuiet(ShardsOf(lock), segments_, expandable_);
}

std::vector<Segment*> AllocatorRestoreHost::SegmentsOf(const PoolLock& lock) const {
  std::vector<Segment*> out;
  for (const auto& [base, segment] : segments_) {
    if (lock.Holds(segment->shard)) out.push_back(segment);
  }
  return out;
}

Segment* AllocatorRestoreHost::FindSegment(const PoolLock& /*lock*/, DevicePtr base) const {
  return segments_.Find(base);
}

// ---- The pool's blocks. ----

void AllocatorRestoreHost::FlushQuickCaches(const PoolLock& lock) {
  for (StreamShard* shard : ShardsOf(lock).shards()) blocks_.FlushQuickCache(*shard);
}

Block* AllocatorRestoreHost::SplitOff(const PoolLock& /*lock*/, StreamShard& shard, Block* b, DevicePtr at) {
  return blocks_.SplitOff(shard, b, at);
}

Block* AllocatorRestoreHost::CarveRange(const PoolLock& /*lock*/, StreamShard& shard, Block* b,
                                        DevicePtr begin, DevicePtr end) {
  return blocks_.CarveRange(shard, b, begin, end);
}

stat_events::BlockFigures AllocatorRestoreHost::FiguresOf(const Block* block, bool small) const {
  return blocks_.FiguresOf(block, small);
}

// ---- Chunks of expandable segments. ----

std::size_t AllocatorRestoreHost::Granularity() const { return driver_.Info().granularity; }

absl::Status AllocatorRestoreHost::RepairQuarantinedChunks() { return expandable_.RepairQuarantinedChunks(); }

std::vector<int> AllocatorRestoreHost::Peers(const PoolLock& /*lock*/) const { return expandable_.peers(); }

absl::StatusOr<PhysicalHandle> AllocatorRestoreHost::CreateHandle(const PoolState* pool, std::size_t size) {
  return expandable_.CreateHandleOrReleaseCache(pool, size);
}

absl::Status AllocatorRestoreHost::MapChunk(const ChunkPlacement& chunk, const std::vector<int>& peers,
                                            std::vector<ChunkPlacement>* no_access) {
  return MapChunks(driver_, std::span<const ChunkPlacement>(&chunk, 1), peers, no_access);
}

absl::Status AllocatorRestoreHost::UnmapChunk(const ChunkPlacement& chunk) {
  return driver_.MemUnmap(chunk.ptr, chunk.size);
}

absl::Status AllocatorRestoreHost::ReleaseHandle(PhysicalHandle handle) { return driver_.MemRelease(handle); }

void AllocatorRestoreHost::CacheHandle(const PoolLock& /*lock*/, const ChunkPlacement& chunk) {
  expandable_.CacheHandle(chunk);
}

void AllocatorRestoreHost::LockAndCacheHandle(const ChunkPlacement& chunk) {
  MutexLock lock(&device_mu_);
  expandable_.CacheHandle(chunk);
}

bool AllocatorRestoreHost::MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const {
  return expandable_.MustStayMapped(segment, begin, end);
}

void AllocatorRestoreHost::ReportMapped(const Segment& segment, const ChunkPlacement& chunk) {
  expandable_.hooks().Map(PoolOf(segment), chunk.ptr, chunk.size, chunk.handle, /*expandable=*/true);
}

void AllocatorRestoreHost::ReportUnmapped(const Segment& segment, const ChunkPlacement& chunk) {
  expandable_.hooks().Unmap(PoolOf(segment), chunk.ptr, chunk.size, chunk.handle, /*expandable=*/true);
}

void AllocatorRestoreHost::SettleInFlight(const PoolLock& /*lock*/, StreamShard& shard, Block* b,
                                          const ChunkPlacement& chunk, bool mapped, bool no_access) {
  expandable_.SettleInFlight(shard, b, std::span<const ChunkPlacement>(&chunk, 1), std::vector<bool>{mapped},
                             std::vector<bool>{no_access});
}

void AllocatorRestoreHost::AccountMapped(const PoolLock& /*lock*/, Segment* segment,
                                         const ChunkPlacement& chunk) {
  segments_.ChunkMapped(segment, chunk);
}

void AllocatorRestoreHost::AccountUnmapped(const PoolLock& /*lock*/, Segment* segment,
                                           const ChunkPlacement& chunk) {
  segments_.ChunkUnmapped(segment, chunk);
}

// ---- History. ----

void AllocatorRestoreHost::RecordFreed(DevicePtr ptr, std::size_t requested, Stream stream) {
  history_.Record(HistoryAction::kFreeCompleted, ptr, requested, static_cast<std::uint64_t>(stream), 0);
}

void AllocatorRestoreHost::RecordAllocated(DevicePtr ptr, std::size_t requested, Stream stream) {
  history_.Record(HistoryAction::kAlloc, ptr, requested, static_cast<std::uint64_t>(stream), 0);
}

}  // namespace graphalloc
