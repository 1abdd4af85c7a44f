// The tree options a front end over another framework needs (PyTorch's, python/csrc/graphs): warmups
// outside the pool, input layouts in the key, recordings that keep memory they did not return, failed
// recordings that fall back to eager calls, and what the last call did. Runs on the simulated device and,
// as *_gpu, on the GPU.
#include "absl/strings/match.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

class TreeFrontEndOptionsTest : public GraphFixture {
 protected:
  std::unique_ptr<GraphTree> Tree(void (*tweak)(TreeOptions&)) {
    TreeOptions options = CapturingOptions();
    tweak(options);
    return MakeTree(std::move(options));
  }
  FunctionId Register(GraphTree& tree, TreeFunction f, std::string name,
                      std::vector<std::size_t> statics = {}) {
    absl::StatusOr<FunctionId> id = tree.Register(
        std::move(f), FunctionOptions{.name = std::move(name), .static_inputs = std::move(statics)});
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  // The tree's pool's allocated bytes.
  std::size_t PoolAllocated(const GraphTree& tree) {
    absl::StatusOr<PoolStats> stats = allocator_->GetPoolStats(tree.pool().id());
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? stats->allocated_bytes : 0;
  }
};

TEST_F(TreeFrontEndOptionsTest, AWarmupOutsideThePoolAllocatesNothingThereAndItsOutputsAreOwned) {
  auto tree = Tree([](TreeOptions& o) { o.warmup_in_pool = false; });
  const FunctionId f = Register(*tree, Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1)), w = Upload(Values(2));
  ASSERT_OK_AND_ASSIGN(std::vector<TreeOutput> out, tree->Call(f, {x, w}, caller_));
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kWarmup);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind(), OutputKind::kOwned);
  EXPECT_EQ(PoolAllocated(*tree), 0u) << "a warmup outside the pool leaves nothing in it";
  EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2)));
  out.clear();  // the handle frees the buffer
  ASSERT_OK(allocator_->CheckInvariants());
  tree->BeginStep();
  ASSERT_OK_AND_ASSIGN(out, tree->Call(f, {x, w}, caller_));
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kRecord);
  EXPECT_NE(tree->last_call().node, 0u);
  EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2)));
}

TEST_F(TreeFrontEndOptionsTest, WhatWarmupsCachedOutsideThePoolIsReleasedBeforeARecording) {
  auto tree = Tree([](TreeOptions& o) {
    o.warmup_in_pool = false;
    o.release_cache_before_recording = true;
  });
  constexpr std::size_t kTemp = std::size_t{32} << 20;
  TreeFunction with_temp = [&](std::span<const BufferView> in,
                               Stream s) -> absl::StatusOr<std::vector<BufferView>> {
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr temp, allocator_->Allocate(kTemp, s));
    GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(temp));
    return Affine(2.0f)(in, s);
  };
  const FunctionId f = Register(*tree, with_temp, "with a temporary", {1});
  const BufferView x = Upload(Values(1)), w = Upload(Values(2));
  auto outside_pool = [&] {
    absl::StatusOr<PoolStats> pool = allocator_->GetPoolStats(tree->pool().id());
    EXPECT_TRUE(pool.ok()) << pool.status();
    return static_cast<std::size_t>(allocator_->GetStats().reserved_bytes.all().current) -
           (pool.ok() ? pool->reserved_bytes : 0);
  };
  ASSERT_OK(tree->Call(f, {x, w}, caller_).status());  // warmup: the temporary stays cached
  EXPECT_GE(outside_pool(), kTemp);
  tree->BeginStep();
  ASSERT_OK_AND_ASSIGN(std::vector<TreeOutput> out, tree->Call(f, {x, w}, caller_));
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kRecord);
  EXPECT_LT(outside_pool(), kTemp) << "the warmup's cached temporary went back before the recording";
  EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2)));
  ASSERT_OK(allocator_->CheckInvariants());
}

TEST_F(TreeFrontEndOptionsTest, LastCallNamesTheNodeAReplayLaunched) {
  auto tree = Tree([](TreeOptions&) {});
  const FunctionId f = Register(*tree, Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1)), w = Upload(Values(2));
  ASSERT_OK(tree->Call(f, {x, w}, caller_).status());  // warmup
  ASSERT_OK(tree->Call(f, {x, w}, caller_).status());  // recording
  const std::uint64_t recorded = tree->last_call().node;
  ASSERT_OK_AND_ASSIGN(std::vector<TreeOutput> out, tree->Call(f, {x, w}, caller_));
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kReplay);
  EXPECT_EQ(tree->last_call().node, recorded);
}

TEST_F(TreeFrontEndOptionsTest, TheSameBytesInAnotherLayoutAreRecordedAgainNotReplayed) {
  auto tree = Tree([](TreeOptions&) {});
  const FunctionId f = Register(*tree, Affine(2.0f), "affine", {1});
  const BufferView x = Upload(Values(1)), w = Upload(Values(2));
  for (int i = 0; i < 3; ++i) {  // warmup, recording, replay with layout 7
    ASSERT_OK(tree->Call(f, {CallInput(x).WithLayout(7), CallInput(w).WithLayout(9)}, caller_).status());
  }
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kReplay);
  ASSERT_OK(tree->Call(f, {CallInput(x).WithLayout(8), CallInput(w).WithLayout(9)}, caller_).status());
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kRecord);
  const TreeDump d = tree->Dump();
  ASSERT_EQ(d.nodes.size(), 2u) << FormatTreeDump(d);
  EXPECT_EQ(d.nodes[1].reason, RerecordReason::kInputLayout);
  EXPECT_TRUE(absl::StrContains(FormatTreeDump(d), "input 0 changed layout")) << FormatTreeDump(d);
}

TEST_F(TreeFrontEndOptionsTest, ARecordingThatKeepsMemoryItDidNotReturnFailsAndLaterCallsRunEagerly) {
  auto tree = Tree([](TreeOptions& o) {
    o.warmup_in_pool = false;
    o.fail_on_leftover_allocations = true;
  });
  std::vector<DevicePtr> kept;  // state the function creates on every call and keeps (a cache)
  TreeFunction keeps = [&](std::span<const BufferView> in,
                           Stream s) -> absl::StatusOr<std::vector<BufferView>> {
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr state, allocator_->Allocate(4096, s));
    kept.push_back(state);
    return Affine(2.0f)(in, s);
  };
  const FunctionId f = Register(*tree, keeps, "keeps state", {1});
  const BufferView x = Upload(Values(1)), w = Upload(Values(2));
  ASSERT_OK(tree->Call(f, {x, w}, caller_).status());  // warmup, outside the pool
  tree->BeginStep();
  absl::StatusOr<std::vector<TreeOutput>> recorded = tree->Call(f, {x, w}, caller_);
  ASSERT_FALSE(recorded.ok());
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(recorded.status().message(),
                                "recording 'keeps state' kept 1 allocation(s) (4096 bytes)"))
      << recorded.status();
  EXPECT_TRUE(tree->recording_disabled());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_GT(PoolAllocated(*tree), 0u) << "what the capture kept stays allocated for its holder";
  ASSERT_OK(allocator_->CheckInvariants());
  tree->BeginStep();
  ASSERT_OK_AND_ASSIGN(std::vector<TreeOutput> out, tree->Call(f, {x, w}, caller_));
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kEager);
  EXPECT_EQ(out[0].kind(), OutputKind::kOwned);
  EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2)));
  EXPECT_EQ(tree->Dump().counters.recordings, 0u);
  out.clear();
  for (DevicePtr p : kept) ASSERT_OK(allocator_->Free(p));  // the holder frees its state: no double free
  ASSERT_OK(allocator_->CheckInvariants());
}

TEST_F(TreeFrontEndOptionsTest, AFailedRecordingStopsRecordingAndLeavesWhatItAllocatedToItsHolder) {
  auto tree = Tree([](TreeOptions& o) { o.stop_recording_after_failure = true; });
  int calls = 0;
  DevicePtr held = 0;  // what the failed call allocated and its caller still holds (a Python frame, say)
  TreeFunction fails_when_recorded = [&](std::span<const BufferView> in,
                                         Stream s) -> absl::StatusOr<std::vector<BufferView>> {
    if (++calls == 2) {  // the recording
      GRAPHALLOC_ASSIGN_OR_RETURN(held, allocator_->Allocate(4096, s));
      return absl::UnavailableError("cannot be captured");
    }
    return Affine(2.0f)(in, s);
  };
  const FunctionId f = Register(*tree, fails_when_recorded, "host sync", {1});
  const BufferView x = Upload(Values(1)), w = Upload(Values(2));
  ASSERT_OK(tree->Call(f, {x, w}, caller_).status());
  tree->BeginStep();
  absl::StatusOr<std::vector<TreeOutput>> failed = tree->Call(f, {x, w}, caller_);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "recording 'host sync' failed:"))
      << failed.status();
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "cannot be captured")) << failed.status();
  EXPECT_TRUE(tree->recording_disabled());
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_TRUE(absl::StrContains(warnings_[0], "every call runs eagerly")) << warnings_[0];
  ASSERT_OK(allocator_->CheckInvariants());
  tree->BeginStep();
  ASSERT_OK_AND_ASSIGN(std::vector<TreeOutput> out, tree->Call(f, {x, w}, caller_));
  EXPECT_EQ(tree->last_call().kind, TreeCallInfo::Kind::kEager);
  EXPECT_EQ(Read(out[0]), AffineRef(2.0f, Values(1), Values(2)));
  EXPECT_EQ(calls, 3);
  out.clear();
  ASSERT_NE(held, 0u);
  ASSERT_OK(allocator_->Free(held));  // still the holder's: no double free
  tree.reset();                       // and the tree's cleanup frees the rest only
  ASSERT_OK(allocator_->CheckInvariants());
}

}  // namespace
}  // namespace graphalloc::testing
