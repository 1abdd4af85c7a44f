// AllocatorSleepHost: each method one call into the allocator's part that owns the state, under the lock
// sleep_host.h says.
#include "graphalloc/allocator/core/allocator_sleep_host.h"

#include <algorithm>

#include "graphalloc/allocator/core/mapping_hooks.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {

// The locks this host hands out: each holds the allocator's own scoped lock for its lifetime.
class AllocatorSleepHost::Gate final : public SleepHost::GateLock {
 public:
  explicit Gate(Mutex& gate) : lock_(&gate) {}

 private:
  MutexLock lock_;
};

class AllocatorSleepHost::Device final : public SleepHost::DeviceLock {
 public:
  explicit Device(Mutex& device_mu) : lock_(&device_mu) {}

 private:
  MutexLock lock_;
};

class AllocatorSleepHost::Shards final : public SleepHost::ShardsLock {
 public:
  Shards(const ShardTable& table, Mutex& device_mu) : lock_(table, device_mu) {}

 private:
  AllShardsLock lock_;
};

AllocatorSleepHost::AllocatorSleepHost(const Parts& parts)
    : driver_(parts.driver),
      shards_(parts.shards),
      blocks_(parts.blocks),
      device_mu_(parts.device_mu),
      segments_(parts.segments),
      pools_(parts.pools),
      expandable_(parts.expandable),
      captures_(parts.captures),
      releaser_(parts.releaser) {}

// ---- Locks. ----

std::unique_ptr<SleepHost::GateLock> AllocatorSleepHost::LockCaptureGate() {
  return std::make_unique<Gate>(captures_.gate());
}

std::unique_ptr<SleepHost::DeviceLock> AllocatorSleepHost::LockDevice() {
  return std::make_unique<Device>(device_mu_);
}

std::unique_ptr<SleepHost::ShardsLock> AllocatorSleepHost::LockAllShards() {
  return std::make_unique<Shards>(shards_, device_mu_);
}

// ---- The capture gate. ----

bool AllocatorSleepHost::CaptureUnderway(const GateLock& /*gate*/) const { return captures_.underway(); }

absl::Status AllocatorSleepHost::WaitForDevice(const GateLock& /*gate*/) {
  captures_.gate().AssertHeld();
  return captures_.WaitForWorkBeforeUnmap(std::nullopt);
}

// ---- Pools and their segments. ----

std::vector<SleepHost::Pool> AllocatorSleepHost::PrivatePools(const DeviceLock& /*lock*/) const {
  device_mu_.AssertHeld();
  std::vector<Pool> out;
  pools_.ForEach([&](PoolId id, const PoolState& pool) { out.push_back({id, pool.options.tag}); });
  return out;
}

std::optional<std::string> AllocatorSleepHost::PoolTag(const DeviceLock& /*lock*/, PoolId id) const {
  device_mu_.AssertHeld();
  const PoolState* pool = pools_.Find(id);
  if (pool == nullptr) return std::nullopt;
  return pool->options.tag;
}

std::vector<Segment*> AllocatorSleepHost::SegmentsOf(const DeviceLock& /*lock*/, PoolId pool) const {
  device_mu_.AssertHeld();
  std::vector<Segment*> out;
  for (const auto& [base, segment] : segments_) {
    if (PoolOf(*segment) == pool) out.push_back(segment);
  }
  return out;
}

Segment* AllocatorSleepHost::SegmentContaining(const DeviceLock& /*lock*/, DevicePtr ptr) const {
  device_mu_.AssertHeld();
  return segments_.Containing(ptr);
}

// ---- Blocks and regular segments. ----

void AllocatorSleepHost::FlushQuickCaches(const ShardsLock& /*lock*/, const std::vector<PoolId>& pools) {
  shards_.ForEach([&](StreamShard* shard) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // every shard is locked
    const PoolId id = shard->pool == nullptr ? kDefaultPool : shard->pool->id;
    if (std::find(pools.begin(), pools.end(), id) != pools.end()) blocks_.FlushQuickCache(*shard);
  });
}

void AllocatorSleepHost::Unlink(const ShardsLock& /*lock*/, Segment* segment) {
  device_mu_.AssertHeld();
  segments_.Unlink(segment);
}

void AllocatorSleepHost::Link(const ShardsLock& /*lock*/, Segment* segment) {
  device_mu_.AssertHeld();
  segments_.Link(segment);
}

absl::Status AllocatorSleepHost::ReleaseSegments(std::vector<Segment*> segments) {
  return releaser_.Release(std::move(segments));
}

// ---- Chunks of expandable segments. ----

bool AllocatorSleepHost::MustStayMapped(const Segment& segment, DevicePtr begin, DevicePtr end) const {
  return expandable_.MustStayMapped(segment, begin, end);
}

std::vector<int> AllocatorSleepHost::Peers(const DeviceLock& /*lock*/) const { return expandable_.peers(); }

bool AllocatorSleepHost::TakeCachedHandle(const DeviceLock& /*lock*/, const Segment& segment,
                                          std::size_t size, PhysicalHandle* handle) {
  return expandable_.TakeCachedHandle(segment.shard->pool, size, handle);
}

void AllocatorSleepHost::CacheHandle(const DeviceLock& /*lock*/, const ChunkPlacement& chunk) {
  expandable_.CacheHandle(chunk);
}

absl::StatusOr<PhysicalHandle> AllocatorSleepHost::CreateHandle(const Segment& segment, std::size_t size) {
  return expandable_.CreateHandle(segment.shard->pool, size);
}

absl::Status AllocatorSleepHost::MapChunk(const ChunkPlacement& chunk) {
  return driver_.MemMap(chunk.ptr, chunk.size, chunk.handle);
}

absl::Status AllocatorSleepHost::SetAccess(const ChunkPlacement& chunk, const std::vector<int>& peers) {
  return driver_.MemSetAccess(chunk.ptr, chunk.size, peers);
}

absl::Status AllocatorSleepHost::UnmapChunk(const ChunkPlacement& chunk) {
  return driver_.MemUnmap(chunk.ptr, chunk.size);
}

absl::Status AllocatorSleepHost::ReleaseHandle(PhysicalHandle handle) { return driver_.MemRelease(handle); }

void AllocatorSleepHost::ReportMapped(const Segment& segment, const ChunkPlacement& chunk) {
  expandable_.hooks().Map(PoolOf(segment), chunk.ptr, chunk.size, chunk.handle, /*expandable=*/true);
}

void AllocatorSleepHost::ReportUnmapped(const Segment& segment, const ChunkPlacement& chunk) {
  expandable_.hooks().Unmap(PoolOf(segment), chunk.ptr, chunk.size, chunk.handle, /*expandable=*/true);
}

void AllocatorSleepHost::AccountAsleep(const ShardsLock& /*lock*/, Segment* segment,
                                       const ChunkPlacement& chunk) {
  device_mu_.AssertHeld();
  segments_.ChunkAsleep(segment, chunk);
}

void AllocatorSleepHost::AccountAwake(const ShardsLock& /*lock*/, Segment* segment,
                                      const ChunkPlacement& chunk) {
  device_mu_.AssertHeld();
  segments_.ChunkAwake(segment, chunk);
}

// ---- Pinned host memory and copies. ----

absl::StatusOr<void*> AllocatorSleepHost::HostAlloc(std::size_t size) { return driver_.HostAlloc(size); }

absl::Status AllocatorSleepHost::HostFree(void* host) { return driver_.HostFree(host); }

absl::Status AllocatorSleepHost::CopyAsync(DevicePtr dst, DevicePtr src, std::size_t size) {
  return driver_.CopyAsync(dst, src, size, kDefaultStream);
}

absl::Status AllocatorSleepHost::SynchronizeCopies() { return driver_.StreamSynchronize(kDefaultStream); }

}  // namespace graphalloc
