// The memory budget's decisions on plain numbers: the cap from a fraction or a limit, segments and growths
// in flight counted against it, and the garbage-collection target.
#include "graphalloc/allocator/core/memory_budget.h"

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

constexpr std::size_t kDevice = std::size_t{80} << 30;

TEST(MemoryBudgetTest, NoCapByDefault) {
  MemoryBudget budget(kDevice);
  EXPECT_EQ(budget.limit(), 0u);
  EXPECT_EQ(budget.fraction(), 1.0);
  EXPECT_EQ(budget.capacity(), kDevice);
  EXPECT_TRUE(budget.BeginSegment(kDevice * 2, kDevice));  // only the device says no
  EXPECT_FALSE(budget.OverLimit(kDevice, kDevice, kDevice));
  EXPECT_EQ(budget.GarbageCollectionTarget(kDevice, 0.5), 0u);
}

TEST(MemoryBudgetTest, FractionSetsTheLimitAndBack) {
  MemoryBudget budget(1000);
  budget.SetFraction(0.25);
  EXPECT_EQ(budget.limit(), 250u);
  EXPECT_EQ(budget.fraction(), 0.25);
  EXPECT_EQ(budget.capacity(), 250u);
  budget.SetFraction(1.0);
  EXPECT_EQ(budget.limit(), 0u);
  // A zero fraction (or one too small for a byte) allows nothing: a one-byte cap, not "no cap".
  budget.SetFraction(0.0);
  EXPECT_EQ(budget.limit(), 1u);
  budget.SetFraction(0.0001);
  EXPECT_EQ(budget.limit(), 1u);
}

TEST(MemoryBudgetTest, LimitSetsTheFraction) {
  MemoryBudget budget(1000);
  budget.SetLimit(500);
  EXPECT_EQ(budget.limit(), 500u);
  EXPECT_EQ(budget.fraction(), 0.5);
  budget.SetLimit(4000);  // above the device: the capacity is still the device's memory
  EXPECT_EQ(budget.capacity(), 1000u);
  budget.SetLimit(0);
  EXPECT_EQ(budget.fraction(), 1.0);
  EXPECT_EQ(budget.limit(), 0u);
}

TEST(MemoryBudgetTest, SegmentsInFlightCountAgainstTheCap) {
  MemoryBudget budget(kDevice);
  budget.SetLimit(100);
  EXPECT_TRUE(budget.BeginSegment(20, 40));  // 60 of 100
  EXPECT_TRUE(budget.BeginSegment(20, 40));  // 100 of 100: exactly at the cap fits
  EXPECT_FALSE(budget.BeginSegment(20, 1));
  budget.EndSegment(40);
  EXPECT_TRUE(budget.BeginSegment(20, 40));
  budget.EndSegment(40);
  budget.EndSegment(40);
  // Growths in flight are a separate account: they do not block a regular segment.
  budget.BeginGrowth(90);
  EXPECT_TRUE(budget.BeginSegment(0, 100));
}

TEST(MemoryBudgetTest, GrowthAdmission) {
  MemoryBudget budget(kDevice);
  budget.SetLimit(100);
  EXPECT_EQ(budget.Committed(30, 10, 5), 45u);
  budget.BeginGrowth(10);  // cached handles taken by a plan
  EXPECT_EQ(budget.growth_in_flight(), 10u);
  EXPECT_EQ(budget.Committed(30, 10, 5), 55u);
  EXPECT_FALSE(budget.OverLimit(30, 10, 50));  // 100
  EXPECT_TRUE(budget.OverLimit(30, 10, 51));
  EXPECT_TRUE(budget.AdmitNewHandles(30, 10, 50));
  EXPECT_EQ(budget.growth_in_flight(), 60u);
  EXPECT_FALSE(budget.AdmitNewHandles(30, 10, 1));
  EXPECT_EQ(budget.growth_in_flight(), 60u);       // refused: nothing counted
  EXPECT_TRUE(budget.AdmitNewHandles(30, 10, 0));  // nothing new always fits
  budget.EndGrowth(60);
  EXPECT_EQ(budget.growth_in_flight(), 0u);
}

TEST(MemoryBudgetTest, GarbageCollectionTargetIsTheExcessOverTheThresholdShareOfTheCap) {
  MemoryBudget budget(kDevice);
  budget.SetLimit(1000);
  EXPECT_EQ(budget.GarbageCollectionTarget(800, 0.8), 0u);
  EXPECT_EQ(budget.GarbageCollectionTarget(900, 0.8), 100u);
  EXPECT_EQ(budget.GarbageCollectionTarget(1000, 0.5), 500u);
}

}  // namespace
}  // namespace graphalloc
