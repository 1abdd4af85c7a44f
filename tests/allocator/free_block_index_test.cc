// The free-block index against a reference ordered set: best-fit lookups, iteration, erasing at an iterator,
// the largest size and the bin arrays' switch to a tree and back, on random operations and on hand-picked
// edge cases.
#include "graphalloc/allocator/core/free_block_index.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_scale.h"

namespace graphalloc {
namespace {

FreeKey Key(std::size_t size, DevicePtr ptr) { return FreeKey{size, ptr, reinterpret_cast<Block*>(ptr)}; }

std::vector<FreeKey> Contents(const FreeBlockIndex& index) { return {index.begin(), index.end()}; }

// Everything the allocator asks of the index, compared with the reference after each step.
void ExpectSameAs(const FreeBlockIndex& index, const std::set<FreeKey>& reference) {
  ASSERT_EQ(index.size(), reference.size());
  ASSERT_EQ(index.empty(), reference.empty());
  ASSERT_EQ(Contents(index), std::vector<FreeKey>(reference.begin(), reference.end()));
  if (!reference.empty()) {
    ASSERT_EQ(index.LargestSize(), reference.rbegin()->size);
  }
}

TEST(FreeBlockIndexTest, LowerBoundIsTheSmallestFitWithTheLowestAddressAmongEquals) {
  FreeBlockIndex index;
  ASSERT_TRUE(index.Insert(Key(4096, 0x9000)));
  ASSERT_TRUE(index.Insert(Key(4096, 0x3000)));
  ASSERT_TRUE(index.Insert(Key(1024, 0x1000)));
  ASSERT_TRUE(index.Insert(Key(1 << 20, 0x100000)));
  EXPECT_EQ(index.LowerBound(512)->ptr, 0x1000u);
  EXPECT_EQ(index.LowerBound(1536)->ptr, 0x3000u);  // 4096 at 0x3000 before 4096 at 0x9000
  EXPECT_EQ(index.LowerBound(4096)->ptr, 0x3000u);
  EXPECT_EQ(index.LowerBound(4097)->ptr, 0x100000u);
  EXPECT_EQ(index.LowerBound((1 << 20) + 512), index.end());
  EXPECT_EQ(index.LargestSize(), std::size_t{1} << 20);
}

TEST(FreeBlockIndexTest, DuplicateInsertAndMissingEraseChangeNothing) {
  FreeBlockIndex index;
  ASSERT_TRUE(index.Insert(Key(2048, 0x4000)));
  EXPECT_FALSE(index.Insert(Key(2048, 0x4000)));
  EXPECT_FALSE(index.Erase(Key(2048, 0x8000)));
  EXPECT_FALSE(index.Erase(Key(2560, 0x4000)));
  EXPECT_EQ(index.size(), 1u);
  EXPECT_TRUE(index.Contains(Key(2048, 0x4000)));
  EXPECT_FALSE(index.Contains(Key(2048, 0x4200)));
  EXPECT_TRUE(index.Erase(Key(2048, 0x4000)));
  EXPECT_TRUE(index.empty());
  EXPECT_EQ(index.begin(), index.end());
  EXPECT_EQ(index.LowerBound(1), index.end());
}

TEST(FreeBlockIndexTest, BinsAreMonotoneInSizeAcrossTheWholeRange) {
  std::size_t previous = 0;
  for (int log = 0; log < 64; ++log) {
    for (std::size_t step : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{511}}) {
      const std::size_t size = (std::size_t{1} << log) + (log > 12 ? step << (log - 12) : 0);
      const std::size_t bin = FreeBlockIndex::BinOf(size);
      EXPECT_GE(bin, previous) << "size " << size;
      previous = bin;
    }
  }
  constexpr std::size_t kSub = FreeBlockIndex::kSubBins;
  EXPECT_LT(FreeBlockIndex::BinOf(std::numeric_limits<std::size_t>::max()), 64 * kSub);
  // Sizes 1/kSub of a power of two apart land in neighbouring bins; within that step, in the same.
  const std::size_t step = (std::size_t{1} << 20) / kSub;
  EXPECT_EQ(FreeBlockIndex::BinOf(1 << 20), FreeBlockIndex::BinOf((1 << 20) + step - 512));
  EXPECT_EQ(FreeBlockIndex::BinOf(1 << 20) + 1, FreeBlockIndex::BinOf((1 << 20) + step));
}

TEST(FreeBlockIndexTest, ACrowdedBinBecomesATreeAndBackWithTheSameOrder) {
  // 1,000 blocks of one size apart from each other (the case a bin array would shift for): the bin turns
  // into a tree past a few dozen and back to an array below, the order and the lookups unchanged throughout.
  FreeBlockIndex index;
  std::set<FreeKey> reference;
  std::mt19937_64 rng(7);
  std::vector<DevicePtr> ptrs;
  for (int i = 0; i < 1000; ++i) ptrs.push_back(0x10000000 + 0x400 * static_cast<DevicePtr>(i));
  std::shuffle(ptrs.begin(), ptrs.end(), rng);
  for (DevicePtr p : ptrs) {
    ASSERT_TRUE(index.Insert(Key(512, p)));
    reference.insert(Key(512, p));
    ASSERT_EQ(index.LowerBound(512)->ptr, reference.begin()->ptr);
  }
  ExpectSameAs(index, reference);
  std::shuffle(ptrs.begin(), ptrs.end(), rng);
  for (DevicePtr p : ptrs) {
    ASSERT_TRUE(index.Erase(Key(512, p)));
    reference.erase(Key(512, p));
    if (!reference.empty()) {
      ASSERT_EQ(index.LowerBound(512)->ptr, reference.begin()->ptr);
    }
    if (reference.size() % 97 == 0) ExpectSameAs(index, reference);
  }
  EXPECT_TRUE(index.empty());
}

TEST(FreeBlockIndexTest, EraseAtAnIteratorErasesExactlyItsKeyInArraysAndTrees) {
  // An allocation erases the block LowerBound found by its place in the bin, without searching again: the
  // place must follow the iterator wherever it got to (the bin it starts in, a later bin's first key, a
  // step forward) and work for an array bin and a tree bin alike.
  for (int crowd : {4, 100}) {  // 100 keys of one size: a tree bin
    FreeBlockIndex index;
    std::set<FreeKey> reference;
    for (int i = 0; i < crowd; ++i) {
      const FreeKey key = Key(4096, 0x100000 + 0x2000 * static_cast<DevicePtr>(i));
      ASSERT_TRUE(index.Insert(key));
      reference.insert(key);
    }
    for (const FreeKey& key : {Key(1024, 0x1000), Key(65536, 0x10000000), Key(65536, 0x20000000)}) {
      ASSERT_TRUE(index.Insert(key));
      reference.insert(key);
    }
    SCOPED_TRACE(::testing::Message() << crowd << " keys of 4 KiB");
    FreeBlockIndex::Iterator it = index.LowerBound(4096);  // the first key of its bin
    ASSERT_EQ(it->ptr, 0x100000u);
    ++it;  // the second one
    ASSERT_EQ(it->ptr, 0x102000u);
    index.Erase(it);
    reference.erase(Key(4096, 0x102000));
    ExpectSameAs(index, reference);
    it = index.LowerBound(4097);  // the first key of a later bin
    ASSERT_EQ(it->ptr, 0x10000000u);
    ++it;
    ASSERT_EQ(it->ptr, 0x20000000u);
    index.Erase(it);
    reference.erase(Key(65536, 0x20000000));
    ExpectSameAs(index, reference);
    index.Erase(index.LowerBound(512));  // 1 KiB at 0x1000
    reference.erase(Key(1024, 0x1000));
    ExpectSameAs(index, reference);
  }
}

TEST(FreeBlockIndexTest, RandomOperationsMatchAnOrderedSet) {
  const std::uint64_t seed = testing::TestSeed(std::random_device{}());
  std::printf("FreeBlockIndexTest seed %llu (GRAPHALLOC_TEST_SEED replays it)\n",
              static_cast<unsigned long long>(seed));
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  FreeBlockIndex index;
  std::set<FreeKey> reference;
  // Sizes from 512 bytes to 1 TiB in 512-byte steps, skewed small, and a few sizes repeated often so that
  // some bins crowd into trees; addresses from a small range, so that equal sizes collide.
  auto random_size = [&]() -> std::size_t {
    if (rng() % 4 == 0) return std::size_t{512} << (rng() % 4);
    const int log = 9 + static_cast<int>(rng() % 32);
    return ((std::size_t{1} << log) + (rng() % (std::size_t{1} << log))) & ~std::size_t{511};
  };
  const int steps = testing::ScaledCount(200000);
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5 || reference.empty()) {
      const FreeKey key = Key(random_size(), 0x1000000 + 512 * (rng() % 4096));
      ASSERT_EQ(index.Insert(key), reference.insert(key).second);
    } else if (op < 8) {
      // Erase the best fit of a random size, as an allocation does.
      const std::size_t size = random_size();
      auto expected = reference.lower_bound(Key(size, 0));
      FreeBlockIndex::Iterator it = index.LowerBound(size);
      if (expected == reference.end()) {
        ASSERT_EQ(it, index.end());
        continue;
      }
      ASSERT_NE(it, index.end());
      ASSERT_EQ(*it, *expected);
      // The few keys after it too, as the quick-hit check and the growth planner walk them.
      auto walk = it;
      auto reference_walk = expected;
      for (int i = 0; i < 3 && reference_walk != reference.end(); ++i, ++walk, ++reference_walk) {
        ASSERT_EQ(*walk, *reference_walk);
      }
      if (reference_walk == reference.end()) {
        ASSERT_EQ(walk, index.end());
      }
      index.Erase(it);
      reference.erase(expected);
    } else {
      const FreeKey key = Key(random_size(), 0x1000000 + 512 * (rng() % 4096));
      ASSERT_EQ(index.Erase(key), reference.erase(key) == 1);
    }
    ASSERT_EQ(index.size(), reference.size());
    if (!reference.empty()) {
      ASSERT_EQ(index.LargestSize(), reference.rbegin()->size);
    }
    if (step % 5000 == 0) ExpectSameAs(index, reference);
  }
  ExpectSameAs(index, reference);
}

}  // namespace
}  // namespace graphalloc
