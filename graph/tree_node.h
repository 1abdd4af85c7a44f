// The pieces of a graph tree: recorded nodes, the call sites that hold them, and the path of the
// current step. Internal to GraphTree (graph_tree.h is the API); the dump (tree_dump.h) reads them.
//
// A node is one recording of one function under one parent (the node recorded or replayed just before
// it in the step; none for a root). Its call site is the pair (parent, function): it holds every
// recording of that function there, keyed by RecordingKey for a hash lookup, the site's executables and
// its re-record budget. The path is what the current step ran, in order, with weak references to the
// outputs each call handed out: their liveness is what recordings are checked against.
#ifndef GRAPHALLOC_GRAPH_TREE_NODE_H_
#define GRAPHALLOC_GRAPH_TREE_NODE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "graphalloc/allocator/core/pool_checkpoint.h"
#include "graphalloc/graph/capture_participant.h"
#include "graphalloc/graph/capture_session.h"
#include "graphalloc/graph/recording_key.h"
#include "graphalloc/graph/site_executables.h"
#include "graphalloc/graph/tree_output.h"

namespace graphalloc {

using FunctionId = std::uint32_t;

// Where a (depth, index) output of the path sits: depth = position of the call in the step.
struct PathOutputRef {
  std::uint32_t depth = 0;
  std::uint32_t index = 0;

  friend bool operator==(const PathOutputRef&, const PathOutputRef&) = default;
};

// How an output of a call relates to its inputs and its other outputs, fixed at recording. An alias
// (kSameAsOutput, kInput) is the whole source or a view of it: `offset` bytes in, `buffer.bytes` long.
struct OutputSpec {
  enum class Source : std::uint8_t {
    kNew,           // a buffer the function allocated during the call (in the pool, or eagerly outside it)
    kSameAsOutput,  // output `from` of this call, or a view of it
    kInput,         // input `from` (any role), or a view of it; a copied input's is the caller's buffer
    kEmpty,         // a null, zero-byte output
  };
  Source source = Source::kNew;
  std::uint32_t from = 0;
  std::size_t offset = 0;
  BufferView buffer;  // the buffer the call returned (for kInput of a copied input: in the graph's copy)
};

struct CallSite;

struct TreeNode {
  std::uint64_t id = 0;
  // An eager node stands for the eager calls of a site past its fallback: no graph, no checkpoint of its
  // own (the pool is its parent's: eager calls allocate outside it), but a place in the path, so later
  // calls of the step become its children.
  bool eager = false;
  FunctionId function = 0;
  TreeNode* parent = nullptr;
  CallSite* site = nullptr;
  std::uint32_t depth = 0;  // its position in a step's path
  RecordingKey key;
  RerecordReason reason = RerecordReason::kFirst;
  std::string reason_detail;  // DescribeMismatch of the call that caused it

  // Copied inputs: (input index, the graph's own buffer). The buffers are free in the pool after recording
  // (only the graph's launch reads them, right after the copy), so they cost no memory between calls.
  std::vector<std::pair<std::uint32_t, DevicePtr>> copies;
  // The copies of declared mutated inputs (FunctionOptions::mutated_inputs): copied back into the
  // caller's buffer right after every launch, on the launch stream.
  std::vector<std::pair<std::uint32_t, DevicePtr>> write_backs;
  std::vector<OutputSpec> outputs;

  OwnedGraph graph;
  ExecHolder exec;
  // One per participant of the function (FunctionOptions::generators), in that order: what each kept for
  // this recording (for a generator: what it draws and the slots its kernels read the base from), handed
  // back to it before every launch.
  std::vector<std::unique_ptr<CaptureParticipant::Captured>> participants;
  // The pool right after recording (its outputs allocated), restored before recording a child.
  PoolCheckpoint checkpoint;
  // Path outputs (this node's included) allocated in `checkpoint`: freed after a restore once dead.
  std::vector<PathOutputRef> live_after;
  // Path outputs that were dead when this was recorded: its replay may overwrite them, so it is only
  // replayed while they are still dead.
  std::vector<PathOutputRef> expected_dead;

  std::uint64_t replays = 0;  // launches after the recording's own

  // Child call sites by function.
  absl::flat_hash_map<FunctionId, std::unique_ptr<CallSite>> children;
};

struct CallSite {
  CallSite(Driver& driver, std::size_t executables, bool update_first, TreeNode* parent_node, FunctionId fn)
      : parent(parent_node), function(fn), executables(driver, executables, update_first) {}

  TreeNode* parent = nullptr;
  FunctionId function = 0;
  // Recordings in the order they were made.
  std::vector<std::unique_ptr<TreeNode>> nodes;
  // Key hash -> recordings with that hash (several only for equal keys of other liveness, or collisions).
  absl::flat_hash_map<std::uint64_t, absl::InlinedVector<TreeNode*, 1>> by_key;
  SiteExecutables executables;

  int rerecords = 0;  // recordings after the first
  std::array<int, kRerecordReasonCount> reasons{};
  int failed_recordings = 0;
  bool eager = false;  // past the re-record limit: every call here runs eagerly
  std::uint64_t eager_calls = 0;
  std::string eager_warning;             // the warning logged when it fell back
  std::unique_ptr<TreeNode> eager_node;  // the path's node for the eager calls here (made with `eager`)
};

// One call of the current step.
struct PathEntry {
  TreeNode* node = nullptr;  // nullptr for a warmup call (or an eager one during a warmup step)
  bool eager = false;        // an eager call: its outputs are the caller's, not the pool's
  FunctionId function = 0;
  // One weak reference per output (aliases share their state); liveness = not expired.
  std::vector<std::weak_ptr<OutputState>> outputs;
  // Warmup calls: the pool blocks the call allocated (its kNew outputs), still to be freed.
  std::vector<std::pair<std::uint32_t, DevicePtr>> warmup_blocks;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_TREE_NODE_H_
