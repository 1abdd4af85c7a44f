// The eager fallback past the re-record limit, on the selected device: an eager call is a node of the
// step's path, later calls of the step are placed after it, and no order of calls escapes the fallback.
#include <vector>

#include "graphalloc/graph/graph_tree.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;
using TreeEagerFallbackTest = TreeTest;

TEST_F(TreeEagerFallbackTest, EagerFallbackAtTheRootKeepsTheStepsPathAndCannotBeEscaped) {
  TreeOptions options = CapturingOptions();
  options.max_recordings = 0;  // the first change of fwd's weight address falls back at the root
  tree_ = MakeTree(options);
  const FunctionId fwd = Register(Affine(2.0f), "fwd", {1});
  const FunctionId bwd = Register(Affine(3.0f), "bwd", {1});
  const BufferView x = Upload(Values(1));
  const BufferView w[] = {Upload(Values(2)), Upload(Values(3))};
  const BufferView v = Upload(Values(4));
  // Iterations 0, 1: warmup, then recording with w0; iteration 2 moves fwd's weight past the limit, and
  // from then on it alternates between w1 and the recorded w0: both run eagerly.
  for (int it = 0; it < 8; ++it) {
    const int k = it < 2 ? 0 : (it + 1) % 2;
    const std::uint64_t step_before = tree_->step();
    ASSERT_OK_AND_ASSIGN(Outputs f, tree_->Call(fwd, {x, w[k]}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs g, tree_->Call(bwd, {f[0], v}, caller_));
    const std::vector<float> f_ref = AffineRef(2.0f, Values(1), Values(2 + k));
    // fwd's output of this iteration is still readable after bwd: bwd did not begin another step.
    EXPECT_EQ(Read(f[0]), f_ref) << "iteration " << it;
    EXPECT_EQ(Read(g[0]), AffineRef(3.0f, f_ref, Values(4))) << "iteration " << it;
    if (it > 0) {
      EXPECT_EQ(tree_->step(), step_before + 1) << "iteration " << it << " began more than one step";
    }
    if (it >= 2) {
      EXPECT_EQ(f[0].kind(), OutputKind::kOwned) << "iteration " << it;
    }
    ExpectInvariants();
  }
  const TreeDump d = tree_->Dump();
  // fwd was recorded once (with w0) and never again: every later call ran eagerly at the root.
  EXPECT_EQ(d.NodesOf(fwd).size(), 1u) << FormatTreeDump(d);
  const TreeDumpSite* root = Site(d, 0, fwd);
  ASSERT_NE(root, nullptr);
  EXPECT_TRUE(root->eager);
  EXPECT_EQ(root->eager_calls, 6u);
  ASSERT_NE(root->eager_node, 0u);
  // bwd after the eager fwd: one recording, under the eager node, replayed from then on.
  const std::vector<const TreeDumpNode*> bwds = d.NodesOf(bwd);
  ASSERT_EQ(bwds.size(), 2u) << FormatTreeDump(d);
  EXPECT_EQ(bwds[0]->parent, d.NodesOf(fwd)[0]->id);
  EXPECT_EQ(bwds[1]->parent, root->eager_node);
  EXPECT_EQ(bwds[1]->replays, 5u);
  EXPECT_EQ(d.counters.eager_runs, 6u);
  ASSERT_EQ(warnings_.size(), 1u);
}

}  // namespace
}  // namespace graphalloc::testing
