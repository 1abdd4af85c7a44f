// RecordingKey: equal keys hash equally, and a mismatch names the input and both addresses (host only).
#include "graphalloc/graph/recording_key.h"

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

RecordingKey Key(std::vector<KeyInput> inputs) {
  RecordingKey k{std::move(inputs), 0};
  k.Rehash();
  return k;
}

TEST(RecordingKeyTest, EqualInputsGiveEqualKeysAndHashes) {
  const RecordingKey a = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7000, 512}});
  const RecordingKey b = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7000, 512}});
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_TRUE(a == b);
}

TEST(RecordingKeyTest, AddressRoleSizeAndCountEachChangeTheHash) {
  const RecordingKey base = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7000, 512}});
  const RecordingKey moved = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7200, 512}});
  const RecordingKey managed = Key({{InputRole::kManaged, 0x9000, 4096}, {InputRole::kStatic, 0x7000, 512}});
  const RecordingKey bigger = Key({{InputRole::kCopied, 0, 8192}, {InputRole::kStatic, 0x7000, 512}});
  const RecordingKey fewer = Key({{InputRole::kCopied, 0, 4096}});
  for (const RecordingKey* k : {&moved, &managed, &bigger, &fewer}) {
    EXPECT_NE(k->hash, base.hash);
    EXPECT_FALSE(*k == base);
  }
}

TEST(RecordingKeyTest, NeighbouringAddressesSpreadOverBuckets) {
  // Blocks 512 bytes apart differ only in low bits; their hashes must not collide in the low bits a hash
  // table uses for buckets.
  std::vector<std::uint64_t> low;
  for (int i = 0; i < 64; ++i) {
    low.push_back(Key({{InputRole::kStatic, 0x7f0000000000ULL + 512u * i, 512}}).hash & 0xff);
  }
  std::sort(low.begin(), low.end());
  EXPECT_GT(std::unique(low.begin(), low.end()) - low.begin(), 40);
}

TEST(RecordingKeyTest, StaticAddressChangeIsNamedWithBothAddresses) {
  const RecordingKey rec = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7000, 512}});
  const RecordingKey now = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7a00, 512}});
  const KeyMismatch m = CompareKeys(rec, now);
  EXPECT_EQ(m.reason, RerecordReason::kStaticAddress);
  EXPECT_EQ(m.input, 1u);
  EXPECT_EQ(m.differences, 1u);
  EXPECT_EQ(DescribeMismatch(m), "static input 1 changed address from 0x7000 to 0x7a00");
}

TEST(RecordingKeyTest, AStaticAddressChangeIsReportedBeforeASizeChange) {
  const RecordingKey rec = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kStatic, 0x7000, 512}});
  const RecordingKey now = Key({{InputRole::kCopied, 0, 2048}, {InputRole::kStatic, 0x8000, 512}});
  const KeyMismatch m = CompareKeys(rec, now);
  EXPECT_EQ(m.reason, RerecordReason::kStaticAddress);
  EXPECT_EQ(m.input, 1u);
  EXPECT_EQ(m.differences, 2u);
}

TEST(RecordingKeyTest, SizeRoleAndCountChangesHaveTheirOwnReasons) {
  const RecordingKey rec = Key({{InputRole::kCopied, 0, 4096}, {InputRole::kManaged, 0x9000, 512}});
  const KeyMismatch size =
      CompareKeys(rec, Key({{InputRole::kCopied, 0, 2048}, {InputRole::kManaged, 0x9000, 512}}));
  EXPECT_EQ(size.reason, RerecordReason::kInputSize);
  EXPECT_EQ(DescribeMismatch(size), "input 0 changed size from 4096 to 2048 bytes");
  const KeyMismatch role =
      CompareKeys(rec, Key({{InputRole::kCopied, 0, 4096}, {InputRole::kCopied, 0, 512}}));
  EXPECT_EQ(role.reason, RerecordReason::kManagedInput);
  EXPECT_EQ(DescribeMismatch(role), "input 1 changed from managed at 0x9000 to copied at 0x0");
  const KeyMismatch count = CompareKeys(rec, Key({{InputRole::kCopied, 0, 4096}}));
  EXPECT_EQ(count.reason, RerecordReason::kInputSize);
  EXPECT_TRUE(count.input_count_changed);
  EXPECT_EQ(DescribeMismatch(count), "the number of inputs changed (input 1 is new or gone)");
}

}  // namespace
}  // namespace graphalloc
