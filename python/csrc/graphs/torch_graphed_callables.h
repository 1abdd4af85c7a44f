// graphalloc.torch.make_graphed_callables: PyTorch callables (modules, functions) whose forward and
// backward are recorded and replayed by a staged GraphedStep (lifetime/graphed_step.h): one stage
// per callable, all recorded in one tree (one pool) per lane, micro-batches on lanes, gradients owned by
// default, retained backwards, releases deferred while one may run.
//
// Python wraps each stage in a torch.autograd.Function whose forward calls Forward and whose backward
// calls Backward. The stage's bodies are Python too:
//   forward(forward_id, inputs, params) -> (outputs, saved): runs the callable with autograd on inputs (as
//     the graph passes them) and keeps the autograd graph it built for its backwards; `saved` are the
//     tensors that graph saved (a saved_tensors_hooks pack hook lists them);
//   backward(forward_id, forward_node, grad_outputs) -> one gradient per input (None where none): runs
//     autograd over the graph the forward built, found by forward_node (the recording the forward replayed:
//     its saved tensors are that recording's buffers) or by forward_id (a warmup or eager forward).
// Backward always retains the forward (PyTorch does not tell a custom Function whether its graph is
// retained): a forward ends when PyTorch frees its saved tensors, which a sentinel tensor saved with it
// reports (ReleaseSentinel), or when Discard is called.
#ifndef GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPHED_CALLABLES_H_
#define GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPHED_CALLABLES_H_

#include <ATen/Tensor.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "graphalloc/lifetime/graphed_step.h"
#include "python/csrc/graphs/torch_graph_front_end.h"
#include "python/csrc/graphs/torch_output_plan.h"

namespace graphalloc_torch {

struct GraphedStage {
  std::string name;
  std::size_t num_inputs = 0;  // the callable's flattened tensor arguments
  std::size_t num_params = 0;  // its parameters and buffers (static)
  pybind11::function forward;
  pybind11::function backward;
  // Gradient slots (one per input, then one per parameter) the caller owns (parameter gradients not opted
  // out). Every slot is handed out over the backward graph's buffer; an owned one is copied to memory of its
  // own only if the caller still holds it when its lane is about to be reused
  // (HandedOut::CopyOutOverwritten). Empty: none.
  std::vector<bool> owned_slots;
};

struct GraphedCallablesOptions : FrontEndOptions {
  std::size_t max_outstanding_forwards = 4;  // lanes (GraphedStepOptions::max_outstanding_forwards)
};

class TorchGraphedCallables final : public GraphFrontEnd {
 public:
  TorchGraphedCallables(std::vector<GraphedStage> stages, GraphedCallablesOptions options);
  ~TorchGraphedCallables();

  // What a Forward gives: its outputs, the forward's id (for Backward, ReleaseSentinel and Discard), the
  // lane it ran in and the recorded node it recorded or replayed there (0: a warmup or eager call).
  struct ForwardCall {
    std::vector<std::optional<at::Tensor>> outputs;
    std::uint64_t id = 0;
    std::size_t lane = 0;
    std::uint64_t node = 0;
  };
  // A forward of `stage` on `inputs` (its flattened tensor arguments) with `params`.
  ForwardCall Forward(std::size_t stage, const std::vector<std::optional<at::Tensor>>& inputs,
                      const std::vector<at::Tensor>& params);
  // The gradients of forward `forward_id`'s inputs and parameters for `grad_outputs` (one per output).
  std::vector<std::optional<at::Tensor>> Backward(std::uint64_t forward_id,
                                                  const std::vector<std::optional<at::Tensor>>& grad_outputs);
  // An empty tensor that, when PyTorch frees it, ends forward `forward_id` (save it for backward).
  at::Tensor ReleaseSentinel(std::uint64_t forward_id);
  // Ends a forward whose backward will not run. A forward that already ended is ignored.
  void Discard(std::uint64_t forward_id);
  // Forwards that ended since the last call (their autograd graphs may go).
  std::vector<std::uint64_t> TakeEndedForwards();
  // The recorded node forward `forward_id` replayed or recorded (0: warmup or eager).
  std::uint64_t NodeOf(std::uint64_t forward_id) const;
  // Runs `release` now, or once no retained backward can run any more.
  void RequestRelease(std::string what, pybind11::function release);

  const graphalloc::GraphedStep& step() const { return *step_; }

 private:
  struct ReleaseQueue {
    std::mutex mu;
    std::vector<std::uint64_t> ids;
  };
  struct ForwardState {
    graphalloc::StepForward forward;
    std::vector<at::Tensor> params;
    std::size_t stage = 0;
  };

  absl::StatusOr<graphalloc::ForwardResult> ForwardBody(const graphalloc::ForwardArgs& args);
  absl::StatusOr<std::vector<graphalloc::BufferView>> BackwardBody(const graphalloc::BackwardArgs& args);
  void ProcessReleases();
  // GraphedStepOptions::before_lane_reuse: copies out the owned gradients the caller still holds.
  absl::Status CopyOutHeldGradients();

  std::vector<GraphedStage> stages_;
  GraphedCallablesOptions options_;
  std::unique_ptr<graphalloc::GraphedStep> step_;
  absl::flat_hash_map<std::uint64_t, ForwardState> forwards_;
  std::shared_ptr<ReleaseQueue> releases_ = std::make_shared<ReleaseQueue>();
  // The call under way (the step runs bodies synchronously).
  std::vector<at::Tensor> inputs_;     // in the tree's order: parameters, then inputs (or saved, gradients)
  std::vector<at::Tensor> grads_;      // a backward's gradients
  std::exception_ptr copy_out_error_;  // what CopyOutHeldGradients threw (an OOM), rethrown by Forward
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPHED_CALLABLES_H_
