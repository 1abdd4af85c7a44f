// The per-thread work of every random kernel, written once for the device kernels (rng/random_ops.cu) and
// the simulated device (rng/random_ops.cc), which run it for thread indices 0..TotalThreads(n)-1.
// Same code, same Philox words, same float operations (rng/philox.h), so both produce identical bits.
// The mapping of threads to elements is rng/launch_policy.h.
#ifndef GRAPHALLOC_RNG_RANDOM_OP_BODIES_H_
#define GRAPHALLOC_RNG_RANDOM_OP_BODIES_H_

#include <cstdint>

#include "graphalloc/rng/launch_policy.h"
#include "graphalloc/rng/philox.h"
#include "graphalloc/rng/philox_args.h"

namespace graphalloc::rng_body {

// Element types the kernels read and write.
enum class ElementType : std::uint32_t { kFloat32 = 0, kBFloat16 = 1, kUint32 = 2 };
// What a fill draws.
enum class Distribution : std::uint32_t { kBits = 0, kUniform = 1, kNormal = 2 };

GA_HD GA_INLINE void StoreFloat(void* out, std::uint64_t index, ElementType type, float value) {
  if (type == ElementType::kBFloat16) {
    static_cast<std::uint16_t*>(out)[index] = FloatToBFloat16(value);
  } else {
    static_cast<float*>(out)[index] = value;
  }
}

GA_HD GA_INLINE float LoadFloat(const void* in, std::uint64_t index, ElementType type) {
  if (type == ElementType::kBFloat16) return BFloat16ToFloat(static_cast<const std::uint16_t*>(in)[index]);
  return static_cast<const float*>(in)[index];
}

// The four values of one curand4 draw.
struct Values4 {
  float v[4];
};

GA_HD GA_INLINE Values4 Transform(Distribution dist, const PhiloxWords& w) {
  Values4 r{};
  if (dist == Distribution::kNormal) {
    const FloatPair a = NormalPair(w.x, w.y);
    const FloatPair b = NormalPair(w.z, w.w);
    r.v[0] = a.first;
    r.v[1] = a.second;
    r.v[2] = b.first;
    r.v[3] = b.second;
  } else {
    r.v[0] = UniformFloat(w.x);
    r.v[1] = UniformFloat(w.y);
    r.v[2] = UniformFloat(w.z);
    r.v[3] = UniformFloat(w.w);
  }
  return r;
}

// One thread of a fill: out[element] = draw, for the elements rng_policy assigns to `thread`.
GA_HD GA_INLINE void FillThread(std::uint64_t thread, std::uint64_t n, const PhiloxArgs& args, void* out,
                                ElementType type, Distribution dist) {
  const PhiloxSeedOffset so = Unpack(args);
  PhiloxStream stream(so.seed, thread, so.offset);
  const std::uint64_t threads = rng_policy::TotalThreads(n);
  const std::uint64_t iterations = rng_policy::Iterations(n);
  std::uint64_t base = thread;
  for (std::uint64_t it = 0; it < iterations; ++it, base += threads * rng_policy::kWordsPerIteration) {
    const PhiloxWords w = stream.Next4();
    if (dist == Distribution::kBits) {
      for (int k = 0; k < 4; ++k) {
        const std::uint64_t index = base + static_cast<std::uint64_t>(k) * threads;
        if (index < n) static_cast<std::uint32_t*>(out)[index] = w[k];
      }
    } else {
      const Values4 values = Transform(dist, w);
      for (int k = 0; k < 4; ++k) {
        const std::uint64_t index = base + static_cast<std::uint64_t>(k) * threads;
        if (index < n) StoreFloat(out, index, type, values.v[k]);
      }
    }
  }
}

// Dropout parameters computed once on the host, so device and host use the same float bits.
struct DropoutParams {
  float keep_probability = 1.0f;  // an element is kept when UniformFloat(word) <= keep_probability
  float scale = 1.0f;             // 1 / keep_probability (0 when nothing is kept)
};

// One thread of dropout: out[i] = keep(i) ? in[i] * scale : 0. The mask is a pure function of
// (args, i, n), so the backward recomputes it from the same PhiloxArgs: grad_in = keep ? grad_out * scale :
// 0. `in` and `out` may be the same buffer.
GA_HD GA_INLINE void DropoutThread(std::uint64_t thread, std::uint64_t n, const PhiloxArgs& args,
                                   const void* in, void* out, ElementType type, DropoutParams params) {
  const PhiloxSeedOffset so = Unpack(args);
  PhiloxStream stream(so.seed, thread, so.offset);
  const std::uint64_t threads = rng_policy::TotalThreads(n);
  const std::uint64_t iterations = rng_policy::Iterations(n);
  std::uint64_t base = thread;
  for (std::uint64_t it = 0; it < iterations; ++it, base += threads * rng_policy::kWordsPerIteration) {
    const PhiloxWords w = stream.Next4();
    for (int k = 0; k < 4; ++k) {
      const std::uint64_t index = base + static_cast<std::uint64_t>(k) * threads;
      if (index < n) {
        const bool keep = UniformFloat(w[k]) <= params.keep_probability;
        const float x = LoadFloat(in, index, type);
        StoreFloat(out, index, type, keep ? GA_FMUL(x, params.scale) : 0.0f);
      }
    }
  }
}

}  // namespace graphalloc::rng_body

#endif  // GRAPHALLOC_RNG_RANDOM_OP_BODIES_H_
