// What a function of tensors returned, in the terms of the graph tree, and the tensors a call of it hands
// back.
//
// When a body runs (a warmup, a recording, an eager call), each tensor it returns is classified against
// the buffers it was passed: a new buffer (its storage, which the tree owns once recorded), a view of an
// input (the caller's tensor, at the same offset from the data it was passed), the same storage as an
// earlier output, or nothing. The classification is kept with the recording, so a replay, which runs no
// body, hands back tensors of the same shapes over the recording's buffers and the caller's inputs.
#ifndef GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_OUTPUT_PLAN_H_
#define GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_OUTPUT_PLAN_H_

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "graphalloc/graph/graph_tree.h"
#include "graphalloc/graph/tree_output.h"
#include "python/csrc/graphs/torch_tensor_buffers.h"

namespace graphalloc_torch {

struct OutputPlan {
  enum class Kind { kNone, kEmpty, kNew, kSameStorage, kInput };  // kEmpty: a tensor of no bytes
  Kind kind = Kind::kNone;
  std::size_t from = 0;         // kSameStorage: the earlier output; kInput: the input
  std::size_t input_delta = 0;  // kInput: bytes from the input's data to the output's
  TensorLayout layout;
};

// Classifies `produced` against `seen` (what the body was passed), fills `plans` and returns the buffers
// the tree is told of. New outputs are disowned from PyTorch when `disowned` is given (a recording: the
// tree owns what the capture allocated), and appended to it. Throws std::invalid_argument for an output
// the tree cannot hand back (not a CUDA tensor of this device).
std::vector<graphalloc::BufferView> PlanOutputs(std::span<const at::Tensor> produced,
                                                std::span<const graphalloc::BufferView> seen,
                                                std::vector<at::Tensor>* disowned, c10::DeviceIndex device,
                                                std::vector<OutputPlan>& plans);

// The tensors a call hands back: over the tree's outputs where it owns them (recordings, replays), the
// body's own tensors where PyTorch does (warmups and eager calls, detached from the body's autograd graph),
// views of the caller's `inputs` for aliases. Pool outputs are added to `handed_out`.
std::vector<std::optional<at::Tensor>> HandOut(std::span<const graphalloc::TreeOutput> outputs,
                                               std::span<const OutputPlan> plans,
                                               std::span<const at::Tensor> inputs,
                                               std::span<const at::Tensor> produced, c10::DeviceIndex device,
                                               HandedOut& handed_out);

// What a front end keeps of its calls' outputs: the body's of the call under way (a warmup, a recording,
// an eager call), and per recorded node the plans its replays hand back by.
class CallOutputs {
 public:
  // Before a tree call: no body has run yet.
  void Begin() {
    produced.clear();
    body_ran = false;
  }
  // After a tree call that did (`info`; in `lane` of a front end with several trees, else 0): the tensors
  // to hand back for `outputs`, by the recording's plans for a replay, else the body's (a recording's kept
  // for its replays). `inputs` are the call's arguments in the tree's order.
  std::vector<std::optional<at::Tensor>> Finish(const graphalloc::TreeCallInfo& info, std::size_t lane,
                                                std::span<const graphalloc::TreeOutput> outputs,
                                                std::span<const at::Tensor> inputs, c10::DeviceIndex device,
                                                HandedOut& handed_out);

  // Filled by the body (PlanOutputs).
  std::vector<at::Tensor> produced;
  std::vector<OutputPlan> plans;
  bool body_ran = false;

 private:
  absl::flat_hash_map<std::pair<std::size_t, std::uint64_t>, std::vector<OutputPlan>> node_plans_;
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_OUTPUT_PLAN_H_
