// CudaDriver: the Driver interface on the real CUDA driver API.
//
// Context handling: every call first makes this device's primary context current on the calling thread
// (ScopedContext). When the thread had another context current (another device's, e.g. PyTorch working on
// device 1), that context is restored afterwards, because the CUDA runtime derives its "current device" from
// it; when the thread had none, ours stays current, as cudaSetDevice would leave it.
//
// Host closures: LaunchHostFunction hands cuLaunchHostFunc a trampoline and a heap-allocated
// std::function. Outside capture the trampoline runs it once and deletes it. During capture the host node
// runs on every launch of every exec made from the graph, so the closure is owned by a list kept per capture
// id, moved into the Graph at EndCapture and shared with each GraphExec; it is freed when the graph and all
// its execs are destroyed. CUDA frees a destroyed exec that is still running only when it completes, so, as
// for any memory a launched graph uses, callers destroy an exec after its launches have finished.
#include "graphalloc/allocator/device/cuda_driver.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/cuda/cuda_symbols.h"
#include "graphalloc/allocator/device/driver_error.h"

namespace graphalloc {
namespace {

using cuda::CudaApi;

// Closures captured into one graph; stable addresses, since the graph's host nodes point at them.
using ClosureList = std::vector<std::unique_ptr<HostFunction>>;

CUstream ToCu(Stream s) { return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(s)); }
CUevent ToCu(Event e) { return reinterpret_cast<CUevent>(static_cast<std::uintptr_t>(e)); }
CUgraph ToCu(Graph g) { return reinterpret_cast<CUgraph>(static_cast<std::uintptr_t>(g)); }
CUgraphExec ToCu(GraphExec e) { return reinterpret_cast<CUgraphExec>(static_cast<std::uintptr_t>(e)); }

void CUDA_CB RunAndDelete(void* user_data) {
  std::unique_ptr<HostFunction> fn(static_cast<HostFunction*>(user_data));
  (*fn)();
}

void CUDA_CB RunCaptured(void* user_data) { (*static_cast<HostFunction*>(user_data))(); }

// Makes `context` current on this thread for the guard's lifetime (see the top comment).
class ScopedContext {
 public:
  ScopedContext(const CudaApi& api, CUcontext context) : api_(api) {
    CUcontext current = nullptr;
    if (CUresult r = api_.CtxGetCurrent(&current); r != CUDA_SUCCESS) {
      status_ = cuda::CudaError(api_, "cuCtxGetCurrent", r);
      return;
    }
    if (current == context) return;
    if (CUresult r = api_.CtxSetCurrent(context); r != CUDA_SUCCESS) {
      status_ = cuda::CudaError(api_, "cuCtxSetCurrent", r);
      return;
    }
    previous_ = current;
  }
  ~ScopedContext() {
    if (previous_ != nullptr) api_.CtxSetCurrent(previous_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  const CudaApi& api_;
  CUcontext previous_ = nullptr;
  absl::Status status_;
};

}  // namespace

struct CudaDriver::State {
  const CudaApi* api = nullptr;
  CUdevice device = 0;
  CUcontext context = nullptr;  // retained primary context; released by ~CudaDriver
  DeviceInfo info;
  CUmemAllocationProp prop{};  // what MemCreate asks for; set up once by Create

  Mutex mu;
  absl::flat_hash_map<int, CUcontext> peers ABSL_GUARDED_BY(mu);  // retained peer primary contexts
  absl::flat_hash_map<cuuint64_t, std::shared_ptr<ClosureList>> captures ABSL_GUARDED_BY(mu);
  // The capture id each capturing stream began with: once a capture is invalidated the driver no longer
  // reports its id, but its closures must still be found and freed at EndCapture.
  absl::flat_hash_map<CUstream, cuuint64_t> capture_of_stream ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<CUgraph, std::shared_ptr<ClosureList>> graphs ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<CUgraphExec, std::vector<std::shared_ptr<ClosureList>>> execs ABSL_GUARDED_BY(mu);

  absl::Status Check(const char* call, CUresult result) const { return cuda::CudaError(*api, call, result); }
};

// Makes the device's context current for the rest of the enclosing method, or returns its error.
#define GRAPHALLOC_CUDA_CONTEXT()                             \
  ScopedContext context_guard(*state_->api, state_->context); \
  if (!context_guard.status().ok()) return context_guard.status()

// Calls cu<name>(args...) and returns its error, if any, from the enclosing method.
#define GRAPHALLOC_CUDA_RETURN_IF_ERROR(name, ...)                      \
  if (CUresult r = state_->api->name(__VA_ARGS__); r != CUDA_SUCCESS) { \
    return state_->Check("cu" #name, r);                                \
  }

absl::StatusOr<std::unique_ptr<CudaDriver>> CudaDriver::Create(int ordinal) {
  absl::StatusOr<const CudaApi*> loaded = cuda::LoadCudaApi();
  if (!loaded.ok()) return loaded.status();
  const CudaApi& api = **loaded;
  int count = 0;
  if (CUresult r = api.DeviceGetCount(&count); r != CUDA_SUCCESS) {
    return cuda::CudaError(api, "cuDeviceGetCount", r);
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist: the driver reports ", count, " device(s)",
                     count > 0 ? absl::StrCat(", ordinals 0 to ", count - 1) : ""));
  }
  auto state = std::make_unique<State>();
  state->api = &api;
  if (CUresult r = api.DeviceGet(&state->device, ordinal); r != CUDA_SUCCESS) {
    return cuda::CudaError(api, "cuDeviceGet", r);
  }
  if (CUresult r = api.DevicePrimaryCtxRetain(&state->context, state->device); r != CUDA_SUCCESS) {
    return cuda::CudaError(api, "cuDevicePrimaryCtxRetain", r);
  }
  // From here the driver object owns the context: an early return releases it.
  std::unique_ptr<CudaDriver> driver(new CudaDriver(std::move(state)));
  State& s = *driver->state_;
  const CUdevice dev = s.device;
  DeviceInfo& info = s.info;
  info.ordinal = ordinal;

  char name[256] = {};
  if (CUresult r = api.DeviceGetName(name, sizeof(name) - 1, dev); r != CUDA_SUCCESS) {
    return s.Check("cuDeviceGetName", r);
  }
  info.name = name;
  if (CUresult r = api.DeviceTotalMem(&info.total_memory, dev); r != CUDA_SUCCESS) {
    return s.Check("cuDeviceTotalMem", r);
  }
  int vmm = 0;
  int rdma = 0;
  for (auto [attribute, value] :
       {std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &info.compute_capability_major},
        std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &info.compute_capability_minor},
        std::pair{CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &vmm},
        std::pair{CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, &rdma}}) {
    if (CUresult r = api.DeviceGetAttribute(value, attribute, dev); r != CUDA_SUCCESS) {
      return s.Check("cuDeviceGetAttribute", r);
    }
  }
  if (vmm == 0) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", ordinal, " (", info.name,
                                                      ") does not support virtual memory management "
                                                      "(cuMemCreate/cuMemMap), which graphalloc needs"));
  }
  // Pinned device memory, no exportable handle type (nothing is shared across processes), RDMA-capable
  // where the device allows it so the memory can be registered with a NIC.
  s.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  s.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  s.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  s.prop.location.id = dev;
  s.prop.allocFlags.gpuDirectRDMACapable = rdma != 0 ? 1 : 0;
  if (CUresult r =
          api.MemGetAllocationGranularity(&info.granularity, &s.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS) {
    return s.Check("cuMemGetAllocationGranularity", r);
  }
  if (CUresult r = api.MemGetAllocationGranularity(&info.recommended_granularity, &s.prop,
                                                   CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS) {
    return s.Check("cuMemGetAllocationGranularity", r);
  }
  return driver;
}

absl::StatusOr<int> CudaDriver::DeviceCount() {
  absl::StatusOr<const CudaApi*> api = cuda::LoadCudaApi();
  if (!api.ok()) return api.status();
  int count = 0;
  if (CUresult r = (*api)->DeviceGetCount(&count); r != CUDA_SUCCESS) {
    return cuda::CudaError(**api, "cuDeviceGetCount", r);
  }
  return count;
}

void CudaDriver::SetLibraryPathForTesting(const char* path) { cuda::SetCudaLibraryPathForTesting(path); }

CudaDriver::CudaDriver(std::unique_ptr<State> state) : state_(std::move(state)) {}

CudaDriver::~CudaDriver() {
  // Graphs, execs and captures still alive here are the caller's leak; their closures go with us (freed
  // outside the lock, as everywhere).
  absl::flat_hash_map<int, CUcontext> peers;
  absl::flat_hash_map<cuuint64_t, std::shared_ptr<ClosureList>> captures;
  absl::flat_hash_map<CUgraph, std::shared_ptr<ClosureList>> graphs;
  absl::flat_hash_map<CUgraphExec, std::vector<std::shared_ptr<ClosureList>>> execs;
  {
    MutexLock lock(&state_->mu);
    peers.swap(state_->peers);
    captures.swap(state_->captures);
    graphs.swap(state_->graphs);
    execs.swap(state_->execs);
  }
  // Errors are ignored: at process exit the driver may already be shutting down (CUDA_ERROR_DEINITIALIZED).
  for (const auto& [ordinal, context] : peers) {
    CUdevice peer = 0;
    if (state_->api->DeviceGet(&peer, ordinal) == CUDA_SUCCESS) state_->api->DevicePrimaryCtxRelease(peer);
  }
  state_->api->DevicePrimaryCtxRelease(state_->device);
}

std::string_view CudaDriver::Kind() const { return "cuda"; }

const DeviceInfo& CudaDriver::Info() const { return state_->info; }

absl::Status CudaDriver::EnablePeerAccess(int peer_ordinal) {
  // "Peer access" here means the peer may access this device's memory (see Driver::MemSetAccess): the
  // peer's context enables access to ours.
  if (peer_ordinal == state_->info.ordinal) {
    return absl::InvalidArgumentError(
        absl::StrCat("EnablePeerAccess: device ", peer_ordinal, " is this device"));
  }
  {
    MutexLock lock(&state_->mu);
    if (state_->peers.contains(peer_ordinal)) return absl::OkStatus();
  }
  const CudaApi& api = *state_->api;
  CUdevice peer = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(DeviceGet, &peer, peer_ordinal);
  int can_access = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(DeviceCanAccessPeer, &can_access, peer, state_->device);
  if (can_access == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("EnablePeerAccess: device ", peer_ordinal, " cannot access the memory of device ",
                     state_->info.ordinal, " (no peer-to-peer path between them)"));
  }
  CUcontext peer_context = nullptr;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(DevicePrimaryCtxRetain, &peer_context, peer);
  CUresult result = CUDA_SUCCESS;
  {
    ScopedContext guard(api, peer_context);
    if (!guard.status().ok()) {
      api.DevicePrimaryCtxRelease(peer);
      return guard.status();
    }
    result = api.CtxEnablePeerAccess(state_->context, 0);
  }
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
    api.DevicePrimaryCtxRelease(peer);
    return state_->Check("cuCtxEnablePeerAccess", result);
  }
  MutexLock lock(&state_->mu);
  if (!state_->peers.emplace(peer_ordinal, peer_context).second) api.DevicePrimaryCtxRelease(peer);  // raced
  return absl::OkStatus();
}

absl::StatusOr<MemoryInfo> CudaDriver::GetMemoryInfo() {
  GRAPHALLOC_CUDA_CONTEXT();
  MemoryInfo info;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemGetInfo, &info.free, &info.total);
  return info;
}

absl::StatusOr<DevicePtr> CudaDriver::AddressReserve(std::size_t size, std::size_t alignment) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUdeviceptr ptr = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemAddressReserve, &ptr, size, alignment, /*addr=*/0, /*flags=*/0);
  return static_cast<DevicePtr>(ptr);
}

absl::Status CudaDriver::AddressFree(DevicePtr ptr, std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemAddressFree, ptr, size);
  return absl::OkStatus();
}

absl::StatusOr<PhysicalHandle> CudaDriver::MemCreate(std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUmemGenericAllocationHandle handle = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemCreate, &handle, size, &state_->prop, /*flags=*/0);
  return PhysicalHandle{handle};
}

absl::Status CudaDriver::MemRelease(PhysicalHandle handle) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemRelease, static_cast<CUmemGenericAllocationHandle>(handle));
  return absl::OkStatus();
}

absl::Status CudaDriver::MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemMap, ptr, size, /*offset=*/0,
                                  static_cast<CUmemGenericAllocationHandle>(handle),
                                  /*flags=*/0);
  return absl::OkStatus();
}

absl::Status CudaDriver::MemUnmap(DevicePtr ptr, std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemUnmap, ptr, size);
  return absl::OkStatus();
}

absl::Status CudaDriver::MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers) {
  GRAPHALLOC_CUDA_CONTEXT();
  // One descriptor per device; a handful at most, so a small vector is fine here.
  std::vector<CUmemAccessDesc> access(1 + peers.size());
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = state_->device;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (std::size_t i = 0; i < peers.size(); ++i) {
    access[i + 1].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i + 1].location.id = peers[i];
    access[i + 1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemSetAccess, ptr, size, access.data(), access.size());
  return absl::OkStatus();
}

absl::StatusOr<DevicePtr> CudaDriver::MemAlloc(std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUdeviceptr ptr = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemAlloc, &ptr, size);
  return static_cast<DevicePtr>(ptr);
}

absl::Status CudaDriver::MemFree(DevicePtr ptr) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemFree, ptr);
  return absl::OkStatus();
}

absl::StatusOr<int> CudaDriver::MemGetDmaBufFd(DevicePtr ptr, std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  int fd = -1;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemGetHandleForAddressRange, &fd, ptr, size,
                                  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, /*flags=*/0);
  return fd;
}

absl::StatusOr<PhysicalHandle> CudaDriver::MemCreateShareable(std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUmemAllocationProp prop = state_->prop;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle handle = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemCreate, &handle, size, &prop, /*flags=*/0);
  return PhysicalHandle{handle};
}

absl::StatusOr<Driver::ShareableHandle> CudaDriver::MemExportToShareableHandle(PhysicalHandle handle) {
  GRAPHALLOC_CUDA_CONTEXT();
  int fd = -1;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemExportToShareableHandle, &fd,
                                  static_cast<CUmemGenericAllocationHandle>(handle),
                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, /*flags=*/0);
  // CUDA cannot tell a handle's size; the caller, who created it, fills `size` in.
  return ShareableHandle{.fd = fd, .offset = 0, .size = 0};
}

absl::StatusOr<PhysicalHandle> CudaDriver::MemImportFromShareableHandle(const ShareableHandle& shared) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUmemGenericAllocationHandle handle = 0;
  // For POSIX file descriptors the driver takes the descriptor's value in the pointer argument.
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemImportFromShareableHandle, &handle,
                                  reinterpret_cast<void*>(static_cast<std::intptr_t>(shared.fd)),
                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  return PhysicalHandle{handle};
}

absl::StatusOr<PhysicalHandle> CudaDriver::MemRetainAllocationHandle(DevicePtr ptr) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUmemGenericAllocationHandle handle = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemRetainAllocationHandle, &handle, reinterpret_cast<void*>(ptr));
  return PhysicalHandle{handle};
}

absl::StatusOr<Driver::IpcMemHandle> CudaDriver::IpcGetMemHandle(DevicePtr ptr) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUipcMemHandle native{};
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(IpcGetMemHandle, &native, ptr);
  IpcMemHandle handle;
  static_assert(sizeof(native.reserved) == sizeof(handle.bytes));
  std::memcpy(handle.bytes.data(), native.reserved, sizeof(native.reserved));
  return handle;
}

absl::StatusOr<DevicePtr> CudaDriver::IpcOpenMemHandle(const IpcMemHandle& handle) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUipcMemHandle native{};
  std::memcpy(native.reserved, handle.bytes.data(), sizeof(native.reserved));
  CUdeviceptr ptr = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(IpcOpenMemHandle, &ptr, native, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  return static_cast<DevicePtr>(ptr);
}

absl::Status CudaDriver::IpcCloseMemHandle(DevicePtr ptr) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(IpcCloseMemHandle, ptr);
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaDriver::HostAlloc(std::size_t size) {
  GRAPHALLOC_CUDA_CONTEXT();
  void* ptr = nullptr;
  // Portable: pinned for every context, so any device's copies run at full bandwidth.
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemHostAlloc, &ptr, size, CU_MEMHOSTALLOC_PORTABLE);
  return ptr;
}

absl::Status CudaDriver::HostFree(void* ptr) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemFreeHost, ptr);
  return absl::OkStatus();
}

absl::Status CudaDriver::CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemcpyHtoD, dst, src, bytes);
  // From pageable memory, cuMemcpyHtoD returns once the source is in the driver's staging buffer, before
  // the DMA to the device has finished; the legacy stream it ran on orders that for blocking streams only.
  // Work on a non-blocking stream launched next could read the old bytes (a graph replay did, on an H200
  // under load), so the copy is waited for, as a synchronous copy promises.
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamSynchronize, CU_STREAM_LEGACY);
  return absl::OkStatus();
}

absl::Status CudaDriver::CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemcpyDtoH, dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CudaDriver::CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  // Unified addressing: the driver infers each side's memory type from the address.
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemcpyAsync, dst, src, bytes, ToCu(stream));
  return absl::OkStatus();
}

absl::Status CudaDriver::MemsetAsync(DevicePtr dst, std::uint8_t value, std::size_t bytes, Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(MemsetD8Async, dst, value, bytes, ToCu(stream));
  return absl::OkStatus();
}

absl::StatusOr<Stream> CudaDriver::StreamCreate() {
  GRAPHALLOC_CUDA_CONTEXT();
  CUstream stream = nullptr;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  return StreamFromNative(stream);
}

absl::Status CudaDriver::StreamDestroy(Stream stream) {
  if (stream == kDefaultStream)
    return absl::InvalidArgumentError("StreamDestroy: the default stream cannot be destroyed");
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamDestroy, ToCu(stream));
  return absl::OkStatus();
}

absl::Status CudaDriver::StreamSynchronize(Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamSynchronize, ToCu(stream));
  return absl::OkStatus();
}

absl::Status CudaDriver::StreamWaitEvent(Stream stream, Event event) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamWaitEvent, ToCu(stream), ToCu(event), 0);
  return absl::OkStatus();
}

absl::Status CudaDriver::LaunchHostFunction(Stream stream, HostFunction fn) {
  if (!fn) return absl::InvalidArgumentError("LaunchHostFunction: empty function");
  GRAPHALLOC_CUDA_CONTEXT();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture_id = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamGetCaptureInfo, ToCu(stream), &capture, &capture_id, nullptr, nullptr,
                                  nullptr, nullptr);
  auto closure = std::make_unique<HostFunction>(std::move(fn));
  HostFunction* raw = closure.get();
  if (capture == CU_STREAM_CAPTURE_STATUS_NONE) {
    // Runs once; the trampoline owns and deletes it.
    GRAPHALLOC_CUDA_RETURN_IF_ERROR(LaunchHostFunc, ToCu(stream), &RunAndDelete, raw);
    closure.release();
    return absl::OkStatus();
  }
  // Captured (or refused by an invalidated capture): the capture's list owns it until EndCapture.
  {
    MutexLock lock(&state_->mu);
    if (auto it = state_->capture_of_stream.find(ToCu(stream)); it != state_->capture_of_stream.end()) {
      capture_id = it->second;
    }
    std::shared_ptr<ClosureList>& list = state_->captures[capture_id];
    if (list == nullptr) list = std::make_shared<ClosureList>();
    list->push_back(std::move(closure));
  }
  const CUresult result = state_->api->LaunchHostFunc(ToCu(stream), &RunCaptured, raw);
  if (result != CUDA_SUCCESS) {
    // No node refers to it: take it back out (and free it outside the lock).
    std::unique_ptr<HostFunction> unused;
    MutexLock lock(&state_->mu);
    if (auto it = state_->captures.find(capture_id); it != state_->captures.end()) {
      ClosureList& list = *it->second;
      auto pos = std::find_if(list.begin(), list.end(), [raw](const auto& f) { return f.get() == raw; });
      if (pos != list.end()) {
        unused = std::move(*pos);
        list.erase(pos);
      }
    }
    return state_->Check("cuLaunchHostFunc", result);
  }
  return absl::OkStatus();
}

absl::Status CudaDriver::DeviceSynchronize() {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(CtxSynchronize);
  return absl::OkStatus();
}

absl::StatusOr<Event> CudaDriver::EventCreate() {
  GRAPHALLOC_CUDA_CONTEXT();
  CUevent event = nullptr;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(EventCreate, &event, CU_EVENT_DISABLE_TIMING);
  return Event{reinterpret_cast<std::uintptr_t>(event)};
}

absl::Status CudaDriver::EventDestroy(Event event) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(EventDestroy, ToCu(event));
  return absl::OkStatus();
}

absl::Status CudaDriver::EventRecord(Event event, Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(EventRecord, ToCu(event), ToCu(stream));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaDriver::EventQuery(Event event) {
  GRAPHALLOC_CUDA_CONTEXT();
  const CUresult result = state_->api->EventQuery(ToCu(event));
  if (result == CUDA_SUCCESS) return true;
  if (result == CUDA_ERROR_NOT_READY) return false;
  return state_->Check("cuEventQuery", result);
}

absl::Status CudaDriver::EventSynchronize(Event event) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(EventSynchronize, ToCu(event));
  return absl::OkStatus();
}

absl::Status CudaDriver::BeginCapture(Stream stream, CaptureMode mode) {
  CUstreamCaptureMode cu_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  switch (mode) {
    case CaptureMode::kGlobal:
      cu_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
      break;
    case CaptureMode::kThreadLocal:
      cu_mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
      break;
    case CaptureMode::kRelaxed:
      cu_mode = CU_STREAM_CAPTURE_MODE_RELAXED;
      break;
  }
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamBeginCapture, ToCu(stream), cu_mode);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture_id = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamGetCaptureInfo, ToCu(stream), &capture, &capture_id, nullptr, nullptr,
                                  nullptr, nullptr);
  MutexLock lock(&state_->mu);
  state_->capture_of_stream[ToCu(stream)] = capture_id;
  return absl::OkStatus();
}

absl::StatusOr<Graph> CudaDriver::EndCapture(Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture_id = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamGetCaptureInfo, ToCu(stream), &capture, &capture_id, nullptr, nullptr,
                                  nullptr, nullptr);
  CUgraph graph = nullptr;
  const CUresult result = state_->api->StreamEndCapture(ToCu(stream), &graph);
  std::shared_ptr<ClosureList> closures;  // declared before the lock: freed after it, if no graph takes it
  MutexLock lock(&state_->mu);
  if (auto it = state_->capture_of_stream.find(ToCu(stream)); it != state_->capture_of_stream.end()) {
    capture_id = it->second;
    capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    state_->capture_of_stream.erase(it);
  }
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    if (auto it = state_->captures.find(capture_id); it != state_->captures.end()) {
      closures = std::move(it->second);
      state_->captures.erase(it);
    }
  }
  if (result != CUDA_SUCCESS) {
    // An invalidated capture leaves no graph, so nothing can run its closures any more.
    return state_->Check("cuStreamEndCapture", result);
  }
  if (closures != nullptr && !closures->empty()) state_->graphs[graph] = std::move(closures);
  return Graph{reinterpret_cast<std::uintptr_t>(graph)};
}

absl::StatusOr<CaptureMode> CudaDriver::ExchangeCaptureMode(CaptureMode mode) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUstreamCaptureMode cu_mode = mode == CaptureMode::kRelaxed       ? CU_STREAM_CAPTURE_MODE_RELAXED
                                : mode == CaptureMode::kThreadLocal ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                                    : CU_STREAM_CAPTURE_MODE_GLOBAL;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(ThreadExchangeStreamCaptureMode, &cu_mode);
  switch (cu_mode) {
    case CU_STREAM_CAPTURE_MODE_RELAXED:
      return CaptureMode::kRelaxed;
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
      return CaptureMode::kThreadLocal;
    default:
      return CaptureMode::kGlobal;
  }
}

absl::StatusOr<CaptureInfo> CudaDriver::GetCaptureInfo(Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t capture_id = 0;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(StreamGetCaptureInfo, ToCu(stream), &capture, &capture_id, nullptr, nullptr,
                                  nullptr, nullptr);
  CaptureInfo info;
  switch (capture) {
    case CU_STREAM_CAPTURE_STATUS_ACTIVE:
      info.status = CaptureStatus::kActive;
      info.id = capture_id;
      break;
    case CU_STREAM_CAPTURE_STATUS_INVALIDATED:
      info.status = CaptureStatus::kInvalidated;
      info.id = capture_id;
      break;
    default:
      break;
  }
  return info;
}

absl::StatusOr<GraphExec> CudaDriver::GraphInstantiate(Graph graph) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUgraphExec exec = nullptr;
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(GraphInstantiateWithFlags, &exec, ToCu(graph), /*flags=*/0);
  MutexLock lock(&state_->mu);
  if (auto it = state_->graphs.find(ToCu(graph)); it != state_->graphs.end()) {
    state_->execs[exec].push_back(it->second);
  }
  return GraphExec{reinterpret_cast<std::uintptr_t>(exec)};
}

absl::StatusOr<GraphUpdateResult> CudaDriver::GraphExecUpdate(GraphExec exec, Graph graph) {
  GRAPHALLOC_CUDA_CONTEXT();
  CUgraphExecUpdateResultInfo info{};
  const CUresult result = state_->api->GraphExecUpdate(ToCu(exec), ToCu(graph), &info);
  if (result == CUDA_SUCCESS) {
    // The exec's host nodes now point at the new graph's closures: it must keep them alive too.
    MutexLock lock(&state_->mu);
    if (auto it = state_->graphs.find(ToCu(graph)); it != state_->graphs.end()) {
      std::vector<std::shared_ptr<ClosureList>>& held = state_->execs[ToCu(exec)];
      if (std::find(held.begin(), held.end(), it->second) == held.end()) held.push_back(it->second);
    }
    return GraphUpdateResult::kSuccess;
  }
  if (result != CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) return state_->Check("cuGraphExecUpdate", result);
  // The update was refused and the exec left as it was: a result the caller acts on, not an error.
  return info.result == CU_GRAPH_EXEC_UPDATE_ERROR ? GraphUpdateResult::kError
                                                   : GraphUpdateResult::kTopologyChanged;
}

absl::Status CudaDriver::GraphLaunch(GraphExec exec, Stream stream) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(GraphLaunch, ToCu(exec), ToCu(stream));
  return absl::OkStatus();
}

absl::Status CudaDriver::GraphExecDestroy(GraphExec exec) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(GraphExecDestroy, ToCu(exec));
  std::vector<std::shared_ptr<ClosureList>> released;  // freed after the lock is dropped
  MutexLock lock(&state_->mu);
  if (auto it = state_->execs.find(ToCu(exec)); it != state_->execs.end()) {
    released = std::move(it->second);
    state_->execs.erase(it);
  }
  return absl::OkStatus();
}

absl::Status CudaDriver::GraphDestroy(Graph graph) {
  GRAPHALLOC_CUDA_CONTEXT();
  GRAPHALLOC_CUDA_RETURN_IF_ERROR(GraphDestroy, ToCu(graph));
  std::shared_ptr<ClosureList> released;  // freed after the lock is dropped (unless an exec still holds it)
  MutexLock lock(&state_->mu);
  if (auto it = state_->graphs.find(ToCu(graph)); it != state_->graphs.end()) {
    released = std::move(it->second);
    state_->graphs.erase(it);
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
