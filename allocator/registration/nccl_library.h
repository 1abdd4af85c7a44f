// libnccl, loaded at run time: no graphalloc binary links NCCL, so the library builds and runs without it,
// and registers memory with NCCL's communicators where the process has it.
#ifndef GRAPHALLOC_ALLOCATOR_REGISTRATION_NCCL_LIBRARY_H_
#define GRAPHALLOC_ALLOCATOR_REGISTRATION_NCCL_LIBRARY_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace graphalloc {

// The NCCL entry points graphalloc calls, with NCCL's signatures (ncclResult_t is an int-sized enum,
// ncclComm_t an opaque pointer).
struct NcclLibrary {
  using RegisterFn = int (*)(void* comm, void* buff, std::size_t size, void** handle);
  using DeregisterFn = int (*)(void* comm, void* handle);
  using ErrorStringFn = const char* (*)(int result);

  // Opens GRAPHALLOC_NCCL_LIBRARY if set, else libnccl.so.2, once per path per process (the handle stays
  // open). Unavailable, saying which library and what dlopen or dlsym said, when it cannot be loaded.
  static absl::StatusOr<const NcclLibrary*> Load();

  // The address of another NCCL function (ncclCommInitRank, ...), or null.
  void* Symbol(const char* name) const;
  // Status for an NCCL result: `call` failed with NCCL's error string (ncclGetErrorString) and code.
  absl::Status Error(const std::string& call, int result) const;

  std::string path;
  void* handle = nullptr;  // from dlopen
  RegisterFn comm_register = nullptr;
  DeregisterFn comm_deregister = nullptr;
  ErrorStringFn get_error_string = nullptr;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_REGISTRATION_NCCL_LIBRARY_H_
