// Random kernels users call: uniform and normal fills (float32, bfloat16), raw Philox words, and dropout
// (forward: mask and scale; backward: the same mask recomputed from the PhiloxArgs, never stored).
//
// Each op enqueues its work on `stream` through the Driver: on "cuda" a kernel (rng/random_ops.cu), on
// "sim" a LaunchHostFunction closure that runs the same per-thread code (rng/random_op_bodies.h) on the
// host over the memory at the device address (host memory there). Both read captured PhiloxArgs when they
// run, not when they are enqueued, so graph replays draw fresh numbers. Both produce identical bits.
//
// Which (seed, offset) to pass: reserve PhiloxIncrement(n) words from a Generator (rng/generator.h) for
// each launch; each PhiloxArgs is used by one launch (a dropout backward reuses its forward's args).
#ifndef GRAPHALLOC_RNG_RANDOM_OPS_H_
#define GRAPHALLOC_RNG_RANDOM_OPS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/rng/philox_args.h"
#include "graphalloc/rng/random_op_bodies.h"

namespace graphalloc {

enum class DType { kFloat32, kBFloat16 };

std::size_t DTypeSize(DType dtype);

// Philox words per thread that one op over n elements consumes (rng/launch_policy.h): the increment to
// reserve from the generator for it. A multiple of 4.
std::uint64_t PhiloxIncrement(std::size_t n);

// out[i] = the i-th curand() word of the element's thread (uint32 elements). For tests and integer draws.
absl::Status FillBits(Driver& driver, Stream stream, DevicePtr out, std::size_t n, const PhiloxArgs& args);

// out[i] = curand_uniform of the element's word, in (0, 1] (bfloat16: rounded to nearest even, so 1.0 can
// occur more often).
absl::Status FillUniform(Driver& driver, Stream stream, DevicePtr out, std::size_t n, DType dtype,
                         const PhiloxArgs& args);

// out[i] = standard normal by Box-Muller over word pairs, laid out as curand_normal4 (rng/philox.h says how
// close to cuRAND's values).
absl::Status FillNormal(Driver& driver, Stream stream, DevicePtr out, std::size_t n, DType dtype,
                        const PhiloxArgs& args);

// out[i] = keep(i) ? in[i] / (1 - p) : 0, keep(i) = uniform(i) <= 1 - p; p in [0, 1]. `in` may equal `out`.
absl::Status DropoutForward(Driver& driver, Stream stream, DevicePtr in, DevicePtr out, std::size_t n,
                            DType dtype, float p, const PhiloxArgs& args);

// grad_in[i] = keep(i) ? grad_out[i] / (1 - p) : 0 with keep(i) recomputed from `args`: pass the forward's
// PhiloxArgs (or args that unpack to the same seed and offset) to get the forward's mask exactly.
absl::Status DropoutBackward(Driver& driver, Stream stream, DevicePtr grad_out, DevicePtr grad_in,
                             std::size_t n, DType dtype, float p, const PhiloxArgs& args);

// Stream-ordered write of (seed, offset) into two uint64 slots at `slots` (seed first): a tiny kernel on
// "cuda", a host closure on "sim". Graph-safe: it never synchronizes and reads no pageable host memory at
// run time (the values travel as kernel arguments). Used by Generator::PrepareReplay.
absl::Status WritePhiloxSlots(Driver& driver, Stream stream, DevicePtr slots, std::uint64_t seed,
                              std::uint64_t offset);

// Makes sure the device kernels are loaded before a stream capture begins (CUDA loads modules lazily,
// and a first launch inside a capture must not have to). A no-op on "sim". Generator::BeginCapture calls it.
absl::Status PrepareKernelsForCapture(Driver& driver);

// ---- Host twins (what the simulated device runs), over host memory. Tests use them for expectations. ----
void FillOnHost(void* out, std::size_t n, rng_body::ElementType type, rng_body::Distribution dist,
                const PhiloxArgs& args);
void DropoutOnHost(const void* in, void* out, std::size_t n, rng_body::ElementType type,
                   rng_body::DropoutParams params, const PhiloxArgs& args);
// The float parameters both devices use for drop probability p (p must be in [0, 1]).
rng_body::DropoutParams DropoutParamsFor(float p);

}  // namespace graphalloc

#endif  // GRAPHALLOC_RNG_RANDOM_OPS_H_
