// Growing one expandable segment by 1 GiB, in requests of 2 MiB, 20 MiB or 512 MiB:
//
//   grow/<device>/<step MiB>           time per 1 GiB of growth, the segment's address range reserved by
//                                      the first request of each iteration (cuMemAddressReserve of the
//                                      device's memory)
//   grow_reserved/<device>/<step MiB>  the same growth into a range reserved beforehand (a 2 MiB block
//                                      stays allocated across iterations): the growth alone
//
// Every request maps new memory: one handle per request up to 64 MiB, and a 512 MiB request into a pool
// with nothing stranded one handle of its own (expandable_growth.cc, MaxNewChunkSize); the counter
// handles_per_GiB says how many. Each iteration starts with nothing of the growth mapped and no cached
// handles (the teardown, free + EmptyCache, is not timed). The simulated device always runs; GPU 0 runs
// when CudaDriver::Create(0) succeeds. Target on the H100: under 1 ms per GiB for the 512 MiB steps.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/device/cuda_driver.h"
#include "allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

constexpr std::size_t kGrowth = std::size_t{1} << 30;

void BM_Grow(benchmark::State& state, std::shared_ptr<Driver> driver, std::size_t step, bool reserved) {
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
  for (auto _ : state) {
    for (std::size_t done = 0; done < kGrowth; done += step) {
      absl::StatusOr<DevicePtr> p = a.Allocate(step);
      if (!p.ok()) {
        state.SkipWithError(std::string(p.status().message()).c_str());
        return;
      }
      live.push_back(*p);
    }
    state.PauseTiming();
    for (DevicePtr p : live) (void)a.Free(p);
    live.clear();
    if (absl::Status s = a.EmptyCache(); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    state.ResumeTiming();
  }
  const DeviceStats stats = a.GetStats();
  state.counters["handles_per_GiB"] =
      static_cast<double>(stats.num_device_alloc - maps_before) / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(kGrowth));
  if (anchor != 0) (void)a.Free(anchor);
}

void Register(const std::string& device, std::shared_ptr<Driver> driver) {
  for (bool reserved : {false, true}) {
    for (std::size_t step_mib : {2, 20, 512}) {
      const std::string name =
          std::string(reserved ? "grow_reserved/" : "grow/") + device + "/" + std::to_string(step_mib);
      benchmark::RegisterBenchmark(name.c_str(), BM_Grow, driver, step_mib << 20, reserved)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
  }
}

}  // namespace
}  // namespace graphalloc

int main(int argc, char** argv) {
  using namespace graphalloc;
  benchmark::Initialize(&argc, argv);
  absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create();
  if (sim.ok()) Register("sim", std::shared_ptr<Driver>(std::move(*sim)));
  absl::StatusOr<std::unique_ptr<CudaDriver>> cuda = CudaDriver::Create(0);
  if (cuda.ok()) {
    Register("cuda", std::shared_ptr<Driver>(std::move(*cuda)));
  } else {
    std::fprintf(stderr, "expandable_bench: no GPU (%s); simulated device only\n",
                 std::string(cuda.status().message()).c_str());
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
