// The gradient-lifetime layer (issue 7): a graphed forward/backward step never hands out memory a replay
// will overwrite, matches the eager step bit for bit (dropout included) in order, out of order, retained
// and recomputed, and always runs its release epilogue. Runs on the simulated device and, as *_gpu, on
// the GPU.
//
// The model, elementwise over n floats, with one dropout (random op 0):
//   forward:  y = dropout(x * w),  r = y * y           outputs {r}, saved {copy of x, y} ({copy of x}
//                                                      when recomputing)
//   backward: gy = 2 * (y * gr),  gz = dropout'(gy),   slots {gx = gz * w, gw = gz * x}
// A recomputing backward computes y again from the copy of x with the backward generator.
#include "graphalloc/lifetime/graphed_step.h"

#include <iostream>
#include <stdexcept>

#include "absl/strings/match.h"
#include "examples/mlp/mlp_kernels.h"
#include "graphalloc/rng/random_ops.h"
#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

using mlp::F;

constexpr float kP = 0.25f;
constexpr std::uint64_t kSeed = 777;  // the dropout generator pair's seed
constexpr std::size_t kGx = 0, kGw = 1;

bool Contains(absl::string_view text, absl::string_view part) { return absl::StrContains(text, part); }

struct ModelOptions {
  bool recompute = false;
  bool fail_backward = false;      // the backward function returns an error (after drawing its mask)
  bool throw_in_backward = false;  // the backward function throws
  bool extra_draw = false;         // the backward draws more than its forward
};

class GraphedStepTest : public GraphFixture {
 protected:
  void SetUp() override {
    GraphFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_OK(mlp::PreloadMlpKernels(*driver_));
    std::cout << "dropout seed " << kSeed << ", p " << kP << "\n";
    w_ = Upload(Values(1));
    gr_ = Upload(std::vector<float>(kN, 1.5f));
    for (int k = 0; k < 6; ++k) x_.push_back(Upload(Values(10 + k)));
  }
  void TearDown() override {
    graphed_.reset();
    eager_.reset();
    GraphFixture::TearDown();
  }

  ForwardFunction Forward() {
    return [this](const ForwardArgs& a) -> absl::StatusOr<ForwardResult> {
      const Stream s = a.stream;
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr xs, allocator_->Allocate(kBytes, s));
      GRAPHALLOC_RETURN_IF_ERROR(driver_->CopyAsync(xs, a.inputs[0].ptr, kBytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr y,
                                  DropoutOfProduct(a.generator(0), xs, a.params[0].ptr, s, nullptr));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr r, allocator_->Allocate(kBytes, s));
      GRAPHALLOC_RETURN_IF_ERROR(mlp::Run(*driver_, s, mlp_body::Mul{F(r), F(y), F(y), kN}));
      ForwardResult result;
      result.outputs = {{r, kBytes}};
      if (options_.recompute) {
        GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(y));
        result.saved = {{xs, kBytes}};
      } else {
        result.saved = {{xs, kBytes}, {y, kBytes}};
      }
      return result;
    };
  }

  BackwardFunction Backward() {
    return [this](const BackwardArgs& a) -> absl::StatusOr<std::vector<BufferView>> {
      const Stream s = a.stream;
      const DevicePtr xs = a.saved[0].ptr, w = a.params[0].ptr;
      GRAPHALLOC_ASSIGN_OR_RETURN(const PhiloxArgs mask, a.generator(0).Reserve(PhiloxIncrement(kN)));
      if (options_.fail_backward) return absl::DataLossError("injected backward failure");
      if (options_.throw_in_backward) throw std::runtime_error("injected backward exception");
      if (options_.extra_draw) GRAPHALLOC_RETURN_IF_ERROR(a.generator(0).Reserve(4).status());
      DevicePtr y = 0;
      if (options_.recompute) {
        GRAPHALLOC_ASSIGN_OR_RETURN(y, DropoutOfProduct(a.generator(0), xs, w, s, &mask));
      } else {
        y = a.saved[1].ptr;
      }
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr g, allocator_->Allocate(kBytes, s));
      GRAPHALLOC_RETURN_IF_ERROR(
          mlp::Run(*driver_, s, mlp_body::Mul{F(g), F(y), F(a.grad_outputs[0].ptr), kN}));
      GRAPHALLOC_RETURN_IF_ERROR(ScaleF32(*driver_, s, g, g, kN, 2.0f));
      GRAPHALLOC_RETURN_IF_ERROR(DropoutBackward(*driver_, s, g, g, kN, DType::kFloat32, kP, mask));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr gx, allocator_->Allocate(kBytes, s));
      GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr gw, allocator_->Allocate(kBytes, s));
      GRAPHALLOC_RETURN_IF_ERROR(mlp::Run(*driver_, s, mlp_body::Mul{F(gx), F(g), F(w), kN}));
      GRAPHALLOC_RETURN_IF_ERROR(mlp::Run(*driver_, s, mlp_body::Mul{F(gw), F(g), F(xs), kN}));
      GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(g));
      if (options_.recompute) GRAPHALLOC_RETURN_IF_ERROR(allocator_->Free(y));
      return std::vector<BufferView>{{gx, kBytes}, {gw, kBytes}};
    };
  }

  // dropout(x * w) in a new buffer; draws a mask from `gen` unless `mask` is given (a recomputation
  // reuses the mask its backward reserved).
  absl::StatusOr<DevicePtr> DropoutOfProduct(Generator& gen, DevicePtr x, DevicePtr w, Stream s,
                                             const PhiloxArgs* mask) {
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr z, allocator_->Allocate(kBytes, s));
    GRAPHALLOC_RETURN_IF_ERROR(mlp::Run(*driver_, s, mlp_body::Mul{F(z), F(x), F(w), kN}));
    PhiloxArgs args;
    if (mask != nullptr) {
      args = *mask;
    } else {
      GRAPHALLOC_ASSIGN_OR_RETURN(args, gen.Reserve(PhiloxIncrement(kN)));
    }
    GRAPHALLOC_RETURN_IF_ERROR(DropoutForward(*driver_, s, z, z, kN, DType::kFloat32, kP, args));
    return z;
  }

  std::unique_ptr<GraphedStep> MakeStep(bool graphed, std::shared_ptr<RngStatePairs>* rng = nullptr) {
    auto pairs = std::make_shared<RngStatePairs>(driver_, std::vector<std::uint64_t>{kSeed});
    if (rng != nullptr) *rng = pairs;
    GraphedStepOptions options;
    options.name = graphed ? "graphed" : "eager";
    options.graphed = graphed;
    options.rng = pairs;
    options.tree = CapturingOptions();
    absl::StatusOr<std::unique_ptr<GraphedStep>> step =
        GraphedStep::Create(*allocator_, {w_}, Forward(), Backward(), std::move(options));
    EXPECT_TRUE(step.ok()) << step.status();
    return step.ok() ? std::move(*step) : nullptr;
  }
  void MakeBoth() {
    graphed_ = MakeStep(true, &graphed_rng_);
    eager_ = MakeStep(false, &eager_rng_);
    ASSERT_NE(graphed_, nullptr);
    ASSERT_NE(eager_, nullptr);
  }

  StepForward Fwd(GraphedStep& step, BufferView x) {
    absl::StatusOr<StepForward> f = step.Forward({x}, caller_);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? *f : StepForward();
  }
  std::vector<TreeOutput> Bwd(GraphedStep& step, const StepForward& f, bool retain = false) {
    absl::StatusOr<std::vector<TreeOutput>> g = step.Backward(f, {gr_}, caller_, {.retain_graph = retain});
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : std::vector<TreeOutput>{};
  }
  // The gradients' values (empty for a failed call).
  std::vector<std::vector<float>> Values(const std::vector<TreeOutput>& grads) {
    std::vector<std::vector<float>> v;
    for (const TreeOutput& g : grads) v.push_back(Read(g));
    return v;
  }
  static std::vector<float> Values(int seed) { return testing::Values(seed); }

  // Host reference of the gradients of forward number `k` in draw order (its mask at offset 4k: one
  // curand4 per thread for 1024 elements), with the same roundings as the kernels.
  std::vector<std::vector<float>> Reference(const std::vector<float>& x, std::uint64_t k) {
    const std::vector<float> w = Values(1);
    const PhiloxArgs mask = PhiloxArgs::Eager(kSeed, k * PhiloxIncrement(kN));
    const rng_body::DropoutParams params = DropoutParamsFor(kP);
    std::vector<float> z(kN), y(kN), g(kN), gx(kN), gw(kN);
    for (std::size_t i = 0; i < kN; ++i) z[i] = x[i] * w[i];
    DropoutOnHost(z.data(), y.data(), kN, rng_body::ElementType::kFloat32, params, mask);
    for (std::size_t i = 0; i < kN; ++i) {
      const volatile float t = y[i] * 1.5f;  // volatile: one rounding per operation, as the kernels
      g[i] = 2.0f * t;
    }
    DropoutOnHost(g.data(), g.data(), kN, rng_body::ElementType::kFloat32, params, mask);
    for (std::size_t i = 0; i < kN; ++i) {
      gx[i] = g[i] * w[i];
      gw[i] = g[i] * x[i];
    }
    return {gx, gw};
  }

  ModelOptions options_;
  BufferView w_, gr_;
  std::vector<BufferView> x_;
  std::unique_ptr<GraphedStep> graphed_, eager_;
  std::shared_ptr<RngStatePairs> graphed_rng_, eager_rng_;
};

TEST_F(GraphedStepTest, AClonedGradientHeldAcrossTwoReplaysKeepsItsValues) {
  MakeBoth();
  std::vector<std::vector<float>> held_values;
  std::vector<TreeOutput> held;
  for (int k = 0; k < 5; ++k) {  // warmup, recording, replays
    const std::vector<TreeOutput> grads = Bwd(*graphed_, Fwd(*graphed_, x_[k]));
    ASSERT_EQ(grads.size(), 2u);
    EXPECT_EQ(Values(grads), Reference(Values(10 + k), k)) << "step " << k;
    EXPECT_EQ(grads[kGw].kind(), OutputKind::kOwned);
    if (k == 2) {  // the first replay: hold its gradients across the next two replays
      held = grads;
      held_values = Values(grads);
    }
    if (k > 2) {
      EXPECT_NE(*grads[kGw].ptr(), *held[kGw].ptr());
      EXPECT_EQ(Values(held), held_values) << "the gradient of step 2, read after step " << k;
    }
  }
  EXPECT_EQ(graphed_->tree(0)->Dump().counters.replays, 6u);  // forward and backward of steps 2, 3, 4
}

TEST_F(GraphedStepTest, AnAliasedGradientHeldAcrossTheNextReplayIsTheLivenessError) {
  MakeBoth();
  ASSERT_OK(graphed_->SetAliasGradient(kGw, true));
  std::vector<TreeOutput> held;
  for (int k = 0; k < 4; ++k) {
    std::vector<TreeOutput> grads = Bwd(*graphed_, Fwd(*graphed_, x_[k]));
    EXPECT_EQ(Values(grads), Reference(Values(10 + k), k)) << "step " << k;  // consumed at once: right
    EXPECT_EQ(grads[kGw].kind(), OutputKind::kPool);
    EXPECT_EQ(grads[kGx].kind(), OutputKind::kOwned);
    if (k == 2) held = grads;
    if (k == 3) {
      EXPECT_EQ(*grads[kGw].ptr(), held[kGw].state()->buffer.ptr) << "the alias is the static buffer";
      const absl::StatusOr<DevicePtr> stale = held[kGw].ptr();
      ASSERT_FALSE(stale.ok());
      EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_TRUE(Contains(stale.status().message(), "has been overwritten")) << stale.status();
      EXPECT_EQ(Read(held[kGx]), Reference(Values(12), 2)[kGx]) << "the cloned slot of step 2 is intact";
    }
  }
}

TEST_F(GraphedStepTest, FlippingTheAliasPolicyAfterCaptureChangesNothing) {
  MakeBoth();
  ASSERT_OK(graphed_->SetAliasGradient(kGx, true));  // before capture: takes effect
  std::vector<TreeOutput> first = Bwd(*graphed_, Fwd(*graphed_, x_[0]));
  EXPECT_TRUE(graphed_->captured());
  const absl::Status flip = graphed_->SetAliasGradient(kGw, true);
  EXPECT_EQ(flip.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(flip.message(), "gradient slot 1 was fixed as cloned")) << flip;
  EXPECT_EQ(graphed_->SetAliasGradient(kGx, false).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<TreeOutput> held;
  for (int k = 1; k < 5; ++k) {
    std::vector<TreeOutput> grads = Bwd(*graphed_, Fwd(*graphed_, x_[k]));
    EXPECT_EQ(Values(grads), Reference(Values(10 + k), k)) << "step " << k;
    EXPECT_EQ(grads[kGw].kind(), OutputKind::kOwned) << "slot 1 is still cloned, step " << k;
    EXPECT_EQ(grads[kGx].kind(), OutputKind::kPool) << "slot 0 is still aliased, step " << k;
    if (k == 3) held = grads;
  }
  EXPECT_EQ(Read(held[kGw]), Reference(Values(13), 3)[kGw]);
  EXPECT_FALSE(held[kGx].Check().ok());
}

TEST_F(GraphedStepTest, MicroBatchAccumulationEqualsEagerBitForBit) {
  MakeBoth();
  auto accumulate = [&](GraphedStep& step, int micro_batches, int steps) {
    const BufferView acc = Upload(std::vector<float>(kN, 0.0f));
    std::vector<std::vector<float>> per_step;
    for (int s = 0; s < steps; ++s) {
      Overwrite(acc.ptr, std::vector<float>(kN, 0.0f));
      for (int m = 0; m < micro_batches; ++m) {
        const std::vector<TreeOutput> grads =
            Bwd(step, Fwd(step, x_[static_cast<std::size_t>(s * micro_batches + m) % x_.size()]));
        EXPECT_OK(AddF32(*driver_, caller_, acc.ptr, acc.ptr, *grads[kGw].ptr(), kN));
      }
      per_step.push_back(Download(acc.ptr));
    }
    return per_step;
  };
  const std::vector<std::vector<float>> graphed = accumulate(*graphed_, 4, 4);
  const std::vector<std::vector<float>> eager = accumulate(*eager_, 4, 4);
  ASSERT_EQ(graphed.size(), 4u);
  for (std::size_t s = 0; s < graphed.size(); ++s) EXPECT_EQ(graphed[s], eager[s]) << "step " << s;
  // And the sum is g1 + g2 + g3 + g4 of the reference, not the last gradient four times.
  std::vector<float> want(kN, 0.0f);
  for (int m = 0; m < 4; ++m) {
    const std::vector<float> g = Reference(Values(10 + m), static_cast<std::uint64_t>(m))[kGw];
    for (std::size_t i = 0; i < kN; ++i) want[i] += g[i];
  }
  EXPECT_EQ(graphed[0], want);
}

TEST_F(GraphedStepTest, ForwardBackwardRetainBackwardGivesTwoIdenticalGradients) {
  MakeBoth();
  for (int k = 0; k < 4; ++k) {
    const StepForward f = Fwd(*graphed_, x_[k]);
    const std::vector<std::vector<float>> first = Values(Bwd(*graphed_, f, /*retain=*/true));
    EXPECT_TRUE(f.pending());
    EXPECT_GT(graphed_->saved_bytes(), 0u) << "the retained backward keeps the saved state";
    const std::vector<std::vector<float>> second = Values(Bwd(*graphed_, f));
    EXPECT_FALSE(f.pending());
    EXPECT_EQ(first, second) << "step " << k;
    EXPECT_EQ(first, Reference(Values(10 + k), k)) << "step " << k;
    const StepForward e = Fwd(*eager_, x_[k]);
    EXPECT_EQ(Values(Bwd(*eager_, e, true)), first);
    EXPECT_EQ(Values(Bwd(*eager_, e)), second);
  }
  EXPECT_EQ(graphed_rng_->snapshot_count(), 0u);
  EXPECT_EQ(graphed_->lanes(), 1u);
  const absl::StatusOr<std::vector<TreeOutput>> again =
      graphed_->Backward(Fwd(*graphed_, x_[0]), {gr_}, caller_);
  ASSERT_TRUE(again.ok());
}

TEST_F(GraphedStepTest, OutOfOrderBackwardsEachGetTheirOwnForwardsResult) {
  MakeBoth();
  for (int round = 0; round < 4; ++round) {  // warmup, recording, replays of both lanes
    const StepForward f0 = Fwd(*graphed_, x_[0]);
    const StepForward f1 = Fwd(*graphed_, x_[1]);
    const std::vector<std::vector<float>> b1 = Values(Bwd(*graphed_, f1));
    const std::vector<std::vector<float>> b0 = Values(Bwd(*graphed_, f0));
    const StepForward e0 = Fwd(*eager_, x_[0]);
    const StepForward e1 = Fwd(*eager_, x_[1]);
    EXPECT_EQ(b1, Values(Bwd(*eager_, e1))) << "round " << round;
    EXPECT_EQ(b0, Values(Bwd(*eager_, e0))) << "round " << round;
    EXPECT_EQ(b0, Reference(Values(10), 2 * static_cast<std::uint64_t>(round))) << "round " << round;
    EXPECT_EQ(b1, Reference(Values(11), 2 * static_cast<std::uint64_t>(round) + 1)) << "round " << round;
  }
  EXPECT_EQ(graphed_->lanes(), 2u) << "one recording per outstanding forward";
  EXPECT_EQ(graphed_->tree(1)->Dump().counters.replays, 4u);
  EXPECT_EQ(graphed_rng_->snapshot_count(), 0u);
}

TEST_F(GraphedStepTest, RecomputationReproducesTheForwardsDropoutExactly) {
  options_.recompute = true;
  graphed_ = MakeStep(true, &graphed_rng_);
  ASSERT_NE(graphed_, nullptr);
  for (int round = 0; round < 3; ++round) {
    // In order, retained, and out of order: each recomputation sees its own forward's mask.
    const StepForward a = Fwd(*graphed_, x_[0]);
    EXPECT_EQ(Values(Bwd(*graphed_, a, true)), Reference(Values(10), 4 * static_cast<std::uint64_t>(round)));
    EXPECT_EQ(Values(Bwd(*graphed_, a)), Reference(Values(10), 4 * static_cast<std::uint64_t>(round)));
    const StepForward b = Fwd(*graphed_, x_[1]);
    const StepForward c = Fwd(*graphed_, x_[2]);
    const StepForward d = Fwd(*graphed_, x_[3]);
    EXPECT_EQ(Values(Bwd(*graphed_, c)), Reference(Values(12), 4 * static_cast<std::uint64_t>(round) + 2));
    EXPECT_EQ(Values(Bwd(*graphed_, d)), Reference(Values(13), 4 * static_cast<std::uint64_t>(round) + 3));
    EXPECT_EQ(Values(Bwd(*graphed_, b)), Reference(Values(11), 4 * static_cast<std::uint64_t>(round) + 1));
  }
  EXPECT_EQ(graphed_->saved_bytes(), 0u);
}

TEST_F(GraphedStepTest, ABackwardThatFailsStillRunsTheEpilogueAndLeavesNothingDeferred) {
  graphed_ = MakeStep(true, &graphed_rng_);
  ASSERT_NE(graphed_, nullptr);
  int released = 0;
  for (int k = 0; k < 3; ++k) {  // the failing backward is a warmup, then recorded: its function runs
    const StepForward f = Fwd(*graphed_, x_[k]);
    Bwd(*graphed_, f, /*retain=*/true);
    graphed_->RequestRelease("parameter shard", [&] { ++released; });
    EXPECT_EQ(graphed_->deferred_releases(), 1u);
    EXPECT_EQ(released, k);
    options_.fail_backward = true;
    const absl::StatusOr<std::vector<TreeOutput>> failed = graphed_->Backward(f, {gr_}, caller_);
    options_.fail_backward = false;
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(failed.status().message(), "injected backward failure")) << failed.status();
    EXPECT_TRUE(Contains(failed.status().message(), "saved state is released")) << failed.status();
    EXPECT_EQ(graphed_->deferred_releases(), 0u);
    EXPECT_EQ(released, k + 1);
    EXPECT_FALSE(f.pending());
    EXPECT_EQ(graphed_->pending_forwards(), 0u);
    EXPECT_EQ(graphed_->saved_bytes(), 0u);
    EXPECT_EQ(graphed_rng_->snapshot_count(), 0u);
    EXPECT_EQ(graphed_->Backward(f, {gr_}, caller_).status().code(), absl::StatusCode::kFailedPrecondition);
  }
  // The step goes on, with the right masks (the failed backwards drew; the pairs do not trust them).
  const std::uint64_t next = 3;
  EXPECT_EQ(Values(Bwd(*graphed_, Fwd(*graphed_, x_[3]))), Reference(Values(13), next));
}

TEST_F(GraphedStepTest, AFailedLaunchOfAReplayedBackwardRunsTheEpilogue) {
  SimDriver* sim = AsSim(driver_.get());
  if (sim == nullptr) GTEST_SKIP() << "fault injection needs the simulated device";
  graphed_ = MakeStep(true, &graphed_rng_);
  ASSERT_NE(graphed_, nullptr);
  int released = 0;
  for (int k = 0; k < 4; ++k) {  // forward, backward(retain), backward: warmup, recording, replays
    const StepForward f = Fwd(*graphed_, x_[k]);
    Bwd(*graphed_, f, /*retain=*/true);
    graphed_->RequestRelease("buffer", [&] { ++released; });
    EXPECT_EQ(released, k);
    if (k == 3) sim->InjectFault(SimCall::kGraphLaunch, 1, DriverResult::kIllegalAddress);
    const absl::StatusOr<std::vector<TreeOutput>> last = graphed_->Backward(f, {gr_}, caller_);
    EXPECT_EQ(last.ok(), k < 3) << last.status();
    EXPECT_EQ(released, k + 1);
    EXPECT_EQ(graphed_->deferred_releases(), 0u);
    EXPECT_EQ(graphed_->pending_forwards(), 0u);
    EXPECT_EQ(graphed_rng_->snapshot_count(), 0u);
  }
  EXPECT_EQ(graphed_->tree(0)->Dump().counters.recordings, 3u);
  EXPECT_EQ(Values(Bwd(*graphed_, Fwd(*graphed_, x_[4]))), Reference(Values(14), 4));
}

TEST_F(GraphedStepTest, ABackwardThatThrowsStillRunsTheEpilogue) {
  eager_ = MakeStep(false, &eager_rng_);
  ASSERT_NE(eager_, nullptr);
  const StepForward f = Fwd(*eager_, x_[0]);
  Bwd(*eager_, f, /*retain=*/true);
  int released = 0;
  eager_->RequestRelease("buffer", [&] { ++released; });
  options_.throw_in_backward = true;
  EXPECT_THROW((void)eager_->Backward(f, {gr_}, caller_), std::runtime_error);
  options_.throw_in_backward = false;
  EXPECT_EQ(released, 1);
  EXPECT_EQ(eager_->deferred_releases(), 0u);
  EXPECT_FALSE(f.pending());
  EXPECT_EQ(eager_->saved_bytes(), 0u);
  EXPECT_EQ(Values(Bwd(*eager_, Fwd(*eager_, x_[1]))), Reference(Values(11), 1));
}

TEST_F(GraphedStepTest, ReleasesAskedForWhileARetainedBackwardMayRunWaitForOneEpilogue) {
  MakeBoth();
  std::vector<std::string> order;
  graphed_->RequestRelease("now", [&] { order.push_back("now"); });
  EXPECT_EQ(order, std::vector<std::string>{"now"}) << "nothing retained: released at once";
  const StepForward f0 = Fwd(*graphed_, x_[0]);
  const StepForward f1 = Fwd(*graphed_, x_[1]);
  Bwd(*graphed_, f0, /*retain=*/true);
  Bwd(*graphed_, f1, /*retain=*/true);
  graphed_->RequestRelease("a", [&] { order.push_back("a"); });
  graphed_->RequestRelease("b", [&] { order.push_back("b"); });
  EXPECT_EQ(graphed_->deferred_release_names(), (std::vector<std::string>{"a", "b"}));
  Bwd(*graphed_, f0, /*retain=*/true);  // a retained backward again: still deferred
  Bwd(*graphed_, f0);                   // f0 done, but f1's retained backward may still run
  EXPECT_EQ(graphed_->deferred_releases(), 2u);
  EXPECT_EQ(order.size(), 1u);
  Bwd(*graphed_, f1);  // the last retained backward: one epilogue runs both, in order
  EXPECT_EQ(order, (std::vector<std::string>{"now", "a", "b"}));
  EXPECT_EQ(graphed_->deferred_releases(), 0u);
}

TEST_F(GraphedStepTest, AfterAFullStepNothingIsDeferredAndThePoolsLiveBytesReturnToTheBaseline) {
  MakeBoth();
  const std::size_t default_baseline = Stats().allocated_bytes.all().current;
  std::size_t pool_allocated = 0;
  for (int k = 0; k < 5; ++k) {
    {
      const StepForward f = Fwd(*graphed_, x_[k]);
      EXPECT_EQ(graphed_->saved_bytes(), 2 * kBytes);
      Bwd(*graphed_, f, /*retain=*/true);
      graphed_->RequestRelease("shard", [] {});
      const std::vector<TreeOutput> grads = Bwd(*graphed_, f);
      EXPECT_EQ(graphed_->deferred_releases(), 0u) << "step " << k;
      EXPECT_EQ(graphed_->pending_forwards(), 0u) << "step " << k;
      EXPECT_EQ(graphed_->saved_bytes(), 0u) << "step " << k;
      // Still referenced: the forward's output (held by `f`) and nothing else of the pool.
      EXPECT_EQ(graphed_->live_pool_bytes(), kBytes) << "step " << k;
    }
    EXPECT_EQ(graphed_->live_pool_bytes(), 0u) << "the step's baseline, step " << k;
    EXPECT_EQ(graphed_rng_->snapshot_count(), 0u);
    EXPECT_OK(driver_->StreamSynchronize(caller_));
    ASSERT_OK_AND_ASSIGN(const PoolStats pool, allocator_->GetPoolStats(graphed_->tree(0)->pool().id()));
    // The default pool's share of the device's allocated bytes: the cloned gradients are all freed.
    EXPECT_EQ(Stats().allocated_bytes.all().current - pool.allocated_bytes, default_baseline) << "step " << k;
    if (k >= 3) {  // replays change nothing in the pool
      EXPECT_EQ(pool.allocated_bytes, pool_allocated) << "step " << k;
    }
    pool_allocated = pool.allocated_bytes;
  }
  ExpectInvariants();
}

TEST_F(GraphedStepTest, ABackwardThatDrawsDifferentlyFromItsForwardIsRejected) {
  graphed_ = MakeStep(true, &graphed_rng_);
  ASSERT_NE(graphed_, nullptr);
  options_.extra_draw = true;
  const absl::StatusOr<std::vector<TreeOutput>> g = graphed_->Backward(Fwd(*graphed_, x_[0]), {gr_}, caller_);
  ASSERT_FALSE(g.ok());
  EXPECT_TRUE(
      Contains(g.status().message(), "drew 8 Philox words per thread from random op 0, its forward drew 4"))
      << g.status();
  EXPECT_EQ(graphed_->pending_forwards(), 0u);
}

TEST_F(GraphedStepTest, TooManyOutstandingForwardsIsAClearError) {
  auto pairs = std::make_shared<RngStatePairs>(driver_, std::vector<std::uint64_t>{kSeed});
  GraphedStepOptions options;
  options.max_outstanding_forwards = 2;
  options.rng = pairs;
  absl::StatusOr<std::unique_ptr<GraphedStep>> step =
      GraphedStep::Create(*allocator_, {w_}, Forward(), Backward(), std::move(options));
  ASSERT_TRUE(step.ok()) << step.status();
  const StepForward f0 = Fwd(**step, x_[0]);
  const StepForward f1 = Fwd(**step, x_[1]);
  const absl::StatusOr<StepForward> f2 = (*step)->Forward({x_[2]}, caller_);
  ASSERT_FALSE(f2.ok());
  EXPECT_EQ(f2.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(f2.status().message(), "with 2 forwards still waiting for their last backward"))
      << f2.status();
  ASSERT_OK((*step)->Discard(f1));
  EXPECT_TRUE(Fwd(**step, x_[2]).pending());
  EXPECT_EQ(pairs->snapshot_count(), 1u) << "the third forward's snapshot (f0's backward has not run)";
}

}  // namespace
}  // namespace graphalloc::testing
