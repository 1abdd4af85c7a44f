// The C++ types of PyTorch's CUDAPluggableAllocator hooks that the shim (torch_shim.cc) implements, spelled
// without PyTorch's or CUDA's headers. PyTorch's Python setters take a hook as an integer and call it through
// a function pointer of exactly these types, so a mismatch would be undefined behaviour, not a compile
// error: python/CMakeLists.txt compiles torch_hook_types_check.cc against the PyTorch being built for and
// leaves the pool hooks out of the shim unless they match.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_HOOK_TYPES_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_HOOK_TYPES_H_

#include <cstddef>
#include <functional>
#include <utility>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace graphalloc_torch {

using CudaStream = CUstream_st*;
// c10::cuda::MempoolId_t: {id from a capture, id from graph_pool_handle() or MemPool}; {0, 0} is the default.
using MempoolId = std::pair<unsigned long long, unsigned long long>;
// CUDAGraph's filter: true for the streams of the capture that owns the pool.
using StreamFilter = std::function<bool(CudaStream)>;

using MallocFn = void*(std::size_t size, int device, CudaStream stream);
using FreeFn = void(void* ptr, std::size_t size, int device, CudaStream stream);
using BeginAllocateToPoolFn = void(int device, MempoolId pool, StreamFilter filter);
using EndAllocateToPoolFn = void(int device, MempoolId pool);
using ReleasePoolFn = void(int device, MempoolId pool);

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_HOOK_TYPES_H_
