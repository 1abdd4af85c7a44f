// The CUDA driver's entry points, resolved at run time.
//
// No binary links libcuda: LoadCudaApi() dlopens libcuda.so.1 once per process, takes cuGetProcAddress_v2
// from it with dlsym and resolves every other entry point through it. Each entry point is asked for at the
// CUDA version of the signature we call it with (cudaTypedefs.h's PFN_cu<Name>_v<version>), not at
// CUDA_VERSION: cuGetProcAddress returns the newest variant at or below the version asked, and under CUDA 13
// "cuCtxSynchronize" at 13000 is a variant taking a CUcontext while cuda.h still declares the old
// cuCtxSynchronize(void). Pinning each version makes every pointer's type exactly right whatever the driver
// or the headers. cuda.h and cudaTypedefs.h are used for types and constants only.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_CUDA_SYMBOLS_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_CUDA_SYMBOLS_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/status/statusor.h"

namespace graphalloc::cuda {

// X(Name, version) stands for the driver function cu<Name> with the signature PFN_cu<Name>_v<version>; it is
// asked of cuGetProcAddress by its un-suffixed name at that version (e.g. cuStreamGetCaptureInfo at 12030 is
// the 7-argument _v3, cuMemAlloc at 3020 the 64-bit _v2).
#define GRAPHALLOC_CUDA_SYMBOLS(X)          \
  X(Init, 2000)                             \
  X(DriverGetVersion, 2020)                 \
  X(GetErrorName, 6000)                     \
  X(GetErrorString, 6000)                   \
  X(DeviceGetCount, 2000)                   \
  X(DeviceGet, 2000)                        \
  X(DeviceGetName, 2000)                    \
  X(DeviceTotalMem, 3020)                   \
  X(DeviceGetAttribute, 2000)               \
  X(DeviceCanAccessPeer, 4000)              \
  X(DevicePrimaryCtxRetain, 7000)           \
  X(DevicePrimaryCtxRelease, 11000)         \
  X(CtxGetCurrent, 4000)                    \
  X(CtxSetCurrent, 4000)                    \
  X(CtxSynchronize, 2000)                   \
  X(CtxEnablePeerAccess, 4000)              \
  X(MemGetInfo, 3020)                       \
  X(MemGetAllocationGranularity, 10020)     \
  X(MemAddressReserve, 10020)               \
  X(MemAddressFree, 10020)                  \
  X(MemCreate, 10020)                       \
  X(MemRelease, 10020)                      \
  X(MemMap, 10020)                          \
  X(MemUnmap, 10020)                        \
  X(MemSetAccess, 10020)                    \
  X(MemAlloc, 3020)                         \
  X(MemFree, 3020)                          \
  X(MemGetHandleForAddressRange, 11070)     \
  X(MemExportToShareableHandle, 10020)      \
  X(MemImportFromShareableHandle, 10020)    \
  X(MemRetainAllocationHandle, 11000)       \
  X(IpcGetMemHandle, 4010)                  \
  X(IpcOpenMemHandle, 11000)                \
  X(IpcCloseMemHandle, 4010)                \
  X(MemHostAlloc, 2020)                     \
  X(MemFreeHost, 2000)                      \
  X(MemcpyHtoD, 3020)                       \
  X(MemcpyDtoH, 3020)                       \
  X(MemcpyAsync, 4000)                      \
  X(MemsetD8Async, 3020)                    \
  X(StreamCreate, 2000)                     \
  X(StreamDestroy, 4000)                    \
  X(StreamSynchronize, 2000)                \
  X(StreamWaitEvent, 3020)                  \
  X(LaunchHostFunc, 10000)                  \
  X(EventCreate, 2000)                      \
  X(EventDestroy, 4000)                     \
  X(EventRecord, 2000)                      \
  X(EventQuery, 2000)                       \
  X(EventSynchronize, 2000)                 \
  X(StreamBeginCapture, 10010)              \
  X(StreamEndCapture, 10000)                \
  X(StreamGetCaptureInfo, 12030)            \
  X(ThreadExchangeStreamCaptureMode, 10010) \
  X(GraphInstantiateWithFlags, 11040)       \
  X(GraphExecUpdate, 12000)                 \
  X(GraphLaunch, 10000)                     \
  X(GraphExecDestroy, 10000)                \
  X(GraphDestroy, 10000)

struct CudaApi {
#define GRAPHALLOC_CUDA_FIELD(name, version) PFN_cu##name##_v##version name = nullptr;
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
