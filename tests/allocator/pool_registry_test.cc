// The pool registry on its own: ids in creation order, users and pins, the moment a pool is orphaned,
// which pools the release paths may touch, and its NotFound messages.
#include "graphalloc/allocator/core/pool_registry.h"

#include <vector>

#include "gtest/gtest.h"

namespace graphalloc {
namespace {

TEST(PoolRegistryTest, IdsInCreationOrderWithOneUser) {
  PoolRegistry registry;
  EXPECT_EQ(registry.Create({}, nullptr), 1u);
  EXPECT_EQ(registry.Create({.use_on_oom = true}, nullptr), 2u);
  ASSERT_NE(registry.Find(1), nullptr);
  EXPECT_EQ(registry.Find(1)->users.load(), 1);
  EXPECT_EQ(registry.Find(3), nullptr);
  std::vector<PoolId> seen;
  registry.ForEach([&](PoolId id, const PoolState& pool) {
    EXPECT_EQ(pool.id, id);
    seen.push_back(id);
  });
  EXPECT_EQ(seen, (std::vector<PoolId>{1, 2}));
}

TEST(PoolRegistryTest, OrphanedWhenTheLastUserAndPinAreGone) {
  PoolRegistry registry;
  const PoolId id = registry.Create({}, nullptr);
  ASSERT_TRUE(registry.AddUser(id).ok());
  ASSERT_TRUE(registry.AddPin(id).ok());
  EXPECT_FALSE(registry.DropUser(id));
  EXPECT_FALSE(registry.DropUser(id));  // a pin still holds it
  EXPECT_FALSE(registry.Find(id)->orphaned.load());
  EXPECT_TRUE(registry.DropPin(id));
  EXPECT_TRUE(registry.Find(id)->orphaned.load());
  EXPECT_EQ(registry.Orphans(), (std::vector<PoolId>{id}));
  // An orphan takes no new users (a pin may still be asked for while it is being released).
  absl::Status refused = registry.AddUser(id);
  EXPECT_TRUE(absl::IsNotFound(refused));
  EXPECT_EQ(refused.message(),
            "private pool 1 does not exist (any more): every user and graph of it was dropped; create a new "
            "pool");
  registry.Forget(id);
  EXPECT_EQ(registry.Find(id), nullptr);
  EXPECT_FALSE(registry.DropUser(id));  // gone: nothing to drop
  EXPECT_EQ(registry.AddPin(id).message(), "private pool 1 is gone");
  EXPECT_EQ(registry.SetUseOnOom(id, true).message(), "private pool 1 does not exist");
}

TEST(PoolRegistryTest, UseOnOomPoolsAreTheLiveOnesThatAllowIt) {
  PoolRegistry registry;
  const PoolId a = registry.Create({.use_on_oom = true}, nullptr);
  const PoolId b = registry.Create({}, nullptr);
  const PoolId c = registry.Create({.use_on_oom = true}, nullptr);
  ASSERT_TRUE(registry.SetUseOnOom(b, true).ok());
  ASSERT_TRUE(registry.SetUseOnOom(a, false).ok());
  EXPECT_TRUE(registry.DropUser(c));  // orphaned
  EXPECT_EQ(registry.UseOnOomPools(), (std::vector<PoolId>{b}));
}

TEST(PoolRegistryTest, Releasable) {
  PoolRegistry registry;
  const PoolId id = registry.Create({}, nullptr);
  const PoolState* pool = registry.Find(id);
  // The default pool's memory is always releasable by a device-wide release, never by a pool's.
  EXPECT_TRUE(PoolRegistry::Releasable(nullptr, kDefaultPool));
  EXPECT_FALSE(PoolRegistry::Releasable(nullptr, id));
  // A pool in use: only its own release (EmptyPoolCache) may touch it.
  EXPECT_FALSE(PoolRegistry::Releasable(pool, kDefaultPool));
  EXPECT_TRUE(PoolRegistry::Releasable(pool, id));
  EXPECT_FALSE(PoolRegistry::Releasable(pool, id + 1));
  // Pinned by a graph: nobody.
  ASSERT_TRUE(registry.AddPin(id).ok());
  EXPECT_FALSE(PoolRegistry::Releasable(pool, id));
  EXPECT_FALSE(registry.DropUser(id));
  EXPECT_FALSE(PoolRegistry::Releasable(pool, kDefaultPool));
  // Neither users nor pins: the device-wide release too.
  EXPECT_TRUE(registry.DropPin(id));
  EXPECT_TRUE(PoolRegistry::Releasable(pool, kDefaultPool));
}

}  // namespace
}  // namespace graphalloc
