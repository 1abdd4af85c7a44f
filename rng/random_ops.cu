// Device kernels of the random ops. They draw exactly what the simulated device draws: the element ->
// (subsequence, draw, word) mapping of rng/launch_policy.h and the per-thread bodies of
// rng/random_op_bodies.h define the numbers; these kernels only compute them faster.
//
// Fast path (every launch whose Philox offset is a multiple of 4, whose counter does not carry out of its
// low word during the launch and whose buffers are aligned for vector access; the others run the shared
// body as before):
//   - one CUDA thread runs S consecutive subsequences t0..t0+S-1 of the policy (blocks of
//     kBlockSize / S threads, so the grid of rng_policy::GridBlocks(n) blocks covers the same subsequences).
//     Word k of iteration j of subsequence t goes to element j*4T + k*T + t, so the S subsequences' word k
//     are S consecutive elements: one S-wide vector store (16 bytes for float32) instead of S 4-byte ones,
//     and S independent Philox chains per thread for instruction-level parallelism;
//   - the counter of iteration j is (x0 + j, y0, t, 0) with (y0, t) fixed, so round 1's M1 * t product is
//     computed once per thread and its M0 * (x0 + j) product once per iteration for all S subsequences;
//     the key schedule is computed once per thread;
//   - iterations that lie wholly inside [0, n) store without bounds checks or per-element index math;
//   - uniform conversion is one fused multiply-add (exact: the product by 2^-32 is exact);
//   - dropout's keep test is an integer compare against the largest Philox word w with
//     UniformFloat(w) <= keep_probability (UniformFloat is monotonic), found on the host at launch;
//   - __launch_bounds__ keeps 8 blocks per SM resident, so the fixed grid of 1056 blocks runs in one wave
//     on an H100 (the old dropout kernel used 40 registers: 6 blocks per SM and a second, 1/3-full wave).
#include <cuda_runtime.h>

#include "graphalloc/rng/launch_policy.h"
#include "graphalloc/rng/random_kernels_cuda.h"

namespace graphalloc::rng_cuda {
namespace {

using rng_body::Distribution;
using rng_body::ElementType;

// Subsequences per thread on the fast path; whether stores (and dropout's loads) use the streaming
// (evict-first) cache hints; whether dropout loads the next iteration's inputs before storing this one's.
// Measured on the H100 (1 GiB float32): fill S = 1/2/4: 383/352/346 us (memset 337 us); dropout
// forward + backward S = 1/2/4: 1622/1535/1532 us (two copies 1436 us); streaming hints and the prefetch
// changed neither by more than noise (< 0.5%).
constexpr int kFillSubsPerThread = 4;
constexpr bool kFillStreaming = false;
constexpr int kDropoutSubsPerThread = 2;
constexpr bool kDropoutStreaming = false;
constexpr bool kDropoutPrefetch = true;
constexpr int kMinBlocksPerSm = 8;

template <ElementType kType>
struct ElementTraits {
  using Bits = std::uint32_t;
};
template <>
struct ElementTraits<ElementType::kBFloat16> {
  using Bits = std::uint16_t;
};

// S elements of one type as one aligned vector.
template <typename Bits, int S>
struct alignas(sizeof(Bits) * S) Vec {
  Bits v[S];
};

template <bool kStream, typename V>
__device__ __forceinline__ void StoreVec(V* p, const V& value) {
  if constexpr (kStream && sizeof(V) == 16) {
    uint4 u;
    __builtin_memcpy(&u, &value, 16);
    __stcs(reinterpret_cast<uint4*>(p), u);
  } else if constexpr (kStream && sizeof(V) == 8) {
    uint2 u;
    __builtin_memcpy(&u, &value, 8);
    __stcs(reinterpret_cast<uint2*>(p), u);
  } else if constexpr (kStream && sizeof(V) == 4) {
    unsigned int u;
    __builtin_memcpy(&u, &value, 4);
    __stcs(reinterpret_cast<unsigned int*>(p), u);
  } else {
    *p = value;
  }
}

template <bool kStream, typename V>
__device__ __forceinline__ V LoadVec(const V* p) {
  if constexpr (kStream && sizeof(V) == 16) {
    const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
    V value;
    __builtin_memcpy(&value, &u, 16);
    return value;
  } else if constexpr (kStream && sizeof(V) == 8) {
    const uint2 u = __ldcs(reinterpret_cast<const uint2*>(p));
    V value;
    __builtin_memcpy(&value, &u, 8);
    return value;
  } else {
    return *p;
  }
}

// The ten round keys of one seed.
struct KeySchedule {
  PhiloxKey k[kPhiloxDefaultRounds];
};

__device__ __forceinline__ KeySchedule MakeKeySchedule(std::uint64_t seed) {
  KeySchedule ks;
  ks.k[0] = PhiloxKey{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
#pragma unroll
  for (int r = 1; r < kPhiloxDefaultRounds; ++r) ks.k[r] = PhiloxBumpKey(ks.k[r - 1]);
  return ks;
}

// Philox4x32-10 of the counter (x, y, z, 0), given round 1's parts: a = hi(M1 z) ^ y ^ k0.x and
// b = lo(M1 z) (fixed per subsequence), and (hi0, lo0) = M0 x (shared by all subsequences of an iteration).
__device__ __forceinline__ PhiloxWords PhiloxAfterRound1(std::uint32_t a, std::uint32_t b,
                                                         std::uint32_t hi0_k, std::uint32_t lo0,
                                                         const KeySchedule& ks) {
  PhiloxWords c{a, b, hi0_k, lo0};
#pragma unroll
  for (int r = 1; r < kPhiloxDefaultRounds; ++r) c = PhiloxRound(c, ks.k[r]);
  return c;
}

// The launch-wide facts of the fast path, the same in every thread.
struct FastPlan {
  bool ok = false;
  std::uint32_t x0 = 0, y0 = 0;  // counter words of iteration 0
  std::uint32_t threads = 0;     // T = TotalThreads(n)
  std::uint64_t full = 0;        // iterations wholly inside [0, n)
  std::uint64_t iterations = 0;
};

__device__ __forceinline__ FastPlan PlanFast(std::uint64_t n, const PhiloxSeedOffset& so, bool aligned) {
  FastPlan plan;
  const std::uint64_t block = so.offset / 4;
  plan.x0 = static_cast<std::uint32_t>(block);
  plan.y0 = static_cast<std::uint32_t>(block >> 32);
  plan.threads = static_cast<std::uint32_t>(rng_policy::TotalThreads(n));
  plan.iterations = rng_policy::Iterations(n);
  plan.full = n / (std::uint64_t{4} * plan.threads);
  // Counter of iteration j = (x0 + j, y0, t, 0) exactly when x0 + j never wraps (PhiloxStream's carries
  // are then no-ops) and the stream starts on a block boundary (Next4 returns whole blocks).
  plan.ok = aligned && (so.offset & 3) == 0 && plan.iterations <= (std::uint64_t{1} << 32) - plan.x0;
  return plan;
}

// Per-subsequence values of round 1 that do not change with the iteration.
template <int S>
struct Round1Fixed {
  std::uint32_t a[S], b[S];
};

template <int S>
__device__ __forceinline__ Round1Fixed<S> MakeRound1Fixed(std::uint32_t t0, std::uint32_t y0,
                                                          const KeySchedule& ks) {
  Round1Fixed<S> f;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    std::uint32_t hi1;
    f.b[s] = MulHiLo32(kPhiloxM1, t0 + static_cast<std::uint32_t>(s), &hi1);
    f.a[s] = hi1 ^ y0 ^ ks.k[0].x;
  }
  return f;
}

// The S Philox blocks of iteration counter word x.
template <int S>
__device__ __forceinline__ void DrawBlocks(std::uint32_t x, const Round1Fixed<S>& f, const KeySchedule& ks,
                                           PhiloxWords (&w)[S]) {
  std::uint32_t hi0;
  const std::uint32_t lo0 = MulHiLo32(kPhiloxM0, x, &hi0);
  const std::uint32_t hi0_k = hi0 ^ ks.k[0].y;  // counter word w = 0
#pragma unroll
  for (int s = 0; s < S; ++s) w[s] = PhiloxAfterRound1(f.a[s], f.b[s], hi0_k, lo0, ks);
}

// The element bits a fill stores for word k of one block (kUniform/kNormal through rng_body::Transform).
template <ElementType kType, Distribution kDist>
__device__ __forceinline__ void BlockToElements(const PhiloxWords& w,
                                                typename ElementTraits<kType>::Bits (&e)[4]) {
  if constexpr (kDist == Distribution::kBits) {
    e[0] = w.x;
    e[1] = w.y;
    e[2] = w.z;
    e[3] = w.w;
  } else {
    const rng_body::Values4 v = rng_body::Transform(kDist, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (kType == ElementType::kBFloat16) {
        e[k] = FloatToBFloat16(v.v[k]);
      } else {
        e[k] = __float_as_uint(v.v[k]);
      }
    }
  }
}

template <ElementType kType, Distribution kDist, int S, bool kStream>
__device__ __forceinline__ void FillFast(const FastPlan& plan, const KeySchedule& ks, std::uint32_t t0,
                                         void* out, std::uint64_t n) {
  using Bits = typename ElementTraits<kType>::Bits;
  using V = Vec<Bits, S>;
  const Round1Fixed<S> fixed = MakeRound1Fixed<S>(t0, plan.y0, ks);
  const std::uint32_t T = plan.threads;
  Bits* p = static_cast<Bits*>(out) + t0;  // element t0 of iteration 0
  std::uint32_t x = plan.x0;
  for (std::uint64_t j = 0; j < plan.full; ++j, ++x, p += std::uint64_t{4} * T) {
    PhiloxWords w[S];
    DrawBlocks<S>(x, fixed, ks, w);
    Bits e[S][4];
#pragma unroll
    for (int s = 0; s < S; ++s) BlockToElements<kType, kDist>(w[s], e[s]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      V v;
#pragma unroll
      for (int s = 0; s < S; ++s) v.v[s] = e[s][k];
      StoreVec<kStream>(reinterpret_cast<V*>(p + static_cast<std::uint64_t>(k) * T), v);
    }
  }
  if (plan.full < plan.iterations) {  // the last, partial iteration
    PhiloxWords w[S];
    DrawBlocks<S>(x, fixed, ks, w);
    const std::uint64_t base = plan.full * 4 * T + t0;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      Bits e[4];
      BlockToElements<kType, kDist>(w[s], e);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const std::uint64_t index = base + static_cast<std::uint64_t>(k) * T + s;
        if (index < n) static_cast<Bits*>(out)[index] = e[k];
      }
    }
  }
}

// The element type and distribution are template parameters so each instantiation is branch-free.
template <ElementType kType, Distribution kDist, int S = kFillSubsPerThread, bool kStream = kFillStreaming>
__global__ void __launch_bounds__(rng_policy::kBlockSize / S, kMinBlocksPerSm)
    FillKernel(void* out, std::uint64_t n, PhiloxArgs args) {
  using Bits = typename ElementTraits<kType>::Bits;
  const std::uint32_t t0 = blockIdx.x * rng_policy::kBlockSize + threadIdx.x * S;
  const PhiloxSeedOffset so = Unpack(args);
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % (sizeof(Bits) * S) == 0;
  const FastPlan plan = PlanFast(n, so, aligned);
  if (plan.ok) {
    FillFast<kType, kDist, S, kStream>(plan, MakeKeySchedule(so.seed), t0, out, n);
  } else {
#pragma unroll 1
    for (int s = 0; s < S; ++s) rng_body::FillThread(t0 + s, n, args, out, kType, kDist);
  }
}

// Dropout's keep test as an integer compare: keep(w) = UniformFloat(w) <= keep_probability is monotonic in w,
// so it is w <= threshold, or false for every w (keep_none).
struct KeepTest {
  std::uint32_t threshold = 0;
  bool keep_none = true;
};

KeepTest KeepTestFor(float keep_probability) {
  KeepTest t;
  if (!(UniformFloat(0u) <= keep_probability)) return t;  // nothing kept (also for NaN)
  std::uint32_t lo = 0, hi = 0xffffffffu;                 // keep(lo) holds; find the largest w that keeps
  if (UniformFloat(hi) <= keep_probability) {
    lo = hi;
  } else {
    while (hi - lo > 1) {  // keep(lo) && !keep(hi)
      const std::uint32_t mid = lo + (hi - lo) / 2;
      if (UniformFloat(mid) <= keep_probability) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
  }
  t.threshold = lo;
  t.keep_none = false;
  return t;
}

// One dropout element on the fast path (keep_none launches take the shared body).
template <ElementType kType>
__device__ __forceinline__ typename ElementTraits<kType>::Bits DropoutElement(
    typename ElementTraits<kType>::Bits x, std::uint32_t word, std::uint32_t threshold, float scale) {
  if constexpr (kType == ElementType::kBFloat16) {
    const float y = __fmul_rn(BFloat16ToFloat(x), scale);
    return FloatToBFloat16(word <= threshold ? y : 0.0f);
  } else {
    const float y = __fmul_rn(__uint_as_float(x), scale);
    return __float_as_uint(word <= threshold ? y : 0.0f);
  }
}

template <ElementType kType, int S, bool kStream, bool kPrefetch>
__device__ __forceinline__ void DropoutFast(const FastPlan& plan, const KeySchedule& ks, std::uint32_t t0,
                                            const void* in, void* out, std::uint64_t n, KeepTest keep,
                                            float scale) {
  using Bits = typename ElementTraits<kType>::Bits;
  using V = Vec<Bits, S>;
  const Round1Fixed<S> fixed = MakeRound1Fixed<S>(t0, plan.y0, ks);
  const std::uint32_t T = plan.threads;
  const std::uint64_t stride = std::uint64_t{4} * T;
  const Bits* src = static_cast<const Bits*>(in) + t0;
  Bits* dst = static_cast<Bits*>(out) + t0;
  std::uint32_t x = plan.x0;
  auto load = [&](V(&v)[4], const Bits* from) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = LoadVec<kStream>(reinterpret_cast<const V*>(from + static_cast<std::uint64_t>(k) * T));
    }
  };
  // Each element is read and written by its own thread only, so loading iteration j + 1 before storing
  // iteration j is safe also in place; kPrefetch keeps two iterations' loads in flight.
  V v[4];
  if (kPrefetch && plan.full > 0) load(v, src);
  for (std::uint64_t j = 0; j < plan.full; ++j, ++x, src += stride, dst += stride) {
    V next[4];
    if constexpr (kPrefetch) {
      if (j + 1 < plan.full) load(next, src + stride);
    } else {
      load(v, src);
    }
    PhiloxWords w[S];
    DrawBlocks<S>(x, fixed, ks, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#pragma unroll
      for (int s = 0; s < S; ++s)
        v[k].v[s] = DropoutElement<kType>(v[k].v[s], w[s][k], keep.threshold, scale);
      StoreVec<kStream>(reinterpret_cast<V*>(dst + static_cast<std::uint64_t>(k) * T), v[k]);
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = next[k];
    }
  }
  if (plan.full < plan.iterations) {
    PhiloxWords w[S];
    DrawBlocks<S>(x, fixed, ks, w);
    const std::uint64_t base = plan.full * 4 * T + t0;
#pragma unroll
    for (int s = 0; s < S; ++s) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const std::uint64_t index = base + static_cast<std::uint64_t>(k) * T + s;
        if (index < n) {
          static_cast<Bits*>(out)[index] =
              DropoutElement<kType>(static_cast<const Bits*>(in)[index], w[s][k], keep.threshold, scale);
        }
      }
    }
  }
}

template <ElementType kType, int S = kDropoutSubsPerThread, bool kStream = kDropoutStreaming,
          bool kPrefetch = kDropoutPrefetch>
__global__ void __launch_bounds__(rng_policy::kBlockSize / S, kMinBlocksPerSm)
    DropoutKernel(const void* in, void* out, std::uint64_t n, rng_body::DropoutParams params, KeepTest keep,
                  PhiloxArgs args) {
  using Bits = typename ElementTraits<kType>::Bits;
  const std::uint32_t t0 = blockIdx.x * rng_policy::kBlockSize + threadIdx.x * S;
  const PhiloxSeedOffset so = Unpack(args);
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % (sizeof(Bits) * S) == 0 &&
                       reinterpret_cast<std::uintptr_t>(in) % (sizeof(Bits) * S) == 0;
  const FastPlan plan = PlanFast(n, so, aligned && !keep.keep_none);
  if (plan.ok) {
    DropoutFast<kType, S, kStream, kPrefetch>(plan, MakeKeySchedule(so.seed), t0, in, out, n, keep,
                                              params.scale);
  } else {
#pragma unroll 1
    for (int s = 0; s < S; ++s) rng_body::DropoutThread(t0 + s, n, args, in, out, kType, params);
  }
}

__global__ void WriteSlotsKernel(std::uint64_t* slots, std::uint64_t seed, std::uint64_t offset) {
  slots[0] = seed;
  slots[1] = offset;
}

LaunchResult Result(cudaError_t err, const char* call) {
  LaunchResult r;
  r.code = static_cast<int>(err);
  r.call = call;
  if (err != cudaSuccess) {
    r.error_name = cudaGetErrorName(err);
    r.error_string = cudaGetErrorString(err);
  }
  return r;
}

LaunchResult SetDevice(int device_ordinal) {
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) return Result(err, "cudaGetDevice");
  if (current != device_ordinal) {
    err = cudaSetDevice(device_ordinal);
    if (err != cudaSuccess) return Result(err, "cudaSetDevice");
  }
  return LaunchResult{};
}

}  // namespace

LaunchResult LaunchFill(int device_ordinal, void* stream, void* out, std::uint64_t n,
                        rng_body::ElementType type, rng_body::Distribution dist, const PhiloxArgs& args) {
  LaunchResult r = SetDevice(device_ordinal);
  if (r.code != 0) return r;
  const dim3 grid(rng_policy::GridBlocks(n));
  const dim3 block(rng_policy::kBlockSize / kFillSubsPerThread);
  auto s = static_cast<cudaStream_t>(stream);
  if (dist == Distribution::kBits) {
    FillKernel<ElementType::kUint32, Distribution::kBits><<<grid, block, 0, s>>>(out, n, args);
  } else if (type == ElementType::kBFloat16) {
    if (dist == Distribution::kNormal) {
      FillKernel<ElementType::kBFloat16, Distribution::kNormal><<<grid, block, 0, s>>>(out, n, args);
    } else {
      FillKernel<ElementType::kBFloat16, Distribution::kUniform><<<grid, block, 0, s>>>(out, n, args);
    }
  } else {
    if (dist == Distribution::kNormal) {
      FillKernel<ElementType::kFloat32, Distribution::kNormal><<<grid, block, 0, s>>>(out, n, args);
    } else {
      FillKernel<ElementType::kFloat32, Distribution::kUniform><<<grid, block, 0, s>>>(out, n, args);
    }
  }
  return Result(cudaGetLastError(), "FillKernel<<<>>>");
}

LaunchResult LaunchDropout(int device_ordinal, void* stream, const void* in, void* out, std::uint64_t n,
                           rng_body::ElementType type, rng_body::DropoutParams params,
                           const PhiloxArgs& args) {
  LaunchResult r = SetDevice(device_ordinal);
  if (r.code != 0) return r;
  const dim3 grid(rng_policy::GridBlocks(n));
  const dim3 block(rng_policy::kBlockSize / kDropoutSubsPerThread);
  auto s = static_cast<cudaStream_t>(stream);
  const KeepTest keep = KeepTestFor(params.keep_probability);
  if (type == ElementType::kBFloat16) {
    DropoutKernel<ElementType::kBFloat16><<<grid, block, 0, s>>>(in, out, n, params, keep, args);
  } else {
    DropoutKernel<ElementType::kFloat32><<<grid, block, 0, s>>>(in, out, n, params, keep, args);
  }
  return Result(cudaGetLastError(), "DropoutKernel<<<>>>");
}

LaunchResult LaunchWriteSlots(int device_ordinal, void* stream, void* slots, std::uint64_t seed,
                              std::uint64_t offset) {
  LaunchResult r = SetDevice(device_ordinal);
  if (r.code != 0) return r;
  WriteSlotsKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<std::uint64_t*>(slots), seed,
                                                                   offset);
  return Result(cudaGetLastError(), "WriteSlotsKernel<<<>>>");
}

LaunchResult PreloadKernels(int device_ordinal) {
  LaunchResult r = SetDevice(device_ordinal);
  if (r.code != 0) return r;
  const void* kernels[] = {
      reinterpret_cast<const void*>(&FillKernel<ElementType::kUint32, Distribution::kBits>),
      reinterpret_cast<const void*>(&FillKernel<ElementType::kFloat32, Distribution::kUniform>),
      reinterpret_cast<const void*>(&FillKernel<ElementType::kFloat32, Distribution::kNormal>),
      reinterpret_cast<const void*>(&FillKernel<ElementType::kBFloat16, Distribution::kUniform>),
      reinterpret_cast<const void*>(&FillKernel<ElementType::kBFloat16, Distribution::kNormal>),
      reinterpret_cast<const void*>(&DropoutKernel<ElementType::kFloat32>),
      reinterpret_cast<const void*>(&DropoutKernel<ElementType::kBFloat16>),
      reinterpret_cast<const void*>(&WriteSlotsKernel),
  };
  for (const void* kernel : kernels) {
    cudaFuncAttributes attributes;
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return Result(err, "cudaFuncGetAttributes");
  }
  return LaunchResult{};
}

}  // namespace graphalloc::rng_cuda
