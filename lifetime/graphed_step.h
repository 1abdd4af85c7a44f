// A graphed training step: a forward function and its backward recorded as a pair of CUDA graphs in one
// private pool (the C++ counterpart of PyTorch's and TransformerEngine's make_graphed_callables), built so
// that it never hands out memory a replay will overwrite (docs/graphed_step.md, "Lifetime rules"; the
// randomness side in docs/rng.md).
//
// The pieces:
//   - Stages: a step graphs one or several callables (stages), each a forward and a backward, all
//     recorded in one tree per lane, so that they share one pool (PyTorch's make_graphed_callables over a
//     tuple of modules). A micro-batch is what one lane's step holds: the forwards of its stages, then
//     their backwards, in whatever order they come.
//   - Parameters are static inputs of the tree: their addresses are baked into the graphs. Create with
//     fixed parameters takes them once (update them in place); the staged form takes each stage's
//     parameters with every Forward, so a parameter that moved is seen: the tree records again for the
//     new address (up to its re-record limit, then runs the stage eagerly), never replays the old one.
//   - Forward(inputs) runs the forward (warmup, recording or replay, through a GraphTree) and returns a
//     StepForward: the outputs, and the saved state its backward reads, which the step keeps alive until
//     that forward's last backward.
//   - Backward(forward, grad_outputs) runs the backward on what that forward saved and returns one
//     gradient per slot (whatever the backward function returns, in its order). By default every slot is a
//     copy out of the graph's static memory, owned by the caller, so no later replay can change it (the bug
//     of TransformerEngine PR 2937 / pytorch#181723). SetAliasGradient(slot, true) opts a slot out: it
//     then aliases the static buffer, and reading it after the next step of its lane is the tree's
//     "overwritten" error. The policy is fixed when the step is captured (its first Backward) and later
//     changes are refused, so a captured step never changes behaviour.
//   - Lanes: a lane is a GraphTree of its own (its own pool) whose steps are micro-batches. A forward of
//     stage s joins the lane of the micro-batch it continues: the lane one of its inputs is a pool output
//     of (an earlier stage's output passed on), else the oldest lane whose micro-batch has not run stage s
//     nor begun a backward; else it begins a micro-batch on the first free lane (every forward of it
//     ended), else on a new lane. So a second forward while a backward is pending gets a separate
//     recording in a separate pool, one per outstanding micro-batch (Megatron's one runner per
//     outstanding micro-batch); past max_outstanding_forwards lanes, Forward is an error. Any schedule
//     (in order, f0 f1 b1 b0, 1F1B and interleaved pipelines) replays once recorded.
//   - retain_graph: Backward(fwd, grads, stream, {.retain_graph = true}) leaves the forward pending, its
//     saved state intact, and the backward can run again. Releases asked for (RequestRelease) while any
//     retained backward may still run are deferred and run together in one epilogue (deferred_releases.h),
//     which every Backward runs on its way out, also when it fails or an exception passes through it.
//   - Randomness: with an RngStatePairs (rng/rng_state_pairs.h), the forward draws from the forward
//     generators and the backward from the backward generators, positioned at its own forward's start,
//     also out of order and when retained. A backward must reserve exactly what its forward reserved, in
//     the same order: a dropout backward reserves what its dropout forward did, and a recomputed forward
//     (activation checkpointing) reserves as the forward did and then reuses those PhiloxArgs for the
//     backward kernels. The step checks the totals per op and fails a backward that drew differently.
//
// Eager mode (GraphedStepOptions::graphed = false) runs the same functions directly on the caller's stream
// with the same lifetime rules: the reference a graphed step is compared with, bit for bit.
//
// Not thread-safe (one thread drives a step). Use one caller stream: the step relies on stream order
// between a backward and the next use of the memory it released.
#ifndef GRAPHALLOC_LIFETIME_GRAPHED_STEP_H_
#define GRAPHALLOC_LIFETIME_GRAPHED_STEP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/graph/graph_tree.h"
#include "graphalloc/graph/tree_output.h"
#include "graphalloc/lifetime/deferred_releases.h"
#include "graphalloc/rng/rng_state_pairs.h"

namespace graphalloc {

// What the forward function receives.
struct ForwardArgs {
  std::span<const BufferView> params;      // the stage's parameters, at their own addresses
  std::span<const BufferView> inputs;      // this micro-batch (graphed: the graph's copies of the caller's)
  Stream stream;                           // enqueue everything here; never synchronize
  std::span<Generator* const> generators;  // forward generator of each random op
  std::size_t stage = 0;                   // which stage (callable) runs
  std::uint64_t forward_id = 0;            // the StepForward::id() this call will have
  std::size_t lane = 0;                    // the lane it runs in (tree(lane) when graphed)

  Generator& generator(std::size_t op) const { return *generators[op]; }
};

// What it returns: buffers allocated with the step's allocator during the call (or parameters as they
// are). Inputs are the graph's own copies when graphed: save a copy of an input, never the input itself.
struct ForwardResult {
  std::vector<BufferView> outputs;  // handed to the caller
  std::vector<BufferView> saved;    // read by the backward; kept until the forward's last backward
};

struct BackwardArgs {
  std::span<const BufferView> params;
  std::span<const BufferView> saved;         // what this backward's forward saved
  std::span<const BufferView> grad_outputs;  // (graphed: the graph's copies of the caller's)
  Stream stream;
  std::span<Generator* const> generators;  // backward generators, at this forward's starting positions
  std::size_t stage = 0;
  std::size_t lane = 0;
  std::uint64_t forward_id = 0;  // the forward whose backward this is
  // The recorded node the forward recorded or replayed (TreeCallInfo::node); 0 when it ran as a warmup
  // or eagerly. A front end whose backward is derived from what a forward call built (an autograd graph)
  // finds it by this: every forward that replays node n saved into node n's buffers.
  std::uint64_t forward_node = 0;

  Generator& generator(std::size_t op) const { return *generators[op]; }
};

using ForwardFunction = std::function<absl::StatusOr<ForwardResult>(const ForwardArgs&)>;
// Returns one gradient per slot, newly allocated during the call; an empty BufferView for a slot with no
// gradient. The slot count must not change between calls.
using BackwardFunction = std::function<absl::StatusOr<std::vector<BufferView>>(const BackwardArgs&)>;

// One stage of a staged step: a callable's forward and backward, and how many parameters its forwards
// take (the first inputs of every call, static inputs of the tree).
struct StageSpec {
  std::string name;
  std::size_t num_params = 0;
  ForwardFunction forward;
  BackwardFunction backward;
};

struct GraphedStepOptions {
  std::string name = "step";
  // false: run the functions eagerly (no graphs, default pool), with the same lifetime rules.
  bool graphed = true;
  int warmup_calls = 1;  // eager calls per lane before a function is recorded
  // Lanes (forwards whose last backward has not run) at most; one more Forward is an error.
  std::size_t max_outstanding_forwards = 4;
  // Random ops' generator pairs, or null when the functions draw nothing. Shared so the caller can look
  // at them; it must not be used by anything else while the step lives.
  std::shared_ptr<RngStatePairs> rng = nullptr;
  // For each lane's tree: its log sink and re-record limit (implicit_steps is always off: the step
  // begins a lane's steps itself).
  TreeOptions tree = {};
  // Capture participants every stage's forward and backward take part with (random generators of a front
  // end, graph/capture_participant.h), after the generators of `rng`. They must outlive the step.
  std::vector<CaptureParticipant*> participants = {};
  // Called on the caller's stream when a lane begins its next micro-batch: after the outputs it handed out
  // for the previous one stopped being current (TreeOutput::Current), before anything of the new one is
  // launched over them. The last moment a front end can copy out what its caller still holds and was
  // promised to keep (parameter gradients it owns); copies enqueued on `stream` read the old values. An
  // error fails that Forward.
  std::function<absl::Status(std::size_t lane, Stream stream)> before_lane_reuse = nullptr;
};

struct BackwardOptions {
  // This backward may run again for the same forward: its saved state stays and releases are deferred.
  bool retain_graph = false;
};

struct ForwardRecord;  // graphed_step.cc

// One forward of a GraphedStep: its outputs and its pending backward. Cheap to copy.
class StepForward {
 public:
  StepForward() = default;
  // Outputs of the forward (pool outputs of its lane when graphed: valid until the lane's next step, clone
  // what must outlive it).
  const std::vector<TreeOutput>& outputs() const;
  // The forward's number (0, 1, ...), in the order Forward was called.
  std::uint64_t id() const;
  // Whether a backward may still run for it.
  bool pending() const;
  std::size_t stage() const;
  // How many buffers it saved for its backward (the backward's arguments after the parameters).
  std::size_t saved_count() const;
  // The lane it runs in, and the tree node it recorded or replayed (0: a warmup or eager call).
  std::size_t lane() const;
  std::uint64_t node() const;

 private:
  friend class GraphedStep;
  explicit StepForward(std::shared_ptr<ForwardRecord> record) : record_(std::move(record)) {}
  std::shared_ptr<ForwardRecord> record_;
};

class GraphedStep {
 public:
  // A step over `params` (fixed for its life) in `allocator` (which, like the params and options.rng,
  // must outlive it).
  static absl::StatusOr<std::unique_ptr<GraphedStep>> Create(CachingAllocator& allocator,
                                                             std::vector<BufferView> params,
                                                             ForwardFunction forward,
                                                             BackwardFunction backward,
                                                             GraphedStepOptions options = {});
  // A staged step: each Forward names its stage and passes that stage's parameters.
  static absl::StatusOr<std::unique_ptr<GraphedStep>> Create(CachingAllocator& allocator,
                                                             std::vector<StageSpec> stages,
                                                             GraphedStepOptions options = {});
  // Runs the deferred releases (the step's graphs are going away), then frees the lanes.
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  absl::StatusOr<StepForward> Forward(std::span<const BufferView> inputs, Stream stream);
  absl::StatusOr<StepForward> Forward(std::initializer_list<BufferView> inputs, Stream stream) {
    return Forward(std::span<const BufferView>(inputs.begin(), inputs.size()), stream);
  }
  // A forward of `stage` (staged steps): `params` are the stage's parameters now (num_params of them),
  // `inputs` the micro-batch's (outputs of earlier stages may be passed as they are).
  absl::StatusOr<StepForward> Forward(std::size_t stage, std::span<const CallInput> params,
                                      std::span<const CallInput> inputs, Stream stream);

  // Gradients for `forward`, one per slot (see the file comment for cloning, aliasing and retain_graph).
  // Errors before the backward starts (a forward with no pending backward, a wrong number of gradient
  // outputs) change nothing. A backward that fails once started (its function, a launch, mismatched
  // random draws) ends its forward: the epilogue releases its saved state and flushes the deferred
  // releases that no other retained backward still needs; run the forward again.
  absl::StatusOr<std::vector<TreeOutput>> Backward(const StepForward& forward,
                                                   std::span<const BufferView> grad_outputs, Stream stream,
                                                   BackwardOptions options = {});
  absl::StatusOr<std::vector<TreeOutput>> Backward(const StepForward& forward,
                                                   std::initializer_list<BufferView> grad_outputs,
                                                   Stream stream, BackwardOptions options = {}) {
    return Backward(forward, std::span<const BufferView>(grad_outputs.begin(), grad_outputs.size()), stream,
                    options);
  }
  absl::StatusOr<std::vector<TreeOutput>> Backward(const StepForward& forward,
                                                   std::span<const CallInput> grad_outputs, Stream stream,
                                                   BackwardOptions options = {});

  // A pending forward whose backward will not run (an evaluation pass, an abandoned micro-batch): ends it
  // as its last backward would, without running anything.
  absl::Status Discard(const StepForward& forward);

  // Runs `release` now when no retained backward may still run, else in the epilogue of the backward
  // that leaves none (or in the destructor). `what` names it in deferred_release_names().
  void RequestRelease(std::string what, DeferredReleases::Release release);

  // Gradient slot `slot` (of `stage`) aliases the graph's static buffer instead of being cloned (the
  // default). FailedPrecondition once the stage is captured (its first Backward): the policy is fixed then.
  absl::Status SetAliasGradient(std::size_t slot, bool alias) { return SetAliasGradient(0, slot, alias); }
  absl::Status SetAliasGradient(std::size_t stage, std::size_t slot, bool alias);
  bool captured() const { return captured(0); }
  bool captured(std::size_t stage) const;

  // The ids of the forwards that ended (their last backward ran, they were discarded or failed) since the
  // last call, in order: for front ends that keep per-forward state of their own.
  std::vector<std::uint64_t> TakeEndedForwards() { return std::exchange(ended_forwards_, {}); }

  // ---- Introspection (tests, debugging). ----
  std::size_t pending_forwards() const;
  std::size_t deferred_releases() const { return deferred_.size(); }
  std::vector<std::string> deferred_release_names() const { return deferred_.Describe(); }
  // Bytes of the state pending backwards keep (saved buffers, counted once each).
  std::size_t saved_bytes() const;
  // Bytes of the lanes' pool outputs that something still references in their current steps: what the
  // next recording must keep. 0 in eager mode.
  std::size_t live_pool_bytes() const;
  std::size_t lanes() const { return lanes_.size(); }
  // Lane `lane`'s tree (nullptr in eager mode), for dumps and counters.
  const GraphTree* tree(std::size_t lane) const;
  std::size_t stages() const;

 private:
  struct Lane;
  struct Stage;
  class BackwardEpilogue;

  GraphedStep(CachingAllocator& allocator, std::vector<StageSpec> stages, std::vector<BufferView> params,
              GraphedStepOptions options);
  static absl::Status Validate(const std::vector<StageSpec>& stages, const GraphedStepOptions& options);
  // The lane a forward of `stage` with `inputs` joins (see the file comment), made if needed; `fresh` says
  // whether it begins a micro-batch there.
  absl::StatusOr<Lane*> LaneFor(std::size_t stage, std::span<const CallInput> inputs, bool& fresh);
  absl::StatusOr<Lane*> NewLane();
  absl::StatusOr<std::vector<TreeOutput>> RunForward(Lane& lane, ForwardRecord& record, bool fresh,
                                                     std::span<const CallInput> params,
                                                     std::span<const CallInput> inputs, Stream stream);
  // Why Backward cannot run for `record` with `grad_outputs` gradients (OK when it can).
  absl::Status CheckBackward(const ForwardRecord* record, std::size_t grad_outputs) const;
  absl::StatusOr<std::vector<TreeOutput>> RunBackward(ForwardRecord& record,
                                                      std::span<const CallInput> grad_outputs, Stream stream);
  // The graphed step's tree functions: a stage's functions behind the tree's calling convention. The
  // forward/backward being run is current_ (the tree calls bodies synchronously).
  absl::StatusOr<std::vector<BufferView>> ForwardBody(std::size_t stage, std::span<const BufferView> in,
                                                      Stream stream);
  absl::StatusOr<std::vector<BufferView>> BackwardBody(std::size_t stage, std::span<const BufferView> in,
                                                       Stream stream);
  // The backward's gradients as the caller gets them: cloned out of the pool unless the slot aliases.
  absl::StatusOr<std::vector<TreeOutput>> HandOutGradients(const Stage& stage, std::vector<TreeOutput> grads,
                                                           Stream stream) const;
  // Eager outputs as handles: owned unless they are an input (borrowed) or repeat an earlier one.
  std::vector<TreeOutput> WrapEager(std::span<const BufferView> produced, std::span<const BufferView> inputs);
  absl::Status CheckDraws(const ForwardRecord& record, const std::vector<std::uint64_t>& start) const;
  std::vector<std::uint64_t> Offsets(bool backward) const;
  // The end of a forward's last (or failed) backward, and of a Discard.
  void EndForward(ForwardRecord& record);
  bool AnyRetained() const;

  CachingAllocator& allocator_;
  const std::vector<BufferView> params_;
  const GraphedStepOptions options_;
  std::vector<Stage> stages_;
  std::vector<Generator*> forward_generators_;
  std::vector<Generator*> backward_generators_;
  std::shared_ptr<const OutputOrigin> eager_origin_;

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::uint64_t next_forward_ = 0;
  std::uint64_t next_batch_ = 0;
  // The forward or backward whose body the tree is about to run (set around each tree call).
  const ForwardRecord* current_ = nullptr;

  std::vector<std::uint64_t> ended_forwards_;
  DeferredReleases deferred_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_LIFETIME_GRAPHED_STEP_H_
