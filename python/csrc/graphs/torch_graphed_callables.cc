#include "python/csrc/graphs/torch_graphed_callables.h"

#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>

#include "absl/container/flat_hash_set.h"

namespace graphalloc_torch {

namespace py = pybind11;

namespace {

// The context of a release sentinel's storage: which forward it ends, and where to say so.
struct Sentinel {
  std::weak_ptr<void> queue;
  void (*push)(const std::shared_ptr<void>&, std::uint64_t);
  std::uint64_t forward = 0;
};

void DeleteSentinel(void* context) {
  std::unique_ptr<Sentinel> sentinel(static_cast<Sentinel*>(context));
  if (std::shared_ptr<void> queue = sentinel->queue.lock()) sentinel->push(queue, sentinel->forward);
}

py::list ToList(std::span<const at::Tensor> tensors) {
  py::list out;
  for (const at::Tensor& t : tensors) out.append(t.defined() ? py::cast(t) : py::none());
  return out;
}

std::vector<at::Tensor> FromList(const py::handle& list) {
  std::vector<at::Tensor> out;
  for (py::handle o : list) out.push_back(o.is_none() ? at::Tensor() : o.cast<at::Tensor>());
  return out;
}

}  // namespace

TorchGraphedCallables::TorchGraphedCallables(std::vector<GraphedStage> stages,
                                             GraphedCallablesOptions options)
    : GraphFrontEnd(options), stages_(std::move(stages)), options_(std::move(options)) {
  std::vector<graphalloc::StageSpec> specs;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    graphalloc::StageSpec spec;
    spec.name = stages_[s].name;
    spec.num_params = stages_[s].num_params;
    spec.forward = [this](const graphalloc::ForwardArgs& a) { return ForwardBody(a); };
    spec.backward = [this](const graphalloc::BackwardArgs& a) { return BackwardBody(a); };
    specs.push_back(std::move(spec));
  }
  graphalloc::GraphedStepOptions step;
  step.name = options_.name;
  step.warmup_calls = options_.warmup_calls;
  step.max_outstanding_forwards = options_.max_outstanding_forwards;
  step.participants = Participants();
  step.tree.max_recordings = options_.max_recordings;
  step.tree.warmup_in_pool = false;
  step.tree.fail_on_leftover_allocations = true;
  step.tree.stop_recording_after_failure = true;
  step.tree.release_cache_before_recording = true;
  step.tree.eager_outputs_owned = false;
  step.tree.check_input_mutation = false;  // Python compares tensor versions instead
  step.tree.log = WarnInPython();
  step.before_lane_reuse = [this](std::size_t, graphalloc::Stream) { return CopyOutHeldGradients(); };
  absl::StatusOr<std::unique_ptr<graphalloc::GraphedStep>> made =
      graphalloc::GraphedStep::Create(allocator(), std::move(specs), std::move(step));
  if (!made.ok()) throw std::runtime_error("graphalloc: " + made.status().ToString());
  step_ = std::move(*made);
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    // The step hands every gradient out over its buffer; owned_slots decides what is copied out, and when.
    for (std::size_t slot = 0; slot < stages_[s].num_inputs + stages_[s].num_params; ++slot) {
      (void)step_->SetAliasGradient(s, slot, true);
    }
  }
}

TorchGraphedCallables::~TorchGraphedCallables() {
  KeepHeldOutputs();
  forwards_.clear();
  py::gil_scoped_release release;  // the trees wait for the device
  step_.reset();
}

void TorchGraphedCallables::ProcessReleases() {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(releases_->mu);
    ids.swap(releases_->ids);
  }
  for (std::uint64_t id : ids) Discard(id);
}

absl::Status TorchGraphedCallables::CopyOutHeldGradients() {
  try {
    handed_out_.CopyOutOverwritten(device());
    return absl::OkStatus();
  } catch (const std::exception& e) {
    copy_out_error_ = std::current_exception();
    return absl::ResourceExhaustedError(std::string("copying out the parameter gradients still held: ") +
                                        e.what());
  }
}

absl::StatusOr<graphalloc::ForwardResult> TorchGraphedCallables::ForwardBody(
    const graphalloc::ForwardArgs& a) {
  calls_.body_ran = true;
  const GraphedStage& stage = stages_[a.stage];
  std::vector<at::Tensor> params(inputs_.begin(),
                                 inputs_.begin() + static_cast<std::ptrdiff_t>(a.params.size()));
  std::vector<at::Tensor> inputs;
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    inputs.push_back(TensorAsPassed(inputs_[a.params.size() + i], a.inputs[i], device()));
  std::vector<at::Tensor> saved;
  calls_.produced.clear();
  absl::Status ran = RunBody(a.stream, [&] {
    py::tuple result = stage.forward(a.forward_id, ToList(inputs), ToList(params));
    calls_.produced = FromList(result[0]);
    saved = FromList(result[1]);
  });
  if (!ran.ok()) return ran;
  const bool recording = Capturing(a.stream);
  std::vector<graphalloc::BufferView> seen(a.params.begin(), a.params.end());
  seen.insert(seen.end(), a.inputs.begin(), a.inputs.end());
  graphalloc::ForwardResult result;
  try {
    result.outputs =
        PlanOutputs(calls_.produced, seen, recording ? &disowned_ : nullptr, device(), calls_.plans);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  if (recording) {
    // What the backward reads and the capture allocated: the tree keeps it until the forward's last
    // backward. Parameters, inputs and memory from outside the graph's pool stay their owners'.
    const graphalloc::PoolId pool = step_->tree(a.lane)->pool().id();
    absl::flat_hash_set<graphalloc::DevicePtr> seen_storage;
    for (const at::Tensor& t : saved) {
      if (!t.defined() || !t.is_cuda()) continue;
      const graphalloc::BufferView storage = StorageBufferOf(t);
      if (storage.ptr == 0 || !seen_storage.insert(storage.ptr).second) continue;
      absl::StatusOr<graphalloc::PoolId> owner = allocator().PoolOfAllocation(storage.ptr);
      if (!owner.ok() || *owner != pool) continue;
      if (Disown(t)) disowned_.push_back(t);
      result.saved.push_back(storage);
    }
  }
  return result;
}

absl::StatusOr<std::vector<graphalloc::BufferView>> TorchGraphedCallables::BackwardBody(
    const graphalloc::BackwardArgs& a) {
  calls_.body_ran = true;
  const GraphedStage& stage = stages_[a.stage];
  std::vector<at::Tensor> grads;
  for (std::size_t i = 0; i < a.grad_outputs.size(); ++i)
    grads.push_back(TensorAsPassed(grads_[i], a.grad_outputs[i], device()));
  calls_.produced.clear();
  absl::Status ran = RunBody(a.stream, [&] {
    calls_.produced = FromList(stage.backward(a.forward_id, a.lane, a.forward_node, ToList(grads)));
  });
  if (!ran.ok()) return ran;
  const std::size_t slots = stage.num_inputs + stage.num_params;
  if (calls_.produced.size() != slots) {
    return absl::InvalidArgumentError("the backward of '" + stage.name + "' returned " +
                                      std::to_string(calls_.produced.size()) + " gradients for " +
                                      std::to_string(slots) + " inputs and parameters");
  }
  std::vector<graphalloc::BufferView> seen(a.params.begin(), a.params.end());
  seen.insert(seen.end(), a.saved.begin(), a.saved.end());
  seen.insert(seen.end(), a.grad_outputs.begin(), a.grad_outputs.end());
  try {
    return PlanOutputs(calls_.produced, seen, Capturing(a.stream) ? &disowned_ : nullptr, device(),
                       calls_.plans);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

TorchGraphedCallables::ForwardCall TorchGraphedCallables::Forward(
    std::size_t stage, const std::vector<std::optional<at::Tensor>>& inputs,
    const std::vector<at::Tensor>& params) {
  if (stage >= stages_.size()) throw std::out_of_range("graphalloc: no stage " + std::to_string(stage));
  ProcessReleases();
  inputs_.assign(params.begin(), params.end());
  std::vector<graphalloc::CallInput> param_inputs, call_inputs;
  for (const at::Tensor& p : params) param_inputs.push_back(InputOf(p));
  for (const std::optional<at::Tensor>& t : inputs) {
    inputs_.push_back(t.value_or(at::Tensor()));
    call_inputs.push_back(inputs_.back().defined() ? InputOf(inputs_.back())
                                                   : graphalloc::CallInput(graphalloc::BufferView{}));
  }
  calls_.Begin();
  disowned_.clear();
  absl::StatusOr<graphalloc::StepForward> forward =
      step_->Forward(stage, param_inputs, call_inputs, CallerStream());
  if (!forward.ok()) {
    calls_.Begin();
    inputs_.clear();
    if (copy_out_error_) std::rethrow_exception(std::exchange(copy_out_error_, nullptr));
    Raise(forward.status());
  }
  Succeeded();
  const std::size_t lane = forward->lane();
  const graphalloc::TreeCallInfo info = step_->tree(lane)->last_call();
  // The tree's order of arguments (parameters, then inputs) for outputs that alias them.
  std::vector<std::optional<at::Tensor>> outputs =
      calls_.Finish(info, lane, forward->outputs(), inputs_, device(), handed_out_);
  forwards_[forward->id()] = ForwardState{*forward, params, stage};
  inputs_.clear();
  return ForwardCall{std::move(outputs), forward->id(), lane, info.node};
}

std::vector<std::optional<at::Tensor>> TorchGraphedCallables::Backward(
    std::uint64_t forward_id, const std::vector<std::optional<at::Tensor>>& grad_outputs) {
  auto it = forwards_.find(forward_id);
  if (it == forwards_.end()) {
    throw std::runtime_error("graphalloc: backward of forward " + std::to_string(forward_id) + " of '" +
                             name() + "', which has ended (its graph was freed, or its backward failed)");
  }
  const ForwardState state = it->second;  // a copy: the step may end the forward
  // The tree's arguments of a backward: parameters, what the forward saved (no tensors on this side),
  // gradients.
  inputs_.assign(state.params.begin(), state.params.end());
  inputs_.resize(state.params.size() + state.forward.saved_count());
  grads_.clear();
  std::vector<graphalloc::CallInput> grads;
  for (const std::optional<at::Tensor>& g : grad_outputs) {
    grads_.push_back(g.value_or(at::Tensor()));
    inputs_.push_back(grads_.back());
    grads.push_back(grads_.back().defined() ? InputOf(grads_.back())
                                            : graphalloc::CallInput(graphalloc::BufferView{}));
  }
  calls_.Begin();
  disowned_.clear();
  absl::StatusOr<std::vector<graphalloc::TreeOutput>> result =
      step_->Backward(state.forward, std::span<const graphalloc::CallInput>(grads), CallerStream(),
                      graphalloc::BackwardOptions{.retain_graph = true});
  if (!result.ok()) {
    calls_.Begin();
    inputs_.clear();
    grads_.clear();
    Raise(result.status());
  }
  Succeeded();
  const std::size_t lane = state.forward.lane();
  std::vector<std::optional<at::Tensor>> out =
      calls_.Finish(step_->tree(lane)->last_call(), lane, *result, inputs_, device(), handed_out_);
  const std::vector<bool>& owned = stages_[state.stage].owned_slots;
  for (std::size_t j = 0; j < out.size() && j < owned.size(); ++j) {
    if (owned[j] && out[j].has_value()) handed_out_.CopyOutOnOverwrite(*out[j]);
  }
  inputs_.clear();
  grads_.clear();
  return out;
}

at::Tensor TorchGraphedCallables::ReleaseSentinel(std::uint64_t forward_id) {
  auto* sentinel = new Sentinel{std::static_pointer_cast<void>(releases_),
                                [](const std::shared_ptr<void>& queue, std::uint64_t id) {
                                  auto* q = static_cast<ReleaseQueue*>(queue.get());
                                  std::lock_guard<std::mutex> lock(q->mu);
                                  q->ids.push_back(id);
                                },
                                forward_id};
  c10::DataPtr data(nullptr, sentinel, &DeleteSentinel, c10::Device(c10::DeviceType::CUDA, device()));
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), 0,
                                                             std::move(data),
                                                             /*allocator=*/nullptr, /*resizable=*/false));
  TensorLayout layout;
  layout.sizes = {0};
  layout.strides = {1};
  return TensorOn(storage, layout, 0);
}

void TorchGraphedCallables::Discard(std::uint64_t forward_id) {
  auto it = forwards_.find(forward_id);
  if (it == forwards_.end()) return;
  if (it->second.forward.pending()) (void)step_->Discard(it->second.forward);
  forwards_.erase(it);
}

std::vector<std::uint64_t> TorchGraphedCallables::TakeEndedForwards() {
  ProcessReleases();
  std::vector<std::uint64_t> ended = step_->TakeEndedForwards();
  for (std::uint64_t id : ended) forwards_.erase(id);
  return ended;
}

std::uint64_t TorchGraphedCallables::NodeOf(std::uint64_t forward_id) const {
  auto it = forwards_.find(forward_id);
  return it == forwards_.end() ? 0 : it->second.forward.node();
}

void TorchGraphedCallables::RequestRelease(std::string what, py::function release) {
  step_->RequestRelease(std::move(what), [release = std::move(release)] {
    py::gil_scoped_acquire gil;
    try {
      release();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("graphalloc: a deferred release");
    }
  });
}

}  // namespace graphalloc_torch
