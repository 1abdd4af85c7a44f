#include "graphalloc/lifetime/graphed_step.h"

#include <algorithm>
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
  std::size_t stage = 0;
  std::size_t lane = 0;
  std::uint64_t node = 0;         // the tree node the forward recorded or replayed; 0: warmup or eager
  bool eager = false;             // it ran eagerly: so does its backward (what it saved is not the pool's)
  std::vector<CallInput> params;  // the parameters it ran with (its backward reads the same)
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
std::size_t StepForward::stage() const { return record_ ? record_->stage : 0; }
std::size_t StepForward::saved_count() const { return record_ ? record_->saved.size() : 0; }
std::size_t StepForward::lane() const { return record_ ? record_->lane : 0; }
std::uint64_t StepForward::node() const { return record_ ? record_->node : 0; }

struct GraphedStep::Stage {
  StageSpec spec;
  // Fixed by the first forward / backward body run.
  std::size_t num_outputs = 0, num_saved = 0, num_grad_slots = 0;
  bool forward_shape_known = false, backward_shape_known = false;
  std::vector<bool> alias;  // per slot, as set; copied to captured_alias at capture
  std::vector<bool> captured_alias;
  bool policy_fixed = false;
};

struct GraphedStep::Lane {
  std::size_t index = 0;
  std::unique_ptr<GraphTree> tree;  // null in eager mode
  std::vector<FunctionId> forward;  // per stage
  std::vector<FunctionId> backward;
  // The micro-batch the lane holds: its forwards still pending (ended ones leave), the stages it ran,
  // and whether one of its backwards has begun (then no forward joins it any more).
  std::vector<std::shared_ptr<ForwardRecord>> pending;
  std::vector<std::size_t> stages_run;
  std::uint64_t batch_number = 0;
  bool backward_begun = false;
  // Pool outputs of the lane's current step (what live_pool_bytes counts).
  std::vector<std::weak_ptr<OutputState>> handed_out;

  bool free() const { return pending.empty(); }
  // Whether a forward of `stage` may join the micro-batch.
  bool open_for(std::size_t stage) const {
    return !free() && !backward_begun &&
           std::find(stages_run.begin(), stages_run.end(), stage) == stages_run.end();
  }
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
    step_.current_ = nullptr;
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

GraphedStep::GraphedStep(CachingAllocator& allocator, std::vector<StageSpec> stages,
                         std::vector<BufferView> params, GraphedStepOptions options)
    : allocator_(allocator), params_(std::move(params)), options_(std::move(options)) {
  stages_.resize(stages.size());
  for (std::size_t i = 0; i < stages.size(); ++i) stages_[i].spec = std::move(stages[i]);
  if (options_.rng != nullptr) {
    for (std::size_t op = 0; op < options_.rng->num_ops(); ++op) {
      forward_generators_.push_back(&options_.rng->forward_generator(op));
      backward_generators_.push_back(&options_.rng->backward_generator(op));
    }
  }
  eager_origin_ = std::make_shared<const OutputOrigin>(
      OutputOrigin{std::make_shared<TreeEpoch>(), absl::StrCat(options_.name, " (eager)"), this});
}

absl::Status GraphedStep::Validate(const std::vector<StageSpec>& stages, const GraphedStepOptions& options) {
  if (stages.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("GraphedStep '%s': no stages", options.name));
  }
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (!stages[i].forward || !stages[i].backward) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GraphedStep '%s': the %s function of stage %d is empty", options.name,
                          !stages[i].forward ? "forward" : "backward", i));
    }
  }
  if (options.max_outstanding_forwards == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GraphedStep '%s': max_outstanding_forwards must be at least 1", options.name));
  }
  if (options.warmup_calls < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("GraphedStep '%s': warmup_calls must be >= 0, got %d",
                                                      options.name, options.warmup_calls));
  }
  for (std::size_t i = 0; i < options.participants.size(); ++i) {
    if (options.participants[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("GraphedStep '%s': capture participant %d is null", options.name, i));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GraphedStep>> GraphedStep::Create(CachingAllocator& allocator,
                                                                 std::vector<BufferView> params,
                                                                 ForwardFunction forward,
                                                                 BackwardFunction backward,
                                                                 GraphedStepOptions options) {
  std::vector<StageSpec> stages;
  stages.push_back(StageSpec{options.name, params.size(), std::move(forward), std::move(backward)});
  if (absl::Status s = Validate(stages, options); !s.ok()) return s;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].ptr == 0 || params[i].bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "GraphedStep '%s': parameter %d is empty; parameters are device buffers whose addresses "
          "the graphs keep",
          options.name, i));
    }
  }
  return std::unique_ptr<GraphedStep>(
      new GraphedStep(allocator, std::move(stages), std::move(params), std::move(options)));
}

absl::StatusOr<std::unique_ptr<GraphedStep>> GraphedStep::Create(CachingAllocator& allocator,
                                                                 std::vector<StageSpec> stages,
                                                                 GraphedStepOptions options) {
  if (absl::Status s = Validate(stages, options); !s.ok()) return s;
  return std::unique_ptr<GraphedStep>(new GraphedStep(allocator, std::move(stages), {}, std::move(options)));
}

GraphedStep::~GraphedStep() {
  // The step's graphs go away, so no retained backward can run any more: the deferred releases run now
  // (docs/graphed_step.md, "Lifetime rules").
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    while (!lane->pending.empty()) EndForward(*lane->pending.back());
  }
  deferred_.Flush();
  lanes_.clear();
}

absl::StatusOr<GraphedStep::Lane*> GraphedStep::NewLane() {
  if (lanes_.size() >= options_.max_outstanding_forwards) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "GraphedStep '%s': Forward called with %d forwards still waiting for their last backward in %d "
        "micro-batches (max_outstanding_forwards = %d); run a pending backward (or Discard a forward) first, "
        "or raise GraphedStepOptions::max_outstanding_forwards (each outstanding micro-batch needs its own "
        "recording)",
        options_.name, pending_forwards(), lanes_.size(), options_.max_outstanding_forwards));
  }
  auto lane = std::make_unique<Lane>();
  lane->index = lanes_.size();
  if (options_.graphed) {
    TreeOptions tree_options = options_.tree;
    tree_options.implicit_steps = false;  // a lane's step is a micro-batch: the step begins it
    absl::StatusOr<std::unique_ptr<GraphTree>> tree = GraphTree::Create(allocator_, std::move(tree_options));
    if (!tree.ok()) return tree.status();
    lane->tree = std::move(*tree);
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      std::vector<std::size_t> statics(stages_[s].spec.num_params);
      std::iota(statics.begin(), statics.end(), std::size_t{0});
      auto add = [&](const char* what, TreeFunction body, const std::vector<Generator*>& generators) {
        FunctionOptions function;
        function.name = stages_.size() == 1
                            ? absl::StrFormat("%s %s (lane %d)", options_.name, what, lane->index)
                            : absl::StrFormat("%s %s %s (lane %d)", options_.name, stages_[s].spec.name, what,
                                              lane->index);
        function.static_inputs = statics;
        function.warmup_calls = options_.warmup_calls;
        function.generators.assign(generators.begin(), generators.end());
        function.generators.insert(function.generators.end(), options_.participants.begin(),
                                   options_.participants.end());
        return lane->tree->Register(std::move(body), std::move(function));
      };
      absl::StatusOr<FunctionId> f = add(
          "forward", [this, s](std::span<const BufferView> in, Stream st) { return ForwardBody(s, in, st); },
          forward_generators_);
      if (!f.ok()) return f.status();
      absl::StatusOr<FunctionId> b = add(
          "backward",
          [this, s](std::span<const BufferView> in, Stream st) { return BackwardBody(s, in, st); },
          backward_generators_);
      if (!b.ok()) return b.status();
      lane->forward.push_back(*f);
      lane->backward.push_back(*b);
    }
  }
  lanes_.push_back(std::move(lane));
  return lanes_.back().get();
}

absl::StatusOr<GraphedStep::Lane*> GraphedStep::LaneFor(std::size_t stage, std::span<const CallInput> inputs,
                                                        bool& fresh) {
  fresh = false;
  // The micro-batch an input came from (an earlier stage's output passed on).
  for (const CallInput& in : inputs) {
    const OutputState* out = in.output();
    if (out == nullptr || out->kind != OutputKind::kPool || !out->Current()) continue;
    for (const std::unique_ptr<Lane>& lane : lanes_) {
      if (lane->tree != nullptr && out->origin->tree == lane->tree.get() && lane->open_for(stage))
        return lane.get();
    }
  }
  // The oldest micro-batch still running forwards that has not run this stage.
  Lane* oldest = nullptr;
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->open_for(stage) && (oldest == nullptr || lane->batch_number < oldest->batch_number))
      oldest = lane.get();
  }
  if (oldest != nullptr) return oldest;
  fresh = true;
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane->free()) return lane.get();
  }
  return NewLane();
}

std::vector<std::uint64_t> GraphedStep::Offsets(bool backward) const {
  const std::vector<Generator*>& gens = backward ? backward_generators_ : forward_generators_;
  std::vector<std::uint64_t> offsets;
  offsets.reserve(gens.size());
  for (const Generator* g : gens) offsets.push_back(g->host_offset());
  return offsets;
}

absl::StatusOr<StepForward> GraphedStep::Forward(std::span<const BufferView> inputs, Stream stream) {
  std::vector<CallInput> params(params_.begin(), params_.end());
  std::vector<CallInput> in(inputs.begin(), inputs.end());
  return Forward(0, params, in, stream);
}

absl::StatusOr<StepForward> GraphedStep::Forward(std::size_t stage, std::span<const CallInput> params,
                                                 std::span<const CallInput> inputs, Stream stream) {
  if (stage >= stages_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GraphedStep '%s': Forward of stage %d, the step has %d", options_.name, stage, stages_.size()));
  }
  if (params.size() != stages_[stage].spec.num_params) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GraphedStep '%s': stage %d takes %d parameters, Forward passed %d", options_.name,
                        stage, stages_[stage].spec.num_params, params.size()));
  }
  bool fresh = false;
  absl::StatusOr<Lane*> lane = LaneFor(stage, inputs, fresh);
  if (!lane.ok()) return lane.status();
  auto record = std::make_shared<ForwardRecord>();
  record->owner = this;
  record->id = next_forward_;
  record->stage = stage;
  record->lane = (*lane)->index;
  record->params.assign(params.begin(), params.end());
  if (options_.rng != nullptr) {
    absl::StatusOr<std::uint64_t> iteration = options_.rng->BeginForward();
    if (!iteration.ok()) return iteration.status();
    record->has_rng = true;
    record->rng_iteration = *iteration;
  }
  const std::vector<std::uint64_t> start = Offsets(/*backward=*/false);
  absl::StatusOr<std::vector<TreeOutput>> outs = RunForward(**lane, *record, fresh, params, inputs, stream);
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
  const std::size_t n = stages_[stage].num_outputs;
  record->outputs.assign(outs->begin(), outs->begin() + static_cast<std::ptrdiff_t>(n));
  record->saved.assign(outs->begin() + static_cast<std::ptrdiff_t>(n), outs->end());
  ++next_forward_;
  if (fresh) {
    (*lane)->stages_run.clear();
    (*lane)->backward_begun = false;
    (*lane)->batch_number = next_batch_++;
  }
  (*lane)->stages_run.push_back(stage);
  (*lane)->pending.push_back(record);
  return StepForward(std::move(record));
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::RunForward(Lane& lane, ForwardRecord& record, bool fresh,
                                                                std::span<const CallInput> params,
                                                                std::span<const CallInput> inputs,
                                                                Stream stream) {
  current_ = &record;
  struct Clear {
    const ForwardRecord*& current;
    ~Clear() { current = nullptr; }
  } clear{current_};
  if (lane.tree == nullptr) {
    std::vector<BufferView> in;
    in.reserve(params.size() + inputs.size());
    for (const CallInput& p : params) in.push_back(p.view());
    for (const CallInput& x : inputs) in.push_back(x.view());
    absl::StatusOr<std::vector<BufferView>> produced = ForwardBody(record.stage, in, stream);
    if (!produced.ok()) return produced.status();
    return WrapEager(*produced, in);
  }
  if (fresh) {
    // The lane's previous micro-batch is done: its memory may be reused, and what it handed out is
    // overwritten.
    lane.tree->BeginStep();
    lane.handed_out.clear();
    if (options_.before_lane_reuse) {
      if (absl::Status s = options_.before_lane_reuse(lane.index, stream); !s.ok()) return s;
    }
  }
  std::vector<CallInput> call;
  call.reserve(params.size() + inputs.size());
  call.insert(call.end(), params.begin(), params.end());
  call.insert(call.end(), inputs.begin(), inputs.end());
  absl::StatusOr<std::vector<TreeOutput>> outs = lane.tree->Call(lane.forward[record.stage], call, stream);
  if (!outs.ok()) return outs.status();
  record.node = lane.tree->last_call().node;
  record.eager = lane.tree->last_call().kind == TreeCallInfo::Kind::kEager;
  for (const TreeOutput& o : *outs) {
    if (o.kind() == OutputKind::kPool) lane.handed_out.push_back(o.state());
  }
  return outs;
}

absl::StatusOr<std::vector<BufferView>> GraphedStep::ForwardBody(std::size_t stage_index,
                                                                 std::span<const BufferView> in,
                                                                 Stream stream) {
  Stage& stage = stages_[stage_index];
  const std::size_t p = stage.spec.num_params;
  absl::StatusOr<ForwardResult> result = stage.spec.forward(ForwardArgs{
      in.first(p), in.subspan(p), stream, std::span<Generator* const>(forward_generators_), stage_index,
      current_ != nullptr ? current_->id : 0, current_ != nullptr ? current_->lane : 0});
  if (!result.ok()) return result.status();
  if (!stage.forward_shape_known) {
    stage.forward_shape_known = true;
    stage.num_outputs = result->outputs.size();
    stage.num_saved = result->saved.size();
  }
  if (result->outputs.size() != stage.num_outputs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the forward returned %d outputs, its first call %d; the outputs of a stage are fixed "
        "(what it saves may vary)",
        result->outputs.size(), stage.num_outputs));
  }
  std::vector<BufferView> all = std::move(result->outputs);
  all.insert(all.end(), result->saved.begin(), result->saved.end());
  return all;
}

absl::StatusOr<std::vector<BufferView>> GraphedStep::BackwardBody(std::size_t stage_index,
                                                                  std::span<const BufferView> in,
                                                                  Stream stream) {
  Stage& stage = stages_[stage_index];
  const std::size_t p = stage.spec.num_params;
  const std::size_t saved = current_ != nullptr ? current_->saved.size() : stage.num_saved;
  BackwardArgs args{in.first(p),
                    in.subspan(p, saved),
                    in.subspan(p + saved),
                    stream,
                    std::span<Generator* const>(backward_generators_),
                    stage_index};
  if (current_ != nullptr) {
    args.lane = current_->lane;
    args.forward_id = current_->id;
    args.forward_node = current_->node;
  }
  absl::StatusOr<std::vector<BufferView>> grads = stage.spec.backward(args);
  if (!grads.ok()) return grads.status();
  if (!stage.backward_shape_known) {
    stage.backward_shape_known = true;
    stage.num_grad_slots = grads->size();
  }
  if (grads->size() != stage.num_grad_slots) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the backward returned %d gradients, its first call %d; the gradient slots of a step are fixed",
        grads->size(), stage.num_grad_slots));
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
    return absl::FailedPreconditionError(absl::StrFormat(
        "GraphedStep '%s': forward %d has no pending backward: its last backward already "
        "ran, failed or it was discarded, and its saved state is released; pass retain_graph = "
        "true to every backward but the last, or run the forward again",
        options_.name, record->id));
  }
  const std::size_t expected = stages_[record->stage].num_outputs;
  if (grad_outputs != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GraphedStep '%s': Backward of forward %d got %d gradient outputs for %d forward outputs; "
        "pass one per output (an empty buffer where there is none)",
        options_.name, record->id, grad_outputs, expected));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::Backward(const StepForward& forward,
                                                              std::span<const BufferView> grad_outputs,
                                                              Stream stream, BackwardOptions options) {
  std::vector<CallInput> grads(grad_outputs.begin(), grad_outputs.end());
  return Backward(forward, std::span<const CallInput>(grads), stream, options);
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::Backward(const StepForward& forward,
                                                              std::span<const CallInput> grad_outputs,
                                                              Stream stream, BackwardOptions options) {
  const std::shared_ptr<ForwardRecord>& record = forward.record_;
  if (absl::Status s = CheckBackward(record.get(), grad_outputs.size()); !s.ok()) return s;
  Stage& stage = stages_[record->stage];
  if (!stage.policy_fixed) {  // the stage's capture: its gradient policy is fixed from here on
    stage.policy_fixed = true;
    stage.captured_alias = stage.alias;
  }
  lanes_[record->lane]->backward_begun = true;

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
  absl::StatusOr<std::vector<TreeOutput>> result = HandOutGradients(stage, std::move(*grads), stream);
  if (result.ok()) epilogue.Succeeded();
  return result;
}

absl::StatusOr<std::vector<TreeOutput>> GraphedStep::HandOutGradients(const Stage& stage,
                                                                      std::vector<TreeOutput> grads,
                                                                      Stream stream) const {
  std::vector<TreeOutput> result(grads.size());
  for (std::size_t slot = 0; slot < grads.size(); ++slot) {
    TreeOutput& g = grads[slot];
    if (g.empty() || g.bytes() == 0) continue;  // no gradient for this slot
    const bool alias = slot < stage.captured_alias.size() && stage.captured_alias[slot];
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
                                                                 std::span<const CallInput> grad_outputs,
                                                                 Stream stream) {
  Lane& lane = *lanes_[record.lane];
  current_ = &record;
  if (lane.tree == nullptr) {
    std::vector<BufferView> in;
    for (const CallInput& p : record.params) in.push_back(p.view());
    for (const TreeOutput& s : record.saved) in.push_back(s.state() ? s.state()->buffer : BufferView{});
    for (const CallInput& g : grad_outputs) in.push_back(g.view());
    absl::StatusOr<std::vector<BufferView>> grads = BackwardBody(record.stage, in, stream);
    if (!grads.ok()) return grads.status();
    return WrapEager(*grads, in);
  }
  std::vector<CallInput> call;
  call.reserve(record.params.size() + record.saved.size() + grad_outputs.size());
  call.insert(call.end(), record.params.begin(), record.params.end());
  for (const TreeOutput& s : record.saved) call.emplace_back(s);
  call.insert(call.end(), grad_outputs.begin(), grad_outputs.end());
  absl::StatusOr<std::vector<TreeOutput>> grads =
      record.eager ? lane.tree->CallEagerly(lane.backward[record.stage], call, stream)
                   : lane.tree->Call(lane.backward[record.stage], call, stream);
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
  if (!record.pending) return;
  record.pending = false;
  record.retained = false;
  record.saved.clear();  // eager: frees the buffers; graphed: the pool may reuse them
  ended_forwards_.push_back(record.id);
  std::vector<std::shared_ptr<ForwardRecord>>& pending = lanes_[record.lane]->pending;
  std::erase_if(pending, [&](const std::shared_ptr<ForwardRecord>& r) { return r.get() == &record; });
}

bool GraphedStep::AnyRetained() const {
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    for (const std::shared_ptr<ForwardRecord>& r : lane->pending) {
      if (r->retained) return true;
    }
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

absl::Status GraphedStep::SetAliasGradient(std::size_t stage_index, std::size_t slot, bool alias) {
  if (stage_index >= stages_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("GraphedStep '%s': no stage %d (the step has %d)",
                                                      options_.name, stage_index, stages_.size()));
  }
  Stage& stage = stages_[stage_index];
  if (stage.policy_fixed) {
    const bool now = slot < stage.captured_alias.size() && stage.captured_alias[slot];
    return absl::FailedPreconditionError(absl::StrFormat(
        "GraphedStep '%s': gradient slot %d%s was fixed as %s when the stage was captured (its first "
        "Backward); the policy of a captured step does not change: create another GraphedStep for another "
        "policy",
        options_.name, slot, stages_.size() > 1 ? absl::StrFormat(" of stage %d", stage_index) : "",
        now ? "aliased" : "cloned"));
  }
  if (slot >= stage.alias.size()) stage.alias.resize(slot + 1, false);
  stage.alias[slot] = alias;
  return absl::OkStatus();
}

bool GraphedStep::captured(std::size_t stage) const {
  return stage < stages_.size() && stages_[stage].policy_fixed;
}

std::size_t GraphedStep::pending_forwards() const {
  std::size_t n = 0;
  for (const std::unique_ptr<Lane>& lane : lanes_) n += lane->pending.size();
  return n;
}

std::size_t GraphedStep::saved_bytes() const {
  absl::flat_hash_set<const OutputState*> seen;
  std::size_t bytes = 0;
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    for (const std::shared_ptr<ForwardRecord>& r : lane->pending) {
      for (const TreeOutput& s : r->saved) {
        if (s.state() != nullptr && seen.insert(s.state().get()).second) bytes += s.bytes();
      }
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

std::size_t GraphedStep::stages() const { return stages_.size(); }

const GraphTree* GraphedStep::tree(std::size_t lane) const {
  return lane < lanes_.size() ? lanes_[lane]->tree.get() : nullptr;
}

}  // namespace graphalloc
