#include "python/csrc/graphs/torch_output_plan.h"

#include <ATen/ops/empty_strided.h>

#include <stdexcept>
#include <string>

namespace graphalloc_torch {
namespace {

bool Within(const graphalloc::BufferView& inner, const graphalloc::BufferView& outer) {
  if (inner.ptr == 0 || outer.ptr == 0 || inner.ptr < outer.ptr) return false;
  const std::size_t delta = inner.ptr - outer.ptr;
  return delta <= outer.bytes && inner.bytes <= outer.bytes - delta;
}

}  // namespace

std::vector<graphalloc::BufferView> PlanOutputs(std::span<const at::Tensor> produced,
                                                std::span<const graphalloc::BufferView> seen,
                                                std::vector<at::Tensor>* disowned, c10::DeviceIndex device,
                                                std::vector<OutputPlan>& plans) {
  plans.assign(produced.size(), OutputPlan{});
  std::vector<graphalloc::BufferView> buffers(produced.size());
  for (std::size_t j = 0; j < produced.size(); ++j) {
    const at::Tensor& t = produced[j];
    OutputPlan& plan = plans[j];
    if (!t.defined()) continue;
    if (!t.is_cuda() || t.get_device() != device) {
      throw std::invalid_argument("output " + std::to_string(j) + " is a tensor on " + t.device().str() +
                                  "; a graphed function returns CUDA tensors of device " +
                                  std::to_string(device));
    }
    plan.layout = TensorLayout::Of(t);
    const graphalloc::BufferView storage = StorageBufferOf(t);
    const graphalloc::BufferView extent = ExtentOf(t);
    // The same storage as an earlier output: the tree sees the same buffer twice.
    for (std::size_t k = 0; k < j && plan.kind == OutputPlan::Kind::kNone; ++k) {
      if (plans[k].kind == OutputPlan::Kind::kNew && buffers[k].ptr == storage.ptr) {
        plan.kind = OutputPlan::Kind::kSameStorage;
        plan.from = k;
        buffers[j] = storage;
      }
    }
    if (plan.kind != OutputPlan::Kind::kNone) continue;
    for (std::size_t i = 0; i < seen.size() && plan.kind == OutputPlan::Kind::kNone; ++i) {
      if (extent.bytes == 0 || !Within(extent, seen[i])) continue;
      plan.kind = OutputPlan::Kind::kInput;
      plan.from = i;
      plan.input_delta = extent.ptr - seen[i].ptr;
      buffers[j] = extent;
    }
    if (plan.kind != OutputPlan::Kind::kNone) continue;
    if (storage.ptr == 0 || extent.bytes == 0) {  // nothing to hand back but its shape
      plan.kind = OutputPlan::Kind::kEmpty;
      continue;
    }
    plan.kind = OutputPlan::Kind::kNew;
    buffers[j] = storage;
    if (disowned != nullptr && Disown(t)) disowned->push_back(t);
  }
  return buffers;
}

std::vector<std::optional<at::Tensor>> HandOut(std::span<const graphalloc::TreeOutput> outputs,
                                               std::span<const OutputPlan> plans,
                                               std::span<const at::Tensor> inputs,
                                               std::span<const at::Tensor> produced, c10::DeviceIndex device,
                                               HandedOut& handed_out) {
  std::vector<std::optional<at::Tensor>> result(plans.size());
  for (std::size_t j = 0; j < plans.size(); ++j) {
    const OutputPlan& plan = plans[j];
    switch (plan.kind) {
      case OutputPlan::Kind::kNone:
        break;
      case OutputPlan::Kind::kEmpty:
        result[j] =
            at::empty_strided(plan.layout.sizes, plan.layout.strides,
                              at::TensorOptions().dtype(plan.layout.dtype).device(c10::kCUDA, device));
        break;
      case OutputPlan::Kind::kNew: {
        const graphalloc::TreeOutput& out = outputs[j];
        if (out.kind() == graphalloc::OutputKind::kBorrowed && j < produced.size() && produced[j].defined()) {
          result[j] = produced[j].detach();  // PyTorch owns it (a warmup or an eager call)
        } else {
          result[j] = TensorOver(out, plan.layout, device);
          handed_out.Add(*result[j]);
        }
        break;
      }
      case OutputPlan::Kind::kSameStorage:
        result[j] = TensorOn(
            result[plan.from]->storage(), plan.layout,
            static_cast<std::size_t>(plan.layout.storage_offset) * c10::elementSize(plan.layout.dtype));
        break;
      case OutputPlan::Kind::kInput: {
        const at::Tensor& in = inputs[plan.from];
        const std::size_t in_offset = static_cast<std::size_t>(in.storage_offset()) * in.element_size();
        result[j] = TensorOn(in.storage(), plan.layout, in_offset + plan.input_delta);
        break;
      }
    }
  }
  return result;
}

std::vector<std::optional<at::Tensor>> CallOutputs::Finish(const graphalloc::TreeCallInfo& info,
                                                           std::size_t lane,
                                                           std::span<const graphalloc::TreeOutput> outputs,
                                                           std::span<const at::Tensor> inputs,
                                                           c10::DeviceIndex device, HandedOut& handed_out) {
  const auto key = std::make_pair(lane, info.node);
  if (info.kind == graphalloc::TreeCallInfo::Kind::kRecord) node_plans_[key] = plans;
  const std::vector<OutputPlan>& used =
      info.kind == graphalloc::TreeCallInfo::Kind::kReplay ? node_plans_.at(key) : plans;
  std::vector<at::Tensor> body;
  if (body_ran) body = std::move(produced);
  std::vector<std::optional<at::Tensor>> result = HandOut(outputs, used, inputs, body, device, handed_out);
  Begin();
  handed_out.PoisonOverwritten();
  return result;
}

}  // namespace graphalloc_torch
