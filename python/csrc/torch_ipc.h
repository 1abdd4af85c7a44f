// CUDA IPC of PyTorch tensors through graphalloc (torch.multiprocessing): the backend's getBaseAllocation,
// shareIpcHandle and getIpcDevPtr.
//
// A producer shares the block under a tensor's storage: a BlockExporter per device (allocator/ipc) holds
// it and answers the consumers that connect, so expandable segments share too (their physical handles'
// file descriptors travel over a Unix socket: no pidfd_getfd, which unprivileged containers refuse). The
// handle string PyTorch passes to the consumer is the export token. The export's own hold ends when the
// owner frees the block (PyTorch keeps a shared storage alive until its consumers let go, CUDA IPC
// refcounting); each consumer's mapping holds it further until closed. A consumer maps each token once and
// shares the mapping between the storages that name it, as PyTorch's own allocator does; the mapping goes
// when the last of them dies, which ends the producer's hold on the block.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_IPC_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_IPC_H_

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "graphalloc/allocator/ipc/block_exporter.h"

namespace graphalloc_torch {

class TorchIpc {
 public:
  // `allocator_of(device)` is the backend's allocator of a device (created on first use).
  explicit TorchIpc(std::function<graphalloc::CachingAllocator&(c10::DeviceIndex)> allocator_of)
      : allocator_of_(std::move(allocator_of)) {}

  // The block that holds `ptr` (its first byte and size): what a producer shares.
  void* BaseAllocation(void* ptr, size_t* size);
  // Exports the block at `ptr` (a BaseAllocation) and returns its token as PyTorch's handle.
  c10::cuda::CUDACachingAllocator::ShareableHandle Share(void* ptr);
  // Maps the block a producer's token names on the current device, once per token.
  std::shared_ptr<void> Open(const std::string& handle);
  // Whether any block was ever exported (read on every free: one relaxed load until then).
  bool exported_any() const { return exported_any_.load(std::memory_order_relaxed); }
  // The owner freed the block at `ptr`: its export ends (importers connected keep their holds).
  void OwnerFreed(void* ptr);

 private:
  // The device whose allocator holds `ptr`, or -1.
  static int DeviceOf(graphalloc::DevicePtr ptr, graphalloc::DevicePtr* block, size_t* size);

  std::function<graphalloc::CachingAllocator&(c10::DeviceIndex)> allocator_of_;
  std::mutex mu_;
  std::array<std::unique_ptr<graphalloc::ipc::BlockExporter>, graphalloc::kMaxDevices> exporters_;
  std::unordered_map<std::string, std::weak_ptr<void>> opened_;  // by token
  std::unordered_map<graphalloc::DevicePtr, int> exported_;      // block -> device, until the owner frees it
  std::atomic<bool> exported_any_{false};
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_IPC_H_
