#include "python/csrc/graphs/torch_tensor_buffers.h"

#include <ATen/core/TensorBody.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarTypeToTypeMeta.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <algorithm>
#include <utility>

namespace graphalloc_torch {
namespace {

// The context of a storage handed out over a tree output: the output's handle.
struct OutputHolder {
  graphalloc::TreeOutput output;
};
void DeleteHolder(void* context) { delete static_cast<OutputHolder*>(context); }
void NoDelete(void* /*unused*/) {}

c10::StorageImpl& ImplOf(const at::Tensor& t) { return *t.storage().unsafeGetStorageImpl(); }

// The data pointer, read without the checks that throw for a poisoned storage.
graphalloc::DevicePtr DataAddress(const at::Tensor& t) {
  auto* base = static_cast<char*>(ImplOf(t)._mutable_data_ptr_no_checks().get());
  if (base == nullptr) return 0;
  return reinterpret_cast<graphalloc::DevicePtr>(base +
                                                 t.storage_offset() * static_cast<int64_t>(t.element_size()));
}

std::uint64_t Mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

at::Tensor MakeTensor(c10::Storage storage, const TensorLayout& layout, int64_t storage_offset) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                          c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                          c10::scalarTypeToTypeMeta(layout.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(layout.sizes, layout.strides, storage_offset);
  return t;
}

}  // namespace

graphalloc::BufferView ExtentOf(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {DataAddress(t), static_cast<std::size_t>((last + 1) * static_cast<int64_t>(t.element_size()))};
}

graphalloc::BufferView StorageBufferOf(const at::Tensor& t) {
  c10::StorageImpl& impl = ImplOf(t);
  return {reinterpret_cast<graphalloc::DevicePtr>(impl._mutable_data_ptr_no_checks().get()), impl.nbytes()};
}

std::uint64_t LayoutOf(const at::Tensor& t) {
  std::uint64_t h = Mix(0x51ed270b27c3f5a1ULL, static_cast<std::uint64_t>(t.scalar_type()));
  h = Mix(h, static_cast<std::uint64_t>(t.dim()));
  for (int64_t d = 0; d < t.dim(); ++d) {
    h = Mix(h, static_cast<std::uint64_t>(t.size(d)));
    h = Mix(h, static_cast<std::uint64_t>(t.stride(d)));
  }
  return h == 0 ? 1 : h;
}

const std::shared_ptr<graphalloc::OutputState>* OutputOf(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& data = ImplOf(t)._mutable_data_ptr_no_checks();
  if (data.get_deleter() != &DeleteHolder) return nullptr;
  return &static_cast<OutputHolder*>(data.get_context())->output.state();
}

graphalloc::CallInput InputOf(const at::Tensor& t) {
  const graphalloc::BufferView extent = ExtentOf(t);
  if (const std::shared_ptr<graphalloc::OutputState>* out = OutputOf(t); out != nullptr && extent.bytes > 0) {
    const auto* holder = static_cast<OutputHolder*>(ImplOf(t)._mutable_data_ptr_no_checks().get_context());
    // The whole output when the tensor covers it; otherwise a plain buffer (a view of part of an output is
    // copied, as any other argument: its address is still checked through the output's step).
    if (extent == (*out)->buffer) return graphalloc::CallInput(holder->output).WithLayout(LayoutOf(t));
  }
  return graphalloc::CallInput(extent).WithLayout(LayoutOf(t));
}

bool Disown(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return false;
  c10::DataPtr& data = ImplOf(t)._mutable_data_ptr_no_checks();
  return data.compare_exchange_deleter(c10::cuda::CUDACachingAllocator::get()->raw_deleter(), &NoDelete);
}

void Reown(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  c10::DataPtr& data = ImplOf(t)._mutable_data_ptr_no_checks();
  (void)data.compare_exchange_deleter(&NoDelete, c10::cuda::CUDACachingAllocator::get()->raw_deleter());
}

TensorLayout TensorLayout::Of(const at::Tensor& t) {
  TensorLayout layout;
  layout.dtype = t.scalar_type();
  layout.sizes = t.sizes().vec();
  layout.strides = t.strides().vec();
  layout.storage_offset = t.storage_offset();
  layout.storage_bytes = t.has_storage() ? t.storage().nbytes() : 0;
  return layout;
}

at::Tensor TensorOver(const graphalloc::TreeOutput& output, const TensorLayout& layout,
                      c10::DeviceIndex device) {
  const graphalloc::BufferView buffer = output.state()->buffer;
  c10::DataPtr data(reinterpret_cast<void*>(buffer.ptr), new OutputHolder{output}, &DeleteHolder,
                    c10::Device(c10::DeviceType::CUDA, device));
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                             std::max(layout.storage_bytes, buffer.bytes),
                                                             std::move(data), /*allocator=*/nullptr,
                                                             /*resizable=*/false));
  return MakeTensor(std::move(storage), layout, layout.storage_offset);
}

at::Tensor TensorOn(const c10::Storage& storage, const TensorLayout& layout, std::size_t byte_offset) {
  const auto item = static_cast<int64_t>(c10::elementSize(layout.dtype));
  return MakeTensor(storage, layout, static_cast<int64_t>(byte_offset) / item);
}

at::Tensor TensorAt(graphalloc::DevicePtr ptr, std::size_t bytes, const TensorLayout& layout,
                    c10::DeviceIndex device) {
  c10::DataPtr data(reinterpret_cast<void*>(ptr), reinterpret_cast<void*>(ptr), &NoDelete,
                    c10::Device(c10::DeviceType::CUDA, device));
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), bytes,
                                                             std::move(data), /*allocator=*/nullptr,
                                                             /*resizable=*/false));
  return MakeTensor(std::move(storage), layout, 0);
}

at::Tensor TensorAsPassed(const at::Tensor& caller, const graphalloc::BufferView& view,
                          c10::DeviceIndex device) {
  if (!caller.defined() || view.bytes == 0 || view.ptr == ExtentOf(caller).ptr) return caller;
  TensorLayout layout = TensorLayout::Of(caller);
  layout.storage_offset = 0;
  layout.storage_bytes = view.bytes;
  return TensorAt(view.ptr, view.bytes, layout, device);
}

void HandedOut::Add(const at::Tensor& t) {
  const std::shared_ptr<graphalloc::OutputState>* out = OutputOf(t);
  if (out == nullptr || (*out)->kind != graphalloc::OutputKind::kPool) return;
  entries_.push_back(Entry{t.storage().getWeakStorageImpl(), *out});
}

void HandedOut::CopyOutOnOverwrite(const at::Tensor& t) {
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->storage._unsafe_get_target() == impl) {
      it->copy_out = true;
      return;
    }
  }
}

namespace {

// `storage` moves to memory of its own holding the bytes of `out`'s buffer, copied on the current stream;
// the holder of the tree output goes with the old data pointer. Changes nothing when it throws.
void MoveToOwnMemory(c10::StorageImpl& storage, const graphalloc::OutputState& out, c10::DeviceIndex device) {
  const auto bytes = static_cast<int64_t>(std::min(storage.nbytes(), out.buffer.bytes));
  at::Tensor copy = at::empty({static_cast<int64_t>(storage.nbytes())},
                              at::TensorOptions().dtype(at::kByte).device(c10::kCUDA, device));
  TensorLayout raw;
  raw.dtype = at::kByte;
  raw.sizes = {bytes};
  raw.strides = {1};
  copy.narrow(0, 0, bytes).copy_(TensorAt(out.buffer.ptr, static_cast<std::size_t>(bytes), raw, device));
  storage.set_data_ptr_noswap(
      copy.storage().unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr(nullptr, copy.device())));
}

}  // namespace

void HandedOut::CopyOutOverwritten(c10::DeviceIndex device) {
  MoveToOwnMemoryWhere(device, /*marked_only=*/true, /*current=*/false);
}

void HandedOut::CopyOutAllCurrent(c10::DeviceIndex device) {
  MoveToOwnMemoryWhere(device, /*marked_only=*/false, /*current=*/true);
}

// Entry by entry rather than with erase_if: when a copy throws, every entry not yet moved stays listed, for
// PoisonAll or a later copy.
void HandedOut::MoveToOwnMemoryWhere(c10::DeviceIndex device, bool marked_only, bool current) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (marked_only && !it->copy_out) {
      ++it;
      continue;
    }
    c10::intrusive_ptr<c10::StorageImpl> storage = it->storage.lock();
    if (!storage) {
      it = entries_.erase(it);
      continue;
    }
    // An output that is gone is PoisonOverwritten's (or PoisonAll's), whatever is asked here.
    const std::shared_ptr<graphalloc::OutputState> out = it->output.lock();
    if (out != nullptr && out->Current() == current) {
      MoveToOwnMemory(*storage, *out, device);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

void HandedOut::PoisonOverwritten() {
  std::erase_if(entries_, [](Entry& e) {
    c10::intrusive_ptr<c10::StorageImpl> storage = e.storage.lock();
    if (!storage) return true;
    const std::shared_ptr<graphalloc::OutputState> out = e.output.lock();
    if (out != nullptr && out->Current()) return false;
    const std::string message =
        out != nullptr ? std::string("graphalloc: ") + std::string(out->Check().message())
                       : std::string("graphalloc: this tensor was a CUDA graph output that is gone");
    storage->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
    return true;
  });
}

void HandedOut::PoisonAll(const std::string& message) {
  for (Entry& e : entries_) {
    if (c10::intrusive_ptr<c10::StorageImpl> storage = e.storage.lock()) {
      storage->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
    }
  }
  entries_.clear();
}

}  // namespace graphalloc_torch
