// graphalloc's allocator benchmarks, and the CUDA runtime's allocators side by side in the same binary.
//
//   hit/<impl>/<bytes>       allocate + free of one size on one stream after warm-up; time per pair
//   churn/<impl>/<live>      `live` blocks held; per op, free a random one and allocate a random size
//   churn/none/<live>        the churn harness alone, without an allocator (its overhead)
//   threads/<impl>/4096/...  1/2/4/8 threads each on its own stream doing hit pairs; items/s is the total
//
// graphalloc runs on the simulated device always and on GPU 0 when CudaDriver::Create(0) succeeds.
// cudaMallocAsync (default pool, release threshold UINT64_MAX) and cudaMalloc run only on a GPU and only
// in a CUDA build. PyTorch's c10 allocator is in the separate peers_c10 binary (it needs PyTorch).
// Run with --benchmark_format=json or --benchmark_out=FILE; see run_allocator_bench.sh.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_support.h"

#if GRAPHALLOC_BENCH_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

namespace graphalloc::bench {
namespace {

// The churn harness alone (random victim, random size, live-set update; no allocator): what the churn
// numbers include besides the allocator, per live-set size.
struct NoneChurnState final : ChurnStateBase {
  explicit NoneChurnState(std::size_t live_blocks) : live(live_blocks) {}
  ChurnLive live;
  std::uintptr_t next = 0;
};

void BM_NoneChurn(benchmark::State& state, std::size_t live_blocks) {
  const std::string key = ChurnName("none", live_blocks);
  auto* churn = static_cast<NoneChurnState*>(FindChurnState(key));
  if (churn == nullptr) {
    auto owned = std::make_unique<NoneChurnState>(live_blocks);
    NoneChurnState& s = *owned;
    s.live.Fill([&s](std::size_t) { return s.next += 512; });
    churn = owned.get();
    SetChurnState(key, std::move(owned));
  }
  NoneChurnState& s = *churn;
  ChurnLoop(
      state, s.live, [&s](std::size_t) { return s.next += 512; },
      [](std::uintptr_t ptr) {
        benchmark::DoNotOptimize(ptr);
        return true;
      },
      [] { return std::string(); });
}

#if GRAPHALLOC_BENCH_HAVE_CUDART

std::string CudaError(const char* call, cudaError_t e) {
  return std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

struct CudartPeer {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;

  // Empty on success, else what failed.
  std::string SetUp() {
    if (cudaError_t e = cudaSetDevice(0); e != cudaSuccess) return CudaError("cudaSetDevice(0)", e);
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaError("cudaStreamCreateWithFlags", e);
    }
    if (cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, 0); e != cudaSuccess) {
      return CudaError("cudaDeviceGetDefaultMemPool", e);
    }
    // Keep freed memory in the pool across synchronizations, as PyTorch's cudaMallocAsync backend does.
    std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
    if (cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
        e != cudaSuccess) {
      return CudaError("cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)", e);
    }
    int runtime = 0;
    int driver = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaDriverGetVersion(&driver);
    benchmark::AddCustomContext("cuda_runtime_version", std::to_string(runtime));
    benchmark::AddCustomContext("cuda_driver_version", std::to_string(driver));
    benchmark::AddCustomContext("cudaMallocAsync_release_threshold", "UINT64_MAX");
    return "";
  }
  ~CudartPeer() {
    if (stream != nullptr) {
      (void)cudaStreamSynchronize(stream);
      (void)cudaStreamDestroy(stream);
    }
    if (pool != nullptr) (void)cudaMemPoolTrimTo(pool, 0);
  }
};

bool AsyncPair(benchmark::State& state, cudaStream_t stream, std::size_t size) {
  void* p = nullptr;
  if (cudaError_t e = cudaMallocAsync(&p, size, stream); e != cudaSuccess) [[unlikely]] {
    state.SkipWithError(CudaError("cudaMallocAsync", e).c_str());
    return false;
  }
  benchmark::DoNotOptimize(p);
  if (cudaError_t e = cudaFreeAsync(p, stream); e != cudaSuccess) [[unlikely]] {
    state.SkipWithError(CudaError("cudaFreeAsync", e).c_str());
    return false;
  }
  return true;
}

void BM_CudaMallocAsyncHit(benchmark::State& state, CudartPeer* peer, std::size_t size) {
  bool ok = true;
  for (int i = 0; ok && i < kWarmupPairs; ++i) ok = AsyncPair(state, peer->stream, size);
  if (ok) (void)cudaStreamSynchronize(peer->stream);
  for (auto _ : state) {
    if (!ok || !AsyncPair(state, peer->stream, size)) break;
  }
  (void)cudaStreamSynchronize(peer->stream);
  state.SetItemsProcessed(state.iterations());
}

bool SyncPair(benchmark::State& state, std::size_t size) {
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) [[unlikely]] {
    state.SkipWithError(CudaError("cudaMalloc", e).c_str());
    return false;
  }
  benchmark::DoNotOptimize(p);
  if (cudaError_t e = cudaFree(p); e != cudaSuccess) [[unlikely]] {
    state.SkipWithError(CudaError("cudaFree", e).c_str());
    return false;
  }
  return true;
}

void BM_CudaMallocHit(benchmark::State& state, std::size_t size) {
  bool ok = true;
  for (int i = 0; ok && i < 10; ++i) ok = SyncPair(state, size);
  for (auto _ : state) {
    if (!ok || !SyncPair(state, size)) break;
  }
  state.SetItemsProcessed(state.iterations());
}

struct AsyncChurnState final : ChurnStateBase {
  AsyncChurnState(CudartPeer* p, std::size_t live_blocks) : peer(p), live(live_blocks) {}
  ~AsyncChurnState() override {
    for (const ChurnLive::Block& block : live.blocks) {
      if (block.ptr != 0) (void)cudaFreeAsync(reinterpret_cast<void*>(block.ptr), peer->stream);
    }
    (void)cudaStreamSynchronize(peer->stream);
    (void)cudaMemPoolTrimTo(peer->pool, 0);
  }
  CudartPeer* peer;
  ChurnLive live;
  cudaError_t last = cudaSuccess;
  const char* last_call = "";
};

void BM_CudaMallocAsyncChurn(benchmark::State& state, CudartPeer* peer, std::size_t live_blocks) {
  const std::string key = ChurnName("cudaMallocAsync", live_blocks);
  auto* churn = static_cast<AsyncChurnState*>(FindChurnState(key));
  auto alloc = [peer](AsyncChurnState& s, std::size_t size) -> std::uintptr_t {
    void* p = nullptr;
    if (cudaError_t e = cudaMallocAsync(&p, size, peer->stream); e != cudaSuccess) [[unlikely]] {
      s.last = e;
      s.last_call = "cudaMallocAsync";
      return 0;
    }
    return reinterpret_cast<std::uintptr_t>(p);
  };
  if (churn == nullptr) {
    auto owned = std::make_unique<AsyncChurnState>(peer, live_blocks);
    AsyncChurnState& s = *owned;
    if (!s.live.Fill([&](std::size_t size) { return alloc(s, size); })) {
      state.SkipWithError(("churn fill failed: " + CudaError(s.last_call, s.last)).c_str());
      return;
    }
    churn = owned.get();
    SetChurnState(key, std::move(owned));
  }
  AsyncChurnState& s = *churn;
  ChurnLoop(
      state, s.live, [&](std::size_t size) { return alloc(s, size); },
      [&](std::uintptr_t ptr) {
        if (cudaError_t e = cudaFreeAsync(reinterpret_cast<void*>(ptr), peer->stream); e != cudaSuccess)
            [[unlikely]] {
          s.last = e;
          s.last_call = "cudaFreeAsync";
          return false;
        }
        return true;
      },
      [&] { return CudaError(s.last_call, s.last); });
  (void)cudaStreamSynchronize(peer->stream);
}

void RegisterCudartPeers(CudartPeer& peer) {
  for (std::size_t size : kHitSizes) {
    benchmark::RegisterBenchmark(HitName("cudaMallocAsync", size).c_str(), BM_CudaMallocAsyncHit, &peer,
                                 size);
  }
  for (std::size_t size : kCudaMallocSizes) {
    benchmark::RegisterBenchmark(HitName("cudaMalloc", size).c_str(), BM_CudaMallocHit, size);
  }
}

void RegisterCudartChurn(CudartPeer& peer) {
  for (std::size_t live : kChurnLiveBlocks) {
    benchmark::RegisterBenchmark(ChurnName("cudaMallocAsync", live).c_str(), BM_CudaMallocAsyncChurn, &peer,
                                 live);
  }
}

#endif  // GRAPHALLOC_BENCH_HAVE_CUDART

int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::vector<std::unique_ptr<BenchDevice>> devices = MakeBenchDevices();
  bool have_gpu = false;
  for (const auto& device : devices) have_gpu = have_gpu || device->kind == "cuda";

#if GRAPHALLOC_BENCH_HAVE_CUDART
  std::unique_ptr<CudartPeer> peer;
  if (have_gpu) {
    peer = std::make_unique<CudartPeer>();
    if (std::string error = peer->SetUp(); !error.empty()) {
      std::fprintf(stderr, "allocator_bench: skipping cudaMallocAsync/cudaMalloc: %s\n", error.c_str());
      peer.reset();
    }
  } else {
    std::fprintf(stderr, "allocator_bench: no GPU, skipping cudaMallocAsync/cudaMalloc\n");
  }
#else
  std::fprintf(stderr,
               "allocator_bench: built without the CUDA runtime, skipping cudaMallocAsync/cudaMalloc\n");
  benchmark::AddCustomContext("cudart_peers", "not built");
  (void)have_gpu;
#endif

  for (auto& device : devices) RegisterGraphallocHitPath(*device);
#if GRAPHALLOC_BENCH_HAVE_CUDART
  if (peer != nullptr) RegisterCudartPeers(*peer);
#endif
  for (std::size_t live : kChurnLiveBlocks) {
    benchmark::RegisterBenchmark(ChurnName("none", live).c_str(), BM_NoneChurn, live);
  }
  for (auto& device : devices) RegisterGraphallocChurn(*device);
#if GRAPHALLOC_BENCH_HAVE_CUDART
  if (peer != nullptr) RegisterCudartChurn(*peer);
#endif
  for (auto& device : devices) RegisterGraphallocThreads(*device);

  benchmark::RunSpecifiedBenchmarks();
  ResetChurnState();
#if GRAPHALLOC_BENCH_HAVE_CUDART
  peer.reset();
#endif
  devices.clear();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace graphalloc::bench

int main(int argc, char** argv) { return graphalloc::bench::Main(argc, argv); }
