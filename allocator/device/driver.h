// The narrow interface through which every layer above talks to a GPU.
//
// Two implementations: CudaDriver (the real CUDA driver, loaded at run time) and SimDriver (a simulated
// device in host memory, faithful enough that the allocator and the graph layer cannot tell it from a GPU).
// A Driver instance is bound to one device. Every method is thread-safe. Every failure is an absl::Status
// whose message names the call and the driver's error, e.g.
//   "cuMemMap failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_DRIVER_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_DRIVER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace graphalloc {

// A device virtual address (CUdeviceptr). On the simulated device it is also a valid host address.
using DevicePtr = std::uintptr_t;

// Opaque handles. On the real driver each holds the CUDA handle's bits (CUstream, CUevent, ...), so a
// cudaStream_t handed in by PyTorch converts with StreamFromNative(). Value 0 of Stream is the legacy
// default stream.
enum class Stream : std::uintptr_t {};
enum class Event : std::uintptr_t {};
enum class PhysicalHandle : std::uint64_t {};  // CUmemGenericAllocationHandle
enum class Graph : std::uintptr_t {};          // a captured graph (CUgraph)
enum class GraphExec : std::uintptr_t {};      // an instantiated graph (CUgraphExec)

inline constexpr Stream kDefaultStream = Stream{0};

inline Stream StreamFromNative(const void* native) {
  return Stream{reinterpret_cast<std::uintptr_t>(native)};
}
inline void* NativeFromStream(Stream s) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(s)); }

// Stream capture modes, as cudaStreamCaptureMode / CUstreamCaptureMode.
enum class CaptureMode { kGlobal, kThreadLocal, kRelaxed };

// Capture state of a stream, as CUstreamCaptureStatus.
enum class CaptureStatus { kNone, kActive, kInvalidated };

struct CaptureInfo {
  CaptureStatus status = CaptureStatus::kNone;
  std::uint64_t id = 0;  // unique per capture sequence; 0 when not capturing
};

// What GraphExecUpdate could do, as CUgraphExecUpdateResult collapsed to what callers act on.
enum class GraphUpdateResult { kSuccess, kTopologyChanged, kError };

struct DeviceInfo {
  int ordinal = 0;
  std::string name;              // "NVIDIA H100 80GB HBM3" or "graphalloc simulated device"
  std::size_t total_memory = 0;  // bytes
  std::size_t granularity = 0;   // minimum VMM mapping granularity in bytes
  std::size_t recommended_granularity = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

// Host work enqueued on a stream (a simulated "kernel", or a host callback on the real device). It runs
// after everything enqueued before it on that stream and before everything after it. When enqueued on a
// capturing stream it becomes a node of the captured graph and runs on every launch instead.
using HostFunction = std::function<void()>;

class Driver {
 public:
  virtual ~Driver() = default;

  // "cuda" or "sim".
  virtual std::string_view Kind() const = 0;
  virtual const DeviceInfo& Info() const = 0;
  int Ordinal() const { return Info().ordinal; }

  // Devices that can access this device's mappings (peer access enabled). MemSetAccess callers pass these.
  virtual absl::Status EnablePeerAccess(int peer_ordinal) = 0;

  virtual absl::StatusOr<MemoryInfo> GetMemoryInfo() = 0;

  // ---- Virtual memory management (cuMemAddressReserve & co.). ----
  // Sizes and addresses must be multiples of Info().granularity.
  virtual absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment = 0) = 0;
  virtual absl::Status AddressFree(DevicePtr ptr, std::size_t size) = 0;
  virtual absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) = 0;
  virtual absl::Status MemRelease(PhysicalHandle handle) = 0;
  // Maps the whole handle (offset 0) at ptr; `size` must equal the handle's size.
  virtual absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) = 0;
  virtual absl::Status MemUnmap(DevicePtr ptr, std::size_t size) = 0;
  // Grants read/write access to this device and to each of `peers`.
  virtual absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers = {}) = 0;

  // ---- Plain device allocations (cuMemAlloc / cuMemFree). ----
  virtual absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) = 0;
  virtual absl::Status MemFree(DevicePtr ptr) = 0;

  // ---- Sharing memory with other processes. ----
  // A physical handle or plain allocation exported for another process: a file descriptor the caller
  // owns (close it when done), which stays valid in any process it is passed to over a Unix socket. On
  // CUDA a POSIX file descriptor of the handle (offset 0); on the simulated device a memfd holding it at
  // `offset`. `size` is the handle's size, which the importer maps: CUDA cannot tell it, so an export
  // there leaves it 0 and the caller, who created the handle, fills it in.
  struct ShareableHandle {
    int fd = -1;
    std::size_t offset = 0;
    std::size_t size = 0;
  };
  // cuMemCreate with requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR. Only such handles
  // export.
  virtual absl::StatusOr<PhysicalHandle> MemCreateShareable(std::size_t size) = 0;
  virtual absl::StatusOr<ShareableHandle> MemExportToShareableHandle(PhysicalHandle handle) = 0;
  // The caller keeps owning `shared.fd`; the returned handle is MemRelease'd like any other. The memory
  // lives until every process released every handle and mapping of it.
  virtual absl::StatusOr<PhysicalHandle> MemImportFromShareableHandle(const ShareableHandle& shared) = 0;
  // The handle under `ptr` (cuMemRetainAllocationHandle), one more reference: MemRelease it.
  virtual absl::StatusOr<PhysicalHandle> MemRetainAllocationHandle(DevicePtr ptr) = 0;
  // Plain allocations (MemAlloc) across processes: cuIpcGetMemHandle / cuIpcOpenMemHandle /
  // cuIpcCloseMemHandle. `fd` is the simulated device's memfd (the caller owns it), -1 on CUDA.
  struct IpcMemHandle {
    std::array<char, 64> bytes{};
    int fd = -1;
  };
  virtual absl::StatusOr<IpcMemHandle> IpcGetMemHandle(DevicePtr ptr) = 0;  // ptr: the allocation's base
  virtual absl::StatusOr<DevicePtr> IpcOpenMemHandle(const IpcMemHandle& handle) = 0;
  virtual absl::Status IpcCloseMemHandle(DevicePtr ptr) = 0;

  // ---- Pinned host memory (cuMemHostAlloc / cuMemFreeHost): host memory the device copies to and from at
  // full bandwidth. Its address, as a DevicePtr, is a valid CopyAsync source or destination (unified
  // addressing). HostFree of memory HostAlloc did not return is InvalidArgument. ----
  virtual absl::StatusOr<void*> HostAlloc(std::size_t size) = 0;
  virtual absl::Status HostFree(void* ptr) = 0;

  // ---- Exporting mapped memory to other devices' drivers (mapping_observer.h's registration). ----
  // A dma-buf file descriptor for the mapped range [ptr, ptr + size) (cuMemGetHandleForAddressRange with
  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), for an RDMA NIC to register (ibv_reg_dmabuf_mr). Both must be
  // multiples of the host page size, the range mapped. The caller closes the descriptor.
  virtual absl::StatusOr<int> MemGetDmaBufFd(DevicePtr ptr, std::size_t size) = 0;

  // ---- Copies and fills. Synchronous ones wait for the device; async ones are stream-ordered (and
  // captured on a capturing stream). ----
  virtual absl::Status CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) = 0;
  virtual absl::Status CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) = 0;
  virtual absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) = 0;
  virtual absl::Status MemsetAsync(DevicePtr dst, std::uint8_t value, std::size_t bytes, Stream stream) = 0;

  // ---- Streams. ----
  virtual absl::StatusOr<Stream> StreamCreate() = 0;
  virtual absl::Status StreamDestroy(Stream stream) = 0;
  virtual absl::Status StreamSynchronize(Stream stream) = 0;
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) = 0;
  virtual absl::Status LaunchHostFunction(Stream stream, HostFunction fn) = 0;
  virtual absl::Status DeviceSynchronize() = 0;

  // ---- Events (timing disabled). ----
  virtual absl::StatusOr<Event> EventCreate() = 0;
  virtual absl::Status EventDestroy(Event event) = 0;
  virtual absl::Status EventRecord(Event event, Stream stream) = 0;
  // True when all work before the event's last record has completed.
  virtual absl::StatusOr<bool> EventQuery(Event event) = 0;
  virtual absl::Status EventSynchronize(Event event) = 0;

  // ---- Stream capture. ----
  virtual absl::Status BeginCapture(Stream stream, CaptureMode mode) = 0;
  // Ends the capture and returns its graph; an invalidated capture returns an error that says so (and
  // leaves no graph behind).
  virtual absl::StatusOr<Graph> EndCapture(Stream stream) = 0;
  virtual absl::StatusOr<CaptureInfo> GetCaptureInfo(Stream stream) = 0;
  // Sets the calling thread's capture mode (cuThreadExchangeStreamCaptureMode) and returns the previous
  // one. A thread in relaxed mode may make calls that a capture would refuse (allocating memory: CUDA 13
  // refuses cuMemAlloc in a global-mode capture); the default is global.
  virtual absl::StatusOr<CaptureMode> ExchangeCaptureMode(CaptureMode mode) = 0;

  // ---- Graphs. ----
  virtual absl::StatusOr<GraphExec> GraphInstantiate(Graph graph) = 0;
  // Updates `exec` in place to run `graph`'s parameters when the topology is unchanged.
  virtual absl::StatusOr<GraphUpdateResult> GraphExecUpdate(GraphExec exec, Graph graph) = 0;
  virtual absl::Status GraphLaunch(GraphExec exec, Stream stream) = 0;
  virtual absl::Status GraphExecDestroy(GraphExec exec) = 0;
  virtual absl::Status GraphDestroy(Graph graph) = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_DRIVER_H_
