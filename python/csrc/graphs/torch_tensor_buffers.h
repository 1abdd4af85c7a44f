// PyTorch tensors as the graph tree sees them, and the tree's outputs as PyTorch tensors.
//
// The tree works on device buffers (graph/tree_output.h). A tensor passed in is a buffer over its strided
// extent, tagged with its layout (dtype, shape, strides: part of the recording key), and carries the tree
// output it came from when it is one. A tensor handed out over a recorded output has a storage of its own
// whose context holds the output's handle: the output is live exactly as long as some tensor over it is,
// which is what the tree's liveness rules read. Memory a capture allocated for the tree (outputs, what the
// backward reads) is disowned from PyTorch: its deleter becomes a no-op, and the tree alone frees it.
// When a later replay overwrites an output, the tensors still over it are poisoned: any access raises the
// tree's error, which names the function and says how to keep the output.
#ifndef GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_TENSOR_BUFFERS_H_
#define GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_TENSOR_BUFFERS_H_

#include <ATen/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "graphalloc/graph/tree_output.h"

namespace graphalloc_torch {

// The bytes a tensor spans: from its data pointer over its strided extent (0 bytes for an empty tensor).
graphalloc::BufferView ExtentOf(const at::Tensor& t);
// The whole storage: its base and size.
graphalloc::BufferView StorageBufferOf(const at::Tensor& t);
// A hash of dtype, sizes and strides (never 0).
std::uint64_t LayoutOf(const at::Tensor& t);

// The tree output a tensor handed out by a front end is over, or nullptr.
const std::shared_ptr<graphalloc::OutputState>* OutputOf(const at::Tensor& t);
// The tree's view of a tensor argument: its extent and layout, and its output when it is one.
graphalloc::CallInput InputOf(const at::Tensor& t);

// Makes PyTorch stop freeing the storage of `t` (allocated by PyTorch's allocator, which is graphalloc's):
// its deleter becomes a no-op. False when the storage was not PyTorch's to free (already disowned, or not
// allocated by the allocator).
bool Disown(const at::Tensor& t);
// Undoes Disown: PyTorch frees the storage of `t` again (a recording that failed after its body ran).
void Reown(const at::Tensor& t);

// How one output tensor sits on its buffer, recorded from the tensor a function returned.
struct TensorLayout {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> sizes, strides;
  int64_t storage_offset = 0;  // elements from the start of the storage
  std::size_t storage_bytes = 0;

  static TensorLayout Of(const at::Tensor& t);
};

// A tensor laid out as `layout` on a new storage over `output`'s buffer, holding `output` for as long as
// the storage lives.
at::Tensor TensorOver(const graphalloc::TreeOutput& output, const TensorLayout& layout,
                      c10::DeviceIndex device);
// A tensor laid out as `layout` (sizes, strides, dtype) on `storage`, starting `byte_offset` bytes into it.
at::Tensor TensorOn(const c10::Storage& storage, const TensorLayout& layout, std::size_t byte_offset);
// A tensor laid out as `layout` over `bytes` at `ptr` that nothing owns (the tree's memory).
at::Tensor TensorAt(graphalloc::DevicePtr ptr, std::size_t bytes, const TensorLayout& layout,
                    c10::DeviceIndex device);

// The tensor a body is passed for an argument `caller` that the tree passes as `view`: the caller's own
// tensor, or one of the same layout over the graph's copy of it (a recording of a copied argument).
at::Tensor TensorAsPassed(const at::Tensor& caller, const graphalloc::BufferView& view,
                          c10::DeviceIndex device);

// The storages a front end handed out over pool outputs, so that those a later replay overwrote can be
// poisoned, or, for those the caller owns, copied out before the replay.
class HandedOut {
 public:
  void Add(const at::Tensor& t);
  // Marks the storage of `t` (added last by Add) as the caller's: CopyOutOverwritten keeps its values.
  void CopyOutOnOverwrite(const at::Tensor& t);
  // Moves every live marked storage whose output is no longer current (its lane began another micro-batch,
  // whose launches are not enqueued yet) to memory of its own from PyTorch's allocator, copied on the current
  // stream: every tensor over it keeps its values, and the tree output it held is released. Throws what the
  // allocation throws.
  void CopyOutOverwritten(c10::DeviceIndex device);
  // The graphs are going away: moves every live storage whose output is still current, marked or not, to
  // memory of its own the same way, so that what the caller holds keeps its values, as a tensor of a
  // deleted torch.cuda.graph does. What it leaves (outputs already overwritten, or those not reached when an
  // allocation threw, which it rethrows) is for PoisonAll.
  void CopyOutAllCurrent(c10::DeviceIndex device);
  // Poisons every live storage whose output is no longer current (the tree began another step, or is
  // gone), and forgets dead ones.
  void PoisonOverwritten();
  // Poisons every live one with `message` (the front end is going away).
  void PoisonAll(const std::string& message);

 private:
  // The two copy-outs: every live entry (marked by CopyOutOnOverwrite, with `marked_only`) whose output
  // exists and is current or not, as `current` says, moves to memory of its own; dead entries are dropped.
  void MoveToOwnMemoryWhere(c10::DeviceIndex device, bool marked_only, bool current);

  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    std::weak_ptr<graphalloc::OutputState> output;
    bool copy_out = false;
  };
  std::vector<Entry> entries_;
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_TENSOR_BUFFERS_H_
