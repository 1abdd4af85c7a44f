#include "graphalloc/allocator/core/size_policy.h"

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

TEST(SizePolicyTest, RoundsUpToMultiplesOf512) {
  const Config config;
  EXPECT_EQ(RoundSize(1, config), 512u);
  EXPECT_EQ(RoundSize(512, config), 512u);
  EXPECT_EQ(RoundSize(513, config), 1024u);
  EXPECT_EQ(RoundSize(1200, config), 1536u);
  EXPECT_EQ(RoundSize(84 * kMiB + 1, config), 84 * kMiB + 512);
}

TEST(SizePolicyTest, PowerOfTwoDivisionsMatchPyTorchExamples) {
  Config config;
  config.roundup_power2_divisions.fill(4);
  EXPECT_EQ(RoundSize(84 * kMiB, config), 96 * kMiB);
  EXPECT_EQ(RoundSize(64 * kMiB, config), 64 * kMiB);  // powers of two are unchanged
  // Small sizes (<= 512 * divisions) are only rounded to 512.
  EXPECT_EQ(RoundSize(1200, config), 1536u);
  config.roundup_power2_divisions.fill(8);
  EXPECT_EQ(RoundSize(84 * kMiB, config), 88 * kMiB);
  config.roundup_power2_divisions.fill(2);
  EXPECT_EQ(RoundSize(400 * kMiB, config), 512 * kMiB);
}

TEST(SizePolicyTest, SegmentSizesFollowPoolRules) {
  const Config config;
  EXPECT_EQ(SegmentSizeFor(512, config), 2 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kMiB, config), 2 * kMiB);
  EXPECT_EQ(SegmentSizeFor(kMiB + 512, config), 20 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB - 512, config), 20 * kMiB);
  EXPECT_EQ(SegmentSizeFor(10 * kMiB + 512, config), 12 * kMiB);
  EXPECT_EQ(SegmentSizeFor(100 * kMiB, config), 100 * kMiB);
}

TEST(SizePolicyTest, SmallPoolHoldsUpToOneMiB) {
  EXPECT_TRUE(IsSmall(kMiB));
  EXPECT_FALSE(IsSmall(kMiB + 512));
}

TEST(SizePolicyTest, FormatsBytesLikePyTorch) {
  EXPECT_EQ(FormatBytes(512), "512 bytes");
  EXPECT_EQ(FormatBytes(1024), "1024 bytes");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(20 * kMiB), "20.00 MiB");
  EXPECT_EQ(FormatBytes(2 * kGiB + kGiB / 4), "2.25 GiB");
}

}  // namespace
}  // namespace graphalloc
