// Test-only kernels: our Philox on the GPU, and real cuRAND's Philox for comparison.
#include <cuda_runtime.h>
#include <curand_kernel.h>

#include "tests/rng/curand_reference.h"

namespace graphalloc::rng_test {
namespace {

__global__ void PhiloxBlocksKernel(const PhiloxWords* counters, const PhiloxKey* keys, int count, int rounds,
                                   PhiloxWords* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  out[i] = rounds == 7 ? Philox4x32<7>(counters[i], keys[i]) : Philox4x32<10>(counters[i], keys[i]);
}

__global__ void CurandKernel(const std::uint64_t* seeds, const std::uint64_t* subs,
                             const std::uint64_t* offsets, int count, int words, std::uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  curandStatePhilox4_32_10_t state;
  curand_init(seeds[i], subs[i], offsets[i], &state);
  for (int k = 0; k < words; ++k) out[i * words + k] = curand(&state);
}

__global__ void OurStreamKernel(const std::uint64_t* seeds, const std::uint64_t* subs,
                                const std::uint64_t* offsets, int count, int words, std::uint32_t* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  PhiloxStream stream(seeds[i], subs[i], offsets[i]);
  for (int k = 0; k < words; ++k) out[i * words + k] = stream.Next();
}

__global__ void CurandUniformKernel(std::uint64_t seed, int count, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  curandStatePhilox4_32_10_t state;
  curand_init(seed, i, 0, &state);
  out[i] = curand_uniform(&state);
}

template <typename T>
int ToDevice(const T* host, int count, T** device) {
  int err = cudaMalloc(device, sizeof(T) * count);
  if (err != 0) return err;
  return cudaMemcpy(*device, host, sizeof(T) * count, cudaMemcpyHostToDevice);
}

}  // namespace

const char* CudaErrorText(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int RunPhiloxBlocksOnGpu(const PhiloxWords* counters, const PhiloxKey* keys, int count, int rounds,
                         PhiloxWords* out) {
  PhiloxWords* d_ctr = nullptr;
  PhiloxKey* d_key = nullptr;
  PhiloxWords* d_out = nullptr;
  int err = ToDevice(counters, count, &d_ctr);
  if (err == 0) err = ToDevice(keys, count, &d_key);
  if (err == 0) err = cudaMalloc(&d_out, sizeof(PhiloxWords) * count);
  if (err == 0) {
    PhiloxBlocksKernel<<<(count + 127) / 128, 128>>>(d_ctr, d_key, count, rounds, d_out);
    err = cudaGetLastError();
  }
  if (err == 0) err = cudaMemcpy(out, d_out, sizeof(PhiloxWords) * count, cudaMemcpyDeviceToHost);
  cudaFree(d_ctr);
  cudaFree(d_key);
  cudaFree(d_out);
  return err;
}

namespace {
template <typename Launch>
int RunStreams(const std::uint64_t* seeds, const std::uint64_t* subs, const std::uint64_t* offsets, int count,
               int words, std::uint32_t* out, Launch launch) {
  std::uint64_t *d_seeds = nullptr, *d_subs = nullptr, *d_offsets = nullptr;
  std::uint32_t* d_out = nullptr;
  int err = ToDevice(seeds, count, &d_seeds);
  if (err == 0) err = ToDevice(subs, count, &d_subs);
  if (err == 0) err = ToDevice(offsets, count, &d_offsets);
  if (err == 0) err = cudaMalloc(&d_out, sizeof(std::uint32_t) * count * words);
  if (err == 0) {
    launch(d_seeds, d_subs, d_offsets, d_out);
    err = cudaGetLastError();
  }
  if (err == 0) err = cudaMemcpy(out, d_out, sizeof(std::uint32_t) * count * words, cudaMemcpyDeviceToHost);
  cudaFree(d_seeds);
  cudaFree(d_subs);
  cudaFree(d_offsets);
  cudaFree(d_out);
  return err;
}
}  // namespace

int RunCurandOnGpu(const std::uint64_t* seeds, const std::uint64_t* subs, const std::uint64_t* offsets,
                   int count, int words, std::uint32_t* out) {
  return RunStreams(seeds, subs, offsets, count, words, out,
                    [&](std::uint64_t* s, std::uint64_t* u, std::uint64_t* o, std::uint32_t* d) {
                      CurandKernel<<<(count + 127) / 128, 128>>>(s, u, o, count, words, d);
                    });
}

int RunPhiloxStreamOnGpu(const std::uint64_t* seeds, const std::uint64_t* subs, const std::uint64_t* offsets,
                         int count, int words, std::uint32_t* out) {
  return RunStreams(seeds, subs, offsets, count, words, out,
                    [&](std::uint64_t* s, std::uint64_t* u, std::uint64_t* o, std::uint32_t* d) {
                      OurStreamKernel<<<(count + 127) / 128, 128>>>(s, u, o, count, words, d);
                    });
}

int RunCurandUniformOnGpu(std::uint64_t seed, int count, float* out) {
  float* d_out = nullptr;
  int err = cudaMalloc(&d_out, sizeof(float) * count);
  if (err == 0) {
    CurandUniformKernel<<<(count + 127) / 128, 128>>>(seed, count, d_out);
    err = cudaGetLastError();
  }
  if (err == 0) err = cudaMemcpy(out, d_out, sizeof(float) * count, cudaMemcpyDeviceToHost);
  cudaFree(d_out);
  return err;
}

}  // namespace graphalloc::rng_test
