// A Driver that passes every call on to another Driver: the base of decorators, which override only the
// calls they change (timing them, translating their addresses, injecting faults) and inherit the rest.
#ifndef GRAPHALLOC_ALLOCATOR_DEVICE_FORWARDING_DRIVER_H_
#define GRAPHALLOC_ALLOCATOR_DEVICE_FORWARDING_DRIVER_H_

#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class ForwardingDriver : public Driver {
 public:
  explicit ForwardingDriver(std::shared_ptr<Driver> inner) : inner_(std::move(inner)) {}

  std::string_view Kind() const override { return inner_->Kind(); }
  const DeviceInfo& Info() const override { return inner_->Info(); }
  absl::Status EnablePeerAccess(int peer_ordinal) override { return inner_->EnablePeerAccess(peer_ordinal); }
  absl::StatusOr<MemoryInfo> GetMemoryInfo() override { return inner_->GetMemoryInfo(); }

  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment = 0) override {
    return inner_->AddressReserve(size, alignment);
  }
  absl::Status AddressFree(DevicePtr ptr, std::size_t size) override {
    return inner_->AddressFree(ptr, size);
  }
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override { return inner_->MemCreate(size); }
  absl::Status MemRelease(PhysicalHandle handle) override { return inner_->MemRelease(handle); }
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override {
    return inner_->MemMap(ptr, size, handle);
  }
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override { return inner_->MemUnmap(ptr, size); }
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers = {}) override {
    return inner_->MemSetAccess(ptr, size, peers);
  }
  absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) override { return inner_->MemAlloc(size); }
  absl::Status MemFree(DevicePtr ptr) override { return inner_->MemFree(ptr); }

  absl::StatusOr<PhysicalHandle> MemCreateShareable(std::size_t size) override {
    return inner_->MemCreateShareable(size);
  }
  absl::StatusOr<ShareableHandle> MemExportToShareableHandle(PhysicalHandle handle) override {
    return inner_->MemExportToShareableHandle(handle);
  }
  absl::StatusOr<PhysicalHandle> MemImportFromShareableHandle(const ShareableHandle& shared) override {
    return inner_->MemImportFromShareableHandle(shared);
  }
  absl::StatusOr<PhysicalHandle> MemRetainAllocationHandle(DevicePtr ptr) override {
    return inner_->MemRetainAllocationHandle(ptr);
  }
  absl::StatusOr<IpcMemHandle> IpcGetMemHandle(DevicePtr ptr) override {
    return inner_->IpcGetMemHandle(ptr);
  }
  absl::StatusOr<DevicePtr> IpcOpenMemHandle(const IpcMemHandle& handle) override {
    return inner_->IpcOpenMemHandle(handle);
  }
  absl::Status IpcCloseMemHandle(DevicePtr ptr) override { return inner_->IpcCloseMemHandle(ptr); }
  absl::StatusOr<void*> HostAlloc(std::size_t size) override { return inner_->HostAlloc(size); }
  absl::Status HostFree(void* ptr) override { return inner_->HostFree(ptr); }
  absl::StatusOr<int> MemGetDmaBufFd(DevicePtr ptr, std::size_t size) override {
    return inner_->MemGetDmaBufFd(ptr, size);
  }

  absl::Status CopyHostToDevice(DevicePtr dst, const void* src, std::size_t bytes) override {
    return inner_->CopyHostToDevice(dst, src, bytes);
  }
  absl::Status CopyDeviceToHost(void* dst, DevicePtr src, std::size_t bytes) override {
    return inner_->CopyDeviceToHost(dst, src, bytes);
  }
  absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) override {
    return inner_->CopyAsync(dst, src, bytes, stream);
  }
  absl::Status MemsetAsync(DevicePtr dst, std::uint8_t value, std::size_t bytes, Stream stream) override {
    return inner_->MemsetAsync(dst, value, bytes, stream);
  }

  absl::StatusOr<Stream> StreamCreate() override { return inner_->StreamCreate(); }
  absl::Status StreamDestroy(Stream stream) override { return inner_->StreamDestroy(stream); }
  absl::Status StreamSynchronize(Stream stream) override { return inner_->StreamSynchronize(stream); }
  absl::Status StreamWaitEvent(Stream stream, Event event) override {
    return inner_->StreamWaitEvent(stream, event);
  }
  absl::Status LaunchHostFunction(Stream stream, HostFunction fn) override {
    return inner_->LaunchHostFunction(stream, std::move(fn));
  }
  absl::Status DeviceSynchronize() override { return inner_->DeviceSynchronize(); }

  absl::StatusOr<Event> EventCreate() override { return inner_->EventCreate(); }
  absl::Status EventDestroy(Event event) override { return inner_->EventDestroy(event); }
  absl::Status EventRecord(Event event, Stream stream) override { return inner_->EventRecord(event, stream); }
  absl::StatusOr<bool> EventQuery(Event event) override { return inner_->EventQuery(event); }
  absl::Status EventSynchronize(Event event) override { return inner_->EventSynchronize(event); }

  absl::Status BeginCapture(Stream stream, CaptureMode mode) override {
    return inner_->BeginCapture(stream, mode);
  }
  absl::StatusOr<Graph> EndCapture(Stream stream) override { return inner_->EndCapture(stream); }
  absl::StatusOr<CaptureInfo> GetCaptureInfo(Stream stream) override {
    return inner_->GetCaptureInfo(stream);
  }
  absl::StatusOr<CaptureMode> ExchangeCaptureMode(CaptureMode mode) override {
    return inner_->ExchangeCaptureMode(mode);
  }

  absl::StatusOr<GraphExec> GraphInstantiate(Graph graph) override { return inner_->GraphInstantiate(graph); }
  absl::StatusOr<GraphUpdateResult> GraphExecUpdate(GraphExec exec, Graph graph) override {
    return inner_->GraphExecUpdate(exec, graph);
  }
  absl::Status GraphLaunch(GraphExec exec, Stream stream) override {
    return inner_->GraphLaunch(exec, stream);
  }
  absl::Status GraphExecDestroy(GraphExec exec) override { return inner_->GraphExecDestroy(exec); }
  absl::Status GraphDestroy(Graph graph) override { return inner_->GraphDestroy(graph); }

 protected:
  Driver& inner() const { return *inner_; }

 private:
  const std::shared_ptr<Driver> inner_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_DEVICE_FORWARDING_DRIVER_H_
