// PoolHandle gives its target back exactly once, whichever way the handle ends: reset, reassigned,
// destroyed, or moved from (then the destination does it). The allocator is never touched by the handle
// itself, so a stand-in address serves here.
#include "graphalloc/allocator/core/pool_handle.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

std::vector<int> given_back;

void GiveBack(CachingAllocator& allocator, const int& target) {
  EXPECT_NE(&allocator, nullptr);
  given_back.push_back(target);
}

using Handle = PoolHandle<int, &GiveBack>;

CachingAllocator* StandIn() {
  static char storage;
  return reinterpret_cast<CachingAllocator*>(&storage);
}

class PoolHandleTest : public ::testing::Test {
 protected:
  void SetUp() override { given_back.clear(); }
};

TEST_F(PoolHandleTest, EmptyGivesNothingBack) {
  { Handle empty; }
  Handle empty;
  empty.Reset();
  EXPECT_EQ(empty.allocator(), nullptr);
  EXPECT_TRUE(given_back.empty());
}

TEST_F(PoolHandleTest, DestroyedOrResetGivesBackOnce) {
  { Handle h(StandIn(), 1); }
  Handle h(StandIn(), 2);
  h.Reset();
  h.Reset();
  EXPECT_EQ(given_back, (std::vector<int>{1, 2}));
  EXPECT_EQ(h.allocator(), nullptr);
  EXPECT_EQ(h.target(), 2);  // kept: what it held last
}

TEST_F(PoolHandleTest, MovingTransfersWithoutGivingBack) {
  Handle a(StandIn(), 3);
  Handle b(std::move(a));
  EXPECT_EQ(a.allocator(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.allocator(), StandIn());
  EXPECT_TRUE(given_back.empty());
  Handle c;
  c = std::move(b);
  EXPECT_TRUE(given_back.empty());
  c.Reset();
  EXPECT_EQ(given_back, (std::vector<int>{3}));
}

TEST_F(PoolHandleTest, ReassignmentGivesBackWhatWasHeld) {
  Handle a(StandIn(), 4);
  Handle b(StandIn(), 5);
  a = std::move(b);
  EXPECT_EQ(given_back, (std::vector<int>{4}));
  Handle& alias = a;
  a = std::move(alias);  // self-move: nothing changes
  EXPECT_EQ(given_back, (std::vector<int>{4}));
  EXPECT_EQ(a.target(), 5);
}

TEST_F(PoolHandleTest, ReleaseEmptiesWithoutGivingBack) {
  Handle h(StandIn(), 6);
  EXPECT_EQ(h.Release(), StandIn());
  EXPECT_EQ(h.Release(), nullptr);
  EXPECT_TRUE(given_back.empty());
}

}  // namespace
}  // namespace graphalloc
