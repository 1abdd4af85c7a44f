// Outputs that alias inputs (an input returned as is, a view of one, an earlier node's output handed
// through), on the selected device: allowed in warmup, recording and replay, with exact values, liveness
// and the overwritten-output check.
#include <vector>

#include "absl/strings/match.h"
#include "graphalloc/graph/graph_tree.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;
using TreeAliasingTest = TreeTest;

constexpr std::size_t kHalf = kBytes / 2;

// (x) -> (x, the second half of x): both outputs alias input 0.
TreeFunction PassThrough() {
  return [](std::span<const BufferView> in, Stream) -> absl::StatusOr<std::vector<BufferView>> {
    return std::vector<BufferView>{in[0], {in[0].ptr + kHalf, kHalf}};
  };
}

std::vector<float> SecondHalf(const std::vector<float>& v) {
  return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
}

TEST_F(TreeAliasingTest, OutputThatIsItsInputIsAllowedInWarmupAndAnEarlierNodesOutputStaysLive) {
  const FunctionId a = Register(Affine(2.0f), "A", {1});
  const FunctionId b = Register(PassThrough(), "B");
  const FunctionId c = Register(Affine(3.0f), "C", {1});
  const BufferView x = Upload(Values(1));
  const BufferView y = Upload(Values(5));
  const BufferView w = Upload(Values(2));
  const std::vector<float> a_ref = AffineRef(2.0f, Values(1), Values(2));
  const std::vector<float> c_ref = AffineRef(3.0f, Values(5), Values(2));
  Outputs kept;
  for (int step = 0; step < 5; ++step) {  // warmup, record, replays
    ASSERT_OK_AND_ASSIGN(Outputs out_a, tree_->Call(a, {x, w}, caller_));
    ASSERT_OK_AND_ASSIGN(Outputs out_b, tree_->Call(b, {out_a[0]}, caller_));
    ASSERT_EQ(out_b.size(), 2u);
    ASSERT_OK_AND_ASSIGN(const DevicePtr a_ptr, out_a[0].ptr());
    EXPECT_EQ(*out_b[0].ptr(), a_ptr) << "step " << step;
    EXPECT_EQ(*out_b[1].ptr(), a_ptr + kHalf) << "step " << step;
    EXPECT_EQ(out_b[1].bytes(), kHalf);
    // Only B's outputs hold A's buffer now: C must not reuse it.
    out_a.clear();
    ASSERT_OK_AND_ASSIGN(Outputs out_c, tree_->Call(c, {y, w}, caller_));
    EXPECT_EQ(Read(out_c[0]), c_ref) << "step " << step;
    EXPECT_EQ(Read(out_b[0]), a_ref) << "step " << step;
    EXPECT_EQ(Read(out_b[1]), SecondHalf(a_ref)) << "step " << step;
    kept = out_b;
    ExpectInvariants();
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 3u) << FormatTreeDump(d);
  EXPECT_EQ(d.counters.replays, 9u) << FormatTreeDump(d);
  tree_->BeginStep();
  for (const TreeOutput& old : kept) {
    const absl::Status s = old.ptr().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(
        absl::StrContains(s.message(), "output 0 of graph-tree function 'A' (step 5) has been overwritten"))
        << s;
  }
}

TEST_F(TreeAliasingTest, OutputThatIsACopiedInputOrAViewOfOneIsTheCallersBuffer) {
  const FunctionId b = Register(PassThrough(), "B");
  const BufferView x = Upload(Values(1));
  for (int call = 0; call < 4; ++call) {  // warmup, record, replays
    Overwrite(x.ptr, Values(10 + call));
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(b, {x}, caller_));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].kind(), OutputKind::kBorrowed);
    EXPECT_EQ(*out[0].ptr(), x.ptr) << "call " << call;
    EXPECT_EQ(*out[1].ptr(), x.ptr + kHalf) << "call " << call;
    EXPECT_EQ(Read(out[0]), Values(10 + call)) << "call " << call;
    EXPECT_EQ(Read(out[1]), SecondHalf(Values(10 + call))) << "call " << call;
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 1u);
  EXPECT_EQ(d.counters.replays, 2u);
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc::testing
