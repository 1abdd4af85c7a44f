// Sleep and wake of a private pool (issue 22), beside the bare driver calls for the same physical handles
// and beside pinned host copies of the same bytes: the targets are ratios to those baselines,
// without backup within 1.1x of the bare driver calls, with backup at least 90% of pinned copy bandwidth.
//
// The pool: a private pool on expandable segments (CachingAllocator::CreatePool), filled with <GiB> live
// blocks of 1 GiB each, allocated on one stream. A model's weights are hundreds of tensors rather than 1
// GiB blocks, but a backup costs one copy per block, whose launch is microseconds against the tens of
// milliseconds of copying a GiB, and the handles (what the driver calls are made of) come from the growth
// plan, not the block sizes. The pool holds what its growth created: 1 GiB handles while reserved memory
// stays under 30% of the device's memory, single 2 MiB pages past it (growth_plan.cc), so a 40 GiB pool
// is thousands of handles on an 80 GB device (8,216 on the simulated device's 80 GiB) and 40 on a 141 GB
// one (counters unmap_n / create_n).
//
// Every benchmark times only its own call (manual time, wall clock), <device> is sim or cuda:
//
//   sleep/<device>/<GiB>/discard        CachingAllocator::Sleep of the pool, SleepMode::kDiscard (the wake
//                                       after it is untimed)
//   wake/<device>/<GiB>/discard         Wake of it (the sleep before it is untimed)
//   sleep/<device>/<GiB>/backup,        the same with SleepMode::kBackup: the sleep copies every block into
//   wake/<device>/<GiB>/backup          pinned host memory, the wake copies them back. The buffer is the
//                                       one the last wake kept (pool_sleep.h): an untimed sleep and wake
//                                       before the timed ones pin it, as a program's first sleep does
//   bare_unmap_release/<device>/<GiB>   through the Driver interface alone, for handles of the sizes the
//                                       pool's growth created (recorded from the same fill on a pool of its
//                                       own) mapped one after another in one range reserved as the
//                                       allocator reserves a segment: per handle cuMemUnmap, cuMemRelease,
//                                       as a sleep makes them (the create and map before it untimed)
//   bare_create_map/<device>/<GiB>      per handle cuMemCreate, cuMemMap, then cuMemSetAccess for each, as a
//                                       wake makes them (the unmap and release after it untimed)
//   pinned_copy_d2h/<device>/<GiB>,     the pool's bytes copied to (from) pinned host memory as a backup
//   pinned_copy_h2d/<device>/<GiB>      copies them: one cuMemHostAlloc of them all (untimed), one
//                                       cuMemcpyAsync per 1 GiB block on the legacy default stream, one
//                                       cuStreamSynchronize; device side the same handles as bare_*
//   wake/<device>/<GiB>/backup_settled  as wake/.../backup, with a pause (SettleTime) after the untimed
//                                       sleep: the wake of a pool whose memory another job used meanwhile.
//                                       Right after a cuMemRelease the driver still has work of its own
//                                       that slows host-to-device copies (docs/benchmarks.md), which the
//                                       wake right after its sleep pays and pinned_copy_h2d does not
//   bare_wake_backup/<device>/<GiB>     the driver calls of a backed-up wake in the same position: right
//                                       after the handles' unmap and release (untimed), create, map and
//                                       grant access as bare_create_map, then copy as pinned_copy_h2d
//
// Sizes are 1, 10 and 40 GiB; a size the device (or, for backups and copies, the host) has no room for
// now is skipped with an error that says so. The simulated device runs backups and copies at 1 GiB only:
// it copies with memmove in host memory, committing the pages it touches, so N GiB needs 2N GiB of the
// host's memory and about a second per GiB. Iterations are fixed (10, or 3 at 40 GiB, without copies; 5,
// 3 and 2 with them). On an H200 the discard and bare rows take about 30 s with 10 repetitions; each
// repetition of the backups takes about 6 s at 1 GiB, 40 s at 10 GiB and two minutes at 40 GiB, most of it
// pinning host memory. For medians add --benchmark_repetitions=N and
// --benchmark_enable_random_interleaving=true: the driver's own calls drift by 2x over tens of seconds, and
// interleaving puts a benchmark and its baseline on the same side of a drift.
//
// How to read it (bench/sleep_wake_bench_table.py prints these ratios, with medians over repetitions):
//   sleep/.../discard time / bare_unmap_release time       target <= 1.1
//   wake/.../discard time  / bare_create_map time          target <= 1.1
//   sleep/.../backup bytes_per_second / pinned_copy_d2h bytes_per_second   target >= 0.9
//   wake/.../backup_settled bytes_per_second / pinned_copy_h2d bytes_per_second   target >= 0.9
//   wake/.../backup bytes_per_second / pinned_copy_h2d bytes_per_second  (right after the sleep), and
//   wake/.../backup bytes_per_second / bare_wake_backup bytes_per_second (the same, both after a release)
// Neither the copies' pinning nor the backups' is in their bandwidth: a pool's first backed-up sleep pins
// its buffer, and later ones reuse it; host_alloc_once_us and host_free_once_us of the pinned_copy
// benchmarks say what pinning costs.
//
// Counters (per iteration), from bench/timed_driver.h, which every benchmark here goes through: for each
// driver call kind made in the timed call, <call>_n, <call>_us, <call>_cpu_us (<call>: create, release,
// map, unmap, access, sync, host_alloc, host_free, copy (an async copy's enqueueing; its wait is in sync),
// other); td_<call>_us: the untimed half; timed_us, driver_us, rest_us (the timed call minus its driver
// calls: the allocator's own work) and their _cpu_ forms. blocks: live blocks of the pool.
//
// The simulated device always runs; GPU 0 runs when CudaDriver::Create(0) succeeds. On the GPU:
//   build/bench/sleep_wake_bench --benchmark_filter=/cuda/ --benchmark_out=sleep.json
//   bench/sleep_wake_bench_table.py sleep.json
#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "bench/timed_driver.h"
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/forwarding_driver.h"

namespace graphalloc {
namespace {

using bench::PhaseReset;
using bench::TimedDriver;
using Phase = TimedDriver::Phase;

constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kBlockSize = kGiB;
constexpr std::array<std::size_t, 3> kSizesGiB = {1, 10, 40};
constexpr std::size_t kSimCopyMaxGiB = 1;
// Left free for the driver's own device memory (its context and bookkeeping).
constexpr std::size_t kDeviceHeadroom = std::size_t{512} << 20;
// Left free on the host beside a backup's pinned buffer, so that the run does not push the host into
// swapping (or the simulated device's host into the OOM killer).
constexpr std::size_t kHostHeadroom = std::size_t{2} << 30;

int Iterations(std::size_t gib, bool copies) {
  if (copies) return gib >= 40 ? 2 : gib >= 10 ? 3 : 5;
  return gib >= 40 ? 3 : 10;
}

struct Device {
  bench::BenchDevice* bench;           // the driver, its stream and its kind
  std::shared_ptr<TimedDriver> timed;  // wraps bench->driver
  // PoolChunkSizes by pool size: the same every time (the growth plan depends on the device's memory, not
  // on what is free), and a 40 GiB fill takes seconds on the GPU.
  std::map<std::size_t, std::vector<std::size_t>> chunk_sizes{};
  bool sim() const { return bench->kind == "sim"; }
};

// The host's MemAvailable (/proc/meminfo) in bytes; 0 when it cannot be read.
std::size_t HostAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1)
      return static_cast<std::size_t>(kib) << 10;
  }
  return 0;
}

// Why `device` cannot hold a pool of `bytes` now (with `copies`, also a pinned host buffer of them);
// empty when it can.
std::string NoRoom(const Device& device, std::size_t bytes, bool copies) {
  absl::StatusOr<MemoryInfo> info = device.bench->driver->GetMemoryInfo();
  if (!info.ok()) return "GetMemoryInfo: " + info.status().ToString();
  auto gib = [](std::size_t b) { return static_cast<double>(b) / static_cast<double>(kGiB); };
  if (info->free < bytes + kDeviceHeadroom) {
    return absl::StrFormat("needs %.1f GiB free on the device, %.1f GiB are", gib(bytes + kDeviceHeadroom),
                           gib(info->free));
  }
  if (!copies) return "";
  // The simulated device's memory is the host's too: its pages count once copied into.
  const std::size_t host = device.sim() ? 2 * bytes : bytes;
  const std::size_t available = HostAvailableBytes();
  if (available != 0 && available < host + kHostHeadroom) {
    return absl::StrFormat("needs %.1f GiB of host memory, %.1f GiB are available", gib(host + kHostHeadroom),
                           gib(available));
  }
  return "";
}

// A private pool on expandable segments holding `bytes` in live blocks of kBlockSize. Torn down bottom-up:
// the blocks, the pool's handle, then its allocator.
struct FilledPool {
  std::unique_ptr<CachingAllocator> allocator;
  PrivatePool pool;
  std::vector<DevicePtr> blocks;
  ~FilledPool() {
    for (DevicePtr p : blocks) (void)allocator->Free(p);
  }
};

absl::StatusOr<std::unique_ptr<FilledPool>> FillPool(std::shared_ptr<Driver> driver, Stream stream,
                                                     std::size_t bytes) {
  Config config;
  config.expandable_segments = true;
  auto filled = std::make_unique<FilledPool>();
  GRAPHALLOC_ASSIGN_OR_RETURN(filled->allocator, CachingAllocator::Create(std::move(driver), config));
  GRAPHALLOC_ASSIGN_OR_RETURN(filled->pool, filled->allocator->CreatePool());
  GRAPHALLOC_ASSIGN_OR_RETURN(PoolRoute route, filled->allocator->BeginAllocateToPool(
                                                   filled->pool, PoolRouteFilter::ForStream(stream)));
  for (std::size_t done = 0; done < bytes; done += kBlockSize) {
    GRAPHALLOC_ASSIGN_OR_RETURN(DevicePtr p, filled->allocator->Allocate(kBlockSize, stream));
    filled->blocks.push_back(p);
  }
  GRAPHALLOC_RETURN_IF_ERROR(route.End());
  return filled;
}

// Notes the size of every physical handle created through it.
class HandleLog final : public ForwardingDriver {
 public:
  using ForwardingDriver::ForwardingDriver;
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override {
    absl::StatusOr<PhysicalHandle> handle = ForwardingDriver::MemCreate(size);
    if (handle.ok()) sizes_.push_back(size);
    return handle;
  }
  const std::vector<std::size_t>& sizes() const { return sizes_; }

 private:
  std::vector<std::size_t> sizes_;
};

// The sizes of the handles a pool of `bytes` holds, in the order its growth created them: the same fill as
// the sleep benchmarks', on a pool of its own that is gone when this returns. Checked against the pool's
// reserved bytes, which a handle created and released again during the fill would break.
absl::StatusOr<std::vector<std::size_t>> PoolChunkSizes(Device& device, std::size_t bytes) {
  if (auto it = device.chunk_sizes.find(bytes); it != device.chunk_sizes.end()) return it->second;
  auto log = std::make_shared<HandleLog>(device.bench->driver);
  GRAPHALLOC_ASSIGN_OR_RETURN(std::unique_ptr<FilledPool> filled, FillPool(log, device.bench->stream, bytes));
  GRAPHALLOC_ASSIGN_OR_RETURN(PoolStats stats, filled->allocator->GetPoolStats(filled->pool.id()));
  std::size_t created = 0;
  for (std::size_t size : log->sizes()) created += size;
  if (created != stats.reserved_bytes) {
    return absl::InternalError(absl::StrFormat("the pool reserves %d bytes but its growth created %d",
                                               stats.reserved_bytes, created));
  }
  device.chunk_sizes[bytes] = log->sizes();
  return log->sizes();
}

// Physical handles of given sizes, mapped one after another into one range reserved as the allocator
// reserves an expandable segment (the device's memory, rounded up), with the driver calls in the order a
// sleep and a wake make them (pool_sleep.cc). Whatever is left is unmapped and released at the end.
class BareChunks {
 public:
  BareChunks(Driver& driver, const std::vector<std::size_t>& sizes) : driver_(driver) {
    std::size_t offset = 0;
    for (std::size_t size : sizes) {
      chunks_.push_back({offset, size, PhysicalHandle{}, false, false});
      offset += size;
    }
    bytes_ = offset;
  }
  ~BareChunks() {
    (void)UnmapAndRelease();
    if (base_ != 0) (void)driver_.AddressFree(base_, reservation_);
  }
  BareChunks(const BareChunks&) = delete;
  BareChunks& operator=(const BareChunks&) = delete;

  absl::Status Reserve() {
    const std::size_t g = driver_.Info().granularity;
    reservation_ = (driver_.Info().total_memory + g - 1) / g * g;
    GRAPHALLOC_ASSIGN_OR_RETURN(base_, driver_.AddressReserve(reservation_, 0));
    return absl::OkStatus();
  }
  // As PoolSleep::MapAll: create and map each, then grant access to each.
  absl::Status CreateAndMap() {
    for (Chunk& c : chunks_) {
      GRAPHALLOC_ASSIGN_OR_RETURN(c.handle, driver_.MemCreate(c.size));
      c.created = true;
      GRAPHALLOC_RETURN_IF_ERROR(driver_.MemMap(base_ + c.offset, c.size, c.handle));
      c.mapped = true;
    }
    for (const Chunk& c : chunks_)
      GRAPHALLOC_RETURN_IF_ERROR(driver_.MemSetAccess(base_ + c.offset, c.size, {}));
    return absl::OkStatus();
  }
  // As PoolSleep::UnmapAndSettle: unmap each and release its handle.
  absl::Status UnmapAndRelease() {
    for (Chunk& c : chunks_) {
      if (c.mapped) {
        GRAPHALLOC_RETURN_IF_ERROR(driver_.MemUnmap(base_ + c.offset, c.size));
        c.mapped = false;
      }
      if (c.created) {
        GRAPHALLOC_RETURN_IF_ERROR(driver_.MemRelease(c.handle));
        c.created = false;
      }
    }
    return absl::OkStatus();
  }
  DevicePtr base() const { return base_; }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Chunk {
    std::size_t offset;
    std::size_t size;
    PhysicalHandle handle;
    bool created;
    bool mapped;
  };
  Driver& driver_;
  std::vector<Chunk> chunks_;
  std::size_t bytes_ = 0;
  std::size_t reservation_ = 0;
  DevicePtr base_ = 0;
};

// Which of a pair of calls a benchmark times: the one that gives memory back (a sleep, unmap and release)
// or the one that maps it again (a wake, create and map).
enum class Timed { kRelease, kMap };

// Wall and thread CPU time, summed over calls.
struct Clock {
  std::int64_t wall_ns = 0;
  std::int64_t cpu_ns = 0;
};

// Calls `f()`, adding its time to `clock`.
template <class F>
auto Clocked(Clock& clock, F&& f) -> decltype(f()) {
  const std::int64_t wall0 = bench::WallNs();
  const std::int64_t cpu0 = bench::ThreadCpuNs();
  auto result = f();
  clock.cpu_ns += bench::ThreadCpuNs() - cpu0;
  clock.wall_ns += bench::WallNs() - wall0;
  return result;
}

// The counters every benchmark here reports, once its loop has run without error.
void Report(benchmark::State& state, const TimedDriver& timed, std::size_t bytes, const Clock& clock) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["blocks"] = static_cast<double>(bytes / kBlockSize);
  bench::ReportSplit(state, timed, clock.wall_ns, clock.cpu_ns);
}

// How long a settled wake waits after its (untimed) sleep: long enough for the driver to finish what the
// sleep's cuMemRelease left it to do in the background. Right after a release of N GiB, a host-to-device
// copy on an H200 runs ~2.4 ms per GiB slower, whichever memory it lands in, and at full speed again 300 ms
// later (docs/benchmarks.md); this waits 4x that estimate plus 100 ms.
constexpr std::chrono::milliseconds kNoSettle{0};
std::chrono::milliseconds SettleTime(std::size_t bytes) {
  return std::chrono::milliseconds(100 + 10 * static_cast<std::int64_t>(bytes / kGiB));
}

// `settle`: a pause between the sleep and the timed wake, standing for the work of whoever used the memory
// meanwhile; zero times the wake right after the sleep.
void BM_SleepWake(benchmark::State& state, const Device* device, std::size_t bytes, SleepMode mode,
                  Timed which, std::chrono::milliseconds settle) {
  const bool backup = mode == SleepMode::kBackup;
  if (std::string why = NoRoom(*device, bytes, backup); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  TimedDriver& timed = *device->timed;
  PhaseReset phase_reset{&timed};
  timed.SetPhase(Phase::kNone);
  timed.Reset();
  absl::StatusOr<std::unique_ptr<FilledPool>> filled = FillPool(device->timed, device->bench->stream, bytes);
  if (!filled.ok()) {
    state.SkipWithError(("filling the pool: " + filled.status().ToString()).c_str());
    return;
  }
  CachingAllocator& allocator = *(*filled)->allocator;
  SleepRequest sleep;
  sleep.scope = SleepScope::Pool((*filled)->pool.id());
  sleep.mode = mode;
  WakeRequest wake;
  wake.scope = sleep.scope;
  const std::size_t expected_copy = backup ? bytes : 0;
  // The call not timed is clocked all the same, into a clock nobody reads, so that both take the same path.
  Clock timed_clock;
  Clock untimed_clock;
  Clock& sleep_clock = which == Timed::kRelease ? timed_clock : untimed_clock;
  Clock& wake_clock = which == Timed::kMap ? timed_clock : untimed_clock;
  std::string error;
  // The steady state of a program that sleeps and wakes again and again: its first backed-up sleep pinned
  // the buffer later ones reuse. Not counted in any phase.
  timed.SetPhase(Phase::kNone);
  if (absl::Status s = allocator.Sleep(sleep).status(); !s.ok()) error = "warm-up Sleep: " + s.ToString();
  if (absl::Status s = allocator.Wake(wake).status(); error.empty() && !s.ok())
    error = "warm-up Wake: " + s.ToString();
  for (auto _ : state) {
    if (!error.empty()) break;
    const std::int64_t before = timed_clock.wall_ns;
    timed.SetPhase(which == Timed::kRelease ? Phase::kTimed : Phase::kTeardown);
    absl::StatusOr<SleepResult> slept = Clocked(sleep_clock, [&] { return allocator.Sleep(sleep); });
    if (!slept.ok()) {
      error = "Sleep: " + slept.status().ToString();
    } else if (slept->bytes_backed_up != expected_copy) {
      error = absl::StrFormat("Sleep backed up %d bytes of %d", slept->bytes_backed_up, expected_copy);
    }
    if (!error.empty()) break;
    if (settle.count() > 0) std::this_thread::sleep_for(settle);
    timed.SetPhase(which == Timed::kMap ? Phase::kTimed : Phase::kTeardown);
    absl::StatusOr<WakeResult> woke = Clocked(wake_clock, [&] { return allocator.Wake(wake); });
    timed.SetPhase(Phase::kNone);
    if (!woke.ok()) {
      error = "Wake: " + woke.status().ToString();
    } else if (woke->bytes_restored != expected_copy) {
      error = absl::StrFormat("Wake restored %d bytes of %d", woke->bytes_restored, expected_copy);
    }
    if (!error.empty()) break;
    state.SetIterationTime(static_cast<double>(timed_clock.wall_ns - before) / 1e9);
  }
  timed.SetPhase(Phase::kNone);
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  Report(state, timed, bytes, timed_clock);
}

// What the bare-driver benchmarks start from: room for `bytes` (with `copies`, pinned host memory for them
// too), the wrapper's totals cleared, and the pool's handle sizes in a reserved range; null once `state`
// is skipped.
std::unique_ptr<BareChunks> SetUpBare(benchmark::State& state, Device& device, std::size_t bytes,
                                      bool copies) {
  if (std::string why = NoRoom(device, bytes, copies); !why.empty()) {
    state.SkipWithError(why.c_str());
    return nullptr;
  }
  absl::StatusOr<std::vector<std::size_t>> sizes = PoolChunkSizes(device, bytes);
  if (!sizes.ok()) {
    state.SkipWithError(("the pool's handles: " + sizes.status().ToString()).c_str());
    return nullptr;
  }
  device.timed->SetPhase(Phase::kNone);
  device.timed->Reset();
  auto chunks = std::make_unique<BareChunks>(*device.timed, *sizes);
  if (absl::Status s = chunks->Reserve(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return nullptr;
  }
  return chunks;
}

void BM_Bare(benchmark::State& state, Device* device, std::size_t bytes, Timed which) {
  TimedDriver& timed = *device->timed;
  PhaseReset phase_reset{&timed};
  std::unique_ptr<BareChunks> chunks = SetUpBare(state, *device, bytes, /*copies=*/false);
  if (chunks == nullptr) return;
  absl::Status error;
  Clock timed_clock;
  Clock untimed_clock;
  Clock& map_clock = which == Timed::kMap ? timed_clock : untimed_clock;
  Clock& release_clock = which == Timed::kRelease ? timed_clock : untimed_clock;
  for (auto _ : state) {
    const std::int64_t before = timed_clock.wall_ns;
    // Mapped first, given back second, whichever of the two is timed.
    timed.SetPhase(which == Timed::kMap ? Phase::kTimed : Phase::kTeardown);
    error = Clocked(map_clock, [&] { return chunks->CreateAndMap(); });
    if (!error.ok()) break;
    timed.SetPhase(which == Timed::kRelease ? Phase::kTimed : Phase::kTeardown);
    error = Clocked(release_clock, [&] { return chunks->UnmapAndRelease(); });
    timed.SetPhase(Phase::kNone);
    if (!error.ok()) break;
    state.SetIterationTime(static_cast<double>(timed_clock.wall_ns - before) / 1e9);
  }
  timed.SetPhase(Phase::kNone);
  if (!error.ok()) {
    state.SkipWithError(error.ToString().c_str());
    return;
  }
  Report(state, timed, chunks->bytes(), timed_clock);
}

// `bytes` from `src` to `dst` as a backup copies them: one copy per block on the legacy default stream, then
// one synchronization (also after a failed copy, so that nothing is left in flight).
absl::Status CopyBlocks(Driver& driver, DevicePtr dst, DevicePtr src, std::size_t bytes) {
  absl::Status s;
  for (std::size_t offset = 0; s.ok() && offset < bytes; offset += kBlockSize) {
    s = driver.CopyAsync(dst + offset, src + offset, kBlockSize, kDefaultStream);
  }
  absl::Status synced = driver.StreamSynchronize(kDefaultStream);
  return s.ok() ? synced : s;
}

// What a backed-up wake is made of, through the Driver interface alone, right after the release of the same
// handles (as a wake comes right after its sleep): per iteration, timed, create and map the handles and copy
// every block from pinned host memory (as bare_create_map, then as pinned_copy_h2d); untimed, unmap and
// release them again.
void BM_BareWakeBackup(benchmark::State& state, Device* device, std::size_t bytes) {
  TimedDriver& timed = *device->timed;
  PhaseReset phase_reset{&timed};
  std::unique_ptr<BareChunks> chunks = SetUpBare(state, *device, bytes, /*copies=*/true);
  if (chunks == nullptr) return;
  absl::StatusOr<void*> host = timed.HostAlloc(bytes);
  if (!host.ok()) {
    state.SkipWithError(("pinned host memory: " + host.status().ToString()).c_str());
    return;
  }
  const auto host_ptr = reinterpret_cast<DevicePtr>(*host);
  // The first timed iteration follows a release too.
  absl::Status error = chunks->CreateAndMap();
  if (error.ok()) error = chunks->UnmapAndRelease();
  Clock timed_clock;
  for (auto _ : state) {
    if (!error.ok()) break;
    const std::int64_t before = timed_clock.wall_ns;
    timed.SetPhase(Phase::kTimed);
    error = Clocked(timed_clock, [&] {
      absl::Status s = chunks->CreateAndMap();
      return s.ok() ? CopyBlocks(timed, chunks->base(), host_ptr, bytes) : s;
    });
    timed.SetPhase(Phase::kTeardown);
    if (error.ok()) error = chunks->UnmapAndRelease();
    timed.SetPhase(Phase::kNone);
    if (!error.ok()) break;
    state.SetIterationTime(static_cast<double>(timed_clock.wall_ns - before) / 1e9);
  }
  timed.SetPhase(Phase::kNone);
  absl::Status freed = timed.HostFree(*host);
  if (error.ok()) error = freed;
  if (!error.ok()) {
    state.SkipWithError(error.ToString().c_str());
    return;
  }
  Report(state, timed, bytes, timed_clock);
}

void BM_PinnedCopy(benchmark::State& state, Device* device, std::size_t bytes, bool to_host) {
  TimedDriver& timed = *device->timed;
  PhaseReset phase_reset{&timed};
  std::unique_ptr<BareChunks> chunks = SetUpBare(state, *device, bytes, /*copies=*/true);
  if (chunks == nullptr) return;
  absl::Status error = chunks->CreateAndMap();
  if (!error.ok()) {
    state.SkipWithError(error.ToString().c_str());
    return;
  }
  Clock host_alloc;
  absl::StatusOr<void*> host = Clocked(host_alloc, [&] { return timed.HostAlloc(bytes); });
  if (!host.ok()) {
    state.SkipWithError(("pinned host memory: " + host.status().ToString()).c_str());
    return;
  }
  const auto host_ptr = reinterpret_cast<DevicePtr>(*host);
  const DevicePtr src = to_host ? chunks->base() : host_ptr;
  const DevicePtr dst = to_host ? host_ptr : chunks->base();
  Clock timed_clock;
  for (auto _ : state) {
    const std::int64_t before = timed_clock.wall_ns;
    timed.SetPhase(Phase::kTimed);
    error = Clocked(timed_clock, [&] { return CopyBlocks(timed, dst, src, bytes); });
    timed.SetPhase(Phase::kNone);
    if (!error.ok()) break;
    state.SetIterationTime(static_cast<double>(timed_clock.wall_ns - before) / 1e9);
  }
  timed.SetPhase(Phase::kNone);
  Clock host_free;
  absl::Status freed = Clocked(host_free, [&] { return timed.HostFree(*host); });
  if (error.ok()) error = freed;
  if (!error.ok()) {
    state.SkipWithError(error.ToString().c_str());
    return;
  }
  Report(state, timed, bytes, timed_clock);
  state.counters["host_alloc_once_us"] = static_cast<double>(host_alloc.wall_ns) / 1e3;
  state.counters["host_free_once_us"] = static_cast<double>(host_free.wall_ns) / 1e3;
}

// Each graphalloc benchmark right after its baseline, so that both see the device in the same state.
void Register(Device* device) {
  auto add = [](const std::string& name, int iterations, auto&&... args) {
    benchmark::RegisterBenchmark(name.c_str(), args...)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime()
        ->Iterations(iterations);
  };
  for (std::size_t gib : kSizesGiB) {
    const std::size_t bytes = gib * kGiB;
    const std::string at = "/" + device->bench->kind + "/" + std::to_string(gib);
    const int bare = Iterations(gib, /*copies=*/false);
    add("bare_unmap_release" + at, bare, BM_Bare, device, bytes, Timed::kRelease);
    add("sleep" + at + "/discard", bare, BM_SleepWake, device, bytes, SleepMode::kDiscard, Timed::kRelease,
        kNoSettle);
    add("bare_create_map" + at, bare, BM_Bare, device, bytes, Timed::kMap);
    add("wake" + at + "/discard", bare, BM_SleepWake, device, bytes, SleepMode::kDiscard, Timed::kMap,
        kNoSettle);
    if (device->sim() && gib > kSimCopyMaxGiB) continue;
    const int copies = Iterations(gib, /*copies=*/true);
    add("pinned_copy_d2h" + at, copies, BM_PinnedCopy, device, bytes, /*to_host=*/true);
    add("sleep" + at + "/backup", copies, BM_SleepWake, device, bytes, SleepMode::kBackup, Timed::kRelease,
        kNoSettle);
    add("pinned_copy_h2d" + at, copies, BM_PinnedCopy, device, bytes, /*to_host=*/false);
    add("wake" + at + "/backup", copies, BM_SleepWake, device, bytes, SleepMode::kBackup, Timed::kMap,
        kNoSettle);
    add("bare_wake_backup" + at, copies, BM_BareWakeBackup, device, bytes);
    add("wake" + at + "/backup_settled", copies, BM_SleepWake, device, bytes, SleepMode::kBackup, Timed::kMap,
        SettleTime(bytes));
  }
}

}  // namespace
}  // namespace graphalloc

int main(int argc, char** argv) {
  using namespace graphalloc;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::vector<std::unique_ptr<bench::BenchDevice>> bench_devices = bench::MakeBenchDevices();
  std::vector<std::unique_ptr<Device>> devices;
  for (const auto& d : bench_devices) {
    devices.push_back(
        std::make_unique<Device>(Device{d.get(), std::make_shared<bench::TimedDriver>(d->driver)}));
    Register(devices.back().get());
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  devices.clear();
  return 0;
}
