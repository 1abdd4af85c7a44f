// TreeOutput: an output knows its step, and reading it after its tree moved on is an error that names the
// function and says how to keep it (host only: the states are built directly).
#include "graphalloc/graph/tree_output.h"

#include <memory>

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

std::shared_ptr<OutputState> PoolOutput(const std::shared_ptr<const OutputOrigin>& origin,
                                        std::uint64_t step) {
  auto s = std::make_shared<OutputState>();
  s->kind = OutputKind::kPool;
  s->buffer = BufferView{0x1000, 64};
  s->step = step;
  s->index = 2;
  s->origin = origin;
  return s;
}

TEST(TreeOutputTest, PoolOutputIsReadableUntilItsTreeBeginsAnotherStep) {
  auto epoch = std::make_shared<TreeEpoch>();
  auto origin = std::make_shared<const OutputOrigin>(OutputOrigin{epoch, "forward", nullptr});
  TreeOutput out(PoolOutput(origin, 1));
  ASSERT_TRUE(out.ptr().ok());
  EXPECT_EQ(*out.ptr(), 0x1000u);
  epoch->step.store(2);
  EXPECT_TRUE(out.overwritten());
  const absl::Status s = out.ptr().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      s.message(),
      "output 2 of graph-tree function 'forward' (step 1) has been overwritten: the tree has begun step 2, "
      "which reuses its memory; to keep it, clone it before the next step (TreeOutput::Clone, or "
      "FunctionOptions::clone_outputs), or begin the next step (BeginStep) only after its last use");
}

TEST(TreeOutputTest, OutputOfADestroyedTreeSaysSo) {
  auto epoch = std::make_shared<TreeEpoch>();
  auto origin = std::make_shared<const OutputOrigin>(OutputOrigin{epoch, "f", nullptr});
  TreeOutput out(PoolOutput(origin, 1));
  epoch->step.store(TreeEpoch::kDestroyed);
  EXPECT_NE(out.Check().message().find("the tree that produced it was destroyed"), std::string_view::npos)
      << out.Check();
}

TEST(TreeOutputTest, BorrowedOutputsNeverExpire) {
  auto epoch = std::make_shared<TreeEpoch>();
  auto state = PoolOutput(std::make_shared<const OutputOrigin>(OutputOrigin{epoch, "f", nullptr}), 1);
  state->kind = OutputKind::kBorrowed;
  TreeOutput out(state);
  epoch->step.store(7);
  EXPECT_TRUE(out.Check().ok());
}

TEST(TreeOutputTest, EmptyHandleIsAnErrorNotACrash) {
  TreeOutput out;
  EXPECT_EQ(out.ptr().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.bytes(), 0u);
  const CallInput in(out);
  EXPECT_EQ(in.output(), nullptr);
  EXPECT_EQ(in.view().ptr, 0u);
}

TEST(TreeOutputTest, CallInputFromAnOutputCarriesItsBufferAndHandle) {
  auto epoch = std::make_shared<TreeEpoch>();
  TreeOutput out(PoolOutput(std::make_shared<const OutputOrigin>(OutputOrigin{epoch, "f", nullptr}), 1));
  const CallInput in(out);
  EXPECT_EQ(in.view(), (BufferView{0x1000, 64}));
  EXPECT_EQ(in.output(), out.state().get());
  EXPECT_EQ(in.handle(), &out.state());
}

}  // namespace
}  // namespace graphalloc
