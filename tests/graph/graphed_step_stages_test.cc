// A staged GraphedStep: several callables graphed into one tree per lane (one pool), micro-batches placed on
// lanes by where their inputs come from, parameters passed with every forward (a moved one is recorded
// again, never replayed at its old address), per-stage gradient policies, and what a front end learns of
// each forward. Runs on the simulated device and, as *_gpu, on the GPU.
//
// Each stage s is y = 2 * x + w_s over n floats; its backward gives {gx = 2 * gy, gw = gy}.
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "graphalloc/lifetime/graphed_step.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

std::vector<float> Twice(const std::vector<float>& g) {
  std::vector<float> out(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) out[i] = 2.0f * g[i];
  return out;
}

class GraphedStepStagesTest : public GraphFixture {
 protected:
  void SetUp() override {
    GraphFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int s = 0; s < 2; ++s) w_.push_back(Upload(Values(100 + s)));
    gy_ = Upload(Values(7));
    for (int k = 0; k < 6; ++k) x_.push_back(Upload(Values(10 + k)));
  }
  void TearDown() override {
    step_.reset();
    GraphFixture::TearDown();
  }

  StageSpec Stage(std::string name) {
    StageSpec spec;
    spec.name = std::move(name);
    spec.num_params = 1;
    spec.forward = [this](const ForwardArgs& a) -> absl::StatusOr<ForwardResult> {
      forward_ids_.push_back(a.forward_id);
      GRAPHALLOC_ASSIGN_OR_RETURN(std::vector<BufferView> y,
                                  Affine(2.0f)(std::vector<BufferView>{a.inputs[0], a.params[0]}, a.stream));
      return ForwardResult{.outputs = std::move(y), .saved = {}};
    };
    spec.backward = [this](const BackwardArgs& a) -> absl::StatusOr<std::vector<BufferView>> {
      backward_seen_.push_back({a.forward_id, a.forward_node});
      const BufferView gy = a.grad_outputs[0];
      const std::size_t n = gy.bytes / sizeof(float);
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr gx, allocator_->Allocate(gy.bytes, a.stream));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr gw, allocator_->Allocate(gy.bytes, a.stream));
      GRAPHALLOC_RETURN_IF_ERROR(ScaleF32(*driver_, a.stream, gx, gy.ptr, n, 2.0f));
      GRAPHALLOC_RETURN_IF_ERROR(ScaleF32(*driver_, a.stream, gw, gy.ptr, n, 1.0f));
      return std::vector<BufferView>{{gx, gy.bytes}, {gw, gy.bytes}};
    };
    return spec;
  }

  void Make(bool graphed, std::size_t stages, int max_recordings = 5,
            std::function<absl::Status(std::size_t, Stream)> before_lane_reuse = nullptr) {
    GraphedStepOptions options;
    options.before_lane_reuse = std::move(before_lane_reuse);
    options.name = graphed ? "graphed" : "eager";
    options.graphed = graphed;
    options.tree = CapturingOptions();
    options.tree.max_recordings = max_recordings;
    std::vector<StageSpec> specs;
    for (std::size_t s = 0; s < stages; ++s) specs.push_back(Stage("stage" + std::to_string(s)));
    absl::StatusOr<std::unique_ptr<GraphedStep>> step =
        GraphedStep::Create(*allocator_, std::move(specs), std::move(options));
    ASSERT_TRUE(step.ok()) << step.status();
    step_ = std::move(*step);
  }

  StepForward Fwd(std::size_t stage, CallInput x, BufferView w) {
    const CallInput params[] = {w};
    const CallInput inputs[] = {x};
    absl::StatusOr<StepForward> f = step_->Forward(stage, params, inputs, caller_);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : StepForward();
  }
  std::vector<TreeOutput> Bwd(const StepForward& f, CallInput gy) {
    const CallInput grads[] = {gy};
    absl::StatusOr<std::vector<TreeOutput>> g = step_->Backward(f, grads, caller_);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : std::vector<TreeOutput>{};
  }

  // Two stages forward then backward: {y2, gx, gw0, gw1}'s values.
  std::vector<std::vector<float>> TwoStageStep(BufferView x) {
    const StepForward f0 = Fwd(0, x, w_[0]);
    const StepForward f1 = Fwd(1, f0.outputs()[0], w_[1]);
    std::vector<std::vector<float>> out{Read(f1.outputs()[0])};
    const std::vector<TreeOutput> g1 = Bwd(f1, gy_);
    const std::vector<TreeOutput> g0 = Bwd(f0, g1[0]);
    out.push_back(Read(g0[0]));
    out.push_back(Read(g0[1]));
    out.push_back(Read(g1[1]));
    return out;
  }
  std::vector<std::vector<float>> TwoStageReference(int x_seed) {
    const std::vector<float> y1 = AffineRef(2.0f, Values(x_seed), Values(100));
    const std::vector<float> g = Values(7);
    return {AffineRef(2.0f, y1, Values(101)), Twice(Twice(g)), Twice(g), g};
  }

  std::vector<BufferView> w_;
  BufferView gy_;
  std::vector<BufferView> x_;
  std::unique_ptr<GraphedStep> step_;
  std::vector<std::uint64_t> forward_ids_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> backward_seen_;  // (forward id, forward node)
};

TEST_F(GraphedStepStagesTest, TwoStagesShareOneLaneAndItsPoolAndMatchTheEagerStep) {
  for (bool graphed : {false, true}) {
    Make(graphed, 2);
    for (int k = 0; k < 4; ++k) {  // warmup, recording, replays
      EXPECT_EQ(TwoStageStep(x_[k]), TwoStageReference(10 + k))
          << (graphed ? "graphed" : "eager") << " step " << k;
      ASSERT_OK(allocator_->CheckInvariants());
    }
    EXPECT_EQ(step_->lanes(), 1u);
    EXPECT_EQ(step_->pending_forwards(), 0u);
    if (graphed) {
      const TreeDump d = step_->tree(0)->Dump();
      EXPECT_EQ(d.counters.recordings, 4u) << FormatTreeDump(d);  // two forwards, two backwards
      EXPECT_EQ(d.counters.replays, 8u) << FormatTreeDump(d);
    }
  }
}

TEST_F(GraphedStepStagesTest, AnInterleavedPipelineOrderGetsALanePerOutstandingMicroBatch) {
  Make(true, 2);
  // Transformer Engine's interleaved schedule: stage s+1 forward as s+1, backward as -(s+1).
  const std::vector<int> order = {1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1};
  for (int iteration = 0; iteration < 3; ++iteration) {
    std::vector<StepForward> forwards[2];  // per stage, by micro-batch
    std::vector<TreeOutput> grads_in[2];   // the gradient each micro-batch's stage 1 backward gives stage 0
    std::size_t next_forward[2] = {0, 0}, next_backward[2] = {0, 0};
    int mb = 0;
    for (int entry : order) {
      const std::size_t stage = static_cast<std::size_t>(std::abs(entry) - 1);
      if (entry > 0) {
        const std::size_t m = next_forward[stage]++;
        const CallInput x = stage == 0 ? CallInput(x_[mb++]) : CallInput(forwards[0][m].outputs()[0]);
        forwards[stage].push_back(Fwd(stage, x, w_[stage]));
        if (stage == 1) {
          EXPECT_EQ(
              Read(forwards[1][m].outputs()[0]),
              AffineRef(2.0f, AffineRef(2.0f, Values(10 + static_cast<int>(m)), Values(100)), Values(101)))
              << "iteration " << iteration << ", micro-batch " << m;
        }
      } else {
        const std::size_t m = next_backward[stage]++;
        const CallInput g = stage == 1 ? CallInput(gy_) : CallInput(grads_in[0][m]);
        const std::vector<TreeOutput> grads = Bwd(forwards[stage][m], g);
        ASSERT_EQ(grads.size(), 2u);
        if (stage == 1) grads_in[0].push_back(grads[0]);
        const std::vector<float> expected = stage == 1 ? Values(7) : Twice(Values(7));
        EXPECT_EQ(Read(grads[1]), expected)
            << "iteration " << iteration << ", stage " << stage << ", mb " << m;
      }
    }
    ASSERT_OK(allocator_->CheckInvariants());
  }
  EXPECT_EQ(step_->lanes(), 2u) << "two micro-batches are outstanding at most";
  EXPECT_EQ(step_->pending_forwards(), 0u);
}

TEST_F(GraphedStepStagesTest, AMovedParameterIsRecordedAgainThenRunsEagerlyNeverAtItsOldAddress) {
  Make(true, 1, /*max_recordings=*/1);
  const BufferView moved[] = {w_[0], Upload(Values(200)), Upload(Values(300))};
  const int seeds[] = {100, 200, 300};
  for (int k = 0; k < 6; ++k) {
    const int where = k < 2 ? 0 : (k < 4 ? 1 : 2);  // warmup+recording, re-record+replay, past the limit
    const StepForward f = Fwd(0, x_[0], moved[where]);
    EXPECT_EQ(Read(f.outputs()[0]), AffineRef(2.0f, Values(10), Values(seeds[where]))) << "call " << k;
    ASSERT_OK(step_->Discard(f));
  }
  const TreeDump d = step_->tree(0)->Dump();
  EXPECT_EQ(d.counters.recordings, 2u) << FormatTreeDump(d);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_TRUE(absl::StrContains(
      warnings_[0],
      absl::StrFormat("static input 0 changed address from 0x%x to 0x%x", moved[1].ptr, moved[2].ptr)))
      << warnings_[0];
  EXPECT_TRUE(absl::StrContains(warnings_[0], "runs eagerly")) << warnings_[0];
}

TEST_F(GraphedStepStagesTest, ABackwardKnowsItsForwardAndTheNodeItReplayed) {
  Make(true, 1);
  for (int k = 0; k < 3; ++k) {
    const StepForward f = Fwd(0, x_[k], w_[0]);
    EXPECT_EQ(f.id(), static_cast<std::uint64_t>(k));
    EXPECT_EQ(f.node(), k == 0 ? 0u : step_->tree(0)->last_call().node);
    (void)Bwd(f, gy_);
  }
  // The backward body runs for the warmup and the recording only; replays run no body.
  ASSERT_EQ(backward_seen_.size(), 2u);
  EXPECT_EQ(backward_seen_[0], std::make_pair(std::uint64_t{0}, std::uint64_t{0}));
  EXPECT_EQ(backward_seen_[1].first, 1u);
  EXPECT_NE(backward_seen_[1].second, 0u);
  EXPECT_EQ(forward_ids_, (std::vector<std::uint64_t>{0, 1}));
}

TEST_F(GraphedStepStagesTest, EndedForwardsAreReportedOnceEach) {
  Make(true, 1);
  const StepForward a = Fwd(0, x_[0], w_[0]);
  (void)Bwd(a, gy_);
  const StepForward b = Fwd(0, x_[1], w_[0]);
  ASSERT_OK(step_->Discard(b));
  EXPECT_EQ(step_->TakeEndedForwards(), (std::vector<std::uint64_t>{0, 1}));
  EXPECT_TRUE(step_->TakeEndedForwards().empty());
}

TEST_F(GraphedStepStagesTest, TheGradientPolicyIsPerStageAndFixedAtEachStagesCapture) {
  Make(true, 2);
  ASSERT_OK(step_->SetAliasGradient(1, 1, true));
  for (int k = 0; k < 3; ++k) {
    const StepForward f0 = Fwd(0, x_[k], w_[0]);
    const StepForward f1 = Fwd(1, f0.outputs()[0], w_[1]);
    const std::vector<TreeOutput> g1 = Bwd(f1, gy_);
    const std::vector<TreeOutput> g0 = Bwd(f0, g1[0]);
    EXPECT_EQ(g0[1].kind(), OutputKind::kOwned) << "stage 0 clones its gradients";
    EXPECT_EQ(g1[1].kind(), OutputKind::kPool) << "stage 1 slot 1 aliases the graph's buffer";
  }
  EXPECT_TRUE(step_->captured(1));
  EXPECT_EQ(step_->SetAliasGradient(1, 1, false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(step_->SetAliasGradient(2, 0, false).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GraphedStepStagesTest, ALaneAboutToBeReusedLetsTheFrontEndCopyOutWhatItsCallerStillHolds) {
  // What a front end that owns parameter gradients does: when the lane begins its next micro-batch, the
  // gradient its caller still holds (no longer current) is copied out before a replay overwrites it.
  std::vector<std::size_t> lanes;
  std::vector<DevicePtr> copies;
  TreeOutput held;
  bool held_was_current = false;
  Make(true, 1, 5, [&](std::size_t lane, Stream stream) -> absl::Status {
    lanes.push_back(lane);
    if (held.empty()) return absl::OkStatus();
    // A pool output (a recording's, a replay's) stopped being current; a warmup's is the caller's anyway.
    if (held.kind() == OutputKind::kPool) held_was_current = held_was_current || !held.overwritten();
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr copy, allocator_->Allocate(held.bytes(), stream));
    copies.push_back(copy);
    return driver_->CopyAsync(copy, held.state()->buffer.ptr, held.bytes(), stream);
  });
  for (int k = 0; k < 5; ++k) {  // warmup, recording, three replays
    const StepForward f = Fwd(0, x_[k], w_[0]);
    held = Bwd(f, Upload(Values(20 + k)))[1];  // gw = gy
    EXPECT_EQ(Read(held), Values(20 + k)) << "step " << k;
    ASSERT_OK(allocator_->CheckInvariants());
  }
  EXPECT_EQ(lanes, std::vector<std::size_t>(5, 0));
  EXPECT_FALSE(held_was_current);
  ASSERT_EQ(copies.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(Download(copies[k]), Values(20 + k)) << "step " << k;
    EXPECT_OK(allocator_->Free(copies[k]));
  }
}

}  // namespace
}  // namespace graphalloc::testing
