// Test-only GPU helpers (curand_reference.cu, built when nvcc is found): run our Philox block function and
// stream on the GPU, and run real cuRAND (curand_init + curand, header-only device API) for comparison.
// Each returns a cudaError_t as int (0 = success); CudaErrorText names it.
#ifndef GRAPHALLOC_TESTS_RNG_CURAND_REFERENCE_H_
#define GRAPHALLOC_TESTS_RNG_CURAND_REFERENCE_H_

#include <cstdint>

#include "graphalloc/rng/philox.h"

namespace graphalloc::rng_test {

const char* CudaErrorText(int code);

// out[i] = Philox4x32<rounds>(counters[i], keys[i]); rounds is 7 or 10.
int RunPhiloxBlocksOnGpu(const PhiloxWords* counters, const PhiloxKey* keys, int count, int rounds,
                         PhiloxWords* out);

// For each i: `words` draws after init(seeds[i], subsequences[i], offsets[i]) into out[i * words + k].
// Real cuRAND (curand_init + curand):
int RunCurandOnGpu(const std::uint64_t* seeds, const std::uint64_t* subsequences,
                   const std::uint64_t* offsets, int count, int words, std::uint32_t* out);
// Our PhiloxStream (constructor + Next):
int RunPhiloxStreamOnGpu(const std::uint64_t* seeds, const std::uint64_t* subsequences,
                         const std::uint64_t* offsets, int count, int words, std::uint32_t* out);
// Real cuRAND uniform floats (curand_uniform), for the conversion check.
int RunCurandUniformOnGpu(std::uint64_t seed, int count, float* out);

}  // namespace graphalloc::rng_test

#endif  // GRAPHALLOC_TESTS_RNG_CURAND_REFERENCE_H_
