// Growing expandable segments by 1 GiB, and the driver calls that growth is made of.
//
// Through the allocator (CachingAllocator, expandable_segments:True), 1 GiB of growth per iteration in
// requests of 2, 20 or 512 MiB:
//
//   grow/<device>/<step MiB>           the segment's address range reserved by the first request of each
//                                      iteration (cuMemAddressReserve of the device's memory)
//   grow_reserved/<device>/<step MiB>  the same growth into a range reserved beforehand (a 2 MiB block
//                                      stays allocated across iterations): the growth alone
//   grow_split/..., grow_reserved_split/...
//                                      the same two through TimedDriver (bench/timed_driver.h), which
//                                      splits the time by driver call (counters below); compare with the
//                                      plain ones for the wrapper's own cost
//   grow_settled/<device>/512, grow_reserved_settled/<device>/512
//                                      as *_split, but each (untimed) teardown ends with a 50 ms sleep, so
//                                      that whatever the driver or the GPU still does after releasing the
//                                      previous iteration's memory (scrubbing it, freeing page tables) is
//                                      over before the next timed growth starts
//
// The same through the Driver interface alone, no allocator (always through TimedDriver), into one range
// reserved once like the allocator's (the device's memory, rounded up):
//
//   raw/<device>/<handle MiB>          1 GiB as handles of 2, 64 or 512 MiB: per handle cuMemCreate,
//                                      cuMemMap, cuMemSetAccess (timed); teardown cuMemUnmap +
//                                      cuMemRelease (untimed, reported as td_*)
//   raw_settled/<device>/512           raw/512 with the 50 ms sleep after the teardown
//   raw_reuse/<device>/512             the two handles created once and kept between iterations
//                                      (unmapped but not released, as the allocator's handle cache keeps
//                                      them): per iteration only cuMemMap + cuMemSetAccess
//
// Each allocator iteration starts with nothing of the growth mapped and no cached handles (the teardown,
// free + EmptyCache, is not timed); every benchmark uses real time, so time spent asleep inside the
// driver counts. Counters (per iteration):
//   handles_per_GiB                    physical handles mapped by the growth (allocator variants)
//   <call>_n, <call>_us, <call>_cpu_us calls of each kind during the timed part, their wall time and the
//                                      calling thread's CPU time; <call>: reserve, addr_free, create,
//                                      release, map, unmap, access, sync (stream/device/event sync, event
//                                      query), other (MemAlloc, MemFree, GetMemoryInfo). Only kinds that
//                                      were called appear; other driver calls are not timed.
//   td_<call>_us                       wall time of each kind during the untimed teardown
//   timed_us, timed_cpu_us             the timed part by the benchmark's own clocks
//   driver_us, driver_cpu_us           sum over the timed kinds of the timed part
//   rest_us, rest_cpu_us               timed minus driver: the allocator's own work (and the loop's);
//                                      about half of the wrapper's clock reads land in rest_cpu_us (where
//                                      reading the thread CPU clock is a slow syscall, as in some VMs, it
//                                      can exceed rest_us for the 2 MiB steps' 1,536 calls)
//
// Reading one run: <call>_us far above <call>_cpu_us means the thread waited inside that call (for the
// GPU or the kernel driver), which a faster allocator cannot remove; rest_us is what the allocator adds.
// raw/512 against grow_reserved_split/512 says whether the allocator makes more or slower calls than
// the minimum; raw_settled and raw_reuse against raw say whether cuMemCreate pays for the memory the
// previous iteration released (a program that grows once would not), and what mapping alone costs;
// raw/2, raw/64 and raw/512 say whether the driver's cost follows handles or bytes on this device.
//
// The simulated device always runs; GPU 0 runs when CudaDriver::Create(0) succeeds. Target on the GPU:
// under 1 ms per GiB for the 512 MiB steps. bench/expandable_bench_table.py makes a table of a JSON run:
//   expandable_bench --benchmark_format=json > grow.json && bench/expandable_bench_table.py grow.json
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/timed_driver.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/cuda_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

using bench::PhaseReset;
using bench::ReportSplit;
using bench::TimedDriver;
using Phase = TimedDriver::Phase;

constexpr std::size_t kMiBytes = std::size_t{1} << 20;
constexpr std::size_t kGrowth = std::size_t{1} << 30;
// Long enough for the GPU to scrub 1 GiB many times over; short enough for a run of a few seconds.
constexpr auto kSettle = std::chrono::milliseconds(50);
constexpr int kSettledIterations = 20;

struct Device {
  std::string name;  // "sim" or "cuda"
  std::shared_ptr<Driver> bare;
  std::shared_ptr<TimedDriver> timed;  // wraps `bare`
};

enum class GrowMode { kBare, kSplit, kSettled };
enum class RawMode { kFresh, kSettled, kReuse };

std::size_t Reservation(const Driver& driver) {
  const std::size_t g = driver.Info().granularity;
  return (driver.Info().total_memory + g - 1) / g * g;
}

void BM_Grow(benchmark::State& state, const Device* device, std::size_t step, bool reserved, GrowMode mode) {
  TimedDriver* timed = mode == GrowMode::kBare ? nullptr : device->timed.get();
  PhaseReset phase_reset{timed};
  if (timed != nullptr) {
    timed->SetPhase(Phase::kNone);
    timed->Reset();
  }
  std::shared_ptr<Driver> driver = timed != nullptr ? std::shared_ptr<Driver>(device->timed) : device->bare;
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator =
      CachingAllocator::Create(driver, *Config::Parse("expandable_segments:True"));
  if (!allocator.ok()) {
    state.SkipWithError(std::string(allocator.status().message()).c_str());
    return;
  }
  CachingAllocator& a = **allocator;
  DevicePtr anchor = 0;  // keeps the segment's reservation (EmptyCache frees only wholly unmapped ones)
  if (reserved) {
    absl::StatusOr<DevicePtr> p = a.Allocate(std::size_t{2} << 20);
    if (!p.ok()) {
      state.SkipWithError(std::string(p.status().message()).c_str());
      return;
    }
    anchor = *p;
  }
  const std::int64_t maps_before = a.GetStats().num_device_alloc;
  std::vector<DevicePtr> live;
  live.reserve(kGrowth / step);
  std::int64_t wall_ns = 0;
  std::int64_t cpu_ns = 0;
  for (auto _ : state) {
    if (timed != nullptr) timed->SetPhase(Phase::kTimed);
    const std::int64_t wall0 = bench::WallNs();
    const std::int64_t cpu0 = bench::ThreadCpuNs();
    for (std::size_t done = 0; done < kGrowth; done += step) {
      absl::StatusOr<DevicePtr> p = a.Allocate(step);
      if (!p.ok()) {
        state.SkipWithError(std::string(p.status().message()).c_str());
        return;
      }
      live.push_back(*p);
    }
    cpu_ns += bench::ThreadCpuNs() - cpu0;
    wall_ns += bench::WallNs() - wall0;
    state.PauseTiming();
    if (timed != nullptr) timed->SetPhase(Phase::kTeardown);
    for (DevicePtr p : live) (void)a.Free(p);
    live.clear();
    if (absl::Status s = a.EmptyCache(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    if (mode == GrowMode::kSettled) std::this_thread::sleep_for(kSettle);
    if (timed != nullptr) timed->SetPhase(Phase::kNone);
    state.ResumeTiming();
  }
  const DeviceStats stats = a.GetStats();
  state.counters["handles_per_GiB"] =
      static_cast<double>(stats.num_device_alloc - maps_before) / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(kGrowth));
  if (timed != nullptr) ReportSplit(state, *timed, wall_ns, cpu_ns);
  if (anchor != 0) (void)a.Free(anchor);
}

void BM_Raw(benchmark::State& state, const Device* device, std::size_t handle_size, RawMode mode) {
  TimedDriver& d = *device->timed;
  PhaseReset phase_reset{&d};
  d.SetPhase(Phase::kNone);
  d.Reset();
  const std::size_t count = kGrowth / handle_size;
  const std::size_t reservation = Reservation(d);
  absl::StatusOr<DevicePtr> base = d.AddressReserve(reservation, 0);
  if (!base.ok()) {
    state.SkipWithError(std::string(base.status().message()).c_str());
    return;
  }
  std::vector<PhysicalHandle> handles;  // created and not released
  std::vector<DevicePtr> mapped;
  handles.reserve(count);
  mapped.reserve(count);
  absl::Status error;
  if (mode == RawMode::kReuse) {
    for (std::size_t i = 0; error.ok() && i < count; ++i) {
      absl::StatusOr<PhysicalHandle> h = d.MemCreate(handle_size);
      if (h.ok()) {
        handles.push_back(*h);
      } else {
        error = h.status();
      }
    }
  }
  std::int64_t wall_ns = 0;
  std::int64_t cpu_ns = 0;
  for (auto _ : state) {
    if (!error.ok()) break;
    d.SetPhase(Phase::kTimed);
    const std::int64_t wall0 = bench::WallNs();
    const std::int64_t cpu0 = bench::ThreadCpuNs();
    for (std::size_t i = 0; i < count; ++i) {
      const DevicePtr at = *base + i * handle_size;
      if (mode != RawMode::kReuse) {
        absl::StatusOr<PhysicalHandle> h = d.MemCreate(handle_size);
        if (!h.ok()) {
          error = h.status();
          break;
        }
        handles.push_back(*h);
      }
      if (error = d.MemMap(at, handle_size, handles[i]); !error.ok()) break;
      mapped.push_back(at);
      if (error = d.MemSetAccess(at, handle_size, {}); !error.ok()) break;
    }
    cpu_ns += bench::ThreadCpuNs() - cpu0;
    wall_ns += bench::WallNs() - wall0;
    if (!error.ok()) break;
    state.PauseTiming();
    d.SetPhase(Phase::kTeardown);
    for (DevicePtr at : mapped) {
      if (absl::Status s = d.MemUnmap(at, handle_size); !s.ok() && error.ok()) error = s;
    }
    mapped.clear();
    if (mode != RawMode::kReuse) {
      for (PhysicalHandle h : handles) {
        if (absl::Status s = d.MemRelease(h); !s.ok() && error.ok()) error = s;
      }
      handles.clear();
    }
    if (mode == RawMode::kSettled) std::this_thread::sleep_for(kSettle);
    d.SetPhase(Phase::kNone);
    state.ResumeTiming();
  }
  d.SetPhase(Phase::kNone);
  if (!error.ok()) state.SkipWithError(std::string(error.message()).c_str());
  for (DevicePtr at : mapped) (void)d.MemUnmap(at, handle_size);
  for (PhysicalHandle h : handles) (void)d.MemRelease(h);
  (void)d.AddressFree(*base, reservation);
  if (!error.ok()) return;
  state.counters["handles_per_GiB"] = static_cast<double>(count);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(kGrowth));
  ReportSplit(state, d, wall_ns, cpu_ns);
}

void Register(const Device* device) {
  auto add = [](const std::string& name, auto&&... args) {
    return benchmark::RegisterBenchmark(name.c_str(), args...)->Unit(benchmark::kMicrosecond)->UseRealTime();
  };
  const std::string dev = "/" + device->name + "/";
  for (GrowMode mode : {GrowMode::kBare, GrowMode::kSplit}) {
    for (bool reserved : {false, true}) {
      for (std::size_t step_mib : {2, 20, 512}) {
        const std::string name = std::string(reserved ? "grow_reserved" : "grow") +
                                 (mode == GrowMode::kSplit ? "_split" : "") + dev + std::to_string(step_mib);
        add(name, BM_Grow, device, step_mib * kMiBytes, reserved, mode);
      }
    }
  }
  for (bool reserved : {false, true}) {
    add(std::string(reserved ? "grow_reserved_settled" : "grow_settled") + dev + "512", BM_Grow, device,
        512 * kMiBytes, reserved, GrowMode::kSettled)
        ->Iterations(kSettledIterations);
  }
  for (std::size_t handle_mib : {2, 64, 512}) {
    add("raw" + dev + std::to_string(handle_mib), BM_Raw, device, handle_mib * kMiBytes, RawMode::kFresh);
  }
  add("raw_settled" + dev + "512", BM_Raw, device, 512 * kMiBytes, RawMode::kSettled)
      ->Iterations(kSettledIterations);
  add("raw_reuse" + dev + "512", BM_Raw, device, 512 * kMiBytes, RawMode::kReuse);
}

Device MakeDevice(std::string name, std::shared_ptr<Driver> driver) {
  Device device{std::move(name), std::move(driver), nullptr};
  device.timed = std::make_shared<TimedDriver>(device.bare);
  return device;
}

}  // namespace
}  // namespace graphalloc

int main(int argc, char** argv) {
  using namespace graphalloc;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::vector<std::unique_ptr<Device>> devices;
  absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create();
  if (sim.ok()) {
    devices.push_back(std::make_unique<Device>(MakeDevice("sim", std::shared_ptr<Driver>(std::move(*sim)))));
    benchmark::AddCustomContext("sim_device", devices.back()->bare->Info().name);
  }
  absl::StatusOr<std::unique_ptr<CudaDriver>> cuda = CudaDriver::Create(0);
  if (cuda.ok()) {
    devices.push_back(
        std::make_unique<Device>(MakeDevice("cuda", std::shared_ptr<Driver>(std::move(*cuda)))));
    benchmark::AddCustomContext("cuda_device", devices.back()->bare->Info().name);
  } else {
    std::fprintf(stderr, "expandable_bench: no GPU (%s); simulated device only\n",
                 std::string(cuda.status().message()).c_str());
    benchmark::AddCustomContext("cuda_device", "absent: " + std::string(cuda.status().message()));
  }
  for (const auto& device : devices) Register(device.get());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  devices.clear();
  return 0;
}
