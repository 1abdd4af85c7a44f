// Capture sessions: a captured function replays with the inputs' current values into pool addresses, and
// a failing function or an invalidated capture leaves no capture, no route and no graph behind.
#include "graphalloc/graph/capture_session.h"

#include "tests/graph/graph_test_util.h"

namespace graphalloc::testing {
namespace {

class CaptureSessionTest : public GraphFixture {
 protected:
  // Captures Affine(alpha) on (x, w) into `pool`; its output buffer lands in *out.
  absl::StatusOr<OwnedGraph> CaptureAffine(const PrivatePool& pool, float alpha, BufferView x, BufferView w,
                                           std::vector<BufferView>* out) {
    TreeFunction f = Affine(alpha);
    const BufferView inputs[] = {x, w};
    return CaptureIntoPool(*allocator_, pool, caller_, [&](Stream s) -> absl::Status {
      absl::StatusOr<std::vector<BufferView>> r = f(inputs, s);
      if (!r.ok()) return r.status();
      *out = std::move(*r);
      return absl::OkStatus();
    });
  }

  void ExpectNotCapturing() {
    absl::StatusOr<CaptureInfo> info = driver_->GetCaptureInfo(caller_);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->status, CaptureStatus::kNone);
  }
};

TEST_F(CaptureSessionTest, CapturedGraphComputesFromTheInputsCurrentValuesIntoItsPoolOutput) {
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  const BufferView x = Upload(Values(1));
  const BufferView w = Upload(Values(2));
  std::vector<BufferView> out;
  ASSERT_OK_AND_ASSIGN(OwnedGraph graph, CaptureAffine(pool, 3.0f, x, w, &out));
  ASSERT_EQ(out.size(), 1u);
  // The capture only recorded: the output (and nothing else: the temporary was freed) is live in the pool.
  ASSERT_OK_AND_ASSIGN(PoolStats stats, allocator_->GetPoolStats(pool.id()));
  EXPECT_EQ(stats.live_blocks, 1u);
  EXPECT_EQ(stats.allocated_bytes, kBytes);
  ExpectNotCapturing();

  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pool));
  ASSERT_OK_AND_ASSIGN(OwnedGraphExec exec, Instantiate(*driver_, graph));
  ASSERT_OK(driver_->GraphLaunch(exec.get(), caller_));
  EXPECT_EQ(Download(out[0].ptr), AffineRef(3.0f, Values(1), Values(2)));
  Overwrite(x.ptr, Values(5));
  ASSERT_OK(driver_->GraphLaunch(exec.get(), caller_));
  EXPECT_EQ(Download(out[0].ptr), AffineRef(3.0f, Values(5), Values(2)));
  ASSERT_OK(driver_->StreamSynchronize(caller_));
  ASSERT_OK(allocator_->Free(out[0].ptr));
  ExpectInvariants();
}

TEST_F(CaptureSessionTest, FailingFunctionEndsTheCaptureAndTheRouteAndSaysWhatFailed) {
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  DevicePtr leaked = 0;
  absl::StatusOr<OwnedGraph> graph =
      CaptureIntoPool(*allocator_, pool, caller_, [&](Stream s) -> absl::Status {
        absl::StatusOr<DevicePtr> p = allocator_->Allocate(kBytes, s);
        if (p.ok()) leaked = *p;
        return absl::InternalError("the function broke");
      });
  ASSERT_FALSE(graph.ok());
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(graph.status().message().find("the function broke"), std::string_view::npos) << graph.status();
  EXPECT_NE(graph.status().message().find("the capture was ended"), std::string_view::npos) << graph.status();
  ExpectNotCapturing();
  ASSERT_NE(leaked, 0u);

  // The route is closed: the stream's allocations go to the default pool again.
  ASSERT_OK_AND_ASSIGN(PoolStats before, allocator_->GetPoolStats(pool.id()));
  EXPECT_EQ(before.live_blocks, 1u);  // what the failed function allocated, still the caller's to free
  const DevicePtr plain = Alloc(kBytes, caller_);
  ASSERT_OK_AND_ASSIGN(PoolStats after, allocator_->GetPoolStats(pool.id()));
  EXPECT_EQ(after.live_blocks, 1u);
  FreeOk(plain);
  FreeOk(leaked);

  // And the stream captures again.
  const BufferView x = Upload(Values(3));
  const BufferView w = Upload(Values(4));
  std::vector<BufferView> out;
  ASSERT_OK_AND_ASSIGN(OwnedGraph again, CaptureAffine(pool, 2.0f, x, w, &out));
  ASSERT_OK_AND_ASSIGN(OwnedGraphExec exec, Instantiate(*driver_, again));
  ASSERT_OK(driver_->GraphLaunch(exec.get(), caller_));
  EXPECT_EQ(Download(out[0].ptr), AffineRef(2.0f, Values(3), Values(4)));
  ASSERT_OK(driver_->StreamSynchronize(caller_));
  FreeOk(out[0].ptr);
}

TEST_F(CaptureSessionTest, InvalidatedCaptureIsReportedAndLeavesNoGraph) {
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  SimDriver* sim = AsSim(driver_.get());
  const std::size_t graphs_before = sim != nullptr ? sim->Counters().graphs : 0;
  absl::StatusOr<OwnedGraph> graph =
      CaptureIntoPool(*allocator_, pool, caller_, [&](Stream s) -> absl::Status {
        // Synchronizing a capturing stream is refused in every capture mode and invalidates the capture; the
        // function ignores the error, as careless code would.
        (void)driver_->StreamSynchronize(s);
        return absl::OkStatus();
      });
  ASSERT_FALSE(graph.ok());
  EXPECT_NE(graph.status().message().find("the capture failed"), std::string_view::npos) << graph.status();
  ExpectNotCapturing();
  if (sim != nullptr) {
    EXPECT_EQ(sim->Counters().graphs, graphs_before);
  }
}

TEST_F(CaptureSessionTest, RouteOpensOnlyOnACapturingStreamAndSessionCleansUpWhenAbandoned) {
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool());
  {
    CaptureSession session(*allocator_, pool, caller_);
    ASSERT_OK(session.Begin());
    EXPECT_TRUE(session.capturing());
    ASSERT_OK_AND_ASSIGN(const DevicePtr p, allocator_->Allocate(kBytes, caller_));
    ASSERT_OK_AND_ASSIGN(PoolStats stats, allocator_->GetPoolStats(pool.id()));
    EXPECT_EQ(stats.live_blocks, 1u);  // routed to the pool
    ASSERT_OK(allocator_->Free(p));
    // Leaving the scope without End() abandons the capture.
  }
  ExpectNotCapturing();
  const DevicePtr plain = Alloc(kBytes, caller_);
  ASSERT_OK_AND_ASSIGN(PoolStats stats, allocator_->GetPoolStats(pool.id()));
  EXPECT_EQ(stats.live_blocks, 0u);
  FreeOk(plain);
}

}  // namespace
}  // namespace graphalloc::testing
