// Launchers for the random kernels on a real GPU (rng/random_ops.cu), compiled only when nvcc is found
// (GRAPHALLOC_RNG_HAVE_CUDA_KERNELS). Plain C++ with no Abseil, so nvcc compiles the .cu without it;
// rng/random_ops.cc turns the result into an absl::Status. Kernels run through the CUDA runtime on
// `stream` (a cudaStream_t), after making `device_ordinal` current; when the stream is capturing, the
// launch is captured into the graph.
#ifndef GRAPHALLOC_RNG_RANDOM_KERNELS_CUDA_H_
#define GRAPHALLOC_RNG_RANDOM_KERNELS_CUDA_H_

#include <cstdint>

#include "graphalloc/rng/philox_args.h"
#include "graphalloc/rng/random_op_bodies.h"

namespace graphalloc::rng_cuda {

// code 0 = success; otherwise the cudaError_t, its name and description, and the call that failed.
struct LaunchResult {
  int code = 0;
  const char* call = "";
  const char* error_name = "";
  const char* error_string = "";
};

LaunchResult LaunchFill(int device_ordinal, void* stream, void* out, std::uint64_t n,
                        rng_body::ElementType type, rng_body::Distribution dist, const PhiloxArgs& args);

LaunchResult LaunchDropout(int device_ordinal, void* stream, const void* in, void* out, std::uint64_t n,
                           rng_body::ElementType type, rng_body::DropoutParams params,
                           const PhiloxArgs& args);

// One thread writes (seed, offset) into the two uint64 slots at `slots` (seed first): the replay prologue.
LaunchResult LaunchWriteSlots(int device_ordinal, void* stream, void* slots, std::uint64_t seed,
                              std::uint64_t offset);

// Loads every kernel of this file on `device_ordinal` (cudaFuncGetAttributes), so that no module is lazily
// loaded while a stream is capturing. Idempotent and cheap after the first call.
LaunchResult PreloadKernels(int device_ordinal);

}  // namespace graphalloc::rng_cuda

#endif  // GRAPHALLOC_RNG_RANDOM_KERNELS_CUDA_H_
