// The C entry points Python (graphalloc.torch) calls to install the PyTorch backend (torch_backend.h):
// plain C, so that ctypes can call them and no C++ type crosses into Python.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "python/csrc/torch_backend.h"

#define GRAPHALLOC_BACKEND_EXPORT extern "C" __attribute__((visibility("default")))

// Makes graphalloc PyTorch's CUDA allocator. Returns 0, or 1 with the reason in `error` (NUL-terminated,
// truncated to error_size) when PyTorch refuses, e.g. because CUDA was already initialised.
GRAPHALLOC_BACKEND_EXPORT int graphalloc_torch_backend_install(char* error, size_t error_size) {
  try {
    graphalloc_torch::InstallTorchBackend();
    return 0;
  } catch (const c10::Error& e) {
    if (error != nullptr && error_size > 0)
      std::snprintf(error, error_size, "%s", e.what_without_backtrace());
  } catch (const std::exception& e) {
    if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", e.what());
  }
  return 1;
}

// What PyTorch's cacheInfo(device, &largest) answers with `largest` starting at `start` (0: PyTorch starts
// from the device's free memory), through PyTorch's own entry point: for tests, as cuDNN sizes its workspace.
GRAPHALLOC_BACKEND_EXPORT size_t graphalloc_torch_backend_cache_info(int device, size_t start) {
  size_t largest = start;
  c10::cuda::CUDACachingAllocator::cacheInfo(static_cast<c10::DeviceIndex>(device), &largest);
  return largest;
}

// PyTorch pool routes begun and not ended (0 outside captures and use_mem_pool blocks).
GRAPHALLOC_BACKEND_EXPORT int graphalloc_torch_backend_open_routes(void) {
  return graphalloc_torch::TorchBackend::Get().pools().OpenRoutes();
}

// ---- Clean-up after a failed capture (graphalloc.torch), with the pluggable shim's signatures. ----

// The pool whose route the calling thread began last: returns 1 and fills the outputs, or 0 if none.
GRAPHALLOC_BACKEND_EXPORT int graphalloc_torch_backend_last_begun(int* device, unsigned long long* first,
                                                                  unsigned long long* second) {
  return graphalloc_torch::LastBegun(graphalloc_torch::TorchBackend::Get().pools(), device, first, second);
}

// Whether a route to the pool is open (*route_open) and its graphalloc pool (*pool); returns 1 when
// graphalloc has a pool for it, else 0.
GRAPHALLOC_BACKEND_EXPORT int graphalloc_torch_backend_route_of(int device, unsigned long long first,
                                                                unsigned long long second, uint64_t* pool,
                                                                int* route_open) {
  return graphalloc_torch::RouteOf(graphalloc_torch::TorchBackend::Get().pools(), device, first, second, pool,
                                   route_open);
}

// Ends the pool's route if it is open; with release != 0 also drops the reference its begin took.
// graphalloc.torch.register_nccl: the PyTorch pool (first, second) of `device` becomes a communication pool
// with handle-aligned placement (TorchPoolTable::SetCommunication). 0, or -1 with the message in `error`.
GRAPHALLOC_BACKEND_EXPORT int graphalloc_torch_backend_pool_for_communication(
    int device, unsigned long long first, unsigned long long second, char* error, size_t error_size) {
  try {
    graphalloc_torch::TorchBackend::Get().pools().SetCommunication(graphalloc_torch::TorchPoolKey{
        static_cast<c10::DeviceIndex>(device),
        {static_cast<c10::CaptureId_t>(first), static_cast<c10::CaptureId_t>(second)}});
    return 0;
  } catch (const std::exception& e) {
    if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", e.what());
    return -1;
  }
}

GRAPHALLOC_BACKEND_EXPORT void graphalloc_torch_backend_abandon(int device, unsigned long long first,
                                                                unsigned long long second, int release) {
  graphalloc_torch::Abandon(graphalloc_torch::TorchBackend::Get().pools(), device, first, second, release);
}
