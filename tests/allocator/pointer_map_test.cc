// The pointer map against a reference map, on random inserts, lookups and erases, for the normal encoding
// and for the paths that the allocator reaches only with millions of blocks (tables past the tag bits) or
// with block pointers above 2^48 (the side map): smaller pointer widths reach them with few blocks.
#include "graphalloc/allocator/core/pointer_map.h"

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

// Blocks with 512-byte-aligned addresses, as the allocator hands out, in arbitrary order.
class Blocks {
 public:
  Block* Make(DevicePtr ptr) {
    blocks_.emplace_back();
    blocks_.back().ptr = ptr;
    return &blocks_.back();
  }

 private:
  std::deque<Block> blocks_;  // stable addresses
};

template <typename Map>
void RunAgainstReference(std::size_t steps, std::size_t max_live, std::uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Map map;
  Blocks blocks;
  std::map<DevicePtr, Block*> reference;
  std::vector<DevicePtr> live;
  DevicePtr next = 0x7f0000000000;
  for (std::size_t step = 0; step < steps; ++step) {
    const bool insert = live.empty() || (live.size() < max_live && rng() % 3 != 0);
    if (insert) {
      next += 512 * (1 + rng() % 64);
      Block* b = blocks.Make(next);
      map.Insert(next, b);
      reference[next] = b;
      live.push_back(next);
    } else {
      const std::size_t i = rng() % live.size();
      const DevicePtr ptr = live[i];
      ASSERT_TRUE(map.Erase(ptr));
      ASSERT_FALSE(map.Erase(ptr));
      reference.erase(ptr);
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(map.size(), reference.size());
    if (step % 64 == 0) {
      for (const auto& [ptr, b] : reference) ASSERT_EQ(map.Find(ptr), b) << std::hex << ptr;
      ASSERT_EQ(map.Find(next + 512), nullptr);
    }
  }
  for (const auto& [ptr, b] : reference) ASSERT_EQ(map.Find(ptr), b);
  for (DevicePtr ptr : live) ASSERT_TRUE(map.Erase(ptr));
  EXPECT_EQ(map.size(), 0u);
  for (const auto& [ptr, b] : reference) EXPECT_EQ(map.Find(ptr), nullptr);
}

TEST(PointerMapTest, MatchesAReferenceMapThroughGrowthAndErases) {
  RunAgainstReference<PointerMap>(40000, 5000, 1);
}

TEST(PointerMapTest, FindAndEraseOfAnAbsentAddressFindNothing) {
  PointerMap map;
  Blocks blocks;
  EXPECT_EQ(map.Find(0x1000), nullptr);
  EXPECT_FALSE(map.Erase(0x1000));
  map.Insert(0x1000, blocks.Make(0x1000));
  EXPECT_EQ(map.Find(0x1200), nullptr);
  EXPECT_FALSE(map.Erase(0x1200));
  EXPECT_EQ(map.size(), 1u);
}

// 56-bit pointers leave 14 tag bits: from 2^14 slots on, homes are read from the blocks.
TEST(PointerMapTest, TablesLargerThanTheTagBitsReadAddressesFromBlocks) {
  RunAgainstReference<BasicPointerMap<56>>(60000, 20000, 2);
}

// With 40-bit pointers no heap block fits an entry: every block goes to the side map.
TEST(PointerMapTest, BlocksWhosePointerDoesNotFitUseTheSideMap) {
  RunAgainstReference<BasicPointerMap<40>>(5000, 500, 3);
}

}  // namespace
}  // namespace graphalloc
