// The graph tree recorder: PyTorch's CUDA graph trees in C++ (docs/graph_tree_rules.md), on the Driver
// interface, so it runs on the simulated device and on a GPU.
//
// A user registers functions. A function takes input buffers and a stream, enqueues work on the stream
// and returns output buffers it allocated through the tree's allocator; some inputs are declared static
// (their address is expected to stay fixed, like parameters), the others are copied into the graph's own
// buffers on each call. A call of a function
//   - runs eagerly, in the tree's private pool, for its first `warmup_calls` calls (and for every call of
//     a step that already ran a warmup: warmup addresses are not stable, so nothing recorded may follow);
//   - then is recorded into a graph (a capture session into the pool) as a child of the node the step ran
//     last (none: a root), and launched;
//   - then, on later calls at the same place in a step, is replayed: its static inputs' addresses and its
//     inputs' sizes are looked up (one hash lookup) among the recordings there, and a match replays;
//   - on a mismatch (a static input moved, say), is recorded again as a sibling, at most `max_recordings`
//     times per (parent node, function); past that the function runs eagerly (outside the pool) at that
//     place from then on, with one logged warning naming the function, the input and both addresses; an
//     eager call is still a node of the step's path (docs/graph_tree_rules.md: aliasing, mutation,
//     fallback, generators).
// The tree shares one pool among all its recordings; each node keeps the allocator checkpoint taken right
// after it was recorded, and recording a new child of a node restores that checkpoint first, so a branch
// sees exactly the memory its parent left (and the outputs that died since are reused).
//
// Steps (generations): BeginStep() starts one; so does calling the function at the root of the current
// step again (TreeOptions::implicit_steps). Outputs of a step live in the pool and the next step's
// replays overwrite them: each output knows its step, and reading or passing one from an earlier step is
// an error that says how to keep it (tree_output.h). Clone outputs that must outlive the step.
//
// Not thread-safe: one thread at a time calls a tree (PyTorch serializes graph trees per device too).
// TreeOutput handles may be read from any thread. Outputs owned by handles (eager ones, clones) must not
// outlive the allocator.
#ifndef GRAPHALLOC_GRAPH_GRAPH_TREE_H_
#define GRAPHALLOC_GRAPH_GRAPH_TREE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/graph/capture_participant.h"
#include "graphalloc/graph/capture_session.h"
#include "graphalloc/graph/recording_key.h"
#include "graphalloc/graph/tree_dump.h"
#include "graphalloc/graph/tree_node.h"
#include "graphalloc/graph/tree_output.h"

namespace graphalloc {

class InputMutationCheck;  // graph/input_mutation_check.h

enum class TreeLogLevel { kInfo, kWarning };
// Where the tree's messages go: the eager-fallback warning (once per call site) and informational lines.
using TreeLogSink = std::function<void(TreeLogLevel level, std::string_view message)>;

struct TreeOptions {
  // Re-records allowed per (parent node, function) after the first recording there; past that, calls
  // there run eagerly. PyTorch's cudagraph_max_recording default.
  int max_recordings = 5;
  // Executables per (parent node, function), and whether a re-record first tries to update an existing
  // one in place (cuGraphExecUpdate, ~5% of an instantiation) before instantiating anew
  // (site_executables.h says which one it takes).
  std::size_t executables_per_site = 2;
  bool update_executables_first = true;
  CaptureOptions capture;
  // Calling the function at the root of the current step again begins a new step. Turn off when the
  // root function legitimately runs twice in a step (a reused layer) and call BeginStep() instead.
  bool implicit_steps = true;
  // Compare each copied input's bytes before and after every warmup call (a synchronizing host copy):
  // a function that writes a copied input it did not declare in FunctionOptions::mutated_inputs is
  // reported once (a warning naming it and the input) and runs eagerly from then on, since a recording
  // would write the graph's private copy instead. Off: such a write is not detected (declare it).
  bool check_input_mutation = true;
  // Where warmup calls run. In the pool (the default): their memory is the tree's, freed as their outputs
  // die. Outside it (false): as eager calls do, on the tree's stream, outputs owned by their handles; for
  // callers whose functions create lasting state on their first calls (lazily built caches, optimizer
  // state, library workspaces), which must not land in memory the tree's recordings reuse.
  bool warmup_in_pool = true;
  // A recording that leaves allocations in the pool beyond its outputs (state the function kept, not
  // returned) normally keeps them for the recording's life, with a warning. With this on, it fails instead
  // and the tree stops recording altogether: the kept memory stays where it is, owned by whatever holds
  // it, and every later call runs eagerly (replays would write into memory that is no longer the tree's).
  // For callers that cannot tell the tree what their functions keep (PyTorch programs).
  bool fail_on_leftover_allocations = false;
  // A recording that fails (the function's error, a capture the driver refused) normally puts the pool back
  // as it was and the call site tries again on the next call. With this on, the tree instead stops
  // recording (every later call runs eagerly, one warning) and leaves what the failed call allocated in the
  // pool to whatever holds it: for callers whose functions' memory may outlive a failure (a Python
  // exception keeps the frames, and the tensors, of the failed call).
  bool stop_recording_after_failure = false;
  // Whether new outputs of eager calls and of warmups outside the pool are owned by their handles (freed
  // with the last one) or only borrowed: for callers whose framework already owns what its functions
  // return (a PyTorch tensor frees its memory itself).
  bool eager_outputs_owned = true;
  // Before each recording, return the allocator's unused cached memory to the device
  // (CachingAllocator::EmptyCache), as PyTorch's torch.cuda.graph does before each capture: what warmups
  // cached outside the pool would otherwise stay reserved beside the pool the recording fills.
  bool release_cache_before_recording = false;
  // Empty: warnings go to stderr, info is dropped.
  TreeLogSink log;
};

// What the last GraphTree::Call did (for front ends that keep per-recording state of their own).
struct TreeCallInfo {
  enum class Kind : std::uint8_t { kWarmup, kRecord, kReplay, kEager };
  Kind kind = Kind::kWarmup;
  // The recorded node it recorded or replayed (TreeDumpNode::id); 0 for warmup and eager calls.
  std::uint64_t node = 0;
};

// What a function receives: its inputs as the graph sees them (static and managed inputs at the caller's
// addresses, copied inputs in the graph's own buffers) and the stream to enqueue on. It returns output
// buffers it allocated with the tree's allocator (CachingAllocator::Allocate; the tree routes them to its
// pool), or aliases of its inputs: an input returned as it is or a view of one (a sub-range), also of a
// copied input (the output is then the caller's buffer) or of an earlier output of the same call. New
// outputs must be whole allocations (the address Allocate returned). It must enqueue its work on `stream` (or
// on streams joined to it) and must not synchronize: during a recording it runs inside a stream capture.
using TreeFunction =
    std::function<absl::StatusOr<std::vector<BufferView>>(std::span<const BufferView> inputs, Stream stream)>;

struct FunctionOptions {
  std::string name;                             // for messages and the dump; "function <id>" when empty
  std::vector<std::size_t> static_inputs = {};  // indices of the static inputs
  int warmup_calls = 1;                         // eager calls (in the pool) before the first recording
  bool clone_outputs = false;                   // hand out owned copies that outlive the step
  // Indices of inputs the function writes. Static and managed inputs are read and written in place; a
  // copied one is copied into the graph's buffer before each launch and back into the caller's buffer
  // right after it (on the same stream), so the caller sees the write as an eager call would make it.
  std::vector<std::size_t> mutated_inputs = {};
  // The capture participants the function uses (capture_participant.h): the random generators it draws
  // from (rng/generator.h). A graph must not bake a (seed, offset) in, so each recording captures their
  // state (its own device slots) and every launch of it is preceded by the generator's replay prologue on
  // the launch stream: a sequence of calls draws exactly what the same sequence of eager calls would,
  // whether each call warms up, records, replays or runs eagerly. They must outlive the tree, and must not
  // be in another capture while the tree records. Drawing from a generator not listed here while the
  // function is recorded fails the recording (RecordingScope).
  std::vector<CaptureParticipant*> generators = {};
};

class GraphTree {
 public:
  // A tree with its own pool in `allocator` (which must outlive it) and its own stream for warmups and
  // recordings.
  static absl::StatusOr<std::unique_ptr<GraphTree>> Create(CachingAllocator& allocator,
                                                           TreeOptions options = {});
  // Waits for the device, then frees the pool: outputs of the tree are gone afterwards (reading one is an
  // error saying so).
  ~GraphTree();
  GraphTree(const GraphTree&) = delete;
  GraphTree& operator=(const GraphTree&) = delete;

  absl::StatusOr<FunctionId> Register(TreeFunction function, FunctionOptions options = {});

  // Runs `function` on `inputs` with its work ordered on `stream` (see the file comment for warmup,
  // recording, replay and eager fallback). Errors: an unknown function, an input that was overwritten, the
  // function's own error, or a driver or allocator failure; after any of them the tree and the allocator
  // stay usable and the call had no effect on the tree's state.
  absl::StatusOr<std::vector<TreeOutput>> Call(FunctionId function, std::span<const CallInput> inputs,
                                               Stream stream);
  // Runs this call eagerly whatever the tree would do (outputs as an eager call's), on the step's path:
  // for a call that depends on one that ran eagerly in a way a recording cannot capture (a backward
  // derived from an eager forward's state, on the forward's streams).
  absl::StatusOr<std::vector<TreeOutput>> CallEagerly(FunctionId function, std::span<const CallInput> inputs,
                                                      Stream stream);
  absl::StatusOr<std::vector<TreeOutput>> Call(FunctionId function, std::initializer_list<CallInput> inputs,
                                               Stream stream) {
    return Call(function, std::span<const CallInput>(inputs.begin(), inputs.size()), stream);
  }

  // Begins a new step: every pool output handed out so far becomes overwritten (an error to read), and the
  // next call starts at the roots.
  void BeginStep();
  std::uint64_t step() const;

  // What the last successful Call did.
  const TreeCallInfo& last_call() const { return last_call_; }
  // Set once a recording kept allocations it did not return (TreeOptions::fail_on_leftover_allocations):
  // the tree records nothing any more and every call runs eagerly; the reason, for messages.
  bool recording_disabled() const { return !disabled_reason_.empty(); }
  const std::string& disabled_reason() const { return disabled_reason_; }

  // The tree's structure and counters, for tests and users (FormatTreeDump prints it).
  TreeDump Dump() const;

  const PrivatePool& pool() const { return pool_; }
  // The tree's own stream (warmups and recordings run on it, joined to the caller's stream by events).
  Stream stream() const { return stream_; }

 private:
  struct Function {
    TreeFunction body;
    FunctionOptions options;
    std::vector<bool> is_static;
    std::vector<bool> is_mutated;
    std::shared_ptr<const OutputOrigin> origin;
    int warmup_runs = 0;
    // Set when a warmup found an undeclared write to a copied input: every call runs eagerly.
    bool runs_eagerly = false;
    std::string eager_warning;
  };

  GraphTree(CachingAllocator& allocator, TreeOptions options);
  absl::Status Init();

  // The destructor's cleanup when recording was disabled: frees the pool's blocks but the kept ones.
  void FreeAllButKept();

  // ---- Dispatch and steps (graph_tree.cc). ----
  void EndStep();
  CallSite& SiteFor(TreeNode* parent, FunctionId function);
  absl::Status CheckInputs(std::span<const CallInput> inputs) const;
  // scratch_views_ = the inputs' views: what a function is passed before copied inputs are staged.
  void ViewInputs(std::span<const CallInput> inputs);
  // How input `i` of a call of `fn` is passed to the graph (recording_key.h).
  InputRole RoleOf(const Function& fn, std::size_t i, const CallInput& input) const;
  // Fills scratch_key_ for a call of `fn`.
  void BuildKey(const Function& fn, std::span<const CallInput> inputs);
  TreeNode* FindReplayable(CallSite& site) const;
  bool LivenessAllows(const TreeNode& node) const;
  KeyMismatch ExplainMiss(const CallSite& site) const;
  absl::StatusOr<std::vector<TreeOutput>> Replay(TreeNode& node, std::span<const CallInput> inputs,
                                                 Stream stream);
  // Launches `node`'s graph on `stream` (its copied inputs already copied in): takes an executable of its
  // site, re-arms the function's participants, launches, and writes declared mutated inputs back.
  absl::Status LaunchNode(TreeNode& node, std::span<const CallInput> inputs, Stream stream);
  // Re-arms the function's participants for a launch of `node` on `stream` (their ArmReplay).
  absl::Status ArmParticipants(const TreeNode& node, Stream stream);
  // Copies declared mutated copied inputs back into the caller's buffers after a launch of `node`.
  absl::Status WriteBack(const TreeNode& node, std::span<const CallInput> inputs, Stream stream);
  // An eager call: a node of the path (the site's eager node; none during a warmup step) whose outputs
  // are the caller's.
  absl::StatusOr<std::vector<TreeOutput>> RunEager(Function& fn, CallSite* site,
                                                   std::span<const CallInput> inputs, Stream stream);
  // Marks `site` eager with `warning` and makes its eager node.
  void MakeSiteEager(CallSite& site, std::string warning);
  // Output handles for one call, from its specs: new outputs get `new_kind` (kPool: of this step,
  // `recorded` when a recording made them; kOwned: eager). Fills `entry.outputs` (tree_recording.cc).
  std::vector<TreeOutput> MakeOutputs(const Function& fn, std::span<const OutputSpec> specs,
                                      std::span<const CallInput> inputs, OutputKind new_kind, bool recorded,
                                      PathEntry& entry);
  // Hands out a recorded node's outputs for this step and appends the call to the path.
  absl::StatusOr<std::vector<TreeOutput>> FinishRecordedCall(TreeNode& node,
                                                             std::span<const CallInput> inputs,
                                                             Stream stream);
  absl::StatusOr<std::vector<TreeOutput>> MaybeClone(const Function& fn, std::vector<TreeOutput> outputs,
                                                     Stream stream);
  void Log(TreeLogLevel level, std::string_view message) const;

  // ---- The pool's layout (tree_recording.cc). ----
  absl::Status JoinTreeToCaller(Stream caller);
  absl::Status JoinCallerToTree(Stream caller);
  // The pool's layout now, once blocks waiting on stream events have settled.
  absl::StatusOr<PoolCheckpoint> CheckpointPool();
  // Makes the pool's layout what it was right after `parent` was recorded (empty for a root), minus the
  // outputs that died since.
  absl::Status PreparePoolFor(const TreeNode* parent);
  // Frees the blocks of warmup calls on the path: the dead ones, or all (`all`) at the end of a step.
  void FreeWarmupBlocks(bool all);
  // What the function returned, classified (OutputSpec); `seen` is what it was passed.
  static std::vector<OutputSpec> ClassifyOutputs(std::span<const BufferView> seen,
                                                 std::span<const BufferView> produced);

  // ---- Warmup (tree_recording.cc). ----
  absl::StatusOr<std::vector<TreeOutput>> Warmup(FunctionId id, std::span<const CallInput> inputs,
                                                 Stream stream);
  // A warmup outside the pool (TreeOptions::warmup_in_pool = false): on the tree's stream, outputs owned.
  absl::StatusOr<std::vector<TreeOutput>> WarmupOutsidePool(FunctionId id, std::span<const CallInput> inputs,
                                                            Stream stream);
  // Whether a warmup of `fn` compares input `i` before and after the call
  // (TreeOptions::check_input_mutation).
  bool ChecksForMutation(const Function& fn, std::size_t i, const CallInput& input) const;
  // Gives `check` the bytes of the inputs a warmup of `fn` compares (synchronizing `stream` once first);
  // false when it compares none.
  absl::StatusOr<bool> TakeInputsBeforeWarmup(const Function& fn, std::span<const CallInput> inputs,
                                              Stream stream, InputMutationCheck& check);
  // Runs `fn` on scratch_views_ on the tree's stream, what it allocates routed to the pool.
  absl::StatusOr<std::vector<BufferView>> RunInPool(const Function& fn);
  // After a warmup of `fn` (its work on the tree's stream): an input that changed makes `fn` run eagerly
  // from then on, with one warning naming it and the input.
  absl::Status CheckWarmupMutation(Function& fn, InputMutationCheck& check);
  // Appends a successful warmup call of `id` to the path (its new outputs: blocks to free once dead) and
  // returns its output handles.
  std::vector<TreeOutput> AddWarmupCall(FunctionId id, std::span<const OutputSpec> specs,
                                        std::span<const CallInput> inputs);

  // ---- Recording (tree_recording.cc): Record's steps, in order. ----
  absl::StatusOr<std::vector<TreeOutput>> Record(CallSite& site, std::span<const CallInput> inputs,
                                                 Stream stream, const KeyMismatch& why);
  // A node for a recording at `site`, keyed by scratch_key_ (not yet in the site).
  std::unique_ptr<TreeNode> NewNode(CallSite& site, const KeyMismatch& why) const;
  // Every step that may fail, in order; returns how many blocks the pool holds allocated afterwards.
  absl::StatusOr<std::size_t> RecordNode(const Function& fn, TreeNode& node,
                                         std::span<const CallInput> inputs, Stream stream);
  // Allocates the graph's own buffers for copied inputs in the pool and fills them now (a capture records,
  // it does not run); scratch_views_ becomes what the captured function is passed.
  absl::Status StageCopiedInputs(const Function& fn, TreeNode& node, std::span<const CallInput> inputs);
  // Captures the function into node.graph, its participants begun before and ended right after (their
  // Captured kept in the node); classifies its outputs.
  absl::Status CaptureBody(const Function& fn, TreeNode& node);
  // Frees the copy buffers, takes node.checkpoint and checks that every new output is a block of it;
  // returns how many blocks it holds allocated.
  absl::StatusOr<std::size_t> CheckpointRecording(const Function& fn, TreeNode& node);
  // Which outputs of the path the node may overwrite (dead now) and which its checkpoint holds.
  void NoteLiveness(TreeNode& node) const;
  // Makes the node one of `site`'s recordings (counters, log, the pool's layout is its checkpoint).
  TreeNode& AddRecording(CallSite& site, std::unique_ptr<TreeNode> node, const KeyMismatch& why,
                         std::size_t allocated);
  // Undoes a failed recording (the node goes, the pool goes back to the parent's layout) and returns
  // `error` saying so.
  absl::Status FailRecording(CallSite& site, std::unique_ptr<TreeNode> node, const Function& fn,
                             const absl::Status& error);
  // FailRecording under TreeOptions::stop_recording_after_failure: `before` are the pool's allocated blocks
  // before the recording began; what the failed call added is left to its holders.
  absl::Status StopRecordingAfter(CallSite& site, std::unique_ptr<TreeNode> node, const Function& fn,
                                  const absl::Status& error, const absl::flat_hash_set<DevicePtr>& before);
  // TreeOptions::fail_on_leftover_allocations: when `node`'s checkpoint holds blocks beyond its live
  // outputs, disables recording (the pool is left as it is: something outside the tree owns those blocks)
  // and returns the error naming the function; OK otherwise.
  absl::Status CheckLeftovers(const Function& fn, CallSite& site, std::unique_ptr<TreeNode>& node,
                              std::size_t allocated);

  CachingAllocator& allocator_;
  Driver& driver_;
  const TreeOptions options_;
  PrivatePool pool_;
  PoolCheckpoint empty_checkpoint_;  // the pool with nothing allocated: what a root records against
  GraphPin pin_;                     // graphs replay into the pool: its memory stays mapped where it is
  Stream stream_ = kDefaultStream;
  Event caller_ready_{};
  Event tree_done_{};
  std::shared_ptr<TreeEpoch> epoch_ = std::make_shared<TreeEpoch>();

  std::vector<Function> functions_;
  absl::flat_hash_map<FunctionId, std::unique_ptr<CallSite>> roots_;
  std::vector<PathEntry> path_;
  TreeNode* current_ = nullptr;  // the last recorded call of this step; nullptr: at the roots
  bool in_warmup_ = false;       // this step ran a warmup: the rest of it runs warmups too
  // Whether the pool's layout is exactly `pool_layout_`'s checkpoint (nullptr: the empty one), so that
  // recording a child of it needs no restore.
  bool pool_layout_known_ = true;
  const TreeNode* pool_layout_ = nullptr;
  bool launched_ = false;  // anything was launched (the destructor then waits for the device)

  TreeCallInfo last_call_;
  std::string disabled_reason_;  // non-empty: recording is disabled (recording_disabled())
  // The blocks a recording kept when recording was disabled: their holders free them, never the tree.
  absl::flat_hash_set<DevicePtr> kept_blocks_;

  RecordingKey scratch_key_;
  std::vector<BufferView> scratch_views_;
  std::uint64_t next_node_id_ = 1;
  TreeCounters counters_;
};

// A warning sink that writes to stderr (the default).
void LogTreeMessageToStderr(TreeLogLevel level, std::string_view message);

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_GRAPH_TREE_H_
