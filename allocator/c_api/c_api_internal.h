// What the C ABI's source files share: Status to graphalloc_status code, the calling thread's last message,
// pools created for C callers, and the guard that keeps C++ exceptions from crossing into C.
#ifndef GRAPHALLOC_ALLOCATOR_C_API_C_API_INTERNAL_H_
#define GRAPHALLOC_ALLOCATOR_C_API_C_API_INTERNAL_H_

#include <cstdint>
#include <exception>
#include <string>

#include "absl/status/status.h"
#include "graphalloc/allocator/c_api/graphalloc.h"

namespace graphalloc::c_api {

// The calling thread's last error message (graphalloc_last_error()).
std::string& LastError();

// Keeps the message of `status` as the thread's last error and returns its graphalloc_status code.
int Report(const absl::Status& status);

// graphalloc_pool_create and graphalloc_pool_create_with_tag (tag may be NULL): a new pool of the device's
// allocator, one reference to it held for the C caller until graphalloc_pool_release, its id in *pool.
// `function` names the C function in errors.
// With `communication`, a communication pool (PoolOptions::communication).
absl::Status CreatePool(const char* function, int device, const graphalloc_pool_options* options,
                        const char* tag, uint64_t* pool, bool communication = false);

// Runs `body` (returning absl::Status) with exceptions turned into an internal error.
template <typename F>
int Guarded(F body) {
  try {
    return Report(body());
  } catch (const std::exception& e) {
    return Report(absl::InternalError(std::string("graphalloc: unexpected exception: ") + e.what()));
  } catch (...) {
    return Report(absl::InternalError("graphalloc: unexpected exception"));
  }
}

}  // namespace graphalloc::c_api

#endif  // GRAPHALLOC_ALLOCATOR_C_API_C_API_INTERNAL_H_
