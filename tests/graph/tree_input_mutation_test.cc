// Functions that write their inputs, on the selected device: a declared mutated copied input is written
// back to the caller's buffer after every call; an undeclared write to a copied input is found during
// warmup, reported once, and the function runs eagerly from then on. Never a silent divergence.
#include <vector>

#include "absl/strings/match.h"
#include "graphalloc/graph/graph_tree.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

using Outputs = std::vector<TreeOutput>;

class TreeInputMutationTest : public TreeTest {
 protected:
  // (counter) -> a copy of counter + 2, after adding 2 to the counter in place.
  TreeFunction Counter() {
    return [this](std::span<const BufferView> in, Stream s) -> absl::StatusOr<std::vector<BufferView>> {
      const std::size_t n = in[0].bytes / sizeof(float);
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr two, allocator_->Allocate(in[0].bytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y, allocator_->Allocate(in[0].bytes, s));
      GRAPHALLOC_RETURN_IF_ERROR(FillF32(*driver_, s, two, n, 2.0f));
      GRAPHALLOC_RETURN_IF_ERROR(AddF32(*driver_, s, in[0].ptr, in[0].ptr, two, n));
      GRAPHALLOC_RETURN_IF_ERROR(ScaleF32(*driver_, s, y, in[0].ptr, n, 1.0f));
      GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(two));
      return std::vector<BufferView>{{y, in[0].bytes}};
    };
  }
  FunctionId RegisterCounter(std::vector<std::size_t> mutated) {
    return RegisterWith(Counter(), FunctionOptions{.name = "counter", .mutated_inputs = std::move(mutated)});
  }
};

TEST_F(TreeInputMutationTest, DeclaredMutatedCopiedInputIsWrittenBackOnEveryCall) {
  const FunctionId f = RegisterCounter({0});
  const BufferView counter = Upload(std::vector<float>(kN, 0.0f));
  for (int call = 1; call <= 6; ++call) {  // warmup, record, replays
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {counter}, caller_));
    const std::vector<float> want(kN, 2.0f * static_cast<float>(call));
    EXPECT_EQ(Read(out[0]), want) << "call " << call;
    EXPECT_EQ(Download(counter.ptr), want) << "call " << call;
  }
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 1u);
  EXPECT_EQ(d.counters.replays, 4u);
  EXPECT_TRUE(warnings_.empty());
  ExpectInvariants();
}

TEST_F(TreeInputMutationTest, UndeclaredWriteToACopiedInputIsReportedOnceAndTheFunctionRunsEagerly) {
  const FunctionId f = RegisterCounter({});
  const BufferView counter = Upload(std::vector<float>(kN, 0.0f));
  for (int call = 1; call <= 6; ++call) {
    ASSERT_OK_AND_ASSIGN(Outputs out, tree_->Call(f, {counter}, caller_));
    const std::vector<float> want(kN, 2.0f * static_cast<float>(call));
    EXPECT_EQ(Read(out[0]), want) << "call " << call;
    EXPECT_EQ(Download(counter.ptr), want) << "call " << call;
  }
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_TRUE(absl::StrContains(warnings_[0], "'counter' wrote its input 0")) << warnings_[0];
  EXPECT_TRUE(absl::StrContains(warnings_[0], "mutated_inputs")) << warnings_[0];
  const TreeDump d = tree_->Dump();
  EXPECT_EQ(d.counters.recordings, 0u);
  EXPECT_EQ(d.counters.warmup_runs, 1u);
  EXPECT_EQ(d.counters.eager_runs, 5u);
  ExpectInvariants();
}

TEST_F(TreeInputMutationTest, TheWarmupCheckCanBeTurnedOff) {
  TreeOptions options = CapturingOptions();
  options.check_input_mutation = false;
  tree_ = MakeTree(options);
  const FunctionId f = RegisterCounter({});
  const BufferView counter = Upload(std::vector<float>(kN, 0.0f));
  for (int call = 0; call < 3; ++call) ASSERT_TRUE(tree_->Call(f, {counter}, caller_).ok());
  EXPECT_TRUE(warnings_.empty());
  EXPECT_EQ(tree_->Dump().counters.recordings, 1u);
}

}  // namespace
}  // namespace graphalloc::testing
