// The MLP example's kernels on a GPU: one generic grid-stride kernel per op body (mlp_op_bodies.h).
#include <cuda_runtime.h>

#include "examples/kernels/cuda_launch.cuh"
#include "examples/mlp/mlp_kernels_cuda.h"

namespace graphalloc::mlp_cuda {
namespace {

using examples_cuda::Grid;
using examples_cuda::kBlock;
using examples_cuda::LaunchError;
using examples_cuda::SetDevice;

template <class Op>
__global__ void OpKernel(Op op, std::uint64_t n) {
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * kBlock + threadIdx.x; i < n;
       i += std::uint64_t{gridDim.x} * kBlock) {
    op(i);
  }
}

template <class Op>
int LaunchOp(int device, void* stream, const Op& op, const char** call) {
  if (int err = SetDevice(device, call); err != 0) return err;
  const std::uint64_t n = op.size();
  OpKernel<Op><<<Grid(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(op, n);
  return LaunchError("OpKernel<<<>>>", call);
}

template <class Op>
int PreloadOp(const char** call) {
  cudaFuncAttributes attributes;
  const cudaError_t err = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(&OpKernel<Op>));
  if (err != cudaSuccess) *call = "cudaFuncGetAttributes";
  return static_cast<int>(err);
}

}  // namespace

#define GRAPHALLOC_MLP_LAUNCHER(Op)                                                 \
  int Launch(int device, void* stream, const mlp_body::Op& op, const char** call) { \
    return LaunchOp(device, stream, op, call);                                      \
  }
GRAPHALLOC_MLP_OPS(GRAPHALLOC_MLP_LAUNCHER)
#undef GRAPHALLOC_MLP_LAUNCHER

int Preload(int device, const char** call) {
  if (int err = SetDevice(device, call); err != 0) return err;
#define GRAPHALLOC_MLP_PRELOAD(Op) \
  if (int err = PreloadOp<mlp_body::Op>(call); err != 0) return err;
  GRAPHALLOC_MLP_OPS(GRAPHALLOC_MLP_PRELOAD)
#undef GRAPHALLOC_MLP_PRELOAD
  return 0;
}

const char* ErrorName(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }

}  // namespace graphalloc::mlp_cuda
