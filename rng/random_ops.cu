// Device kernels of the random ops: each thread runs the shared body of rng/random_op_bodies.h for its
// global index, with the grid of rng/launch_policy.h, so the device draws what the simulated device draws.
#include <cuda_runtime.h>

#include "rng/launch_policy.h"
#include "rng/random_kernels_cuda.h"

namespace graphalloc::rng_cuda {
namespace {

// The element type and distribution are template parameters so each instantiation is branch-free.
template <rng_body::ElementType kType, rng_body::Distribution kDist>
__global__ void __launch_bounds__(rng_policy::kBlockSize)
    FillKernel(void* out, std::uint64_t n, PhiloxArgs args) {
  const std::uint64_t thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  rng_body::FillThread(thread, n, args, out, kType, kDist);
}

template <rng_body::ElementType kType>
__global__ void __launch_bounds__(rng_policy::kBlockSize)
    DropoutKernel(const void* in, void* out, std::uint64_t n, rng_body::DropoutParams params,
                  PhiloxArgs args) {
  const std::uint64_t thread = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  rng_body::DropoutThread(thread, n, args, in, out, kType, params);
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
  const dim3 block(rng_policy::kBlockSize);
  auto s = static_cast<cudaStream_t>(stream);
  using rng_body::Distribution;
  using rng_body::ElementType;
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
  const dim3 block(rng_policy::kBlockSize);
  auto s = static_cast<cudaStream_t>(stream);
  if (type == rng_body::ElementType::kBFloat16) {
    DropoutKernel<rng_body::ElementType::kBFloat16><<<grid, block, 0, s>>>(in, out, n, params, args);
  } else {
    DropoutKernel<rng_body::ElementType::kFloat32><<<grid, block, 0, s>>>(in, out, n, params, args);
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
  using rng_body::Distribution;
  using rng_body::ElementType;
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
