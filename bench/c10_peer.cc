#include "bench/c10_peer.h"

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <exception>

namespace graphalloc::bench::c10peer {
namespace {

thread_local char last_error[1024] = "";

void SetError(const char* what, const char* message) {
  std::snprintf(last_error, sizeof(last_error), "%s: %s", what, message);
}

c10::cuda::CUDACachingAllocator::CUDAAllocator* Get() {
  c10::cuda::CUDACachingAllocator::CUDAAllocator* allocator = c10::cuda::CUDACachingAllocator::get();
  if (allocator == nullptr) SetError("c10::cuda::CUDACachingAllocator::get", "no allocator backend");
  return allocator;
}

}  // namespace

bool Init(int device_count) {
  try {
    auto* allocator = Get();
    if (allocator == nullptr) return false;
    allocator->init(device_count);
    return true;
  } catch (const std::exception& e) {
    SetError("CUDACachingAllocator::init", e.what());
  } catch (...) {
    SetError("CUDACachingAllocator::init", "unknown exception");
  }
  return false;
}

const char* Name() {
  static char name[128] = "";
  try {
    auto* allocator = Get();
    if (allocator == nullptr) return "unavailable";
    std::snprintf(name, sizeof(name), "%s", allocator->name().c_str());
    return name;
  } catch (...) {
    return "unknown";
  }
}

void* Alloc(std::size_t bytes, void* cuda_stream) {
  try {
    void* p =
        c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(cuda_stream));
    if (p == nullptr) [[unlikely]]
      SetError("raw_alloc_with_stream", "returned null");
    return p;
  } catch (const std::exception& e) {
    SetError("raw_alloc_with_stream", e.what());
  } catch (...) {
    SetError("raw_alloc_with_stream", "unknown exception");
  }
  return nullptr;
}

bool Free(void* ptr) {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
    return true;
  } catch (const std::exception& e) {
    SetError("raw_delete", e.what());
  } catch (...) {
    SetError("raw_delete", "unknown exception");
  }
  return false;
}

bool EmptyCache() {
  try {
    c10::cuda::CUDACachingAllocator::emptyCache();
    return true;
  } catch (const std::exception& e) {
    SetError("emptyCache", e.what());
  } catch (...) {
    SetError("emptyCache", "unknown exception");
  }
  return false;
}

const char* LastError() { return last_error; }

}  // namespace graphalloc::bench::c10peer
