// A snapshot of a graph tree's structure and counters (GraphTree::Dump), for tests to assert on and for
// users to print (FormatTreeDump): nodes with their functions and recorded addresses, replay counts, and
// per call site the re-record count, its reasons and whether it fell back to eager execution.
#ifndef GRAPHALLOC_GRAPH_TREE_DUMP_H_
#define GRAPHALLOC_GRAPH_TREE_DUMP_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/graph/recording_key.h"
#include "graphalloc/graph/site_executables.h"
#include "graphalloc/graph/tree_output.h"

namespace graphalloc {

struct TreeCounters {
  std::uint64_t steps = 1;  // the current step's number
  std::uint64_t warmup_runs = 0;
  std::uint64_t recordings = 0;
  std::uint64_t failed_recordings = 0;
  std::uint64_t replays = 0;
  std::uint64_t eager_runs = 0;  // past a re-record limit
  std::uint64_t checkpoint_restores = 0;
  std::uint64_t dead_outputs_freed = 0;  // outputs freed after a restore because nothing held them
};

struct TreeDumpFunction {
  std::uint32_t id = 0;
  std::string name;
  std::vector<std::size_t> static_inputs;
  int warmup_calls = 0;
  int warmup_runs = 0;
};

struct TreeDumpNode {
  std::uint64_t id = 0;
  std::uint64_t parent = 0;  // 0: a root
  std::uint32_t function = 0;
  std::string function_name;
  std::uint32_t depth = 0;
  std::vector<KeyInput> inputs;  // the recording's key: role, address (static, managed), size
  std::vector<BufferView> outputs;
  RerecordReason reason = RerecordReason::kFirst;
  std::string reason_detail;
  std::uint64_t replays = 0;
  bool has_executable = false;
  std::size_t checkpoint_segments = 0;
  std::size_t checkpoint_allocated_bytes = 0;
  std::size_t expected_dead = 0;  // path outputs that must be dead for it to replay
};

struct TreeDumpSite {
  std::uint64_t parent = 0;  // 0: the roots
  std::uint32_t function = 0;
  std::string function_name;
  std::size_t recordings = 0;
  int rerecords = 0;
  std::array<int, kRerecordReasonCount> reasons{};  // indexed by RerecordReason
  int failed_recordings = 0;
  bool eager = false;
  std::uint64_t eager_calls = 0;
  std::string eager_warning;
  std::uint64_t eager_node = 0;  // the id later calls of a step after an eager call here have as parent
  std::size_t executables = 0;
  ExecCounters executable_counters;
};

struct TreeDump {
  std::uint64_t step = 0;
  PoolId pool = kDefaultPool;
  std::size_t pool_reserved_bytes = 0;
  std::size_t pool_allocated_bytes = 0;
  TreeCounters counters;
  std::vector<TreeDumpFunction> functions;
  std::vector<TreeDumpNode> nodes;  // depth-first, each site's recordings in recording order
  std::vector<TreeDumpSite> sites;  // in the same order as their first node

  const TreeDumpNode* FindNode(std::uint64_t id) const;
  const TreeDumpSite* FindSite(std::uint64_t parent, std::uint32_t function) const;
  // Nodes of `function` (in dump order).
  std::vector<const TreeDumpNode*> NodesOf(std::uint32_t function) const;
};

// A readable multi-line rendering: one line per node, indented by depth, then the sites.
std::string FormatTreeDump(const TreeDump& dump);

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_TREE_DUMP_H_
