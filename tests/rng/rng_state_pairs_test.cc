// RngStatePairs: each backward's recomputed dropout mask equals its own forward's mask, in order, out of
// order (f0 f1 b1 b0), and repeated (retain_graph), and snapshots are dropped after the last backward.
#include "graphalloc/rng/rng_state_pairs.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "graphalloc/rng/random_ops.h"
#include "tests/rng/rng_test_util.h"
#include "tests/testing/test_device.h"

namespace graphalloc {
namespace {

using rng_test::DeviceBuffer;

constexpr std::size_t kN = 5000;
constexpr float kP = 0.4f;

// Two random ops (two dropouts) per forward; the backward recomputes both masks from its own generators.
class Model {
 public:
  explicit Model(std::shared_ptr<Driver> driver)
      : driver_(driver), pairs_(driver, std::vector<std::uint64_t>{1111, 2222}), ones_(*driver, kN * 4) {
    ones_.Write(std::vector<float>(kN, 1.0f));
  }

  // Runs forward; returns (iteration, the masks it applied: out = ones * mask * scale, per op).
  std::pair<std::uint64_t, std::vector<std::vector<float>>> Forward() {
    auto it = pairs_.BeginForward();
    EXPECT_TRUE(it.ok()) << it.status();
    return {*it, Run(/*backward=*/false)};
  }

  // Runs a backward of `iteration`; returns the masks it recomputed (grad_in for grad_out = 1).
  std::vector<std::vector<float>> Backward(std::uint64_t iteration, bool retain) {
    absl::Status s = pairs_.BeginBackward(iteration, retain);
    EXPECT_TRUE(s.ok()) << s;
    return Run(/*backward=*/true);
  }

  RngStatePairs& pairs() { return pairs_; }

 private:
  std::vector<std::vector<float>> Run(bool backward) {
    std::vector<std::vector<float>> masks;
    for (std::size_t op = 0; op < pairs_.num_ops(); ++op) {
      Generator& gen = backward ? pairs_.backward_generator(op) : pairs_.forward_generator(op);
      auto args = gen.Reserve(PhiloxIncrement(kN));
      EXPECT_TRUE(args.ok());
      DeviceBuffer out(*driver_, kN * 4);
      absl::Status s = backward ? DropoutBackward(*driver_, kDefaultStream, ones_.get(), out.get(), kN,
                                                  DType::kFloat32, kP, *args)
                                : DropoutForward(*driver_, kDefaultStream, ones_.get(), out.get(), kN,
                                                 DType::kFloat32, kP, *args);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(driver_->StreamSynchronize(kDefaultStream).ok());
      masks.push_back(out.Read<float>());
    }
    return masks;
  }

  std::shared_ptr<Driver> driver_;
  RngStatePairs pairs_;
  DeviceBuffer ones_;
};

TEST(RngStatePairsTest, InOrderNeedsNoSnapshots) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Model m(driver);
  std::vector<std::vector<float>> previous;
  for (int i = 0; i < 3; ++i) {
    auto [it, fwd] = m.Forward();
    EXPECT_EQ(it, static_cast<std::uint64_t>(i));
    EXPECT_EQ(m.pairs().snapshot_count(), 0u);
    EXPECT_EQ(m.Backward(it, false), fwd) << "iteration " << i;
    EXPECT_NE(fwd, previous);
    EXPECT_NE(fwd[0], fwd[1]) << "the two ops draw from different streams";
    previous = fwd;
  }
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
}

TEST(RngStatePairsTest, OutOfOrderBackwardsMatchTheirForwards) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Model m(driver);
  for (int round = 0; round < 2; ++round) {  // the second round checks the tracker corrects itself
    auto [i0, f0] = m.Forward();
    auto [i1, f1] = m.Forward();
    ASSERT_NE(f0, f1);
    EXPECT_TRUE(m.pairs().has_snapshot(i1) || round > 0);
    EXPECT_EQ(m.Backward(i1, false), f1) << "b1, round " << round;
    EXPECT_EQ(m.Backward(i0, false), f0) << "b0, round " << round;
    EXPECT_EQ(m.pairs().snapshot_count(), 0u) << "round " << round;
    EXPECT_FALSE(m.pairs().is_pending(i0));
    EXPECT_FALSE(m.pairs().is_pending(i1));
  }
}

TEST(RngStatePairsTest, RetainedBackwardsRepeatTheMaskAndTheLastOneDropsTheSnapshot) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Model m(driver);
  auto [i0, f0] = m.Forward();
  EXPECT_EQ(m.Backward(i0, /*retain=*/true), f0);
  EXPECT_TRUE(m.pairs().has_snapshot(i0));
  EXPECT_EQ(m.Backward(i0, /*retain=*/true), f0);
  EXPECT_EQ(m.Backward(i0, /*retain=*/false), f0);
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
  EXPECT_FALSE(m.pairs().is_pending(i0));
  absl::Status s = m.pairs().BeginBackward(i0, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("its last backward already ran"), std::string::npos) << s;
  s = m.pairs().BeginBackward(42, false);
  EXPECT_NE(s.message().find("it never ran"), std::string::npos) << s;
  // The next forward/backward is in order again.
  auto [i1, f1] = m.Forward();
  EXPECT_EQ(m.Backward(i1, false), f1);
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
}

TEST(RngStatePairsTest, MixedOrderWithRetainedGraph) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Model m(driver);
  // f0 f1 b0(retain) b1 b0: every backward sees its own forward's masks.
  auto [i0, f0] = m.Forward();
  auto [i1, f1] = m.Forward();
  EXPECT_EQ(m.Backward(i0, true), f0);
  EXPECT_EQ(m.Backward(i1, false), f1);
  EXPECT_EQ(m.Backward(i0, false), f0);
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
  // f2 f3 f4 b3 b2 b4.
  auto [i2, f2] = m.Forward();
  auto [i3, f3] = m.Forward();
  auto [i4, f4] = m.Forward();
  EXPECT_EQ(m.Backward(i3, false), f3);
  EXPECT_EQ(m.Backward(i2, false), f2);
  EXPECT_EQ(m.Backward(i4, false), f4);
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
}

TEST(RngStatePairsTest, AFailedBackwardThatDrewPartOfItsMasksLeavesLaterBackwardsExact) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Model m(driver);
  // f0 f1 f2, b0 fails after one op drew (and an extra stray draw), then b2, b1, and in-order f3 b3.
  auto [i0, f0] = m.Forward();
  auto [i1, f1] = m.Forward();
  auto [i2, f2] = m.Forward();
  ASSERT_TRUE(m.pairs().BeginBackward(i0, false).ok());
  ASSERT_TRUE(m.pairs().backward_generator(0).Reserve(4).ok());  // the failed backward's partial draw
  ASSERT_TRUE(m.pairs().AbandonBackward(i0).ok());
  EXPECT_FALSE(m.pairs().is_pending(i0));
  EXPECT_FALSE(m.pairs().has_snapshot(i0));
  EXPECT_EQ(m.Backward(i2, false), f2);
  EXPECT_EQ(m.Backward(i1, false), f1);
  auto [i3, f3] = m.Forward();
  EXPECT_EQ(m.Backward(i3, false), f3);
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
  // Right after a failure the position is unknown, so even an in-order forward takes a snapshot.
  auto [i4, f4] = m.Forward();
  ASSERT_TRUE(m.pairs().BeginBackward(i4, false).ok());
  ASSERT_TRUE(m.pairs().backward_generator(1).Reserve(8).ok());
  ASSERT_TRUE(m.pairs().AbandonBackward(i4).ok());
  auto [i5, f5] = m.Forward();
  EXPECT_TRUE(m.pairs().has_snapshot(i5));
  EXPECT_EQ(m.Backward(i5, false), f5);
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
}

TEST(RngStatePairsTest, AnAbandonedForwardIsForgotten) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  Model m(driver);
  auto [i0, f0] = m.Forward();
  auto [i1, f1] = m.Forward();
  ASSERT_TRUE(m.pairs().AbandonForward(i1).ok());
  EXPECT_FALSE(m.pairs().is_pending(i1));
  EXPECT_EQ(m.pairs().snapshot_count(), 0u);
  EXPECT_EQ(m.pairs().AbandonForward(i1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.Backward(i0, false), f0);
  auto [i2, f2] = m.Forward();
  EXPECT_EQ(m.Backward(i2, false), f2);
}

TEST(RngStatePairsTest, RejectedWhileAGeneratorIsCapturing) {
  GRAPHALLOC_REQUIRE_DEVICE(driver);
  RngStatePairs pairs(driver, std::vector<std::uint64_t>{1});
  ASSERT_TRUE(pairs.backward_generator(0).BeginCapture(1).ok());
  auto it = pairs.BeginForward();
  EXPECT_EQ(it.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(it.status().message().find("random op 0 is capturing"), std::string::npos) << it.status();
  ASSERT_TRUE(pairs.backward_generator(0).CancelCapture().ok());
  EXPECT_TRUE(pairs.BeginForward().ok());
}

}  // namespace
}  // namespace graphalloc
