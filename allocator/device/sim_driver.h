// A simulated CUDA device in host memory, for tests and for CI machines without a GPU.
//
// Faithful where the allocator and the graph layer can tell the difference: reserved ranges are
// mmap(PROT_NONE), physical memory is a memfd, mapping is mmap(MAP_FIXED|MAP_SHARED) of it, so two mappings
// of one handle alias and touching unmapped memory faults (SIGSEGV) as an illegal address would on a GPU.
// Device addresses are host addresses. Streams run enqueued host closures in order; stream capture
// records them into a graph instead and refuses what CUDA refuses during a global-mode capture. Fault
// injection makes chosen calls fail; counters prove nothing leaks.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_SIM_DRIVER_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_SIM_DRIVER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/device/driver_error.h"

namespace graphalloc {

struct SimDriverOptions {
  std::size_t capacity = std::size_t{80} << 30;    // physical bytes; pages are committed only when touched
  std::size_t granularity = std::size_t{2} << 20;  // VMM granularity, like the H100
  int ordinal = 0;
  std::string name = "graphalloc simulated device";
  // When true, enqueued work waits until the test runs it (RunPendingWork), so events stay incomplete and
  // EventQuery answers false until then. When false, work runs at once, in order, on the calling thread.
  bool manual_completion = false;
};

// The call kinds fault injection and call counting distinguish.
enum class SimCall : int {
  kAddressReserve,
  kAddressFree,
  kMemCreate,
  kMemRelease,
  kMemMap,
  kMemUnmap,
  kMemSetAccess,
  kMemAlloc,
  kMemFree,
  kCopy,  // CopyHostToDevice, CopyDeviceToHost, CopyAsync, MemsetAsync
  kStreamCreate,
  kStreamSynchronize,
  kStreamWaitEvent,
  kLaunchHostFunction,
  kEventCreate,
  kEventRecord,
  kEventQuery,
  kEventSynchronize,
  kBeginCapture,
  kEndCapture,
  kGraphInstantiate,
  kGraphExecUpdate,
  kGraphLaunch,
  kHostAlloc,
  kHostFree,
  kMemGetDmaBufFd,
  // Sharing with other processes (MemCreateShareable counts as kMemCreate).
  kMemExport,  // MemExportToShareableHandle
  kMemImport,  // MemImportFromShareableHandle
  kMemRetain,  // MemRetainAllocationHandle
  kIpcGetMemHandle,
  kIpcOpenMemHandle,
  kIpcCloseMemHandle,
  kCount,
};

// Outstanding resources (created and not yet destroyed). All zero after a clean teardown.
struct SimCounters {
  std::size_t reservations = 0;
  std::size_t reserved_bytes = 0;
  std::size_t handles = 0;
  std::size_t handle_bytes = 0;  // physical bytes held by handles
  std::size_t mappings = 0;
  std::size_t mapped_bytes = 0;
  std::size_t allocations = 0;  // MemAlloc blocks
  std::size_t allocated_bytes = 0;
  std::size_t streams = 0;  // created streams (the default stream is not counted)
  std::size_t events = 0;
  std::size_t graphs = 0;
  std::size_t graph_execs = 0;
  std::size_t host_allocations = 0;  // HostAlloc blocks (pinned host memory)
  std::size_t host_bytes = 0;
  std::size_t ipc_mappings = 0;  // IpcOpenMemHandle mappings not yet closed
  std::size_t pending_work = 0;  // closures queued and not yet run (manual completion)
  // Not a resource: queued copies and memsets that, when they ran, found part of their memory unmapped
  // or without access (on a GPU, an illegal address). Such work is skipped instead of faulting, so a test
  // can assert this stays 0: the allocator must not unmap memory that work already queued still uses.
  std::size_t illegal_accesses = 0;
};

class SimDriver final : public Driver {
 public:
  static absl::StatusOr<std::unique_ptr<SimDriver>> Create(SimDriverOptions options = {});
  ~SimDriver() override;

  // ---- Fault injection (thread-safe). ----
  // The nth call of `call` from now (1 = the next one) fails with `result` and has no effect.
  void InjectFault(SimCall call, int nth, DriverResult result);
  // Every call of a kind in `calls` fails with probability `rate` (deterministic given `seed`).
  void SetRandomFaults(double rate, std::uint64_t seed, std::span<const SimCall> calls,
                       DriverResult result = DriverResult::kOutOfMemory);
  void ClearFaults();
  std::uint64_t InjectedFaultCount() const;
  // How many calls of `call` were made (failed ones included).
  std::uint64_t CallCount(SimCall call) const;

  SimCounters Counters() const;
  // Physical bytes in use by handles and plain allocations, against Options().capacity.
  std::size_t UsedBytes() const;
  const SimDriverOptions& Options() const;

  // ---- Manual completion. ----
  void SetManualCompletion(bool manual);
  // Runs the work queued on `stream` (all of it, or the first `max_items`); returns how many ran.
  std::size_t RunPendingWork(Stream stream, std::size_t max_items = SIZE_MAX);
  // Runs everything queued on every stream; returns how many ran.
  std::size_t RunAllPendingWork();

  // ---- Driver. ----
  std::string_view Kind() const override;
  const DeviceInfo& Info() const override;
  absl::Status EnablePeerAccess(int peer_ordinal) override;
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override;
  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment) override;
  absl::Status AddressFree(DevicePtr ptr, std::size_t size) override;
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override;
  absl::Status MemRelease(PhysicalHandle handle) override;
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override;
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override;
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers) override;
  absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) override;
  absl::Status MemFree(DevicePtr ptr) override;
  absl::StatusOr<PhysicalHandle> MemCreateShareable(std::size_t size) override;
  absl::StatusOr<ShareableHandle> MemExportToShareableHandle(PhysicalHandle handle) override;
  absl::StatusOr<PhysicalHandle> MemImportFromShareableHandle(const ShareableHandle& shared) override;
  absl::StatusOr<PhysicalHandle> MemRetainAllocationHandle(DevicePtr ptr) override;
  absl::StatusOr<IpcMemHandle> IpcGetMemHandle(DevicePtr ptr) override;
  absl::StatusOr<DevicePtr> IpcOpenMemHandle(const IpcMemHandle& handle) override;
  absl::Status IpcCloseMemHandle(DevicePtr ptr) override;
  absl::StatusOr<void*> HostAlloc(std::size_t size) override;
  absl::Status HostFree(void* ptr) override;
  // A memfd holding a copy of the range's bytes (the simulated device has no dma-buf to share).
  absl::StatusOr<int> MemGetDmaBufFd(DevicePtr ptr, std::size_t size) override;
  absl::Status CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) override;
  absl::Status CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) override;
  absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) override;
  absl::Status MemsetAsync(DevicePtr dst, std::uint8_t value, std::size_t bytes, Stream stream) override;
  absl::StatusOr<Stream> StreamCreate() override;
  absl::Status StreamDestroy(Stream stream) override;
  absl::Status StreamSynchronize(Stream stream) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
  absl::Status LaunchHostFunction(Stream stream, HostFunction fn) override;
  absl::Status DeviceSynchronize() override;
  absl::StatusOr<Event> EventCreate() override;
  absl::Status EventDestroy(Event event) override;
  absl::Status EventRecord(Event event, Stream stream) override;
  absl::StatusOr<bool> EventQuery(Event event) override;
  absl::Status EventSynchronize(Event event) override;
  absl::Status BeginCapture(Stream stream, CaptureMode mode) override;
  absl::StatusOr<Graph> EndCapture(Stream stream) override;
  absl::StatusOr<CaptureInfo> GetCaptureInfo(Stream stream) override;
  absl::StatusOr<CaptureMode> ExchangeCaptureMode(CaptureMode mode) override;
  absl::StatusOr<GraphExec> GraphInstantiate(Graph graph) override;
  absl::StatusOr<GraphUpdateResult> GraphExecUpdate(GraphExec exec, Graph graph) override;
  absl::Status GraphLaunch(GraphExec exec, Stream stream) override;
  absl::Status GraphExecDestroy(GraphExec exec) override;
  absl::Status GraphDestroy(Graph graph) override;

 private:
  struct State;
  explicit SimDriver(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_SIM_DRIVER_H_
