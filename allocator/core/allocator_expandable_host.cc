// AllocatorExpandableHost: each method one call into the allocator's part that owns the state, under the
// lock expandable_host.h says. The locks are the allocator's own scoped locks, held inside the objects
// handed out.
#include "graphalloc/allocator/core/allocator_expandable_host.h"

namespace graphalloc {

class AllocatorExpandableHost::ShardLock final : public Lock {
 public:
  explicit ShardLock(StreamShard& shard) : lock_(&shard.mu) {}

 private:
  SpinLockHolder lock_;
};

class AllocatorExpandableHost::DeviceLock final : public Lock {
 public:
  explicit DeviceLock(Mutex& device_mu) : lock_(&device_mu) {}

 private:
  MutexLock lock_;
};

class AllocatorExpandableHost::AllLock final : public AllShards {
 public:
  AllLock(const ShardTable& table, Mutex& device_mu) : lock_(table, device_mu) {}
  void ForEach(absl::FunctionRef<void(StreamShard&)> f) const override {
    lock_.ForEach([&](StreamShard* shard) { f(*shard); });
  }

 private:
  graphalloc::AllShardsLock lock_;
};

class AllocatorExpandableHost::Gate final : public UnmapGate {
 public:
  explicit Gate(CaptureTracker& captures) : captures_(captures), lock_(&captures.gate()) {}
  absl::Status WaitForWorkBeforeUnmap(std::optional<Stream> stream) ABSL_NO_THREAD_SAFETY_ANALYSIS override {
    return captures_.WaitForWorkBeforeUnmap(stream);  // the gate is held by lock_
  }

 private:
  CaptureTracker& captures_;
  MutexLock lock_;
};

AllocatorExpandableHost::AllocatorExpandableHost(const Parts& parts)
    : shards_(parts.shards),
      blocks_(parts.blocks),
      device_mu_(parts.device_mu),
      segments_(parts.segments),
      budget_(parts.budget),
      captures_(parts.captures) {}

// ---- Locks. ----

std::unique_ptr<ExpandableHost::Lock> AllocatorExpandableHost::LockShard(StreamShard& shard) {
  return std::make_unique<ShardLock>(shard);
}

std::unique_ptr<ExpandableHost::Lock> AllocatorExpandableHost::LockDevice() {
  return std::make_unique<DeviceLock>(device_mu_);
}

std::unique_ptr<ExpandableHost::AllShards> AllocatorExpandableHost::LockAllShards() {
  return std::make_unique<AllLock>(shards_, device_mu_);
}

std::unique_ptr<ExpandableHost::UnmapGate> AllocatorExpandableHost::EnterUnmapGate() {
  return std::make_unique<Gate>(captures_);
}

// ---- A locked shard's blocks. ----

DevicePtr AllocatorExpandableHost::AllocateBestFit(StreamShard& shard, const AllocationRequest& request) {
  return blocks_.AllocateBestFit(shard, request);
}

GrowthPlanner AllocatorExpandableHost::Planner(StreamShard& shard, BlockPool& pool, std::size_t size,
                                               std::size_t granularity, GrowthPlan* plan) {
  return GrowthPlanner(shard, pool, blocks_, size, granularity, plan);
}

Block* AllocatorExpandableHost::SplitOff(StreamShard& shard, Block* b, DevicePtr at) {
  return blocks_.SplitOff(shard, b, at);
}

Block* AllocatorExpandableHost::CarveRange(StreamShard& shard, Block* b, DevicePtr begin, DevicePtr end) {
  return blocks_.CarveRange(shard, b, begin, end);
}

void AllocatorExpandableHost::ReturnToIndex(StreamShard& shard, Block* b) { blocks_.ReturnToIndex(shard, b); }

void AllocatorExpandableHost::FlushQuickCache(StreamShard& shard) { blocks_.FlushQuickCache(shard); }

// ---- Segments (device lock held). ----

void AllocatorExpandableHost::AddReservation(Segment* segment) {
  device_mu_.AssertHeld();
  segments_.AddReservation(segment);
}

void AllocatorExpandableHost::RemoveReservation(Segment* segment) {
  device_mu_.AssertHeld();
  segments_.RemoveReservation(segment);
}

void AllocatorExpandableHost::ChunkMapped(Segment* segment, const ChunkPlacement& chunk) {
  device_mu_.AssertHeld();
  segments_.ChunkMapped(segment, chunk);
}

void AllocatorExpandableHost::ChunkUnmapped(Segment* segment, const ChunkPlacement& chunk) {
  device_mu_.AssertHeld();
  segments_.ChunkUnmapped(segment, chunk);
}

std::vector<Segment*> AllocatorExpandableHost::Segments() const {
  device_mu_.AssertHeld();
  std::vector<Segment*> out;
  out.reserve(segments_.size());
  for (const auto& [base, segment] : segments_) out.push_back(segment);
  return out;
}

Segment* AllocatorExpandableHost::FindSegment(DevicePtr base) const {
  device_mu_.AssertHeld();
  return segments_.Find(base);
}

// ---- Admission of growth (device lock held). ----

std::size_t AllocatorExpandableHost::Committed(std::size_t cached, std::size_t extra) const {
  device_mu_.AssertHeld();
  return budget_.Committed(segments_.reserved_bytes(), cached, extra);
}

std::size_t AllocatorExpandableHost::Capacity() const {
  device_mu_.AssertHeld();
  return budget_.capacity();
}

bool AllocatorExpandableHost::OverLimit(std::size_t cached, std::size_t extra) const {
  device_mu_.AssertHeld();
  return budget_.OverLimit(segments_.reserved_bytes(), cached, extra);
}

bool AllocatorExpandableHost::AdmitNewHandles(std::size_t cached, std::size_t bytes) {
  device_mu_.AssertHeld();
  return budget_.AdmitNewHandles(segments_.reserved_bytes(), cached, bytes);
}

void AllocatorExpandableHost::BeginGrowth(std::size_t bytes) {
  device_mu_.AssertHeld();
  budget_.BeginGrowth(bytes);
}

void AllocatorExpandableHost::EndGrowth(std::size_t bytes) {
  device_mu_.AssertHeld();
  budget_.EndGrowth(bytes);
}

std::size_t AllocatorExpandableHost::GrowthInFlight() const {
  device_mu_.AssertHeld();
  return budget_.growth_in_flight();
}

// ---- Captures. ----

bool AllocatorExpandableHost::CaptureUnderway() const { return captures_.underway(); }

}  // namespace graphalloc
