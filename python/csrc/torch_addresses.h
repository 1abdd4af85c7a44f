// PyTorch's device pointers (void*) as graphalloc's device addresses (DevicePtr) and back, for the
// PyTorch backend's files.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_ADDRESSES_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_ADDRESSES_H_

#include "graphalloc/allocator/device/driver.h"

namespace graphalloc_torch {

inline graphalloc::DevicePtr Address(const void* ptr) { return reinterpret_cast<graphalloc::DevicePtr>(ptr); }
inline void* Pointer(graphalloc::DevicePtr address) { return reinterpret_cast<void*>(address); }

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_ADDRESSES_H_
