// PoolSleep: the phases of a sleep and of a wake (pool_sleep.h says what each may leave behind).
#include "graphalloc/allocator/core/pool_sleep.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/invariant_violation.h"
#include "graphalloc/allocator/core/pool_state.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {
namespace {

std::string PoolName(PoolId pool, const std::string& tag) {
  if (pool == kDefaultPool) return "the default pool";
  if (tag.empty()) return absl::StrFormat("pool %d", pool);
  return absl::StrFormat("pool %d (tag '%s')", pool, tag);
}

}  // namespace

struct PoolSleep::Target {
  PoolId id = kDefaultPool;
  std::string tag;
  SleepMode mode = SleepMode::kDiscard;
};

struct PoolSleep::SleepJob {
  struct Chunk {
    Segment* segment;
    ChunkPlacement chunk;
    bool unmapped = false;
    bool released = false;
  };
  struct Backup {
    PoolId pool;
    void* host = nullptr;
    std::size_t size = 0;
    std::size_t capacity = 0;  // of `host`
    bool reused = false;       // `host` was kept by the pool's last wake
    std::vector<BackupRange> ranges;
  };
  std::vector<Target> targets;
  std::vector<Chunk> chunks;
  std::vector<Backup> backups;    // kBackup pools with live blocks
  std::vector<Segment*> marked;   // segments this sleep marked asleep
  std::vector<Segment*> regular;  // wholly free regular segments to free
};

struct PoolSleep::WakeJob {
  struct Chunk {
    Segment* segment;
    ChunkPlacement chunk;     // handle: the one to map (cached, created or left mapped by a failed wake)
    bool was_mapped = false;  // left mapped by an earlier failed wake
    bool has_handle = false;
    bool created = false;     // by this wake
    bool mapped_now = false;  // by this wake
  };
  struct Restore {
    DevicePtr ptr;
    std::size_t size;
    const void* host;
  };
  std::vector<Target> targets;
  std::vector<Chunk> chunks;
  std::vector<Restore> restores;
  bool keep_backup_memory = true;
};

PoolSleep::PoolSleep(SleepHost& host) : host_(host) {}

PoolSleep::~PoolSleep() {
  // At the allocator's end (no other thread left): backups nobody will restore go, errors ignored.
  for (auto& [id, record] : records_) {
    if (record.backup != nullptr) (void)host_.HostFree(record.backup);
  }
  for (const auto& [id, kept] : kept_) (void)host_.HostFree(kept.host);
  for (void* host : stray_backups_) (void)host_.HostFree(host);
}

absl::Status PoolSleep::FreeKeptBackups() {
  absl::btree_map<PoolId, KeptBackup> kept;
  {
    const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
    kept.swap(kept_);
  }
  absl::Status first_error;
  for (auto& [id, buffer] : kept) {
    absl::Status s = host_.HostFree(buffer.host);
    if (s.ok()) continue;
    if (first_error.ok()) first_error = s;
    const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
    kept_.emplace(id, buffer);
  }
  return first_error;
}

bool PoolSleep::InPool(const Segment* segment, PoolId pool) {
  const PoolState* state = segment->shard->pool;
  return state == nullptr ? pool == kDefaultPool : state->id == pool;
}

void PoolSleep::FreeBackup(void* host) {
  if (host_.HostFree(host).ok()) return;
  const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
  stray_backups_.push_back(host);
}

void PoolSleep::MarkAsleep(PoolId pool, const std::string& tag) {
  SpinLockHolder lock(&asleep_mu_);
  if (asleep_.emplace(pool, tag).second) asleep_count_.fetch_add(1, std::memory_order_relaxed);
}

void PoolSleep::MarkAwake(PoolId pool) {
  SpinLockHolder lock(&asleep_mu_);
  if (asleep_.erase(pool) > 0) asleep_count_.fetch_sub(1, std::memory_order_relaxed);
}

bool PoolSleep::IsAsleep(PoolId pool) const {
  if (!any_asleep()) return false;
  SpinLockHolder lock(&asleep_mu_);
  return asleep_.contains(pool);
}

absl::Status PoolSleep::CheckAwake(PoolId pool) const {
  SpinLockHolder lock(&asleep_mu_);
  auto it = asleep_.find(pool);
  if (it == asleep_.end()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      PoolName(pool, it->second), " is asleep: Wake() it before allocating from it (frees are allowed)"));
}

SleepState PoolSleep::StateOf(PoolId pool, const SegmentLedger& segments) const {
  SleepState state;
  if (auto kept = kept_.find(pool); kept != kept_.end()) state.backup_bytes = kept->second.capacity;
  auto it = records_.find(pool);
  if (it == records_.end()) return state;
  state.asleep = true;
  state.backup_bytes += it->second.backup_capacity;
  for (const auto& [base, segment] : segments) {
    if (segment->vmm != nullptr && InPool(segment, pool))
      state.sleeping_bytes += segment->vmm->sleeping_bytes();
  }
  return state;
}

absl::StatusOr<std::vector<PoolSleep::Target>> PoolSleep::Resolve(const DeviceLock& lock,
                                                                  const SleepScope& scope,
                                                                  bool asleep) const {
  std::vector<Target> all;
  switch (scope.kind) {
    case SleepScope::Kind::kAll:
      all.push_back({kDefaultPool, "", SleepMode::kDiscard});
      for (SleepHost::Pool& pool : host_.PrivatePools(lock))
        all.push_back({pool.id, std::move(pool.tag), {}});
      // A pool that went while asleep (it had no memory left to keep it) is woken with the rest: that
      // drops its record and frees its backup.
      for (const auto& [id, record] : records_) {
        if (id != kDefaultPool && !host_.PoolTag(lock, id).has_value()) all.push_back({id, record.tag, {}});
      }
      std::sort(all.begin(), all.end(), [](const Target& a, const Target& b) { return a.id < b.id; });
      break;
    case SleepScope::Kind::kPool:
      if (scope.pool == kDefaultPool) {
        all.push_back({kDefaultPool, "", SleepMode::kDiscard});
      } else if (std::optional<std::string> tag = host_.PoolTag(lock, scope.pool)) {
        all.push_back({scope.pool, *std::move(tag), {}});
      } else {
        return absl::NotFoundError(absl::StrFormat("private pool %d does not exist", scope.pool));
      }
      break;
    case SleepScope::Kind::kTag:
      for (SleepHost::Pool& pool : host_.PrivatePools(lock)) {
        if (pool.tag == scope.tag) all.push_back({pool.id, std::move(pool.tag), {}});
      }
      if (all.empty()) return absl::NotFoundError(absl::StrFormat("no pool has the tag '%s'", scope.tag));
      break;
  }
  std::vector<Target> out;
  for (Target& t : all) {
    if (records_.contains(t.id) == asleep) out.push_back(std::move(t));
  }
  return out;
}

// ---- Sleep. ----

absl::Status PoolSleep::CheckNotPinned(const ShardsLock& /*lock*/, const Segment& segment,
                                       const Target& t) const {
  // A pinned chunk must stay mapped (CachingAllocator::PinMapping), and a communication pool's all do.
  auto pinned = [&](DevicePtr ptr, std::size_t size) {
    const PoolState* pool = segment.shard->pool;
    const bool communication = pool != nullptr && pool->options.communication;
    return absl::FailedPreconditionError(absl::StrFormat(
        "Sleep: %s holds the chunk 0x%x (%d bytes), which must stay mapped (%s); %s", PoolName(t.id, t.tag),
        ptr, size, communication ? "a communication pool's" : "pinned by PinMapping",
        communication ? "communication pools do not sleep" : "unpin it before the pool sleeps"));
  };
  if (segment.vmm == nullptr) {
    if (host_.MustStayMapped(segment, segment.base, segment.base + segment.size))
      return pinned(segment.base, segment.size);
    return absl::OkStatus();
  }
  for (const auto& [ptr, chunk] : segment.vmm->chunks()) {
    if (host_.MustStayMapped(segment, ptr, ptr + chunk.size)) return pinned(ptr, chunk.size);
  }
  return absl::OkStatus();
}

absl::StatusOr<SleepResult> PoolSleep::Sleep(const SleepRequest& request) {
  MutexLock call(&call_mu_);
  // Held throughout: no capture begins while memory it might use is unmapped.
  const std::unique_ptr<GateLock> gate = host_.LockCaptureGate();
  if (host_.CaptureUnderway(*gate)) {
    return absl::FailedPreconditionError(
        "Sleep during a CUDA graph capture: unmapping memory is illegal while capturing; call it after the "
        "capture ends");
  }
  SleepJob job;
  {
    const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
    absl::StatusOr<std::vector<Target>> targets = Resolve(*lock, request.scope, /*asleep=*/false);
    if (!targets.ok()) return targets.status();
    job.targets = *std::move(targets);
  }
  if (job.targets.empty()) return SleepResult{};
  for (Target& t : job.targets) {
    auto mode = request.pool_modes.find(t.id);
    t.mode = mode != request.pool_modes.end() ? mode->second : request.mode;
    MarkAsleep(t.id, t.tag);  // allocations routed to it fail from now on
  }
  if (absl::Status s = Prepare(*gate, request, job.targets, job); !s.ok()) {
    Abandon(job);
    return s;
  }
  if (absl::Status s = BackUp(job); !s.ok()) {
    Abandon(job);
    return s;
  }
  SleepResult result;
  absl::Status error;
  UnmapAndSettle(job, &result, &error);
  if (!error.ok()) return error;
  return result;
}

// The shards' fields it reads and writes are guarded by their locks, which the ShardsLock holds: the analysis
// cannot see through the interface (here and in Abandon).
absl::Status PoolSleep::Prepare(const GateLock& gate, const SleepRequest& request,
                                std::vector<Target>& targets, SleepJob& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // The unmap is not stream-ordered: work queued on the memory (on any stream: blocks may be recorded on
  // others) finishes first.
  if (absl::Status s = host_.WaitForDevice(gate); !s.ok()) return s;
  {
    const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
    std::vector<PoolId> ids;
    for (const Target& t : targets) ids.push_back(t.id);
    host_.FlushQuickCaches(*lock, ids);
    for (const Target& t : targets) {
      std::string regular;  // the pool's regular segments that cannot go, described
      for (Segment* segment : host_.SegmentsOf(*lock, t.id)) {
        if (segment->shard->blocks_in_release > 0) {
          return absl::FailedPreconditionError(absl::StrCat("Sleep: memory of ", PoolName(t.id, t.tag),
                                                            " is being released by another thread; retry"));
        }
        for (const Block* b = segment->head; b != nullptr; b = b->next) {
          if (b->held) {
            return absl::FailedPreconditionError(absl::StrFormat(
                "Sleep: block 0x%x of %s is shared with another process (allocator/ipc); it must stay "
                "mapped until every importer closed it, so the pool cannot sleep now",
                b->ptr, PoolName(t.id, t.tag)));
          }
          if (b->in_flight || b->freeing) {
            return absl::FailedPreconditionError(absl::StrFormat(
                "Sleep: block 0x%x of %s is being changed by another thread (a growth, release or free in "
                "progress); retry",
                b->ptr, PoolName(t.id, t.tag)));
          }
        }
        if (absl::Status s = CheckNotPinned(*lock, *segment, t); !s.ok()) return s;
        if (segment->expandable) continue;
        const Block* head = segment->head;
        const bool wholly_free = head->next == nullptr && !head->allocated && head->event_count == 0;
        if (!request.release_free_regular_segments || !wholly_free) {
          absl::StrAppendFormat(&regular, "%s0x%x (%d bytes, %s)", regular.empty() ? "" : ", ", segment->base,
                                segment->size, wholly_free ? "free" : "in use");
        }
      }
      if (!regular.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("Sleep: ", PoolName(t.id, t.tag),
                         " has regular segments, which cannot keep their addresses while asleep: ", regular,
                         "; use expandable segments for pools that sleep, or free their blocks and set "
                         "SleepRequest::release_free_regular_segments"));
      }
    }
    // Every check passed: from here on the pools' state changes.
    for (const Target& t : targets) {
      for (Segment* segment : host_.SegmentsOf(*lock, t.id)) {
        if (segment->expandable) continue;
        segment->pool->Erase(segment->head);
        ++segment->shard->blocks_in_release;
        job.regular.push_back(segment);
      }
    }
    for (Segment* segment : job.regular) host_.Unlink(*lock, segment);
  }
  if (!job.regular.empty()) {
    // A segment the device refuses to free is cached again as before; the pool then cannot sleep.
    std::vector<Segment*> regular = std::move(job.regular);
    job.regular.clear();
    GRAPHALLOC_RETURN_IF_ERROR(host_.ReleaseSegments(std::move(regular)));
  }
  const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
  for (const Target& t : targets) {
    SleepJob::Backup backup{t.id, nullptr, 0, 0, false, {}};
    for (Segment* segment : host_.SegmentsOf(*lock, t.id)) {
      if (!segment->expandable) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "Sleep: %s gained regular segment 0x%x meanwhile", PoolName(t.id, t.tag), segment->base));
      }
      segment->vmm->set_asleep(true);
      job.marked.push_back(segment);
      for (const ChunkPlacement& c :
           segment->vmm->ChunksWithin(segment->base, segment->base + segment->size)) {
        job.chunks.push_back({segment, c});
      }
      if (t.mode != SleepMode::kBackup) continue;
      for (const Block* b = segment->head; b != nullptr; b = b->next) {
        if (!b->allocated) continue;
        backup.ranges.push_back({b->ptr, b->size, backup.size});
        backup.size += b->size;
      }
    }
    if (!backup.ranges.empty()) job.backups.push_back(std::move(backup));
  }
  return absl::OkStatus();
}

absl::Status PoolSleep::BackUp(SleepJob& job) {
  absl::Status error;
  bool queued = false;
  for (SleepJob::Backup& b : job.backups) {
    KeptBackup kept;
    {
      const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
      if (auto it = kept_.find(b.pool); it != kept_.end()) {
        kept = it->second;
        kept_.erase(it);
      }
    }
    if (kept.host != nullptr && kept.capacity >= b.size) {
      b.host = kept.host;
      b.capacity = kept.capacity;
      b.reused = true;
    } else {
      // Too small for what the pool holds now: a new buffer replaces it.
      if (kept.host != nullptr) FreeBackup(kept.host);
      absl::StatusOr<void*> host = host_.HostAlloc(b.size);
      if (!host.ok()) {
        error = host.status();
        break;
      }
      b.host = *host;
      b.capacity = b.size;
    }
    for (const BackupRange& r : b.ranges) {
      error =
          host_.CopyAsync(reinterpret_cast<DevicePtr>(static_cast<char*>(b.host) + r.offset), r.ptr, r.size);
      if (!error.ok()) break;
      queued = true;
    }
    if (!error.ok()) break;
  }
  // The copies must have landed before the memory goes (or, after a failure, before the backup does).
  if (queued) {
    absl::Status s = host_.SynchronizeCopies();
    if (!s.ok() && error.ok()) error = s;
  }
  return error;
}

void PoolSleep::Abandon(SleepJob& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!job.regular.empty()) {
    // Unlinked but not freed (a failure came before): cached again, as they were.
    const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
    for (Segment* segment : job.regular) {
      host_.Link(*lock, segment);
      segment->pool->Insert(segment->head);
      --segment->shard->blocks_in_release;
    }
  }
  for (SleepJob::Backup& b : job.backups) {
    if (b.host == nullptr) continue;
    if (b.reused) {  // the pool's kept buffer, kept again
      const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
      kept_.emplace(b.pool, KeptBackup{b.host, b.capacity});
      continue;
    }
    FreeBackup(b.host);
  }
  {
    const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
    for (Segment* segment : job.marked) segment->vmm->set_asleep(false);
  }
  for (const Target& t : job.targets) MarkAwake(t.id);
}

void PoolSleep::UnmapAndSettle(SleepJob& job, SleepResult* result, absl::Status* error) {
  std::size_t stuck_bytes = 0;
  for (SleepJob::Chunk& c : job.chunks) {
    host_.ReportUnmapped(*c.segment, c.chunk);
    absl::Status s = host_.UnmapChunk(c.chunk);
    if (!s.ok()) {
      host_.ReportMapped(*c.segment, c.chunk);  // still mapped, asleep
      if (error->ok()) *error = s;
      stuck_bytes += c.chunk.size;
      continue;
    }
    c.unmapped = true;
    s = host_.ReleaseHandle(c.chunk.handle);
    c.released = s.ok();
    if (!s.ok() && error->ok()) *error = s;
  }
  const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
  for (const SleepJob::Chunk& c : job.chunks) {
    if (!c.unmapped) continue;  // stays mapped and reserved: the pool sleeps with it
    host_.AccountAsleep(*lock, c.segment, c.chunk);
    if (c.released) {
      result->bytes_released += c.chunk.size;
    } else {
      host_.CacheHandle(*lock, c.chunk);  // not leaked: EmptyCache releases it
    }
  }
  for (const Target& t : job.targets) {
    Record record{t.mode, t.tag, nullptr, 0, 0, {}};
    for (SleepJob::Backup& b : job.backups) {
      if (b.pool != t.id) continue;
      record.backup = b.host;
      record.backup_size = b.size;
      record.backup_capacity = b.capacity;
      record.ranges = std::move(b.ranges);
      result->bytes_backed_up += b.size;
    }
    records_.emplace(t.id, std::move(record));
    result->pools.push_back(t.id);
  }
  if (!error->ok()) {
    *error = absl::Status(
        error->code(), absl::StrFormat("Sleep: the pools sleep, but %d bytes stay mapped or unreleased (%s); "
                                       "%d bytes were released",
                                       stuck_bytes, error->message(), result->bytes_released));
  }
}

// ---- Wake. ----

absl::StatusOr<WakeResult> PoolSleep::Wake(const WakeRequest& request) {
  MutexLock call(&call_mu_);
  const std::unique_ptr<GateLock> gate = host_.LockCaptureGate();
  if (host_.CaptureUnderway(*gate)) {
    return absl::FailedPreconditionError(
        "Wake during a CUDA graph capture: mapping memory is illegal while capturing; call it after the "
        "capture ends");
  }
  WakeJob job;
  job.keep_backup_memory = request.keep_backup_memory;
  {
    const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
    absl::StatusOr<std::vector<Target>> targets = Resolve(*lock, request.scope, /*asleep=*/true);
    if (!targets.ok()) return targets.status();
    job.targets = *std::move(targets);
    for (const Target& t : job.targets) {
      const Record& record = records_.at(t.id);
      for (Segment* segment : host_.SegmentsOf(*lock, t.id)) {
        if (segment->vmm == nullptr) continue;
        for (const auto& [ptr, chunk] : segment->vmm->sleeping_chunks()) {
          WakeJob::Chunk c{segment, {ptr, chunk.size, chunk.handle}, chunk.mapped, chunk.mapped};
          if (!c.has_handle)
            c.has_handle = host_.TakeCachedHandle(*lock, *segment, chunk.size, &c.chunk.handle);
          job.chunks.push_back(c);
        }
      }
      // Only blocks still allocated are restored: a block freed while asleep has nothing worth keeping.
      for (const BackupRange& r : record.ranges) {
        const Segment* segment = host_.SegmentContaining(*lock, r.ptr);
        if (segment == nullptr) continue;  // cannot happen: a sleeping segment keeps its reservation
        for (const Block* b = segment->head; b != nullptr; b = b->next) {
          if (b->ptr != r.ptr) continue;
          if (b->allocated && b->size == r.size) {
            job.restores.push_back({r.ptr, r.size, static_cast<const char*>(record.backup) + r.offset});
          }
          break;
        }
      }
    }
  }
  if (job.targets.empty()) return WakeResult{};
  WakeResult result;
  absl::Status error = MapAll(job);
  if (error.ok()) error = Restore(job, &result);
  if (!error.ok()) {
    result.bytes_restored = 0;
    UndoMaps(job);
  } else {
    // Mapped and accessible, before any block of it is handed out (a chunk mapped before this wake was
    // reported then).
    for (const WakeJob::Chunk& c : job.chunks) {
      if (c.mapped_now) host_.ReportMapped(*c.segment, c.chunk);
    }
  }
  SettleWake(job, &result, &error);
  if (!error.ok()) return error;
  return result;
}

absl::Status PoolSleep::MapAll(WakeJob& job) {
  std::vector<int> peers;
  {
    const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
    peers = host_.Peers(*lock);
  }
  for (WakeJob::Chunk& c : job.chunks) {
    if (c.was_mapped) continue;
    if (!c.has_handle) {
      absl::StatusOr<PhysicalHandle> handle = host_.CreateHandle(*c.segment, c.chunk.size);
      if (!handle.ok()) return handle.status();
      c.chunk.handle = *handle;
      c.has_handle = c.created = true;
    }
    GRAPHALLOC_RETURN_IF_ERROR(host_.MapChunk(c.chunk));
    c.mapped_now = true;
  }
  // Access last, once everything is mapped: a chunk left mapped by an earlier failure gets it here too.
  for (const WakeJob::Chunk& c : job.chunks) {
    GRAPHALLOC_RETURN_IF_ERROR(host_.SetAccess(c.chunk, peers));
  }
  return absl::OkStatus();
}

absl::Status PoolSleep::Restore(WakeJob& job, WakeResult* result) {
  absl::Status error;
  bool queued = false;
  for (const WakeJob::Restore& r : job.restores) {
    error = host_.CopyAsync(r.ptr, reinterpret_cast<DevicePtr>(r.host), r.size);
    if (!error.ok()) break;
    queued = true;
    result->bytes_restored += r.size;
  }
  // Landed before Wake returns (the memory is then ready for any stream), or before a failure unmaps it.
  if (queued) {
    absl::Status s = host_.SynchronizeCopies();
    if (!s.ok() && error.ok()) error = s;
  }
  return error;
}

void PoolSleep::UndoMaps(WakeJob& job) {
  for (WakeJob::Chunk& c : job.chunks) {
    if (!c.mapped_now && !c.was_mapped) continue;
    // Observers know of a chunk mapped before this wake, not yet of one this wake mapped.
    if (c.was_mapped) host_.ReportUnmapped(*c.segment, c.chunk);
    if (!host_.UnmapChunk(c.chunk).ok()) {
      host_.ReportMapped(*c.segment, c.chunk);
      c.mapped_now = c.was_mapped = true;  // stays mapped, asleep: the next wake reuses it
      continue;
    }
    c.mapped_now = c.was_mapped = false;
  }
  for (WakeJob::Chunk& c : job.chunks) {
    if (!c.has_handle || c.mapped_now) continue;
    // Unmapped now: the handle goes back to the device, or (refused) to the cache, where EmptyCache
    // retries it.
    if (host_.ReleaseHandle(c.chunk.handle).ok()) c.has_handle = false;
  }
}

void PoolSleep::SettleWake(WakeJob& job, WakeResult* result, absl::Status* error) {
  std::vector<void*> backups;
  {
    const std::unique_ptr<ShardsLock> lock = host_.LockAllShards();
    if (!error->ok()) {
      for (const WakeJob::Chunk& c : job.chunks) {
        if (c.mapped_now) {
          c.segment->vmm->SetSleepingMapping(c.chunk.ptr, true, c.chunk.handle);
          continue;
        }
        c.segment->vmm->SetSleepingMapping(c.chunk.ptr, false, {});
        if (c.has_handle) host_.CacheHandle(*lock, c.chunk);
      }
      *error = absl::Status(
          error->code(), absl::StrCat("Wake: the pools stay asleep, their backups kept: ", error->message()));
      return;
    }
    for (const WakeJob::Chunk& c : job.chunks) {
      host_.AccountAwake(*lock, c.segment, c.chunk);
      result->bytes_mapped += c.chunk.size;
    }
    for (const Target& t : job.targets) {
      for (Segment* segment : host_.SegmentsOf(*lock, t.id)) {
        if (segment->vmm != nullptr) segment->vmm->set_asleep(false);
      }
      auto it = records_.find(t.id);
      const Record& record = it->second;
      // A pool gone while asleep will not sleep again.
      const bool keep =
          job.keep_backup_memory && (t.id == kDefaultPool || host_.PoolTag(*lock, t.id).has_value());
      // The pool has no kept buffer now: its backed-up sleep took it (CheckInvariants).
      if (record.backup != nullptr && keep) {
        kept_.emplace(t.id, KeptBackup{record.backup, record.backup_capacity});
      } else if (record.backup != nullptr) {
        backups.push_back(record.backup);
      }
      records_.erase(it);
      result->pools.push_back(t.id);
    }
  }
  for (const Target& t : job.targets) MarkAwake(t.id);
  for (void* host : backups) {
    absl::Status s = host_.HostFree(host);
    if (s.ok()) continue;
    if (error->ok()) *error = s;
    const std::unique_ptr<DeviceLock> lock = host_.LockDevice();
    stray_backups_.push_back(host);
  }
}

// ---- Invariants. ----

absl::Status PoolSleep::CheckInvariants(const SegmentLedger& segments) const {
  // A Sleep or Wake runs its phases with no lock but call_mu_ held between them, so the records and the
  // marks may disagree while one is under way. Taken without waiting, call_mu_ says whether one is, and
  // keeps any from starting while the checks run.
  const bool idle = call_mu_.TryLock();
  absl::Status status = CheckInvariants(segments, idle);
  if (idle) call_mu_.Unlock();
  return status;
}

absl::Status PoolSleep::CheckInvariants(const SegmentLedger& segments, bool idle) const {
  for (const auto& [base, segment] : segments) {
    if (segment->vmm == nullptr) continue;
    const PoolId pool = segment->shard->pool == nullptr ? kDefaultPool : segment->shard->pool->id;
    std::size_t bytes = 0;
    for (const auto& [ptr, chunk] : segment->vmm->sleeping_chunks()) bytes += chunk.size;
    if (bytes != segment->vmm->sleeping_bytes()) {
      return InvariantViolation(
          absl::StrFormat("segment 0x%x: sleeping chunks add up to %d bytes, the segment says %d", base,
                          bytes, segment->vmm->sleeping_bytes()));
    }
    // A sleep under way marks and unmaps its segments before it writes the pool's record: meanwhile the
    // pool is in asleep_ only.
    if ((bytes > 0 || segment->vmm->asleep()) && !records_.contains(pool) && (idle || !IsAsleep(pool))) {
      return InvariantViolation(
          absl::StrFormat("segment 0x%x has sleeping memory but %s is awake", base, PoolName(pool, "")));
    }
    if (!segment->expandable && records_.contains(pool)) {
      return InvariantViolation(
          absl::StrFormat("regular segment 0x%x is in sleeping %s", base, PoolName(pool, "")));
    }
  }
  // Outside a Sleep or Wake call a pool refuses allocations as asleep exactly when it has a record.
  if (idle) {
    SpinLockHolder lock(&asleep_mu_);
    for (const auto& [id, tag] : asleep_) {
      if (!records_.contains(id)) {
        return InvariantViolation(
            absl::StrFormat("%s refuses allocations as asleep but has no sleep record", PoolName(id, tag)));
      }
    }
  }
  for (const auto& [id, record] : records_) {
    std::size_t bytes = 0;
    for (const BackupRange& r : record.ranges) {
      if (r.offset != bytes) {
        return InvariantViolation(
            absl::StrFormat("the backup of %s is not packed", PoolName(id, record.tag)));
      }
      bytes += r.size;
    }
    if (bytes != record.backup_size || (bytes > 0) != (record.backup != nullptr) ||
        record.backup_capacity < bytes) {
      return InvariantViolation(absl::StrFormat("the backup of %s holds %d bytes in %d pinned, its ranges %d",
                                                PoolName(id, record.tag), record.backup_size,
                                                record.backup_capacity, bytes));
    }
    if (!IsAsleep(id)) {
      return InvariantViolation(absl::StrFormat("%s has a sleep record but allocations from it are allowed",
                                                PoolName(id, record.tag)));
    }
    if (record.backup != nullptr && kept_.contains(id)) {
      return InvariantViolation(
          absl::StrFormat("%s holds a backup and a kept buffer at once", PoolName(id, record.tag)));
    }
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
