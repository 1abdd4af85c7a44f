// The tiny kernels on a GPU. __fmul_rn / __fadd_rn keep each element one rounded IEEE operation, as the
// simulated device computes it (nvcc would otherwise be free to contract).
#include <cuda_runtime.h>

#include "examples/kernels/cuda_launch.cuh"
#include "examples/kernels/tiny_kernels_cuda.h"

namespace graphalloc::testing::tiny_cuda {
namespace {

using examples_cuda::Grid;
using examples_cuda::kBlock;
using examples_cuda::LaunchError;
using examples_cuda::SetDevice;

__global__ void FillKernel(float* out, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * std::size_t{kBlock} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kBlock) {
    out[i] = value;
  }
}

__global__ void ScaleKernel(float* out, const float* in, std::size_t n, float alpha) {
  for (std::size_t i = blockIdx.x * std::size_t{kBlock} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kBlock) {
    out[i] = __fmul_rn(alpha, in[i]);
  }
}

__global__ void AddKernel(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{kBlock} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * kBlock) {
    out[i] = __fadd_rn(a[i], b[i]);
  }
}

}  // namespace

int LaunchFill(int device, void* stream, float* out, std::size_t n, float value, const char** call) {
  if (int err = SetDevice(device, call); err != 0) return err;
  FillKernel<<<Grid(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(out, n, value);
  return LaunchError("FillKernel<<<>>>", call);
}

int LaunchScale(int device, void* stream, float* out, const float* in, std::size_t n, float alpha,
                const char** call) {
  if (int err = SetDevice(device, call); err != 0) return err;
  ScaleKernel<<<Grid(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(out, in, n, alpha);
  return LaunchError("ScaleKernel<<<>>>", call);
}

int LaunchAdd(int device, void* stream, float* out, const float* a, const float* b, std::size_t n,
              const char** call) {
  if (int err = SetDevice(device, call); err != 0) return err;
  AddKernel<<<Grid(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(out, a, b, n);
  return LaunchError("AddKernel<<<>>>", call);
}

int Preload(int device, const char** call) {
  if (int err = SetDevice(device, call); err != 0) return err;
  const void* kernels[] = {reinterpret_cast<const void*>(&FillKernel),
                           reinterpret_cast<const void*>(&ScaleKernel),
                           reinterpret_cast<const void*>(&AddKernel)};
  for (const void* kernel : kernels) {
    cudaFuncAttributes attributes;
    if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) {
      *call = "cudaFuncGetAttributes";
      return static_cast<int>(err);
    }
  }
  return 0;
}

const char* ErrorName(int code) { return cudaGetErrorName(static_cast<cudaError_t>(code)); }

}  // namespace graphalloc::testing::tiny_cuda
