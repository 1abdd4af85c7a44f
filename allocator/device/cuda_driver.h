// The real CUDA driver, loaded at run time.
//
// libcuda.so.1 is opened with dlopen and every entry point resolved with cuGetProcAddress, so no binary
// links libcuda: everything builds and runs on a machine with no GPU and no driver, and Create() fails with
// a clear error only when a real device is asked for. Each instance is bound to one device and makes that
// device's primary context current on the calling thread before each call.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_DRIVER_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_DRIVER_H_

#include <memory>

#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class CudaDriver final : public Driver {
 public:
  // Loads the driver (once per process), initialises it and retains device `ordinal`'s primary context.
  // Unavailable with a message naming the library when libcuda.so.1 cannot be loaded, and naming the
  // device count when `ordinal` does not exist.
  static absl::StatusOr<std::unique_ptr<CudaDriver>> Create(int ordinal);
  // Number of devices; an error when the driver cannot be loaded or initialised.
  static absl::StatusOr<int> DeviceCount();
  // Overrides the library Create() loads (default "libcuda.so.1"); for tests of the missing-driver path.
  // Only effective before the first successful load.
  static void SetLibraryPathForTesting(const char* path);

  ~CudaDriver() override;

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
  explicit CudaDriver(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_CUDA_DRIVER_H_
