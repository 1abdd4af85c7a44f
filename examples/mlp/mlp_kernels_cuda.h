// Launchers of the MLP example's kernels on a GPU (mlp_kernels.cu), compiled only with nvcc. Plain C++ with
// no Abseil, so nvcc compiles the .cu without it. Each returns the cudaError_t as an int (0 = success) and
// sets *call to the call that failed.
#ifndef GRAPHALLOC_EXAMPLES_MLP_MLP_KERNELS_CUDA_H_
#define GRAPHALLOC_EXAMPLES_MLP_MLP_KERNELS_CUDA_H_

#include "examples/mlp/mlp_op_bodies.h"

namespace graphalloc::mlp_cuda {

#define GRAPHALLOC_MLP_LAUNCHER(Op) \
  int Launch(int device, void* stream, const mlp_body::Op& op, const char** call);
GRAPHALLOC_MLP_OPS(GRAPHALLOC_MLP_LAUNCHER)
#undef GRAPHALLOC_MLP_LAUNCHER

// Loads every kernel (CUDA loads modules lazily; a first launch must not happen inside a capture).
int Preload(int device, const char** call);
const char* ErrorName(int code);

}  // namespace graphalloc::mlp_cuda

#endif  // GRAPHALLOC_EXAMPLES_MLP_MLP_KERNELS_CUDA_H_
