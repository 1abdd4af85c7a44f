// The CUDA driver's entry points, resolved at run time.
//
// No binary links libcuda: LoadCudaApi() dlopens libcuda.so.1 once per process, takes cuGetProcAddress_v2
// from it with dlsym and resolves every other entry point through it for the CUDA version of the headers
// we build against (CUDA_VERSION), so each pointer has exactly the signature cuda.h declares for that
// version (cuStreamGetCaptureInfo is the _v3 one under CUDA 13, cuMemAlloc the _v2 one, ...). cuda.h is
// used for types and constants only.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_CUDA_SYMBOLS_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_CUDA_SYMBOLS_H_

#include <cuda.h>

#include "absl/status/statusor.h"

namespace graphalloc::cuda {

// X(Name) stands for the driver function cu<Name>. The field's type comes from cuda.h's declaration of the
// un-suffixed name, which its macros map to the current version (cuMemAlloc -> cuMemAlloc_v2), and the
// symbol asked of cuGetProcAddress is the un-suffixed name, which it maps the same way for CUDA_VERSION.
#define GRAPHALLOC_CUDA_SYMBOLS(X) \
  X(Init)                          \
  X(DriverGetVersion)              \
  X(GetErrorName)                  \
  X(GetErrorString)                \
  X(DeviceGetCount)                \
  X(DeviceGet)                     \
  X(DeviceGetName)                 \
  X(DeviceTotalMem)                \
  X(DeviceGetAttribute)            \
  X(DeviceCanAccessPeer)           \
  X(DevicePrimaryCtxRetain)        \
  X(DevicePrimaryCtxRelease)       \
  X(CtxGetCurrent)                 \
  X(CtxSetCurrent)                 \
  X(CtxSynchronize)                \
  X(CtxEnablePeerAccess)           \
  X(MemGetInfo)                    \
  X(MemGetAllocationGranularity)   \
  X(MemAddressReserve)             \
  X(MemAddressFree)                \
  X(MemCreate)                     \
  X(MemRelease)                    \
  X(MemMap)                        \
  X(MemUnmap)                      \
  X(MemSetAccess)                  \
  X(MemAlloc)                      \
  X(MemFree)                       \
  X(MemcpyHtoD)                    \
  X(MemcpyDtoH)                    \
  X(MemcpyAsync)                   \
  X(MemsetD8Async)                 \
  X(StreamCreate)                  \
  X(StreamDestroy)                 \
  X(StreamSynchronize)             \
  X(StreamWaitEvent)               \
  X(LaunchHostFunc)                \
  X(EventCreate)                   \
  X(EventDestroy)                  \
  X(EventRecord)                   \
  X(EventQuery)                    \
  X(EventSynchronize)              \
  X(StreamBeginCapture)            \
  X(StreamEndCapture)              \
  X(StreamGetCaptureInfo)          \
  X(GraphInstantiateWithFlags)     \
  X(GraphExecUpdate)               \
  X(GraphLaunch)                   \
  X(GraphExecDestroy)              \
  X(GraphDestroy)

struct CudaApi {
#define GRAPHALLOC_CUDA_FIELD(name) decltype(&::cu##name) name = nullptr;
  GRAPHALLOC_CUDA_SYMBOLS(GRAPHALLOC_CUDA_FIELD)
#undef GRAPHALLOC_CUDA_FIELD
  int driver_version = 0;  // from cuDriverGetVersion, e.g. 13000
};

// The driver's entry points, with cuInit(0) done. Loaded once per process (thread-safe); a failure is not
// remembered, so a later call tries again (with the path SetCudaLibraryPathForTesting set meanwhile).
// Unavailable when the library cannot be opened, lacks cuGetProcAddress_v2 or a symbol, is older than the
// CUDA version we need, or cuInit fails; the message says what happened and what to do.
absl::StatusOr<const CudaApi*> LoadCudaApi();

// The library LoadCudaApi opens ("libcuda.so.1" by default; nullptr restores it). Only effective before
// the first successful load.
void SetCudaLibraryPathForTesting(const char* path);

// Status for a failed call: DriverError's text and code, with the driver's own name and description
// (cuGetErrorName/cuGetErrorString) when our table does not know the code.
absl::Status CudaError(const CudaApi& api, const char* call, CUresult result);

}  // namespace graphalloc::cuda

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_CUDA_SYMBOLS_H_
