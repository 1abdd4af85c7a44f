// A graphed training step: a forward function and its backward recorded as a pair of CUDA graphs in one
// private pool (the C++ counterpart of PyTorch's and TransformerEngine's make_graphed_callables), built so
// that it never hands out memory a replay will overwrite (docs/graphed_step.md, "Lifetime rules"; the
// randomness side in docs/rng.md).
//
// The pieces:
//   - Parameters are fixed at Create: their addresses are baked into the graphs (static inputs of the
//     tree), so they must stay allocated at those addresses; update them in place.
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
//   - Lanes: each forward takes the first lane with no pending backward. A lane is a GraphTree of its own
//     (its own pool) whose steps are "forward, its backwards", so a second forward while a backward is
//     pending gets a separate recording in a separate pool, one per outstanding micro-batch (Megatron's
//     one runner per outstanding micro-batch); past max_outstanding_forwards, Forward is an
//     error. Any schedule (in order, f0 f1 b1 b0, 1F1B pipelines) replays once recorded.
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
#ifndef GRAPHALLOC_GRAPH_LIFETIME_GRAPHED_STEP_H_
#define GRAPHALLOC_GRAPH_LIFETIME_GRAPHED_STEP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/caching_allocator.h"
#include "graphalloc/graph/graph_tree.h"
#include "graphalloc/graph/lifetime/deferred_releases.h"
#include "graphalloc/graph/tree_output.h"
#include "graphalloc/rng/rng_state_pairs.h"

namespace graphalloc {

// What the forward function receives.
struct ForwardArgs {
  std::span<const BufferView> params;      // the step's parameters, at their own addresses
  std::span<const BufferView> inputs;      // this micro-batch (graphed: the graph's copies of the caller's)
  Stream stream;                           // enqueue everything here; never synchronize
  std::span<Generator* const> generators;  // forward generator of each random op

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

  Generator& generator(std::size_t op) const { return *generators[op]; }
};

using ForwardFunction = std::function<absl::StatusOr<ForwardResult>(const ForwardArgs&)>;
// Returns one gradient per slot, newly allocated during the call; an empty BufferView for a slot with no
// gradient. The slot count must not change between calls.
using BackwardFunction = std::function<absl::StatusOr<std::vector<BufferView>>(const BackwardArgs&)>;

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
  // Runs the deferred releases (the step's graphs are going away), then frees the lanes.
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  absl::StatusOr<StepForward> Forward(std::span<const BufferView> inputs, Stream stream);
  absl::StatusOr<StepForward> Forward(std::initializer_list<BufferView> inputs, Stream stream) {
    return Forward(std::span<const BufferView>(inputs.begin(), inputs.size()), stream);
  }

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

  // A pending forward whose backward will not run (an evaluation pass, an abandoned micro-batch): ends it
  // as its last backward would, without running anything.
  absl::Status Discard(const StepForward& forward);

  // Runs `release` now when no retained backward may still run, else in the epilogue of the backward
  // that leaves none (or in the destructor). `what` names it in deferred_release_names().
  void RequestRelease(std::string what, DeferredReleases::Release release);

  // Gradient slot `slot` aliases the graph's static buffer instead of being cloned (the default).
  // FailedPrecondition once the step is captured (its first Backward): the policy is fixed then.
  absl::Status SetAliasGradient(std::size_t slot, bool alias);
  bool captured() const { return policy_fixed_; }

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

 private:
  struct Lane;
  class BackwardEpilogue;

  GraphedStep(CachingAllocator& allocator, std::vector<BufferView> params, ForwardFunction forward,
              BackwardFunction backward, GraphedStepOptions options);
  absl::StatusOr<Lane*> FreeLane();
  absl::StatusOr<std::vector<TreeOutput>> RunForward(Lane* lane, std::span<const BufferView> inputs,
                                                     Stream stream);
  // Why Backward cannot run for `record` with `grad_outputs` gradients (OK when it can).
  absl::Status CheckBackward(const ForwardRecord* record, std::size_t grad_outputs) const;
  absl::StatusOr<std::vector<TreeOutput>> RunBackward(ForwardRecord& record,
                                                      std::span<const BufferView> grad_outputs,
                                                      Stream stream);
  // The graphed step's tree functions: the user's functions behind the tree's calling convention.
  absl::StatusOr<std::vector<BufferView>> ForwardBody(std::span<const BufferView> in, Stream stream);
  absl::StatusOr<std::vector<BufferView>> BackwardBody(std::span<const BufferView> in, Stream stream);
  // The backward's gradients as the caller gets them: cloned out of the pool unless the slot aliases.
  absl::StatusOr<std::vector<TreeOutput>> HandOutGradients(std::vector<TreeOutput> grads,
                                                           Stream stream) const;
  // Eager outputs as handles: owned unless they are a parameter (borrowed) or repeat an earlier one.
  std::vector<TreeOutput> WrapEager(std::span<const BufferView> produced, std::span<const BufferView> inputs);
  absl::Status CheckDraws(const ForwardRecord& record, const std::vector<std::uint64_t>& start) const;
  std::vector<std::uint64_t> Offsets(bool backward) const;
  // The end of a forward's last (or failed) backward, and of a Discard.
  void EndForward(ForwardRecord& record);
  bool AnyRetained() const;

  CachingAllocator& allocator_;
  const std::vector<BufferView> params_;
  const ForwardFunction forward_;
  const BackwardFunction backward_;
  const GraphedStepOptions options_;
  std::vector<Generator*> forward_generators_;
  std::vector<Generator*> backward_generators_;
  std::shared_ptr<const OutputOrigin> eager_origin_;

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::uint64_t next_forward_ = 0;
  // Fixed by the first forward / backward body run.
  std::size_t num_outputs_ = 0, num_saved_ = 0, num_grad_slots_ = 0;
  bool forward_shape_known_ = false, backward_shape_known_ = false;

  std::vector<bool> alias_;  // per slot, as set; copied to captured_alias_ at capture
  std::vector<bool> captured_alias_;
  bool policy_fixed_ = false;

  DeferredReleases deferred_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_LIFETIME_GRAPHED_STEP_H_
