// Internal state of SimDriver, shared by the files that implement it (sim_driver.cc, sim_memory.cc,
// sim_streams.cc, sim_capture.cc). Not part of the public API.
//
// One Mutex (`mu`, graphalloc's std::mutex-based lock, which ThreadSanitizer sees) guards all device state;
// fault injection and call counting have their own (`fault_mu`) so counting a call never waits on device
// work. Closures never run with `mu` held: the stream engine drops it around each closure, because a
// closure may call back into the driver. A thread that must wait for another thread's closure to finish
// waits on `progress_cv`, which the stream engine notifies whenever it drops `mu` or a stream goes idle.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_SIM_SIM_STATE_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_SIM_SIM_STATE_H_

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {

// The memfd offset space handles and plain allocations live in. Exact-size free lists first (the common
// case: thousands of same-sized handles), then fresh space, then a split of a larger free range.
class SimOffsetSpace {
 public:
  explicit SimOffsetSpace(std::uint64_t limit) : limit_(limit) {}
  bool Take(std::uint64_t size, std::uint64_t* offset);
  void Give(std::uint64_t offset, std::uint64_t size);

 private:
  std::uint64_t limit_;
  std::uint64_t bump_ = 0;
  std::map<std::uint64_t, std::vector<std::uint64_t>> free_by_size_;
};

// A range of the memfd. Outlives its handle id while mappings of it remain (CUDA defers the free).
struct SimPhysical {
  std::uint64_t offset = 0;
  std::size_t size = 0;
  std::size_t map_count = 0;
  bool released = false;  // the handle id was given back; free the range with its last unmap
  // Sharing with other processes. A shareable handle has a memfd of its own (`fd`, offset 0), so that the
  // kernel keeps its pages while any process holds the file or a mapping of it; an imported handle holds
  // a dup of the exporter's file at `offset` and is not charged against this device's capacity. -1: the
  // device's memfd.
  int fd = -1;
  bool shareable = false;
  bool imported = false;
  std::size_t refs = 1;  // MemRetainAllocationHandle adds one; the handle id goes with the last release
};

struct SimMapping {
  std::size_t size = 0;
  std::uint64_t phys_id = 0;
  bool accessible = false;  // MemSetAccess covered it (a fresh mapping has no access, as on CUDA)
};

struct SimAllocation {
  std::uint64_t offset = 0;
  std::size_t size = 0;  // rounded to granularity
};

// Graph node kinds; GraphExecUpdate compares them to decide whether the topology changed.
enum class SimNodeKind { kHost, kMemcpy, kMemset, kChildGraph };

struct SimNode {
  SimNodeKind kind = SimNodeKind::kHost;
  // Shared, not copied, between a graph, its execs and launched work: like a CUDA host node's userData,
  // every launch runs the same function object.
  std::shared_ptr<const HostFunction> fn;
};

struct SimStreamState;

// Completion state of an event, shared with the wait and record items that name it so the event may be
// destroyed while they are queued (as CUDA allows).
struct SimEventState {
  std::uint64_t recorded_gen = 0;               // bumped by each (uncaptured) EventRecord
  std::uint64_t completed_gen = 0;              // the highest record whose marker has run
  std::weak_ptr<SimStreamState> record_stream;  // stream of the latest uncaptured record
  // Set when the last record happened inside a capture: that capture's id and the recording stream's
  // capture clock at that point (what a StreamWaitEvent on it joins to).
  std::uint64_t capture_id = 0;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> capture_clock;
};

struct SimWorkItem {
  enum class Kind { kRun, kRecord, kWait };
  Kind kind = Kind::kRun;
  std::shared_ptr<const HostFunction> fn;  // kRun
  std::shared_ptr<SimEventState> event;    // kRecord, kWait
  std::uint64_t gen = 0;                   // kRecord: the record's generation; kWait: the one awaited
  std::weak_ptr<SimStreamState> source;    // kWait: the stream holding the awaited record marker

  static SimWorkItem Run(std::shared_ptr<const HostFunction> fn) {
    SimWorkItem item;
    item.fn = std::move(fn);
    return item;
  }
  static SimWorkItem Record(std::shared_ptr<SimEventState> event, std::uint64_t gen) {
    SimWorkItem item;
    item.kind = Kind::kRecord;
    item.event = std::move(event);
    item.gen = gen;
    return item;
  }
  static SimWorkItem Wait(std::shared_ptr<SimEventState> event, std::uint64_t gen,
                          std::weak_ptr<SimStreamState> source) {
    SimWorkItem item = Record(std::move(event), gen);
    item.kind = Kind::kWait;
    item.source = std::move(source);
    return item;
  }
};

struct SimCapture;

struct SimStreamState {
  std::uint64_t id = 0;
  std::deque<SimWorkItem> queue;
  bool busy = false;       // a thread is running this stream's queue (it dropped `mu` for a closure)
  bool destroyed = false;  // StreamDestroy'd; kept until its queued work has run, as CUDA does
  std::shared_ptr<SimCapture> capture;  // set while the stream is part of a capture
};

// A capture sequence: the origin stream plus every stream that joined it through an event.
struct SimCapture {
  std::uint64_t id = 0;
  CaptureMode mode = CaptureMode::kGlobal;
  CaptureStatus status = CaptureStatus::kActive;
  std::uint64_t origin = 0;
  std::thread::id thread;
  std::vector<SimNode> nodes;  // in enqueue order, which is a valid topological order
  // Vector clocks over the streams of the capture, in units of work nodes: clocks[s][t] is the number of
  // t's nodes that s's next enqueue depends on. EndCapture requires the origin to depend on every node.
  absl::flat_hash_map<std::uint64_t, absl::flat_hash_map<std::uint64_t, std::uint64_t>> clocks;
  absl::flat_hash_map<std::uint64_t, std::uint64_t> work_count;
};

struct SimGraphState {
  std::vector<SimNode> nodes;
};

// Everything a SimDriver holds. Helpers in the implementation files take it by reference; the public
// class reaches it through its private SimDriver::State, which adds nothing.
struct SimState {
  SimState(SimDriverOptions opts, int fd, std::uint64_t offset_limit);

  // ---- Fault injection and call counting. ----
  // Counts `call` and returns the injected failure for it, if any ("<name> failed: ...").
  absl::Status Begin(SimCall call, absl::string_view name);

  // ---- Capture checks (sim_capture.cc). ----
  enum class Unsafe { kGlobalOnly, kAnyCapture };
  // Fails an unsafe call (plain allocation, synchronization, event query) while a capture forbids it, and
  // invalidates the captures that forbid it: every global-mode capture and the calling thread's
  // thread-local ones (kAnyCapture: every live capture, for calls that synchronize all streams).
  absl::Status RefuseDuringCapture(absl::string_view name, Unsafe what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Invalidate(SimCapture& capture) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records a node on a capturing stream.
  absl::Status RecordNode(SimStreamState& stream, SimNodeKind kind, std::shared_ptr<const HostFunction> fn,
                          absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // StreamWaitEvent where the stream or the event's last record is in a capture: joins the stream to the
  // event's capture (merging its clock), or refuses a wait that would cross a capture boundary.
  absl::Status JoinCapture(SimStreamState& stream, const SimEventState& event,
                           const std::shared_ptr<SimCapture>& recorded_in, absl::string_view name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ---- Memory (sim_memory.cc). ----
  // Whether queued work may touch [ptr, ptr + size): inside one plain allocation, or mapped throughout
  // with access granted. Work that finds it is not counts an illegal access instead of faulting.
  bool Accessible(DevicePtr ptr, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The mapping that holds byte `ptr`, or mappings.end().
  std::map<DevicePtr, SimMapping>::const_iterator MappingAt(DevicePtr ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool CheckQueuedAccess(DevicePtr ptr, std::size_t size) ABSL_LOCKS_EXCLUDED(mu);

  // ---- Stream engine (sim_streams.cc). ----
  SimStreamState* FindStream(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  SimEventState* FindEvent(Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Enqueues work on `stream` (or records it into the stream's capture); in immediate mode runs it.
  absl::Status Enqueue(Stream stream, SimNodeKind kind, HostFunction fn, absl::string_view name);
  void Push(SimStreamState& stream, SimWorkItem item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Runs `stream`'s queue from its head until it is empty, `max_runs` closures ran, the head waits on an
  // event that has not completed, or `stop_event` reached `stop_gen`. Returns closures run; *progress is
  // set when any item was consumed. Does nothing when another caller is running the stream.
  std::size_t RunQueue(const std::shared_ptr<SimStreamState>& stream, std::size_t max_runs, bool* progress,
                       const SimEventState* stop_event = nullptr, std::uint64_t stop_gen = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Runs every runnable queue until none can make progress (immediate mode, RunAllPendingWork).
  std::size_t Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Blocks until `stream` is idle, resolving cross-stream waits by running the streams they wait on.
  void DriveStream(const std::shared_ptr<SimStreamState>& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Blocks until `event` reached `gen`, running `source` (where its marker sits) only up to the marker.
  void DriveEvent(const std::shared_ptr<SimEventState>& event, std::uint64_t gen,
                  const std::weak_ptr<SimStreamState>& source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void DriveAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Blocks, releasing `mu` meanwhile, until `done()` (evaluated with `mu` held) is true.
  template <typename Predicate>
  void Await(Predicate done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // condition_variable_any unlocks and relocks through these (BasicLockable) names.
    struct Lockable {
      Mutex* mu;
      void lock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Lock(); }
      void unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu->Unlock(); }
    } lockable{&mu};
    while (!done()) progress_cv.wait(lockable);
  }
  void ReapStream(const std::shared_ptr<SimStreamState>& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // True when the calling thread is inside a closure this driver is running (synchronizing from there
  // is not permitted, as in a CUDA host callback).
  bool InClosure() const;

  const SimDriverOptions options;
  DeviceInfo info;
  const int memfd;

  mutable Mutex fault_mu;
  std::array<std::uint64_t, static_cast<int>(SimCall::kCount)> call_counts ABSL_GUARDED_BY(fault_mu) = {};
  // Per call kind: absolute call numbers that must fail, with their result.
  std::array<std::vector<std::pair<std::uint64_t, DriverResult>>, static_cast<int>(SimCall::kCount)>
      planned_faults ABSL_GUARDED_BY(fault_mu);
  double random_rate ABSL_GUARDED_BY(fault_mu) = 0;
  std::uint64_t random_seed ABSL_GUARDED_BY(fault_mu) = 0;
  std::array<bool, static_cast<int>(SimCall::kCount)> random_calls ABSL_GUARDED_BY(fault_mu) = {};
  DriverResult random_result ABSL_GUARDED_BY(fault_mu) = DriverResult::kOutOfMemory;
  std::uint64_t injected ABSL_GUARDED_BY(fault_mu) = 0;

  mutable Mutex mu;
  // Notified (with `mu` held) when a stream engine drops `mu` to run a closure or finishes a queue run.
  std::condition_variable_any progress_cv;
  bool manual ABSL_GUARDED_BY(mu);
  SimOffsetSpace space ABSL_GUARDED_BY(mu);
  std::size_t used_bytes ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_set<int> peers ABSL_GUARDED_BY(mu);
  std::map<DevicePtr, std::size_t> reservations ABSL_GUARDED_BY(mu);
  std::map<DevicePtr, SimMapping> mappings ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uint64_t, SimPhysical> physical ABSL_GUARDED_BY(mu);
  std::size_t live_handles ABSL_GUARDED_BY(mu) = 0;
  std::size_t live_handle_bytes ABSL_GUARDED_BY(mu) = 0;
  std::map<DevicePtr, SimAllocation> allocations ABSL_GUARDED_BY(mu);
  std::map<void*, std::size_t> host_allocations ABSL_GUARDED_BY(mu);  // HostAlloc: address -> size
  std::map<DevicePtr, std::size_t> ipc_opened ABSL_GUARDED_BY(mu);    // IpcOpenMemHandle: address -> size

  std::map<std::uint64_t, std::shared_ptr<SimStreamState>> streams ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uint64_t, std::shared_ptr<SimEventState>> events ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uint64_t, std::shared_ptr<SimCapture>> captures ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uint64_t, SimGraphState> graphs ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uint64_t, SimGraphState> execs ABSL_GUARDED_BY(mu);
  std::size_t pending_runs ABSL_GUARDED_BY(mu) = 0;
  std::size_t illegal_accesses ABSL_GUARDED_BY(mu) = 0;  // SimCounters::illegal_accesses
  std::uint64_t next_id ABSL_GUARDED_BY(mu) = 1;         // handles, streams, events, graphs: never reused
  std::uint64_t next_capture_id ABSL_GUARDED_BY(mu) = 1;
};

struct SimDriver::State final : SimState {
  using SimState::SimState;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_SIM_SIM_STATE_H_
