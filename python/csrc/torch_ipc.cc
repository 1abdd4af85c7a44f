// CUDA IPC of PyTorch tensors through graphalloc (torch_ipc.h).
#include "python/csrc/torch_ipc.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/ipc/block_importer.h"
#include "graphalloc/allocator/ipc/export_token.h"
#include "python/csrc/torch_addresses.h"

namespace graphalloc_torch {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using graphalloc::DevicePtr;

}  // namespace

int TorchIpc::DeviceOf(DevicePtr ptr, DevicePtr* block, size_t* size) {
  for (int device = 0; device < graphalloc::kMaxDevices; ++device) {
    graphalloc::CachingAllocator* allocator = graphalloc::ExistingDefaultAllocator(device);
    if (allocator == nullptr) continue;
    for (const graphalloc::SegmentSnapshot& s :
         allocator->TakeSnapshot("ipc", /*record_event=*/false).segments) {
      if (ptr < s.address || ptr >= s.address + s.total_size) continue;
      for (const graphalloc::BlockSnapshot& b : s.blocks) {
        if (ptr < b.address || ptr >= b.address + b.size) continue;
        TORCH_CHECK(b.state == graphalloc::BlockState::kAllocated, "graphalloc: ", Pointer(ptr),
                    " lies in a block that is not allocated: nothing to share");
        *block = b.address;
        *size = b.size;
        return device;
      }
    }
  }
  return -1;
}

void* TorchIpc::BaseAllocation(void* ptr, size_t* size) {
  DevicePtr block = 0;
  size_t block_size = 0;
  TORCH_CHECK(DeviceOf(Address(ptr), &block, &block_size) >= 0, "graphalloc: getBaseAllocation: ", ptr,
              " was not allocated by graphalloc");
  if (size != nullptr) *size = block_size;
  return Pointer(block);
}

cca::ShareableHandle TorchIpc::Share(void* ptr) {
  DevicePtr block = 0;
  size_t size = 0;
  const int device = DeviceOf(Address(ptr), &block, &size);
  TORCH_CHECK(device >= 0, "graphalloc: shareIpcHandle: ", ptr, " was not allocated by graphalloc");
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<graphalloc::ipc::BlockExporter>& exporter = exporters_[static_cast<size_t>(device)];
  if (exporter == nullptr) {
    absl::StatusOr<std::unique_ptr<graphalloc::ipc::BlockExporter>> created =
        graphalloc::ipc::BlockExporter::Create(allocator_of_(static_cast<c10::DeviceIndex>(device)));
    TORCH_CHECK(created.ok(), "graphalloc: shareIpcHandle: cannot serve device ", device, ": ",
                created.status().ToString());
    exporter = *std::move(created);
  }
  absl::StatusOr<graphalloc::ipc::ExportToken> token = exporter->Export(block);
  TORCH_CHECK(token.ok(), "graphalloc: shareIpcHandle(", ptr, "): ", token.status().ToString());
  exported_[block] = device;
  exported_any_.store(true, std::memory_order_relaxed);
  return cca::ShareableHandle{static_cast<ptrdiff_t>(Address(ptr) - block), token->ToString()};
}

void TorchIpc::OwnerFreed(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = exported_.find(Address(ptr));
  if (it == exported_.end()) return;
  if (absl::Status s = exporters_[static_cast<size_t>(it->second)]->Revoke(it->first); !s.ok()) {
    std::cerr << "graphalloc: ending the export of " << ptr << ": " << s << "\n";
  }
  exported_.erase(it);
}

std::shared_ptr<void> TorchIpc::Open(const std::string& handle) {
  absl::StatusOr<graphalloc::ipc::ExportToken> token = graphalloc::ipc::ExportToken::Parse(handle);
  TORCH_CHECK(token.ok(),
              "graphalloc: getIpcDevPtr: not a graphalloc handle (was the producer's allocator "
              "graphalloc?): ",
              token.status().ToString());
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = opened_.find(handle); it != opened_.end()) {
    if (std::shared_ptr<void> live = it->second.lock()) return live;
  }
  const c10::DeviceIndex device = c10::cuda::current_device();
  // Every device that can reach this one may copy from the block (a consumer on another GPU copies a
  // tensor it received to its own): grant them access too, as graphalloc's own segments do once PyTorch
  // enables peer access.
  std::vector<int> peers;
  for (int d = 0; d < static_cast<int>(c10::cuda::device_count()); ++d) {
    int can = 0;
    if (d != device && cudaDeviceCanAccessPeer(&can, d, device) == cudaSuccess && can != 0)
      peers.push_back(d);
  }
  absl::StatusOr<graphalloc::ipc::ImportedBlock> imported =
      graphalloc::ipc::ImportBlock(allocator_of_(device).driver(), *token, absl::Seconds(30), peers);
  TORCH_CHECK(imported.ok(), "graphalloc: getIpcDevPtr: ", imported.status().ToString());
  auto block = std::make_shared<graphalloc::ipc::ImportedBlock>(*std::move(imported));
  void* ptr = Pointer(block->ptr());
  // The deleter may run at interpreter exit, after CUDA is gone: report, never throw.
  std::shared_ptr<void> mapping(ptr, [block](void*) {
    if (absl::Status s = block->Close(); !s.ok()) {
      std::cerr << "graphalloc: closing an imported block: " << s << "\n";
    }
  });
  std::erase_if(opened_, [](const auto& entry) { return entry.second.expired(); });
  opened_[handle] = mapping;
  return mapping;
}

}  // namespace graphalloc_torch
