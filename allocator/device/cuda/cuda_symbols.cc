// Loads libcuda.so.1 at run time and resolves the driver API through cuGetProcAddress.
//
// Why cuGetProcAddress and not dlsym for each name: the driver exports several versions of many entry
// points (cuMemAlloc, cuMemAlloc_v2; cuStreamGetCaptureInfo, _v2, _v3), and cuGetProcAddress returns the one
// whose signature matches the CUDA version we pass, which is the version our pointer type names.
#include "graphalloc/allocator/device/cuda/cuda_symbols.h"

#include <dlfcn.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/driver_error.h"

namespace graphalloc::cuda {
namespace {

constexpr char kDefaultLibrary[] = "libcuda.so.1";
constexpr absl::string_view kAdvice =
    "; install the NVIDIA driver or use the simulated device (--device sim)";
// cuStreamGetCaptureInfo's 7-argument form (_v3) arrived in CUDA 12.3: an older driver would hand back a
// function with another signature for the same name, so we refuse it instead.
constexpr int kMinDriverVersion = 12030;

using GetProcAddressFn = CUresult (*)(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult* symbol_status);

struct Loader {
  Mutex mu;
  std::string path ABSL_GUARDED_BY(mu) = kDefaultLibrary;
  // Set once, after a complete load; never freed (the driver stays loaded for the life of the process).
  std::atomic<const CudaApi*> api{nullptr};
};

Loader& GetLoader() {
  static Loader* loader = new Loader;
  return *loader;
}

absl::Status NotAvailable(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("CUDA driver not available: ", what, kAdvice));
}

std::string VersionText(int version) { return absl::StrCat(version / 1000, ".", (version % 1000) / 10); }

// Resolves every symbol of GRAPHALLOC_CUDA_SYMBOLS into `api`.
absl::Status ResolveAll(GetProcAddressFn get_proc, const std::string& path, CudaApi& api) {
#define GRAPHALLOC_CUDA_RESOLVE(name, version)                                                             \
  {                                                                                                        \
    void* fn = nullptr;                                                                                    \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                           \
    const CUresult result = get_proc("cu" #name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);       \
    if (result != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {                 \
      return NotAvailable(absl::StrCat(path, " has no usable cu" #name " for CUDA ", VersionText(version), \
                                       " (cuGetProcAddress result ", static_cast<int>(result),             \
                                       ", symbol status ", static_cast<int>(found),                        \
                                       "); the driver may be too old"));                                   \
    }                                                                                                      \
    api.name = reinterpret_cast<decltype(api.name)>(fn);                                                   \
  }
  GRAPHALLOC_CUDA_SYMBOLS(GRAPHALLOC_CUDA_RESOLVE)
#undef GRAPHALLOC_CUDA_RESOLVE
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaApi>> LoadFrom(const std::string& path) {
  dlerror();  // clear any stale error so the one we report is ours
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    return NotAvailable(
        absl::StrCat("dlopen(", path, ") failed: ", error != nullptr ? error : "unknown error"));
  }
  auto get_proc = reinterpret_cast<GetProcAddressFn>(dlsym(library, "cuGetProcAddress_v2"));
  auto api = std::make_unique<CudaApi>();
  absl::Status resolved =
      get_proc == nullptr
          ? NotAvailable(
                absl::StrCat(path, " has no cuGetProcAddress_v2, so it predates CUDA 12; a driver for CUDA ",
                             VersionText(kMinDriverVersion), " or newer is needed"))
          : ResolveAll(get_proc, path, *api);
  if (!resolved.ok()) {
    // Nothing of the library ran yet, so unloading it is safe and lets a retry start clean.
    dlclose(library);
    return resolved;
  }
  // From here on the library has run code (and may have registered exit handlers): it stays loaded even when
  // we fail, as unloading it could crash the process at exit.
  if (CUresult r = api->DriverGetVersion(&api->driver_version); r != CUDA_SUCCESS) {
    return NotAvailable(CudaError(*api, "cuDriverGetVersion", r).message());
  }
  if (api->driver_version < kMinDriverVersion) {
    return NotAvailable(absl::StrCat("the driver supports CUDA ", VersionText(api->driver_version),
                                     ", graphalloc needs CUDA ", VersionText(kMinDriverVersion),
                                     " or newer; update the NVIDIA driver"));
  }
  if (CUresult r = api->Init(0); r != CUDA_SUCCESS) {
    absl::Status error = CudaError(*api, "cuInit", r);
    absl::Status status = NotAvailable(error.message());
    error.ForEachPayload(
        [&](absl::string_view url, const absl::Cord& payload) { status.SetPayload(url, payload); });
    return status;
  }
  return api;
}

}  // namespace

absl::StatusOr<const CudaApi*> LoadCudaApi() {
  Loader& loader = GetLoader();
  if (const CudaApi* api = loader.api.load(std::memory_order_acquire)) return api;
  MutexLock lock(&loader.mu);
  if (const CudaApi* api = loader.api.load(std::memory_order_acquire)) return api;
  absl::StatusOr<std::unique_ptr<CudaApi>> api = LoadFrom(loader.path);
  if (!api.ok()) return api.status();
  const CudaApi* loaded = api->release();
  loader.api.store(loaded, std::memory_order_release);
  return loaded;
}

void SetCudaLibraryPathForTesting(const char* path) {
  Loader& loader = GetLoader();
  MutexLock lock(&loader.mu);
  loader.path = path != nullptr ? path : kDefaultLibrary;
}

absl::Status CudaError(const CudaApi& api, const char* call, CUresult result) {
  absl::Status status = DriverError(call, static_cast<int>(result));
  if (status.ok() || DriverResultName(static_cast<int>(result)) != "CUDA_ERROR_UNRECOGNIZED" ||
      api.GetErrorName == nullptr) {
    return status;
  }
  // Our table (shared with the simulated device) lacks this code: ask the driver for its words.
  const char* name = nullptr;
  const char* description = nullptr;
  if (api.GetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) return status;
  if (api.GetErrorString(result, &description) != CUDA_SUCCESS || description == nullptr) {
    description = "no description";
  }
  absl::Status better(status.code(), absl::StrCat(call, " failed: ", name, " (", description, ")"));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { better.SetPayload(url, payload); });
  return better;
}

}  // namespace graphalloc::cuda
