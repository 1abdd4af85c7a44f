// PyTorch's c10 CUDA caching allocator and graphalloc side by side in one binary (built only when CMake
// finds PyTorch; see bench/CMakeLists.txt).
//
//   hit/graphalloc-<device>/<bytes>   graphalloc's hit path, the same code as in allocator_bench
//   hit/c10/<bytes>                   c10 raw_alloc_with_stream + raw_delete of one size on one stream
//   churn/c10/<live>                  the churn workload of allocator_bench (same sizes, same seed)
//
// The c10 variants run only on a GPU; without one they are skipped with a line on stderr.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "allocator/device/cuda_driver.h"
#include "bench/bench_support.h"
#include "bench/c10_peer.h"

namespace graphalloc::bench {
namespace {

struct C10Peer {
  Driver* driver = nullptr;        // the GPU's graphalloc driver, which owns the stream
  Stream stream = kDefaultStream;  // a stream of its own, not graphalloc's
  void* native_stream() const { return NativeFromStream(stream); }
};

bool C10Pair(benchmark::State& state, void* stream, std::size_t size) {
  void* p = c10peer::Alloc(size, stream);
  if (p == nullptr) [[unlikely]] {
    state.SkipWithError(c10peer::LastError());
    return false;
  }
  benchmark::DoNotOptimize(p);
  if (!c10peer::Free(p)) [[unlikely]] {
    state.SkipWithError(c10peer::LastError());
    return false;
  }
  return true;
}

void BM_C10Hit(benchmark::State& state, C10Peer* peer, std::size_t size) {
  void* stream = peer->native_stream();
  bool ok = true;
  for (int i = 0; ok && i < kWarmupPairs; ++i) ok = C10Pair(state, stream, size);
  for (auto _ : state) {
    if (!ok || !C10Pair(state, stream, size)) break;
  }
  state.SetItemsProcessed(state.iterations());
}

struct C10ChurnState final : ChurnStateBase {
  explicit C10ChurnState(std::size_t live_blocks) : live(live_blocks) {}
  ~C10ChurnState() override {
    for (const ChurnLive::Block& block : live.blocks) {
      if (block.ptr != 0) (void)c10peer::Free(reinterpret_cast<void*>(block.ptr));
    }
    (void)c10peer::EmptyCache();
  }
  ChurnLive live;
};

void BM_C10Churn(benchmark::State& state, C10Peer* peer, std::size_t live_blocks) {
  const std::string key = ChurnName("c10", live_blocks);
  void* stream = peer->native_stream();
  auto alloc = [stream](std::size_t size) {
    return reinterpret_cast<std::uintptr_t>(c10peer::Alloc(size, stream));
  };
  auto* churn = static_cast<C10ChurnState*>(FindChurnState(key));
  if (churn == nullptr) {
    auto owned = std::make_unique<C10ChurnState>(live_blocks);
    if (!owned->live.Fill(alloc)) {
      state.SkipWithError((std::string("churn fill failed: ") + c10peer::LastError()).c_str());
      return;
    }
    churn = owned.get();
    SetChurnState(key, std::move(owned));
  }
  ChurnLoop(
      state, churn->live, alloc,
      [](std::uintptr_t ptr) { return c10peer::Free(reinterpret_cast<void*>(ptr)); },
      [] { return std::string(c10peer::LastError()); });
}

int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::vector<std::unique_ptr<BenchDevice>> devices = MakeBenchDevices();
  BenchDevice* gpu = nullptr;
  for (auto& device : devices) {
    if (device->kind == "cuda") gpu = device.get();
  }

  std::unique_ptr<C10Peer> peer;
  if (gpu == nullptr) {
    std::fprintf(stderr, "peers_c10: no GPU, skipping the c10 allocator benchmarks\n");
    benchmark::AddCustomContext("c10_allocator", "skipped: no GPU");
  } else {
    absl::StatusOr<int> count = CudaDriver::DeviceCount();
    absl::StatusOr<Stream> stream = gpu->driver->StreamCreate();
    if (!count.ok() || !stream.ok()) {
      std::fprintf(stderr, "peers_c10: skipping c10: %s\n",
                   (!count.ok() ? count.status() : stream.status()).ToString().c_str());
    } else if (!c10peer::Init(*count)) {
      std::fprintf(stderr, "peers_c10: skipping c10: %s\n", c10peer::LastError());
      (void)gpu->driver->StreamDestroy(*stream);
    } else {
      peer = std::make_unique<C10Peer>();
      peer->driver = gpu->driver.get();
      peer->stream = *stream;
      benchmark::AddCustomContext("c10_allocator", c10peer::Name());
    }
  }

  for (auto& device : devices) RegisterGraphallocHitPath(*device);
  if (peer != nullptr) {
    for (std::size_t size : kHitSizes) {
      benchmark::RegisterBenchmark(HitName("c10", size).c_str(), BM_C10Hit, peer.get(), size);
    }
    RegisterGraphallocChurn(*gpu);  // graphalloc's churn on the GPU too, beside c10's
    for (std::size_t live : kChurnLiveBlocks) {
      benchmark::RegisterBenchmark(ChurnName("c10", live).c_str(), BM_C10Churn, peer.get(), live);
    }
  }

  benchmark::RunSpecifiedBenchmarks();
  ResetChurnState();
  if (peer != nullptr) {
    (void)c10peer::EmptyCache();
    (void)peer->driver->StreamSynchronize(peer->stream);
    (void)peer->driver->StreamDestroy(peer->stream);
  }
  devices.clear();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace graphalloc::bench

int main(int argc, char** argv) { return graphalloc::bench::Main(argc, argv); }
