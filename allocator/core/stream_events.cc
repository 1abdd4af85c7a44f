// Cross-stream safety: a block used on other streams (RecordStream) is reused only after events recorded
// on those streams at Free() time have completed. Events are queried lazily, at the shard's next
// allocation, and always with the shard's lock released.
#include <array>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/driver_error.h"

namespace graphalloc {

absl::Status CachingAllocator::FreeUsedOnOtherStreams(StreamShard& shard, Block* block) {
  // Marked at once, so that a concurrent second Free of the same pointer is refused.
  block->freeing = true;
  // A held block stays allocated: the last ReleaseHold() completes this free.
  if (block->held) {
    shard.mu.Unlock();
    return absl::OkStatus();
  }
  // Freed as far as anyone looking can tell (OwnerFreed): no longer allocated, still active, as PyTorch's
  // allocator has it from this moment. Its checkPoolLiveAllocations runs on other threads too (NCCL's
  // watchdog frees tensors recorded on its stream), and must not see this block allocated while its
  // events are recorded, or all the while a capture defers them.
  blocks_.CountFreed(shard, block, /*live_block_gone=*/false);
  // Recording events on streams that may be capturing would put them into the graph (and querying them
  // later is illegal): the free waits until the last capture route ends (RunDeferredFrees).
  if (captures_.underway() && routes_.DeferWhileCapturing(&shard, block, captures_)) {
    shard.mu.Unlock();
    return absl::OkStatus();
  }
  shard.mu.Unlock();
  if (absl::Status s = FreeWithStreamUses(shard, block); !s.ok()) {
    // The caller keeps the block: allocated again, exactly as before the call.
    SpinLockHolder lock(&shard.mu);
    block->freeing = false;
    blocks_.UndoCountFreed(shard, block);
    return s;
  }
  SettlePeaks(shard);
  PoolId last_of_orphan = kDefaultPool;
  {
    SpinLockHolder lock(&shard.mu);
    last_of_orphan = LastBlockOfOrphan(shard);
  }
  ReleaseOrphanAfterFree(last_of_orphan);
  return absl::OkStatus();
}

absl::Status CachingAllocator::FreeWithStreamUses(StreamShard& shard, Block* block) {
  absl::InlinedVector<Stream, 2> streams;
  absl::InlinedVector<Event, 2> events;
  {
    SpinLockHolder lock(&shard.mu);
    streams.assign(block->stream_uses.begin(), block->stream_uses.end());
    while (events.size() < streams.size() && !shard.idle_events.empty()) {
      events.push_back(shard.idle_events.back());
      shard.idle_events.pop_back();
    }
  }
  absl::Status status;
  while (status.ok() && events.size() < streams.size()) {
    absl::StatusOr<Event> e = driver_->EventCreate();
    if (e.ok()) {
      events.push_back(*e);
    } else {
      status = e.status();
    }
  }
  // A recorded stream destroyed since RecordStream() (which checks that the stream exists) takes no event:
  // the device is synchronized instead, which also waits for the work that stream still had queued. Left
  // failing, such a Free() would fail again on every retry and the block could never be freed.
  std::size_t live = 0;  // streams[0, live) took an event, events[i] on streams[i]
  bool stream_gone = false;
  for (std::size_t i = 0; status.ok() && i < streams.size(); ++i) {
    status = driver_->EventRecord(events[live], streams[i]);
    if (status.ok()) {
      streams[live++] = streams[i];
    } else if (DriverErrorCode(status) == static_cast<int>(DriverResult::kInvalidHandle)) {
      stream_gone = true;
      status = absl::OkStatus();
    }
  }
  if (status.ok() && stream_gone) status = driver_->DeviceSynchronize();
  streams.resize(live);

  SpinLockHolder lock(&shard.mu);
  shard.idle_events.insert(shard.idle_events.end(), events.begin() + (status.ok() ? live : 0), events.end());
  // On failure the block stays in the pointer map, still freeing: the caller gives it back to its owner or
  // tries again later.
  if (!status.ok()) return status;
  block->freeing = false;
  shard.RemoveFromPointerMap(block);
  history_.Record(HistoryAction::kFreeRequested, block->ptr, block->requested_size,
                  static_cast<std::uint64_t>(block->stream()), 0);
  block->allocated = false;
  if (shard.pool != nullptr) shard.pool->AddAllocated(0, -1);  // its bytes went when its owner freed it
  block->stream_uses.clear();
  if (live == 0) {  // every recorded stream was gone, and the device is synchronized: free now
    blocks_.Release(shard, block);
    return absl::OkStatus();
  }
  block->event_count = static_cast<int>(live);
  for (std::size_t i = 0; i < live; ++i) {
    shard.pending_events[streams[i]].push_back({events[i], block, shard.next_pending_event_id++});
  }
  shard.pending_event_count.fetch_add(static_cast<std::int64_t>(live), std::memory_order_relaxed);
  return absl::OkStatus();
}

void CachingAllocator::CompleteEvent(StreamShard& shard, const PendingEvent& pending) {
  shard.idle_events.push_back(pending.event);
  shard.pending_event_count.fetch_sub(1, std::memory_order_relaxed);
  if (--pending.block->event_count == 0) blocks_.Release(shard, pending.block);
}

void CachingAllocator::ProcessEvents(StreamShard& shard) {
  // Query the oldest event of each stream with the lock released; complete those done in a second pass.
  constexpr std::size_t kMaxQueries = 32;
  std::array<PendingEvent, kMaxQueries> heads;
  std::size_t n = 0;
  {
    SpinLockHolder lock(&shard.mu);
    for (auto& [stream, queue] : shard.pending_events) {
      if (n == kMaxQueries) break;
      if (!queue.empty()) heads[n++] = queue.front();
    }
  }
  std::array<bool, kMaxQueries> done{};
  for (std::size_t i = 0; i < n; ++i) {
    absl::StatusOr<bool> ready = driver_->EventQuery(heads[i].event);
    // An event that cannot be queried is left for EmptyCache's synchronization.
    done[i] = ready.ok() && *ready;
  }
  {
    SpinLockHolder lock(&shard.mu);
    for (std::size_t i = 0; i < n; ++i) {
      if (!done[i]) continue;
      for (auto& [stream, queue] : shard.pending_events) {
        if (!queue.empty() && queue.front().id == heads[i].id) {
          CompleteEvent(shard, queue.front());
          queue.pop_front();
          break;
        }
      }
    }
  }
  SettlePeaks(shard);
}

absl::Status CachingAllocator::SynchronizeAndFreeEvents() {
  struct Waiting {
    StreamShard* shard;
    Stream stream;
    PendingEvent pending;
  };
  std::vector<Waiting> all;
  shards_.ForEach([&](StreamShard* shard) {
    SpinLockHolder lock(&shard->mu);
    for (auto& [stream, queue] : shard->pending_events) {
      for (const PendingEvent& p : queue) all.push_back({shard, stream, p});
    }
  });
  if (all.empty()) return absl::OkStatus();
  absl::Status status;
  std::size_t synced = 0;
  for (; synced < all.size(); ++synced) {
    status = driver_->EventSynchronize(all[synced].pending.event);
    if (!status.ok()) break;
  }
  for (std::size_t i = 0; i < synced; ++i) {
    StreamShard& shard = *all[i].shard;
    SpinLockHolder lock(&shard.mu);
    auto& queue = shard.pending_events[all[i].stream];
    auto it = std::find_if(queue.begin(), queue.end(),
                           [&](const PendingEvent& p) { return p.id == all[i].pending.id; });
    if (it == queue.end()) continue;  // completed meanwhile by another thread
    CompleteEvent(shard, *it);
    queue.erase(it);
  }
  SettleAllPeaks();
  MutexLock lock(&device_mu_);
  ++segments_.stats().num_sync_all_streams;
  return status;
}

}  // namespace graphalloc
