// Launchers of the tiny kernels on a real GPU (tiny_kernels.cu), compiled only with nvcc. Plain C++ with
// no Abseil, so nvcc compiles the .cu without it. They return the cudaError_t as an int (0 = success) and
// set *call to the call that failed.
#ifndef GRAPHALLOC_EXAMPLES_KERNELS_TINY_KERNELS_CUDA_H_
#define GRAPHALLOC_EXAMPLES_KERNELS_TINY_KERNELS_CUDA_H_

#include <cstddef>

namespace graphalloc::testing::tiny_cuda {

int LaunchFill(int device, void* stream, float* out, std::size_t n, float value, const char** call);
int LaunchScale(int device, void* stream, float* out, const float* in, std::size_t n, float alpha,
                const char** call);
int LaunchAdd(int device, void* stream, float* out, const float* a, const float* b, std::size_t n,
              const char** call);
int Preload(int device, const char** call);
// cudaGetErrorName of a code returned above.
const char* ErrorName(int code);

}  // namespace graphalloc::testing::tiny_cuda

#endif  // GRAPHALLOC_EXAMPLES_KERNELS_TINY_KERNELS_CUDA_H_
