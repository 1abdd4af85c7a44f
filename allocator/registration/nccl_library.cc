// Loading libnccl with dlopen, and NCCL's results as Status (nccl_library.h).
#include "graphalloc/allocator/registration/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "absl/strings/str_format.h"

namespace graphalloc {

absl::StatusOr<const NcclLibrary*> NcclLibrary::Load() {
  const char* env = std::getenv("GRAPHALLOC_NCCL_LIBRARY");
  const std::string path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
  // One per path: a test points GRAPHALLOC_NCCL_LIBRARY at a fake library, a later one at another.
  static std::mutex mu;
  static auto* loaded = new std::map<std::string, std::unique_ptr<NcclLibrary>>();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded->find(path); it != loaded->end()) return it->second.get();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrFormat(
        "cannot load NCCL from '%s' (%s); install NCCL or set GRAPHALLOC_NCCL_LIBRARY to libnccl.so's path",
        path, why != nullptr ? why : "unknown error"));
  }
  auto lib = std::make_unique<NcclLibrary>();
  lib->path = path;
  lib->handle = handle;
  lib->comm_register = reinterpret_cast<RegisterFn>(dlsym(handle, "ncclCommRegister"));
  lib->comm_deregister = reinterpret_cast<DeregisterFn>(dlsym(handle, "ncclCommDeregister"));
  lib->get_error_string = reinterpret_cast<ErrorStringFn>(dlsym(handle, "ncclGetErrorString"));
  if (lib->comm_register == nullptr || lib->comm_deregister == nullptr || lib->get_error_string == nullptr) {
    dlclose(handle);
    return absl::UnavailableError(absl::StrFormat(
        "'%s' lacks ncclCommRegister, ncclCommDeregister or ncclGetErrorString (NCCL 2.19 or newer has them)",
        path));
  }
  const NcclLibrary* out = lib.get();
  loaded->emplace(path, std::move(lib));
  return out;
}

void* NcclLibrary::Symbol(const char* name) const { return dlsym(handle, name); }

absl::Status NcclLibrary::Error(const std::string& call, int result) const {
  const char* text = get_error_string(result);
  return absl::InternalError(absl::StrFormat("%s failed: NCCL error %d (%s)", call, result,
                                             text != nullptr ? text : "no description"));
}

}  // namespace graphalloc
