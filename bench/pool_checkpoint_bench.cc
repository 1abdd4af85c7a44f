// Checkpoint and restore of a private pool holding 10,000 blocks (issue 5's target: under 1 ms each), on
// the simulated device and, where there is one, the real GPU. The restore is a worst case for the work it
// does: every block of the pool is rebuilt (half of them were freed and others allocated since the
// checkpoint), on regular and on expandable segments.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "bench/bench_support.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {
namespace {

constexpr int kBlocks = 10000;
constexpr std::size_t kBlockSize = 64 << 10;

struct PoolFixture {
  std::unique_ptr<CachingAllocator> allocator;
  PrivatePool pool;
  PoolRoute route;
  std::vector<DevicePtr> live;
};

// A pool with kBlocks live blocks of kBlockSize on `device`'s stream; nullptr if it cannot be built.
std::unique_ptr<PoolFixture> MakePool(bench::BenchDevice& device, bool expandable) {
  Config config;
  config.expandable_segments = expandable;
  auto f = std::make_unique<PoolFixture>();
  absl::StatusOr<std::unique_ptr<CachingAllocator>> a = CachingAllocator::Create(device.driver, config);
  if (!a.ok()) return nullptr;
  f->allocator = std::move(*a);
  absl::StatusOr<PrivatePool> pool = f->allocator->CreatePool();
  if (!pool.ok()) return nullptr;
  f->pool = std::move(*pool);
  absl::StatusOr<PoolRoute> route =
      f->allocator->BeginAllocateToPool(f->pool, PoolRouteFilter::ForStream(device.stream));
  if (!route.ok()) return nullptr;
  f->route = std::move(*route);
  for (int i = 0; i < kBlocks; ++i) {
    absl::StatusOr<DevicePtr> p = f->allocator->Allocate(kBlockSize, device.stream);
    if (!p.ok()) return nullptr;
    f->live.push_back(*p);
  }
  return f;
}

void BM_Checkpoint(benchmark::State& state, bench::BenchDevice* device, bool expandable) {
  std::unique_ptr<PoolFixture> f = MakePool(*device, expandable);
  if (f == nullptr) {
    state.SkipWithError("could not build the pool");
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<PoolCheckpoint> cp = f->allocator->Checkpoint(f->pool);
    if (!cp.ok()) state.SkipWithError(std::string(cp.status().message()).c_str());
    benchmark::DoNotOptimize(cp);
  }
  state.counters["blocks"] = kBlocks;
}

void BM_Restore(benchmark::State& state, bench::BenchDevice* device, bool expandable) {
  std::unique_ptr<PoolFixture> f = MakePool(*device, expandable);
  if (f == nullptr) {
    state.SkipWithError("could not build the pool");
    return;
  }
  absl::StatusOr<PoolCheckpoint> cp = f->allocator->Checkpoint(f->pool);
  if (!cp.ok()) {
    state.SkipWithError(std::string(cp.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    // Diverge (untimed): free every other block, then allocate a quarter as many blocks, of the same size
    // (they fit in the holes) or of twice the size (the pool grows: the restore unmaps or frees that).
    state.PauseTiming();
    for (int i = 0; i < kBlocks; i += 2) (void)f->allocator->Free(f->live[i]);
    for (int i = 0; i < kBlocks / 4; ++i) {
      (void)f->allocator->Allocate(static_cast<std::size_t>(state.range(0)) * kBlockSize, device->stream);
    }
    state.ResumeTiming();
    absl::StatusOr<RestoreResult> r = f->allocator->Restore(f->pool, *cp);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
    benchmark::DoNotOptimize(r);
  }
  state.counters["blocks"] = kBlocks;
}

}  // namespace
}  // namespace graphalloc

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::vector<std::unique_ptr<graphalloc::bench::BenchDevice>> devices =
      graphalloc::bench::MakeBenchDevices();
  for (auto& d : devices) {
    for (bool expandable : {false, true}) {
      const std::string suffix = "/" + d->kind + (expandable ? "/expandable" : "/regular");
      benchmark::RegisterBenchmark(("BM_PoolCheckpoint10k" + suffix).c_str(), graphalloc::BM_Checkpoint,
                                   d.get(), expandable)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("BM_PoolRestore10k" + suffix).c_str(), graphalloc::BM_Restore, d.get(),
                                   expandable)
          ->ArgName("divergence_block_x")
          ->Arg(1)
          ->Arg(2)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
