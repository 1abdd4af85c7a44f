// Sleep and wake of memory pools (CachingAllocator::Sleep / Wake): a sleeping pool's physical memory goes
// back to the device while every reservation and every block's address stays, and a wake maps fresh memory
// at the same addresses, so pointers held and CUDA graphs captured before the sleep stay valid after it.
//
// Rules while a pool sleeps: allocations routed to it fail with FailedPrecondition; frees are allowed (the
// block becomes free and its backed-up bytes are not restored); the release paths (EmptyCache,
// EmptyPoolCache) leave its segments alone; Checkpoint and Restore refuse it. Only expandable segments can
// keep their addresses: a pool with regular segments cannot sleep unless the request releases them, and
// only when each is wholly free. A graph's pin (PinForGraph) keeps a pool from EmptyCache, not from a sleep
// asked for by name: the graph replays after the wake. Sleeping ranges show in snapshots (`asleep`), in
// PoolStats (sleeping_bytes, backup_bytes) and in the history (one `sleep` event per chunk whose memory went,
// one `wake` per chunk mapped again; none for a sleep or wake undone), not in DeviceStats.
//
// Never half: each call either does what it says for a pool or leaves that pool as it was, asleep or
// awake, with nothing leaked, whatever the driver refuses:
//   Sleep  1. mark the pools asleep (no allocation from now on), check them quiet, wait for the device,
//             free the wholly free regular segments when asked; (fallible, undone on failure)
//          2. back up the live blocks of kBackup pools to pinned host memory; (fallible, undone on failure)
//          3. unmap and release every chunk; a chunk the driver refuses to unmap stays mapped and reserved
//             (its pool sleeps all the same; the error says how much was released); a handle the driver
//             refuses to release goes to the handle cache (EmptyCache retries it).
//   Wake   1. map every sleeping chunk (a cached handle of its size first, else a new one) and grant access;
//          2. restore the backed-up blocks still allocated; any failure of 1 or 2 unmaps what this wake
//             mapped and leaves the pool asleep, its backup kept (a chunk whose undo the driver refuses
//             stays mapped, asleep, and the next wake reuses it);
//          3. account the chunks as mapped, keep the backup's pinned memory for the next backed-up sleep
//             (or free it: WakeRequest::keep_backup_memory), mark the pool awake.
//
// PoolSleep reaches the allocator only through a SleepHost (sleep_host.h), which says what a sleep and a
// wake may do to the allocator's parts and under which lock. A call holds the capture gate from its first
// step to its last; each step that plans or settles holds one SleepHost lock for its whole extent (every
// shard's lock with the device lock, or the device lock alone), so that it is one atomic step however many
// calls it makes; the driver calls between them are made with neither lock held.
//
// Pinning host memory costs far more than copying into it (about 0.5 s per GiB against 20 ms on an H200:
// docs/benchmarks.md), so a pool that sleeps with a backup again and again, as a trainer and an inference
// engine time-sharing a GPU do, pays it once: the wake keeps the pool's pinned buffer, and the next sleep
// reuses it when it is large enough (else frees it and pins a new one). EmptyCache() frees every kept
// buffer, as it frees cached device memory; so does the allocator's end.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_SLEEP_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_SLEEP_H_

#include <atomic>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/sleep_host.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

// What becomes of a sleeping pool's contents.
enum class SleepMode {
  kDiscard,  // lost: after the wake the blocks hold whatever the fresh memory holds
  kBackup,   // copied to pinned host memory before the sleep and back after the wake
};

// Which pools a Sleep or Wake concerns.
struct SleepScope {
  enum class Kind {
    kAll,   // the default pool and every private pool
    kPool,  // `pool` (kDefaultPool: the default pool)
    kTag,   // every private pool created with PoolOptions::tag == `tag`
  };
  Kind kind = Kind::kAll;
  PoolId pool = kDefaultPool;
  std::string tag{};

  static SleepScope All() { return {}; }
  static SleepScope Pool(PoolId id) { return {.kind = Kind::kPool, .pool = id, .tag = {}}; }
  static SleepScope Tag(std::string t) {
    return {.kind = Kind::kTag, .pool = kDefaultPool, .tag = std::move(t)};
  }
};

struct SleepRequest {
  SleepScope scope{};
  SleepMode mode = SleepMode::kDiscard;  // for every pool of the scope not in `pool_modes`
  std::map<PoolId, SleepMode> pool_modes{};
  // Regular segments cannot keep their addresses: with this set, those of the pools in scope are freed to
  // the device when every one of them is wholly free (else the sleep is refused, naming them).
  bool release_free_regular_segments = false;
};

struct SleepResult {
  std::size_t bytes_released = 0;   // physical memory given back to the device
  std::size_t bytes_backed_up = 0;  // copied to pinned host memory
  std::vector<PoolId> pools{};      // the pools that fell asleep (those asleep already are not listed)
};

struct WakeRequest {
  SleepScope scope{};
  // Keep each pool's pinned backup memory, once restored, for its next backed-up sleep (EmptyCache frees
  // it); false frees it now.
  bool keep_backup_memory = true;
};

struct WakeResult {
  std::size_t bytes_mapped = 0;    // physical memory mapped again
  std::size_t bytes_restored = 0;  // copied back from pinned host memory
  std::vector<PoolId> pools{};     // the pools that woke
};

// A pool's sleep, as statistics see it.
struct SleepState {
  bool asleep = false;
  std::size_t sleeping_bytes = 0;  // address space whose memory is asleep
  // Pinned host memory held for its backup: the backup while asleep, the buffer kept for the next
  // backed-up sleep while awake (0 after EmptyCache).
  std::size_t backup_bytes = 0;
};

class PoolSleep {
 public:
  // Reaches the allocator only through `host` (sleep_host.h), which outlives it.
  explicit PoolSleep(SleepHost& host);
  // Frees every backup and kept buffer still held.
  ~PoolSleep();
  PoolSleep(const PoolSleep&) = delete;
  PoolSleep& operator=(const PoolSleep&) = delete;

  absl::StatusOr<SleepResult> Sleep(const SleepRequest& request);
  absl::StatusOr<WakeResult> Wake(const WakeRequest& request);

  // Frees the pinned buffers wakes kept (EmptyCache); those of sleeping pools stay. Returns the first
  // error; a buffer the driver refuses to free stays kept.
  absl::Status FreeKeptBackups();

  // Whether any pool sleeps; read on the allocation path before the exact (locked) question below.
  bool any_asleep() const { return asleep_count_.load(std::memory_order_relaxed) > 0; }
  // OK, or the FailedPrecondition an allocation routed to `pool` gets while it sleeps.
  absl::Status CheckAwake(PoolId pool) const;
  bool IsAsleep(PoolId pool) const;
  // The pool's sleep figures. Device lock held by the caller, which lends its ledger for the call.
  SleepState StateOf(PoolId pool, const SegmentLedger& segments) const;
  // Sleeping chunks only in sleeping pools' segments, their bytes as the pools' records say, backups as
  // large as what they hold. Device lock held (with every shard) by the caller, which lends its ledger.
  absl::Status CheckInvariants(const SegmentLedger& segments) const;

 private:
  // The checks, `idle` when no Sleep or Wake is under way (the marks and records must then agree).
  absl::Status CheckInvariants(const SegmentLedger& segments, bool idle) const;
  using GateLock = SleepHost::GateLock;
  using DeviceLock = SleepHost::DeviceLock;
  using ShardsLock = SleepHost::ShardsLock;
  struct BackupRange {
    DevicePtr ptr = 0;  // a block allocated when the sleep began
    std::size_t size = 0;
    std::size_t offset = 0;  // in the backup
  };
  struct Record {
    SleepMode mode = SleepMode::kDiscard;
    std::string tag;
    void* backup = nullptr;           // pinned host memory; null for kDiscard or nothing allocated
    std::size_t backup_size = 0;      // bytes it holds
    std::size_t backup_capacity = 0;  // bytes pinned (a reused buffer may be larger)
    std::vector<BackupRange> ranges;
  };
  // Pinned memory a wake kept for the pool's next backed-up sleep.
  struct KeptBackup {
    void* host = nullptr;
    std::size_t capacity = 0;
  };
  struct Target;  // a pool in the scope of one call (pool_sleep.cc)
  struct SleepJob;
  struct WakeJob;

  // The pools of `scope` (awake ones for a sleep, asleep ones for a wake); NotFound for a pool or tag that
  // names none.
  absl::StatusOr<std::vector<Target>> Resolve(const DeviceLock& lock, const SleepScope& scope,
                                              bool asleep) const;
  // Sleep phases (the gate held throughout).
  absl::Status Prepare(const GateLock& gate, const SleepRequest& request, std::vector<Target>& targets,
                       SleepJob& job);
  // FailedPrecondition, naming the pool and chunk, when a chunk of `segment` must stay mapped (pinned, or a
  // communication pool's).
  absl::Status CheckNotPinned(const ShardsLock& lock, const Segment& segment, const Target& t) const;
  absl::Status BackUp(SleepJob& job);
  void UnmapAndSettle(SleepJob& job, SleepResult* result, absl::Status* error);
  void Abandon(SleepJob& job);
  // Wake phases (the gate held throughout).
  absl::Status MapAll(WakeJob& job);
  absl::Status Restore(WakeJob& job, WakeResult* result);
  void UndoMaps(WakeJob& job);
  void SettleWake(WakeJob& job, WakeResult* result, absl::Status* error);

  // Frees a backup's pinned memory; one the driver refuses to free is kept until the allocator's end.
  void FreeBackup(void* host);
  void MarkAsleep(PoolId pool, const std::string& tag);
  void MarkAwake(PoolId pool);
  // Whether `segment` belongs to `pool`.
  static bool InPool(const Segment* segment, PoolId pool);

  SleepHost& host_;

  // One Sleep or Wake at a time: each runs driver calls with no lock held between its phases.
  // CheckInvariants try-locks it to learn whether one is under way.
  mutable Mutex call_mu_;
  // Guarded by the device lock: read and written only while a SleepHost::DeviceLock (or ShardsLock) is
  // alive, or by StateOf() and CheckInvariants(), whose callers hold the device lock. The sleeping pools'
  // records, written when a sleep has unmapped the pool (a sleep under way is in asleep_ only).
  absl::btree_map<PoolId, Record> records_;
  // Backups the driver refused to free (HostFree failed); freed with the allocator. Device lock.
  std::vector<void*> stray_backups_;
  // Awake pools' pinned buffers, kept for their next backed-up sleep. Device lock.
  absl::btree_map<PoolId, KeptBackup> kept_;
  // The sleeping pools and their tags, for the allocation path: a leaf lock, so that allocations from
  // awake pools never wait for the device lock while some pool sleeps.
  mutable SpinLock asleep_mu_;
  std::map<PoolId, std::string> asleep_ ABSL_GUARDED_BY(asleep_mu_);
  std::atomic<std::size_t> asleep_count_{0};
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_SLEEP_H_
