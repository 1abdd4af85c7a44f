// What the examples' CUDA launchers share (tiny_kernels.cu, examples/mlp/mlp_kernels.cu): the block size and
// grid of their grid-stride kernels, and making the caller's device current. nvcc only. Errors are
// returned as a cudaError_t int (0 = success) with *call set to the call that failed, as the launchers do.
#ifndef GRAPHALLOC_EXAMPLES_KERNELS_CUDA_LAUNCH_CUH_
#define GRAPHALLOC_EXAMPLES_KERNELS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace graphalloc::examples_cuda {

inline constexpr unsigned kBlock = 256;

// Blocks for a grid-stride loop over `n` elements: one per kBlock elements, at least 1, at most 1024.
inline unsigned Grid(std::uint64_t n) {
  const std::uint64_t blocks = (n + kBlock - 1) / kBlock;
  return blocks == 0 ? 1u : blocks > 1024 ? 1024u : static_cast<unsigned>(blocks);
}

// Makes `device` the calling thread's current device (a no-op when it already is).
inline int SetDevice(int device, const char** call) {
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device) err = cudaSetDevice(device);
  if (err != cudaSuccess) *call = "cudaSetDevice";
  return static_cast<int>(err);
}

// After a launch of `kernel`: the launch error, if any.
inline int LaunchError(const char* kernel, const char** call) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) *call = kernel;
  return static_cast<int>(err);
}

}  // namespace graphalloc::examples_cuda

#endif  // GRAPHALLOC_EXAMPLES_KERNELS_CUDA_LAUNCH_CUH_
