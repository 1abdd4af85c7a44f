// The hot path: find the stream's shard, allocate from and free into its cache; plus the small public
// operations.
#include "graphalloc/allocator/core/caching_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/core/invariant_checker.h"
#include "graphalloc/allocator/core/size_policy.h"

namespace graphalloc {
namespace {

std::atomic<std::uint64_t> next_allocator_id{1};

// The shard this thread used last, so that the common case (one thread, one stream) finds its shard and
// the owner of a pointer it frees without searching.
struct ShardCache {
  std::uint64_t allocator_id = 0;
  PoolId pool = kDefaultPool;
  Stream stream = kDefaultStream;
  StreamShard* shard = nullptr;
  std::uint64_t generation = 0;  // the shard's, when cached: a reused shard no longer matches
};
thread_local ShardCache tls_shard;

// What is wrong with passing `ptr` to `operation` when it lies in `segment` (its shard locked): a double
// free, or an address inside a block; empty when neither.
std::string MisusedBlock(const Segment& segment, absl::string_view operation, DevicePtr ptr) {
  for (const Block* b = segment.head; b != nullptr; b = b->next) {
    if (b->ptr == ptr && !b->allocated) {
      return absl::StrFormat(
          "%s(0x%x): double free: the block at this address is not allocated (it was freed already); every "
          "other allocation is unchanged",
          operation, ptr);
    }
    if (b->ptr == ptr && b->freeing) {
      return absl::StrFormat("%s(0x%x): double free: another Free() of this block is in progress", operation,
                             ptr);
    }
    if (ptr > b->ptr && ptr < b->end()) {
      return absl::StrFormat(
          "%s(0x%x): pointer is inside the %s block at 0x%x (%d bytes), not its start; pass the address "
          "Allocate() returned",
          operation, ptr, b->allocated ? "allocated" : "free", b->ptr, b->size);
    }
  }
  return "";
}

absl::Status RequestTooLarge(std::size_t bytes) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory: tried to allocate %d bytes, more than 1 EiB; no device has that much memory", bytes));
}

absl::Status NoShardLeft(Stream stream) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "Allocate on stream 0x%x: this allocator already serves %d (pool, stream) pairs, its maximum; reuse "
      "streams (a stream pool) instead of creating one per operation",
      static_cast<std::uintptr_t>(stream), ShardTable::kMaxShards));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CachingAllocator>> CachingAllocator::Create(std::shared_ptr<Driver> driver,
                                                                           Config config) {
  if (driver == nullptr) return absl::InvalidArgumentError("CachingAllocator::Create: driver is null");
  std::unique_ptr<CachingAllocator> allocator(new CachingAllocator(std::move(driver), config));
  if (config.record_history) {
    // Config::Parse checks these; a Config built in code may still hold a value the ring refuses.
    if (absl::Status s = allocator->history_.RecordHistory(
            HistoryOptions{true, config.history_max_entries, config.history_stacks});
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("CachingAllocator::Create: ", s.message()));
    }
  }
  if (config.per_process_memory_fraction < 1.0) {
    if (absl::Status s = allocator->SetMemoryFraction(config.per_process_memory_fraction); !s.ok()) return s;
  }
  return allocator;
}

CachingAllocator::CachingAllocator(std::shared_ptr<Driver> driver, Config config)
    : driver_(std::move(driver)),
      config_(config),
      id_(next_allocator_id.fetch_add(1)),
      blocks_(config_, history_),
      segments_(config_.max_split_size, history_, driver_->Info().ordinal),
      budget_(driver_->Info().total_memory),
      captures_(*driver_),
      hooks_(driver_->Info().ordinal),
      expandable_host_({shards_, blocks_, device_mu_, segments_, budget_, captures_}),
      expandable_({expandable_host_, *driver_, hooks_, config_.handle_aligned, config_.shareable_handles}),
      releaser_({*driver_, history_, device_mu_, segments_, hooks_}),
      sleep_host_(
          {*driver_, shards_, blocks_, device_mu_, segments_, pools_, expandable_, captures_, releaser_}),
      sleep_(sleep_host_) {
  MutexLock lock(&device_mu_);
  segments_.stats().max_split_size = config_.max_split_size == std::numeric_limits<std::size_t>::max()
                                         ? -1
                                         : static_cast<std::int64_t>(config_.max_split_size);
}

CachingAllocator::~CachingAllocator() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Teardown is best effort: the device may already be gone, and there is no one to report to. Queued work
  // may still use the memory that is about to be unmapped and freed.
  (void)driver_->DeviceSynchronize();
  std::vector<Event> events;
  shards_.ForEach([&](StreamShard* shard) {
    for (auto& [stream, queue] : shard->pending_events) {
      for (const PendingEvent& p : queue) events.push_back(p.event);
    }
    events.insert(events.end(), shard->idle_events.begin(), shard->idle_events.end());
  });
  for (Event e : events) {
    (void)driver_->EventSynchronize(e);
    (void)driver_->EventDestroy(e);
  }
  for (auto& [base, segment] : segments_) {
    segments_.Forget(*segment);
    const PoolId pool = PoolOf(*segment);
    if (segment->vmm != nullptr) {
      for (const auto& [ptr, chunk] : segment->vmm->chunks()) {
        // A quarantined chunk was never reported (it had no access).
        bool accessible;
        {
          MutexLock lock(&device_mu_);
          accessible = expandable_.Accessible(ptr);
        }
        if (accessible) hooks_.Unmap(pool, ptr, chunk.size, chunk.handle, true);
        (void)driver_->MemUnmap(ptr, chunk.size);
        (void)driver_->MemRelease(chunk.handle);
      }
      // Sleeping chunks hold memory only when a failed wake left them mapped.
      for (const auto& [ptr, chunk] : segment->vmm->sleeping_chunks()) {
        if (!chunk.mapped) continue;
        hooks_.Unmap(pool, ptr, chunk.size, chunk.handle, true);
        (void)driver_->MemUnmap(ptr, chunk.size);
        (void)driver_->MemRelease(chunk.handle);
      }
      (void)driver_->AddressFree(segment->base, segment->size);
    } else {
      if (segment->source == nullptr)
        hooks_.Unmap(pool, segment->base, segment->size, PhysicalHandle{}, false);
      (void)releaser_.FreeMemory(*segment);
    }
    delete segment;
  }
  expandable_.ReleaseCachedHandlesAtExit();
}

StreamShard* CachingAllocator::ShardFor(PoolId pool, Stream stream) {
  ShardCache& cache = tls_shard;
  if (cache.allocator_id == id_ && cache.stream == stream && cache.pool == pool &&
      cache.shard->generation.load(std::memory_order_acquire) == cache.generation) {
    return cache.shard;
  }
  StreamShard* found = shards_.Find(pool, stream);
  if (found == nullptr) {
    MutexLock set_lock(&shards_.set_mu());  // not while another thread has every shard locked
    MutexLock lock(&device_mu_);
    found = shards_.Find(pool, stream);
    if (found == nullptr) {
      PoolState* state = nullptr;
      if (pool != kDefaultPool) {
        state = pools_.Find(pool);
        if (state == nullptr) return nullptr;
      }
      found = shards_.Add(pool, stream, state);
      if (found == nullptr) return nullptr;
    }
  }
  cache = ShardCache{id_, pool, stream, found, found->generation.load(std::memory_order_acquire)};
  return found;
}

absl::StatusOr<DevicePtr> CachingAllocator::Allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return DevicePtr{0};
  if (bytes > kMaxRequest) return RequestTooLarge(bytes);
  const PoolId pool = routes_.any_open() ? routes_.Route(stream, *driver_) : kDefaultPool;
  if (sleep_.any_asleep()) {
    if (absl::Status s = sleep_.CheckAwake(pool); !s.ok()) return s;
  }
  StreamShard* shard = ShardFor(pool, stream);
  if (shard == nullptr) return NoShardLeft(stream);
  // Event queries are illegal while a capture is underway: they wait for the capture to end.
  if (shard->pending_event_count.load(std::memory_order_relaxed) > 0 &&
      !captures_.underway(std::memory_order_relaxed)) {
    ProcessEvents(*shard);
  }
  const AllocationRequest request(bytes, stream, config_);
  DevicePtr ptr;
  {
    SpinLockHolder lock(&shard->mu);
    ptr = blocks_.Allocate(*shard, request);
  }
  if (ptr != 0) [[likely]] {
    SettlePeaks(*shard);
    return ptr;
  }
  absl::StatusOr<DevicePtr> slow = AllocateSlow(*shard, request);
  SettleAllPeaks();
  return slow;
}

StreamShard* CachingAllocator::LockOwnerOf(DevicePtr ptr, Block** block) {
  auto try_shard = [&](StreamShard* shard) {
    shard->mu.Lock();
    // A free block parked in the quick cache keeps its entry (stream_shard.h): not a live pointer.
    if (Block* found = shard->allocated.Find(ptr); found != nullptr && found->allocated) {
      *block = found;
      return true;
    }
    shard->mu.Unlock();
    return false;
  };
  StreamShard* guess = tls_shard.allocator_id == id_ ? tls_shard.shard : nullptr;
  if (guess != nullptr && try_shard(guess)) return guess;
  StreamShard* owner = nullptr;
  shards_.ForEach([&](StreamShard* shard) {
    if (owner == nullptr && shard != guess && try_shard(shard)) owner = shard;
  });
  return owner;
}

absl::Status CachingAllocator::Free(DevicePtr ptr) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (ptr == 0) return absl::OkStatus();
  Block* block = nullptr;
  StreamShard* shard = LockOwnerOf(ptr, &block);
  if (shard == nullptr) return UnknownPointerError("Free", ptr);
  // Coalescing reads both neighbours, now or when the next allocation flushes the quick cache: with many
  // live blocks they are cache misses, which this overlaps with the rest of the free.
  __builtin_prefetch(block->prev);
  __builtin_prefetch(block->next);
  if (block->freeing) {
    shard->mu.Unlock();
    return UnknownPointerError("Free", ptr);
  }
  RecordBlockEvent(history_, HistoryAction::kFreeRequested, block);
  if (!block->stream_uses.empty() || block->held) return FreeUsedOnOtherStreams(*shard, block);
  blocks_.Free(*shard, block);
  const PoolId last_of_orphan = LastBlockOfOrphan(*shard);
  shard->mu.Unlock();
  SettlePeaks(*shard);
  ReleaseOrphanAfterFree(last_of_orphan);
  return absl::OkStatus();
}

absl::StatusOr<PoolId> CachingAllocator::PoolOfAllocation(DevicePtr ptr) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Block* block = nullptr;
  StreamShard* shard = ptr != 0 ? LockOwnerOf(ptr, &block) : nullptr;
  if (shard == nullptr || block->freeing) {
    if (shard != nullptr) shard->mu.Unlock();
    return absl::NotFoundError(absl::StrFormat("no live allocation of this allocator starts at 0x%x", ptr));
  }
  const PoolId pool = shard->pool != nullptr ? shard->pool->id : kDefaultPool;
  shard->mu.Unlock();
  return pool;
}

void CachingAllocator::ReleaseOrphanAfterFree(PoolId pool) {
  if (pool == kDefaultPool) return;
  // The free is done: a device failure while the pool's memory goes back must not report it as failed
  // (the caller would think the block still theirs). The memory stays cached; EmptyCache finishes the job.
  (void)MaybeReleasePool(pool);
}

PoolId CachingAllocator::LastBlockOfOrphan(const StreamShard& shard) const {
  const PoolState* pool = shard.pool;
  if (pool == nullptr || !pool->orphaned.load(std::memory_order_acquire) ||
      pool->live_blocks.load(std::memory_order_relaxed) != 0) {
    return kDefaultPool;
  }
  return pool->id;
}

absl::Status CachingAllocator::RecordStream(DevicePtr ptr, Stream stream) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  auto is_new_use = [stream](const Block* b) {
    return stream != b->stream() && !b->freeing &&
           std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end();
  };
  Block* block = nullptr;
  StreamShard* shard = LockOwnerOf(ptr, &block);
  if (shard == nullptr) return UnknownPointerError("RecordStream", ptr);
  const bool new_use = is_new_use(block);
  shard->mu.Unlock();
  if (!new_use) return absl::OkStatus();
  // Free() records an event on every recorded stream: one the device does not know would make that fail,
  // and fail again on every retry. One cheap driver query, with no lock held and only when the stream is
  // new to the block, refuses it here instead.
  if (absl::Status known = driver_->GetCaptureInfo(stream).status(); !known.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "RecordStream(0x%x): stream 0x%x is not a stream of device %d (%s); nothing was recorded, and the "
        "block is unchanged",
        ptr, static_cast<std::uintptr_t>(stream), driver_->Ordinal(), known.message()));
  }
  // Look the block up again: another thread may have freed it meanwhile (then this call comes after that
  // Free, and the pointer is unknown now).
  shard = LockOwnerOf(ptr, &block);
  if (shard == nullptr) return UnknownPointerError("RecordStream", ptr);
  if (is_new_use(block)) block->stream_uses.push_back(stream);
  shard->mu.Unlock();
  return absl::OkStatus();
}

absl::Status CachingAllocator::UnknownPointerError(absl::string_view operation,
                                                   DevicePtr ptr) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  std::string message;
  {
    // The error path may look at every shard: lock them all, in the lock order.
    AllShardsLock lock(shards_, device_mu_);
    if (const Segment* segment = segments_.Containing(ptr)) message = MisusedBlock(*segment, operation, ptr);
  }
  if (message.empty()) {
    message = absl::StrFormat(
        "%s(0x%x): unknown pointer: it was not returned by this allocator (device %d); every other "
        "allocation "
        "is unchanged",
        operation, ptr, driver_->Ordinal());
  }
  return absl::InvalidArgumentError(message);
}

DeviceStats CachingAllocator::GetStats() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  DeviceStats out;
  // Every shard at once: the sums are of one moment, and the peaks are folded with them.
  AllShardsLock lock(shards_, device_mu_);
  ReadStats(lock, out);
  return out;
}

void CachingAllocator::ReadStats(const AllShardsLock& lock,
                                 DeviceStats& out) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // A fold here only raises the peaks to what the shards hold: reading stays a reading.
  peaks_.Fold(lock);
  lock.ForEach([&](StreamShard* shard) { AddBlockStats(out, shard->stats); });
  peaks_.CopyPeaks(out);
  CopySegmentStats(out, segments_.stats());
}

void CachingAllocator::SettleAllPeaks() {
  bool over = false;
  shards_.ForEach(
      [&](StreamShard* shard) { over = over || shard->peak_over.load(std::memory_order_relaxed); });
  if (over) FoldPeaks();
}

void CachingAllocator::FoldPeaks() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AllShardsLock lock(shards_);
  peaks_.Fold(lock);
}

void CachingAllocator::ResetPeakStats() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AllShardsLock lock(shards_, device_mu_);
  peaks_.Reset(lock);
  segments_.stats().ResetPeak();
}

void CachingAllocator::ResetAccumulatedStats() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  shards_.ForEach([](StreamShard* shard) {
    SpinLockHolder lock(&shard->mu);
    shard->stats.ResetAccumulated();
  });
  MutexLock lock(&device_mu_);
  segments_.stats().ResetAccumulated();
}

absl::Status CachingAllocator::RecordHistory(const HistoryOptions& options) {
  return history_.RecordHistory(options);
}

absl::Status CachingAllocator::SetMemoryFraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetMemoryFraction: fraction must be in [0, 1], got ", fraction));
  }
  MutexLock lock(&device_mu_);
  budget_.SetFraction(fraction);
  return absl::OkStatus();
}

double CachingAllocator::GetMemoryFraction() const {
  MutexLock lock(&device_mu_);
  return budget_.fraction();
}

void CachingAllocator::SetMemoryLimit(std::size_t bytes) {
  MutexLock lock(&device_mu_);
  budget_.SetLimit(bytes);
}

absl::Status CachingAllocator::CheckInvariants() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  AllShardsLock lock(shards_, device_mu_);
  GRAPHALLOC_RETURN_IF_ERROR(InvariantChecker({lock, segments_, pools_, expandable_, config_.max_split_size,
                                               driver_->Info().granularity, &sleep_})
                                 .Run());
  GRAPHALLOC_RETURN_IF_ERROR(peaks_.Check(lock));
  GRAPHALLOC_RETURN_IF_ERROR(hooks_.CheckInvariants());
  return CheckHolds();
}

absl::Status CachingAllocator::EnablePeerAccess(int peer_ordinal) {
  if (absl::Status s = driver_->EnablePeerAccess(peer_ordinal); !s.ok()) return s;
  return expandable_.AddPeer(peer_ordinal);
}

}  // namespace graphalloc
