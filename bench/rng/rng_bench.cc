// RNG throughput on the GPU, side by side in one binary:
//   - device write and copy bandwidth (cudaMemsetAsync, cudaMemcpyAsync device-to-device) as the ceiling;
//   - graphalloc's uniform float32 fill of 1 GiB (the FillUniform kernel) and cuRAND's curandGenerateUniform
//     with CURAND_RNG_PSEUDO_PHILOX4_32_10 on the same buffer, each with its ratio to the measured memset
//     bandwidth (the issue asks for >= 0.90 and >= cuRAND);
//   - dropout forward + backward (read in, write out; read grad, write grad_in) against two plain copies
//     of the same bytes (fraction_of_copy_bw: the best of 10 two-copy runs over the dropout's mean time).
// Times come from CUDA events (manual time). Run: rng_bench --benchmark_format=json.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if defined(GRAPHALLOC_BENCH_HAVE_CURAND)
#include <curand.h>
#endif

#include "graphalloc/rng/launch_policy.h"
#include "graphalloc/rng/philox_args.h"
#include "graphalloc/rng/random_kernels_cuda.h"

namespace graphalloc {
namespace {

constexpr std::size_t kBytes = std::size_t{1} << 30;  // 1 GiB
constexpr std::size_t kFloats = kBytes / sizeof(float);

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "rng_bench: %s failed: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

void Check(const rng_cuda::LaunchResult& r) {
  if (r.code != 0) {
    std::fprintf(stderr, "rng_bench: %s failed: %s (%s)\n", r.call, r.error_name, r.error_string);
    std::exit(1);
  }
}

struct Buffers {
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  Buffers() {
    Check(cudaMalloc(&a, kBytes), "cudaMalloc");
    Check(cudaMalloc(&b, kBytes), "cudaMalloc");
    Check(cudaMalloc(&c, kBytes), "cudaMalloc");
    Check(cudaMemset(a, 0, kBytes), "cudaMemset");
    Check(cudaMemset(b, 0, kBytes), "cudaMemset");
    Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    Check(cudaEventCreate(&start), "cudaEventCreate");
    Check(cudaEventCreate(&stop), "cudaEventCreate");
  }
};

Buffers& Bufs() {
  static Buffers* buffers = new Buffers();
  return *buffers;
}

// Times `body` (enqueued on Bufs().stream) with CUDA events; returns seconds.
template <typename Body>
double TimeOnce(Body body) {
  Buffers& b = Bufs();
  Check(cudaEventRecord(b.start, b.stream), "cudaEventRecord");
  body();
  Check(cudaEventRecord(b.stop, b.stream), "cudaEventRecord");
  Check(cudaEventSynchronize(b.stop), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, b.start, b.stop), "cudaEventElapsedTime");
  return ms / 1e3;
}

// Runs `body` once to warm up, then times it once per iteration (manual time); `bytes` are processed per
// iteration. Returns the seconds summed over the timed iterations.
template <typename Body>
double RunTimed(benchmark::State& state, std::size_t bytes, Body body) {
  body();  // warm up
  Check(cudaStreamSynchronize(Bufs().stream), "cudaStreamSynchronize");
  double total = 0;
  for (auto _ : state) {
    const double t = TimeOnce(body);
    total += t;
    state.SetIterationTime(t);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  return total;
}

// The device's write bandwidth, measured once in this process (best of 10 1-GiB memsets).
double MemsetBytesPerSecond() {
  static const double bw = [] {
    Buffers& b = Bufs();
    Check(cudaMemsetAsync(b.a, 1, kBytes, b.stream), "cudaMemsetAsync");
    double best = 1e30;
    for (int i = 0; i < 10; ++i) {
      const double t = TimeOnce([&] { Check(cudaMemsetAsync(b.a, i, kBytes, b.stream), "cudaMemsetAsync"); });
      if (t < best) best = t;
    }
    return static_cast<double>(kBytes) / best;
  }();
  return bw;
}

// Two plain 1-GiB device-to-device copies (a -> b, b -> c), measured once in this process (best of 10):
// the traffic of a dropout forward + backward.
double TwoCopiesSeconds() {
  static const double best = [] {
    Buffers& b = Bufs();
    auto copies = [&] {
      Check(cudaMemcpyAsync(b.b, b.a, kBytes, cudaMemcpyDeviceToDevice, b.stream), "cudaMemcpyAsync");
      Check(cudaMemcpyAsync(b.c, b.b, kBytes, cudaMemcpyDeviceToDevice, b.stream), "cudaMemcpyAsync");
    };
    copies();
    double t_best = 1e30;
    for (int i = 0; i < 10; ++i) {
      const double t = TimeOnce(copies);
      if (t < t_best) t_best = t;
    }
    return t_best;
  }();
  return best;
}

void ReportRatio(benchmark::State& state, std::size_t bytes, double seconds_per_iteration_sum) {
  const double bytes_per_second = static_cast<double>(bytes) * state.iterations() / seconds_per_iteration_sum;
  state.counters["fraction_of_memset_bw"] = bytes_per_second / MemsetBytesPerSecond();
}

void BM_MemsetWrite1GiB(benchmark::State& state) {
  Buffers& b = Bufs();
  RunTimed(state, kBytes, [&] { Check(cudaMemsetAsync(b.a, 0, kBytes, b.stream), "cudaMemsetAsync"); });
  state.counters["memset_bytes_per_second"] = MemsetBytesPerSecond();
}
BENCHMARK(BM_MemsetWrite1GiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_CopyDeviceToDevice1GiB(benchmark::State& state) {
  Buffers& b = Bufs();
  // bytes processed counts the bytes written (1 GiB); the copy also reads 1 GiB.
  RunTimed(state, kBytes, [&] {
    Check(cudaMemcpyAsync(b.b, b.a, kBytes, cudaMemcpyDeviceToDevice, b.stream), "cudaMemcpyAsync");
  });
}
BENCHMARK(BM_CopyDeviceToDevice1GiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

void BM_GraphallocFillUniformF32_1GiB(benchmark::State& state) {
  Buffers& b = Bufs();
  std::uint64_t offset = 0;
  auto body = [&] {
    Check(rng_cuda::LaunchFill(0, b.stream, b.a, kFloats, rng_body::ElementType::kFloat32,
                               rng_body::Distribution::kUniform, PhiloxArgs::Eager(42, offset)));
    offset += rng_policy::Increment(kFloats);
  };
  ReportRatio(state, kBytes, RunTimed(state, kBytes, body));
}
BENCHMARK(BM_GraphallocFillUniformF32_1GiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

#if defined(GRAPHALLOC_BENCH_HAVE_CURAND)
void BM_CurandGenerateUniformPhilox_1GiB(benchmark::State& state) {
  Buffers& b = Bufs();
  curandGenerator_t gen;
  if (curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10) != CURAND_STATUS_SUCCESS ||
      curandSetStream(gen, b.stream) != CURAND_STATUS_SUCCESS ||
      curandSetPseudoRandomGeneratorSeed(gen, 42) != CURAND_STATUS_SUCCESS) {
    state.SkipWithError("curandCreateGenerator/curandSetStream/curandSetPseudoRandomGeneratorSeed failed");
    return;
  }
  auto body = [&] {
    if (curandGenerateUniform(gen, static_cast<float*>(b.a), kFloats) != CURAND_STATUS_SUCCESS) {
      std::fprintf(stderr, "rng_bench: curandGenerateUniform failed\n");
      std::exit(1);
    }
  };
  ReportRatio(state, kBytes, RunTimed(state, kBytes, body));
  curandDestroyGenerator(gen);
}
BENCHMARK(BM_CurandGenerateUniformPhilox_1GiB)->UseManualTime()->Unit(benchmark::kMicrosecond);
#endif

// Dropout forward (a -> b) then backward (b as grad_out -> c): 2 GiB read, 2 GiB written.
void BM_DropoutForwardBackwardF32_1GiB(benchmark::State& state) {
  Buffers& b = Bufs();
  rng_body::DropoutParams params;
  params.keep_probability = 0.9f;
  params.scale = 1.0f / 0.9f;
  std::uint64_t offset = 0;
  auto body = [&] {
    const PhiloxArgs args = PhiloxArgs::Eager(7, offset);
    offset += rng_policy::Increment(kFloats);
    Check(rng_cuda::LaunchDropout(0, b.stream, b.a, b.b, kFloats, rng_body::ElementType::kFloat32, params,
                                  args));
    Check(rng_cuda::LaunchDropout(0, b.stream, b.b, b.c, kFloats, rng_body::ElementType::kFloat32, params,
                                  args));
  };
  const double total = RunTimed(state, 2 * kBytes, body);
  // Throughput relative to the same traffic as two plain copies (1.0 = copy speed).
  state.counters["fraction_of_copy_bw"] = TwoCopiesSeconds() * state.iterations() / total;
}
BENCHMARK(BM_DropoutForwardBackwardF32_1GiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

// The same traffic as two plain copies.
void BM_TwoCopiesF32_1GiB(benchmark::State& state) {
  Buffers& b = Bufs();
  RunTimed(state, 2 * kBytes, [&] {
    Check(cudaMemcpyAsync(b.b, b.a, kBytes, cudaMemcpyDeviceToDevice, b.stream), "cudaMemcpyAsync");
    Check(cudaMemcpyAsync(b.c, b.b, kBytes, cudaMemcpyDeviceToDevice, b.stream), "cudaMemcpyAsync");
  });
}
BENCHMARK(BM_TwoCopiesF32_1GiB)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace graphalloc

BENCHMARK_MAIN();
