// Shared pieces of the allocator benchmarks (allocator_bench and peers_c10): the devices graphalloc is
// measured on, the workloads (hit path, churn, threads) and their registration.
//
// Benchmark names are "<workload>/<implementation>/<parameter>", e.g. "hit/graphalloc-cuda/4096",
// "churn/c10/100000", "threads/graphalloc-sim/4096/real_time/threads:8"; run_allocator_bench.sh parses
// them. Implementations: graphalloc-sim, graphalloc-cuda, cudaMallocAsync, cudaMalloc, c10.
#ifndef GRAPHALLOC_BENCH_BENCH_SUPPORT_H_
#define GRAPHALLOC_BENCH_BENCH_SUPPORT_H_

#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc::bench {

inline constexpr std::size_t kKiB = std::size_t{1} << 10;
inline constexpr std::size_t kMiBytes = std::size_t{1} << 20;

// Hit path: allocate then free the same size on one stream, after this many warm-up pairs.
inline constexpr std::array<std::size_t, 5> kHitSizes = {512, 4 * kKiB, kMiBytes, 20 * kMiBytes,
                                                         256 * kMiBytes};
inline constexpr int kWarmupPairs = 1000;
// cudaMalloc + cudaFree is slow (tens of microseconds): fewer sizes.
inline constexpr std::array<std::size_t, 3> kCudaMallocSizes = {512, kMiBytes, 20 * kMiBytes};
// Churn: live blocks held while one is freed and one allocated per operation.
inline constexpr std::array<std::size_t, 4> kChurnLiveBlocks = {64, 1000, 10000, 100000};
inline constexpr std::size_t kChurnMinSize = 512;
inline constexpr std::size_t kChurnMaxSize = 4 * kMiBytes;
// Expected live bytes of a churn stay under this (the largest size shrinks for large live sets).
inline constexpr std::size_t kChurnLiveBudget = std::size_t{8} << 30;
// Threads: each thread on its own stream doing hit-path pairs of this size.
inline constexpr std::size_t kThreadPairSize = 4 * kKiB;
inline constexpr std::array<int, 4> kThreadCounts = {1, 2, 4, 8};

// One device graphalloc runs on: its driver, a shared allocator for the hit-path and thread benchmarks,
// a stream for the single-stream ones and one stream per benchmark thread.
struct BenchDevice {
  std::string kind;  // "sim" or "cuda"
  std::shared_ptr<Driver> driver;
  std::unique_ptr<CachingAllocator> allocator;
  Stream stream = kDefaultStream;
  std::vector<Stream> thread_streams;  // kThreadCounts.back() of them

  std::string Impl() const { return "graphalloc-" + kind; }
  ~BenchDevice();
};

// The simulated device always; the real GPU when CudaDriver::Create(0) succeeds (otherwise a line on
// stderr says why its variants are skipped). Sets the benchmark context keys "sim_device" and
// "cuda_device".
std::vector<std::unique_ptr<BenchDevice>> MakeBenchDevices();

// Registers graphalloc's benchmarks on `device` (which must outlive the benchmark run).
void RegisterGraphallocHitPath(BenchDevice& device);
void RegisterGraphallocChurn(BenchDevice& device);
void RegisterGraphallocThreads(BenchDevice& device);

// ---- Churn workload, shared by every implementation. ----

// The largest block size for a churn over `live` blocks: kChurnMaxSize, halved until the expected live
// bytes (log-uniform sizes from kChurnMinSize) fit in kChurnLiveBudget.
std::size_t ChurnMaxSize(std::size_t live);

// Fixed-seed random source: the same sequence of victims and sizes for every implementation.
class ChurnRandom {
 public:
  ChurnRandom(std::size_t live, std::size_t max_size);
  // Index of the live block to replace, uniform in [0, live).
  std::size_t NextVictim() {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(Next()) * live_) >> 64);
  }
  // A size, log-uniform in [kChurnMinSize, max_size], from a precomputed table.
  std::size_t NextSize() { return sizes_[Next() & (sizes_.size() - 1)]; }
  std::size_t live() const { return live_; }
  std::size_t max_size() const { return max_size_; }

 private:
  std::uint64_t Next() {  // xorshift64*
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1DULL;
  }
  std::uint64_t state_;
  std::size_t live_;
  std::size_t max_size_;
  std::vector<std::size_t> sizes_;  // a power of two of them
};

// Per-implementation churn state, kept across the calls of one benchmark (its live set is built once)
// and destroyed when a different churn benchmark starts or at ResetChurnState().
class ChurnStateBase {
 public:
  virtual ~ChurnStateBase() = default;
};
// The current churn state when its key is `key`, else null (after destroying any other one).
ChurnStateBase* FindChurnState(const std::string& key);
void SetChurnState(const std::string& key, std::unique_ptr<ChurnStateBase> state);
void ResetChurnState();

// The live set of a churn: `random.live()` blocks, filled with `alloc(size)` (0 on failure).
struct ChurnLive {
  explicit ChurnLive(std::size_t live) : random(live, ChurnMaxSize(live)) {}
  struct Block {
    std::uintptr_t ptr;  // 0: none (freed after a failure)
    std::size_t size;
  };
  ChurnRandom random;
  std::vector<Block> blocks;  // one cache line per replacement, whatever the live set
  std::size_t live_bytes = 0;

  template <class AllocFn>
  bool Fill(AllocFn&& alloc) {
    blocks.reserve(random.live());
    while (blocks.size() < random.live()) {
      const std::size_t size = random.NextSize();
      const std::uintptr_t p = alloc(size);
      if (p == 0) return false;
      blocks.push_back({p, size});
      live_bytes += size;
    }
    return true;
  }
};

// The timed churn loop: per iteration (one "operation"), free a random live block and allocate one of a
// random size in its place. `alloc(size)` returns 0 on failure, `free(ptr)` false; `error()` describes
// the failure. Items processed = operations.
template <class AllocFn, class FreeFn, class ErrorFn>
void ChurnLoop(benchmark::State& state, ChurnLive& live, AllocFn&& alloc, FreeFn&& free, ErrorFn&& error) {
  for (auto _ : state) {
    ChurnLive::Block& block = live.blocks[live.random.NextVictim()];
    if (!free(block.ptr)) [[unlikely]] {
      state.SkipWithError(("churn free failed: " + error()).c_str());
      break;
    }
    live.live_bytes -= block.size;
    const std::size_t size = live.random.NextSize();
    std::uintptr_t p = alloc(size);  // not const: DoNotOptimize(const T&) is deprecated
    if (p == 0) [[unlikely]] {
      block = {0, 0};  // already freed
      state.SkipWithError(("churn allocate failed: " + error()).c_str());
      break;
    }
    benchmark::DoNotOptimize(p);
    block = {p, size};
    live.live_bytes += size;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["live_blocks"] = static_cast<double>(live.random.live());
  state.counters["max_size"] = static_cast<double>(live.random.max_size());
  state.counters["live_bytes"] = static_cast<double>(live.live_bytes);
}

std::string HitName(const std::string& impl, std::size_t size);
std::string ChurnName(const std::string& impl, std::size_t live);
std::string ThreadsName(const std::string& impl, std::size_t size);

}  // namespace graphalloc::bench

#endif  // GRAPHALLOC_BENCH_BENCH_SUPPORT_H_
