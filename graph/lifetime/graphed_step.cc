#include "graphalloc/graph/lifetime/graphed_step.h"

#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace graphalloc {

// What one Forward left for its backwards.
struct ForwardRecord {
  const GraphedStep* owner = nullptr;
  std::uint64_t id = 0;
  std::size_t lane = 0;
  bool has_rng = false;
  std::uint64_t rng_iteration = 0;
  std::vector<std::uint64_t> draws;  // Philox words per thread each random op drew in the forward
  std::vector<TreeOutput> outputs;
  std::vector<TreeOutput> saved;
  bool pending = true;    // a backward may still run
  bool retained = false;  // a retain_graph backward ran, and the last one has not
};

const std::vector<TreeOutput>& StepForward::outputs() const {
  static const std::vector<TreeOutput> kNone;
  return record_ ? record_->outputs : kNone;
}
std::uint64_t StepForward::id() const { return record_ ? record_->id : 0; }
bool StepForward::pending() const { return record_ != nullptr && record_->pending; }

struct GraphedStep::Lane {
  std::size_t index = 0;
  std::unique_ptr<GraphTree> tree;  // null in eager mode
  FunctionId forward = 0;
  FunctionId backward = 0;
  std::shared_ptr<ForwardRecord> busy;  // the pending forward that holds the lane
  // Pool outputs of the lane's current step (what live_pool_bytes counts).
  std::vector<std::weak_ptr<OutputState>> handed_out;
};

// The one way out of a Backward once it has started: whatever happens (an error returned, an exception
// passing through), the destructor ends the backward (docs/graphed_step.md: "Every backward leaves through
// one epilogue").
class GraphedStep::BackwardEpilogue {
 public:
  BackwardEpilogue(GraphedStep& step, std::shared_ptr<ForwardRecord> record, bool retain)
      : step_(step), record_(std::move(record)), retain_(retain) {}
  BackwardEpilogue(const BackwardEpilogue&) = delete;
  BackwardEpilogue& operator=(const BackwardEpilogue&) = delete;
  ~BackwardEpilogue() {
    ForwardRecord& r = *record_;
    if (!succeeded_ && rng_began_) {
      // The failed backward drew an unknown amount: the pairs must stop trusting the in-order position.
      (void)step_.options_.rng->AbandonBackward(r.rng_iteration);
    }
    if (succeeded_ && retain_) {
      r.retained = true;
    } else {
      step_.EndForward(r);
    }
    if (!step_.AnyRetained()) step_.deferred_.Flush();
  }
  void RngBegan() { rng_began_ = true; }
  void Succeeded() { succeeded_ = true; }

 private:
  GraphedStep& step_;
  std::shared_ptr<ForwardRecord> record_;
  const bool retain_;
  bool rng_began_ = false;
  bool succeeded_ = false;
};

GraphedStep::GraphedStep(CachingAllocator& allocator, std::vector<BufferView> params, ForwardFunction forward,
                         BackwardFunction backward, GraphedStepOptions options)
    : allocator_(allocator),
      params_(std::move(params)),
      forward_(std::move(forward)),
      backward_(std::move(backward)),
      options_(std::move(options)) {
  if (options_.rng != nullptr) {
    for (std::size_t op = 0; op < options_.rng->num_ops(); ++op) {
      forward_generators_.push_back(&options_.rng->forward_generator(op));
      backward_generators_.push_back(&options_.rng->backward_generator(op));
    }
  }
  eager_origin_ = std::make_shared<const OutputOrigin>(
      OutputOrigin{std::make_shared<TreeEpoch>(), absl::StrCat(options_.name, " (eager)"), this});
}

absl::StatusOr<std::unique_ptr<GraphedStep>> GraphedStep::Create(CachingAllocator& allocator,
                                                                 std::vector<BufferView> params,
                                                                 ForwardFunction forward,
                                                                 BackwardFunction backward,
                                                                 GraphedStepOptions options) {
  if (!forward || !backward) {
    return absl::InvalidArgumentError(absl::StrFormat("GraphedStep '%s': the %s function is empty",
                                                      options.name, !forward ? "forward" : "backward"));
  }
  if (options.max_outstanding_forwards == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GraphedStep '%s': max_outstanding_forwards must be at least 1", options.name));
  }
  if (options.warmup_calls < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("GraphedStep '%s': warmup_calls must be >= 0, got %d",
                                                      options.name, options.warmup_calls));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].ptr == 0 || params[i].bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GraphedStep '%s': parameter %d is empty; parameters are device buffers whose addresses "
          "the graphs keep",
          options.name, i));
    }
  }
  return std::unique_ptr<GraphedStep>(new GraphedStep(allocator, std::move(params), std::move(forward),
                                                      std::move(backward), std::move(options)));
}

GraphedStep::~GraphedStep() {
  // The step's graphs go away, so no retained backward can run any more: the deferred releases run now
  // (docs/graphed_step.md, "Lifetime rules").
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->busy != nullptr) EndForward(*lane->busy);
  }
  deferred_.Flush();
  lanes_.clear();
}

absl::StatusOr<GraphedStep::Lane*> GraphedStep::FreeLane() {
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->busy == nullptr) return lane.get();
  }
  if (lanes_.size() >= options_.max_outstanding_forwards) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GraphedStep '%s': Forward called with %d forwards still waiting for their last backward "
        "(max_outstanding_forwards = %d); run a pending backward (or Discard a forward) first, or raise "
        "GraphedStepOptions::max_outstanding_forwards (each outstanding forward needs its own recording)",
        options_.name, pending_forwards(), options_.max_outstanding_forwards));
  }
  auto lane = std::make_unique<Lane>();
  lane->index = lanes_.size();
  if (options_.graphed) {
    TreeOptions tree_options = options_.tree;
    tree_options.implicit_steps = false;  // a lane's step is "a forward and its backwards": we begin it
    absl::StatusOr<std::unique_ptr<GraphTree>> tree = GraphTree::Create(allocator_, std::move(tree_options));
    if (!tree.ok()) return tree.status();
    lane->tree = std::move(*tree);
    std::vector<std::size_t> statics(params_.size());
    std::iota(statics.begin(), statics.end(), std::size_t{0});
    auto add = [&](const char* what, TreeFunction body, const std::vector<Generator*>& generators) {
      FunctionOptions function;
      function.name = absl::StrFormat("%s %s (lane %d)", options_.name, what, lane->index);
      function.static_inputs = statics;
      function.warmup_calls = options_.warmup_calls;
      function.generators.assign(generators.begin(), generators.end());
      return lane->tree->Register(std::move(body), std::move(function));
    };
    absl::StatusOr<FunctionId> f = add(
        "forward", [this](std::span<const BufferView> in, Stream s) { return ForwardBody(in, s); },
        forward_generators_);
    if (!f.ok()) return f.status();
    absl::StatusOr<FunctionId> b = add(
        "backward", [this](std::span<const BufferView> in, Stream s) { return BackwardBody(in, s); },
        backward_generators_);
    if (!b.ok()) return b.status();
    lane->forward = *f;
    lane->backward = *b;
  }
  lanes_.push_back(std::move(lane));
  return lanes_.back().get();
}

std::vector<std::uint64_t> GraphedStep::Offsets(bool backward) const {
  const std::vector<Generator*>& gens = backward ? backward_generators_ : forward_generators_;
  std::vector<std::uint64_t> offsets;
  offsets.reserve(gens.size());
  for (const Generator* g : gens) offsets.push_back(g->host_offset());
  return offsets;
}

absl::StatusOr<StepForward> GraphedStep::Forward(std::span<const BufferView> inputs, Stream stream) {
  absl::StatusOr<Lane*> lane = FreeLane();
  if (!lane.ok()) return lane.status();
  auto record = std::make_shared<ForwardRecord>();
  record->owner = this;
  record->id = next_forward_;
  record->lane = (*lane)->index;
  if (options_.rng != nullptr) {
    absl::StatusOr<std::uint64_t> iteration = options_.rng->BeginForward();
    if (!iteration.ok()) return iteration.status();
    record->has_rng = true;
    record->rng_iteration = *iteration;
  }
  const std::vector<std::uint64_t> start = Offsets(/*backward=*/false);
  absl::StatusOr<std::vector<TreeOutput>> outs = RunForward(*lane, inputs, stream);
  if (!outs.ok()) {
    if (record->has_rng) (void)options_.rng->AbandonForward(record->rng_iteration);
    return absl::Status(outs.status().code(),
                        absl::StrFormat("GraphedStep '%s': forward %d failed: %s", options_.name, record->id,
                                        outs.status().message()));
  }
  // What each op drew, the same whether the call ran eagerly, recorded or replayed (a launch's
  // PrepareReplay advances the host offset by the graph's increment): what its backwards must draw.
  const std::vector<std::uint64_t> end = Offsets(/*backward=*/false);
  for (std::size_t op = 0; op < end.size(); ++op) record->draws.push_back(end[op] - start[op]);
  record->outputs.assign(outs->begin(), outs->begin() + static_cast<std::ptrdiff_t>(num_outputs_));
  record->saved.assign(outs->begin() + static_cast<std::ptrdiff_t>(num_outputs_), outs->end());
  ++next_forward_;
  (*lane)->busy = record;
  return StepForward(std::move(record));
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::RunForward(Lane* lane,
                                                                std::span<const BufferView> inputs,
                                                                Stream stream) {
  if (lane->tree == nullptr) {
    std::vector<BufferView> in(params_.begin(), params_.end());
    in.insert(in.end(), inputs.begin(), inputs.end());
    absl::StatusOr<std::vector<BufferView>> produced = ForwardBody(in, stream);
    if (!produced.ok()) return produced.status();
    return WrapEager(*produced, params_);
  }
  // The lane's previous forward is done: its memory may be reused, and what it handed out is overwritten.
  lane->tree->BeginStep();
  lane->handed_out.clear();
  std::vector<CallInput> call;
  call.reserve(params_.size() + inputs.size());
  for (const BufferView& p : params_) call.emplace_back(p);
  for (const BufferView& x : inputs) call.emplace_back(x);
  absl::StatusOr<std::vector<TreeOutput>> outs = lane->tree->Call(lane->forward, call, stream);
  if (!outs.ok()) return outs.status();
  for (const TreeOutput& o : *outs) {
    if (o.kind() == OutputKind::kPool) lane->handed_out.push_back(o.state());
  }
  return outs;
}

absl::StatusOr<std::vector<BufferView>> GraphedStep::ForwardBody(std::span<const BufferView> in,
                                                                 Stream stream) {
  absl::StatusOr<ForwardResult> result =
      forward_(ForwardArgs{in.first(params_.size()), in.subspan(params_.size()), stream,
                           std::span<Generator* const>(forward_generators_)});
  if (!result.ok()) return result.status();
  if (!forward_shape_known_) {
    forward_shape_known_ = true;
    num_outputs_ = result->outputs.size();
    num_saved_ = result->saved.size();
  }
  if (result->outputs.size() != num_outputs_ || result->saved.size() != num_saved_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the forward returned %d outputs and %d saved buffers, its first call %d and %d; the "
                        "shape of a step is "
                        "fixed",
                        result->outputs.size(), result->saved.size(), num_outputs_, num_saved_));
  }
  std::vector<BufferView> all = std::move(result->outputs);
  all.insert(all.end(), result->saved.begin(), result->saved.end());
  return all;
}

absl::StatusOr<std::vector<BufferView>> GraphedStep::BackwardBody(std::span<const BufferView> in,
                                                                  Stream stream) {
  const std::size_t p = params_.size();
  absl::StatusOr<std::vector<BufferView>> grads =
      backward_(BackwardArgs{in.first(p), in.subspan(p, num_saved_), in.subspan(p + num_saved_), stream,
                             std::span<Generator* const>(backward_generators_)});
  if (!grads.ok()) return grads.status();
  if (!backward_shape_known_) {
    backward_shape_known_ = true;
    num_grad_slots_ = grads->size();
  }
  if (grads->size() != num_grad_slots_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the backward returned %d gradients, its first call %d; the gradient slots of a step are fixed",
        grads->size(), num_grad_slots_));
  }
  return grads;
}

std::vector<TreeOutput> GraphedStep::WrapEager(std::span<const BufferView> produced,
                                               std::span<const BufferView> inputs) {
  std::vector<TreeOutput> outputs(produced.size());
  for (std::size_t j = 0; j < produced.size(); ++j) {
    const BufferView& b = produced[j];
    if (b.ptr == 0) continue;  // no buffer: an empty handle
    for (std::size_t k = 0; k < j && outputs[j].empty(); ++k) {
      if (produced[k].ptr == b.ptr) outputs[j] = outputs[k];  // one buffer returned twice: one owner
    }
    if (!outputs[j].empty()) continue;
    auto state = std::make_shared<OutputState>();
    state->index = static_cast<std::uint32_t>(j);
    state->origin = eager_origin_;
    state->allocator = &allocator_;
    state->buffer = b;
    bool borrowed = false;
    for (const BufferView& in : inputs) borrowed = borrowed || in.ptr == b.ptr;
    state->kind = borrowed ? OutputKind::kBorrowed : OutputKind::kOwned;
    outputs[j] = TreeOutput(std::move(state));
  }
  return outputs;
}

absl::Status GraphedStep::CheckBackward(const ForwardRecord* record, std::size_t grad_outputs) const {
  if (record == nullptr || record->owner != this) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GraphedStep '%s': Backward of a forward that is not one of this step's (pass what "
                        "its Forward returned)",
                        options_.name));
  }
  if (!record->pending) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GraphedStep '%s': forward %d has no pending backward: its last backward already "
                        "ran, failed or it was "
                        "discarded, and its saved state is released; pass retain_graph = true to every "
                        "backward but the last, "
                        "or run the forward again",
                        options_.name, record->id));
  }
  if (grad_outputs != num_outputs_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GraphedStep '%s': Backward of forward %d got %d gradient outputs for %d forward outputs; "
        "pass one per output (an empty buffer where there is none)",
        options_.name, record->id, grad_outputs, num_outputs_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::Backward(const StepForward& forward,
                                                              std::span<const BufferView> grad_outputs,
                                                              Stream stream, BackwardOptions options) {
  const std::shared_ptr<ForwardRecord>& record = forward.record_;
  if (absl::Status s = CheckBackward(record.get(), grad_outputs.size()); !s.ok()) return s;
  if (!policy_fixed_) {  // the step's capture: its gradient policy is fixed from here on
    policy_fixed_ = true;
    captured_alias_ = alias_;
  }

  BackwardEpilogue epilogue(*this, record, options.retain_graph);
  if (record->has_rng) {
    if (absl::Status s = options_.rng->BeginBackward(record->rng_iteration, options.retain_graph); !s.ok())
      return s;
    epilogue.RngBegan();
  }
  const std::vector<std::uint64_t> start = Offsets(/*backward=*/true);
  absl::StatusOr<std::vector<TreeOutput>> grads = RunBackward(*record, grad_outputs, stream);
  if (!grads.ok()) {
    return absl::Status(grads.status().code(),
                        absl::StrFormat("GraphedStep '%s': backward of forward %d failed (its saved state is "
                                        "released; run the forward again): %s",
                                        options_.name, record->id, grads.status().message()));
  }
  if (absl::Status s = CheckDraws(*record, start); !s.ok()) return s;
  absl::StatusOr<std::vector<TreeOutput>> result = HandOutGradients(std::move(*grads), stream);
  if (result.ok()) epilogue.Succeeded();
  return result;
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::HandOutGradients(std::vector<TreeOutput> grads,
                                                                      Stream stream) const {
  std::vector<TreeOutput> result(grads.size());
  for (std::size_t slot = 0; slot < grads.size(); ++slot) {
    TreeOutput& g = grads[slot];
    if (g.empty() || g.bytes() == 0) continue;  // no gradient for this slot
    const bool alias = slot < captured_alias_.size() && captured_alias_[slot];
    if (g.kind() != OutputKind::kPool || alias) {
      result[slot] = std::move(g);
      continue;
    }
    // The default: the caller owns a copy, and the static buffer is free for the pool once `g` goes.
    absl::StatusOr<TreeOutput> clone = g.Clone(stream);
    if (!clone.ok()) return clone.status();
    result[slot] = std::move(*clone);
  }
  return result;
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::RunBackward(ForwardRecord& record,
                                                                 std::span<const BufferView> grad_outputs,
                                                                 Stream stream) {
  Lane& lane = *lanes_[record.lane];
  if (lane.tree == nullptr) {
    std::vector<BufferView> saved;
    for (const TreeOutput& s : record.saved) saved.push_back(s.state() ? s.state()->buffer : BufferView{});
    std::vector<BufferView> in(params_.begin(), params_.end());
    in.insert(in.end(), saved.begin(), saved.end());
    in.insert(in.end(), grad_outputs.begin(), grad_outputs.end());
    absl::StatusOr<std::vector<BufferView>> grads = BackwardBody(in, stream);
    if (!grads.ok()) return grads.status();
    return WrapEager(*grads, params_);
  }
  std::vector<CallInput> call;
  call.reserve(params_.size() + record.saved.size() + grad_outputs.size());
  for (const BufferView& p : params_) call.emplace_back(p);
  for (const TreeOutput& s : record.saved) call.emplace_back(s);
  for (const BufferView& g : grad_outputs) call.emplace_back(g);
  absl::StatusOr<std::vector<TreeOutput>> grads = lane.tree->Call(lane.backward, call, stream);
  if (!grads.ok()) return grads.status();
  for (const TreeOutput& g : *grads) {
    if (g.kind() == OutputKind::kPool) lane.handed_out.push_back(g.state());
  }
  return grads;
}

absl::Status GraphedStep::CheckDraws(const ForwardRecord& record,
                                     const std::vector<std::uint64_t>& start) const {
  const std::vector<std::uint64_t> end = Offsets(/*backward=*/true);
  for (std::size_t op = 0; op < end.size(); ++op) {
    if (end[op] - start[op] == record.draws[op]) continue;
    return absl::FailedPreconditionError(absl::StrFormat(
        "GraphedStep '%s': the backward of forward %d drew %d Philox words per thread from random op %d, its "
        "forward drew %d; a backward must reserve exactly what its forward reserved, in the same order (a "
        "recomputation reserves as the forward did and reuses those PhiloxArgs for the backward kernels), or "
        "later backwards would see other masks",
        options_.name, record.id, end[op] - start[op], op, record.draws[op]));
  }
  return absl::OkStatus();
}

void GraphedStep::EndForward(ForwardRecord& record) {
  record.pending = false;
  record.retained = false;
  record.saved.clear();  // eager: frees the buffers; graphed: the pool may reuse them
  Lane& lane = *lanes_[record.lane];
  if (lane.busy.get() == &record) lane.busy.reset();
}

bool GraphedStep::AnyRetained() const {
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->busy != nullptr && lane->busy->retained) return true;
  }
  return false;
}

absl::Status GraphedStep::Discard(const StepForward& forward) {
  const std::shared_ptr<ForwardRecord>& record = forward.record_;
  if (record == nullptr || record->owner != this || !record->pending) {
    return absl::FailedPreconditionError(
        absl::StrFormat("GraphedStep '%s': Discard of a forward with no pending backward", options_.name));
  }
  absl::Status s = absl::OkStatus();
  if (record->has_rng) s = options_.rng->AbandonForward(record->rng_iteration);
  EndForward(*record);
  if (!AnyRetained()) deferred_.Flush();
  return s;
}

void GraphedStep::RequestRelease(std::string what, DeferredReleases::Release release) {
  if (AnyRetained()) {
    deferred_.Defer(std::move(what), std::move(release));
    return;
  }
  release();
}

absl::Status GraphedStep::SetAliasGradient(std::size_t slot, bool alias) {
  if (policy_fixed_) {
    const bool now = slot < captured_alias_.size() && captured_alias_[slot];
    return absl::FailedPreconditionError(absl::StrFormat(
        "GraphedStep '%s': gradient slot %d was fixed as %s when the step was captured (its first Backward); "
        "the policy of a captured step does not change: create another GraphedStep for another policy",
        options_.name, slot, now ? "aliased" : "cloned"));
  }
  if (slot >= alias_.size()) alias_.resize(slot + 1, false);
  alias_[slot] = alias;
  return absl::OkStatus();
}

std::size_t GraphedStep::pending_forwards() const {
  std::size_t n = 0;
  for (const std::unique_ptr<Lane>& lane : lanes_) n += lane->busy != nullptr ? 1 : 0;
  return n;
}

std::size_t GraphedStep::saved_bytes() const {
  absl::flat_hash_set<const OutputState*> seen;
  std::size_t bytes = 0;
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->busy == nullptr) continue;
    for (const TreeOutput& s : lane->busy->saved) {
      if (s.state() != nullptr && seen.insert(s.state().get()).second) bytes += s.bytes();
    }
  }
  return bytes;
}

std::size_t GraphedStep::live_pool_bytes() const {
  absl::flat_hash_set<const OutputState*> seen;
  std::size_t bytes = 0;
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    for (const std::weak_ptr<OutputState>& weak : lane->handed_out) {
      const std::shared_ptr<OutputState> state = weak.lock();
      if (state == nullptr || !state->Current() || !seen.insert(state.get()).second) continue;
      bytes += state->buffer.bytes;
    }
  }
  return bytes;
}

const GraphTree* GraphedStep::tree(std::size_t lane) const {
  return lane < lanes_.size() ? lanes_[lane]->tree.get() : nullptr;
}

}  // namespace graphalloc
