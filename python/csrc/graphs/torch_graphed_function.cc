#include "python/csrc/graphs/torch_graphed_function.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>

namespace graphalloc_torch {

namespace py = pybind11;

TorchGraphedFunction::TorchGraphedFunction(py::function body, FrontEndOptions options)
    : GraphFrontEnd(options), body_(std::move(body)) {}

TorchGraphedFunction::~TorchGraphedFunction() {
  KeepHeldOutputs();
  py::gil_scoped_release release;  // the tree waits for the device
  tree_.reset();
}

absl::StatusOr<std::vector<graphalloc::BufferView>> TorchGraphedFunction::Body(
    std::span<const graphalloc::BufferView> in, graphalloc::Stream stream) {
  calls_.body_ran = true;
  calls_.produced.clear();
  absl::Status ran = RunBody(stream, [&] {
    py::list passed;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const at::Tensor t = i < inputs_.size() ? TensorAsPassed(inputs_[i], in[i], device()) : at::Tensor();
      passed.append(t.defined() ? py::cast(t) : py::none());
    }
    py::object out = body_(passed);
    for (py::handle o : out) calls_.produced.push_back(o.is_none() ? at::Tensor() : o.cast<at::Tensor>());
  });
  if (!ran.ok()) return ran;
  try {
    return PlanOutputs(calls_.produced, in, Capturing(stream) ? &disowned_ : nullptr, device(), calls_.plans);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

std::vector<std::optional<at::Tensor>> TorchGraphedFunction::Call(
    const std::vector<std::optional<at::Tensor>>& inputs, std::size_t num_static, std::uint64_t constants) {
  if (tree_ == nullptr) {
    graphalloc::TreeOptions tree;
    tree.max_recordings = options().max_recordings;
    tree.warmup_in_pool = false;
    tree.fail_on_leftover_allocations = true;
    tree.stop_recording_after_failure = true;
    tree.release_cache_before_recording = true;
    tree.eager_outputs_owned = false;
    tree.check_input_mutation = false;  // Python compares tensor versions instead (cheaper, exact)
    tree.log = WarnInPython();
    absl::StatusOr<std::unique_ptr<graphalloc::GraphTree>> made =
        graphalloc::GraphTree::Create(allocator(), tree);
    if (!made.ok()) Raise(made.status());
    tree_ = std::move(*made);
    graphalloc::FunctionOptions function;
    function.name = options().name;
    function.warmup_calls = options().warmup_calls;
    for (std::size_t i = 0; i < num_static; ++i) function.static_inputs.push_back(i);
    function.generators = Participants();
    absl::StatusOr<graphalloc::FunctionId> id = tree_->Register(
        [this](std::span<const graphalloc::BufferView> in, graphalloc::Stream s) { return Body(in, s); },
        std::move(function));
    if (!id.ok()) Raise(id.status());
    function_ = *id;
    num_static_ = num_static;
  }
  if (num_static != *num_static_) {
    throw std::invalid_argument("graphalloc: '" + name() + "' was called with " + std::to_string(num_static) +
                                " static tensors, its first call with " + std::to_string(*num_static_) +
                                " (modules must not gain or lose parameters or buffers once graphed)");
  }
  inputs_.clear();
  disowned_.clear();
  std::vector<graphalloc::CallInput> call;
  call.reserve(inputs.size() + 1);
  for (const std::optional<at::Tensor>& t : inputs) {
    inputs_.push_back(t.value_or(at::Tensor()));
    call.push_back(inputs_.back().defined() ? InputOf(inputs_.back())
                                            : graphalloc::CallInput(graphalloc::BufferView{}));
  }
  call.push_back(graphalloc::CallInput(graphalloc::BufferView{}).WithLayout(constants));
  inputs_.emplace_back();
  calls_.Begin();
  absl::StatusOr<std::vector<graphalloc::TreeOutput>> outs = tree_->Call(function_, call, CallerStream());
  if (!outs.ok()) {
    calls_.Begin();
    Raise(outs.status());
  }
  Succeeded();
  std::vector<std::optional<at::Tensor>> result =
      calls_.Finish(tree_->last_call(), 0, *outs, inputs_, device(), handed_out_);
  inputs_.clear();
  return result;
}

}  // namespace graphalloc_torch
