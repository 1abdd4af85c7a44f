// Holds on blocks (CachingAllocator::HoldBlock / ReleaseHold, block_holds.cc) and shareable handles
// (Config::shareable_handles, PoolOptions::shareable), on both devices: a held block freed by its
// owner stays allocated, and its address unused, until the last hold goes; a hold reports the chunks under
// the block; a pool with a held block does not sleep; shareable pools create handles that export.
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "gtest/gtest.h"
#include "tests/testing/allocator_fixture.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

class BlockHoldsTest : public testing::AllocatorFixture {
 protected:
  void SetUp() override { GRAPHALLOC_ALLOCATOR_SETUP(); }

  std::int64_t Allocated() { return Stats().allocated_bytes.all().current; }
  // Whether every chunk under the block exports (MemExportToShareableHandle).
  bool ChunksExport(const HeldBlock& held) {
    for (const ChunkPlacement& c : held.chunks) {
      absl::StatusOr<Driver::ShareableHandle> shared = driver_->MemExportToShareableHandle(c.handle);
      if (!shared.ok()) return false;
      close(shared->fd);
    }
    return !held.chunks.empty();
  }
};

TEST_F(BlockHoldsTest, FreeOfAHeldBlockCompletesWithTheLastHold) {
  const DevicePtr p = Alloc(4 * kMiB);
  ASSERT_OK_AND_ASSIGN(const HeldBlock held, allocator_->HoldBlock(p));
  EXPECT_EQ(held.ptr, p);
  EXPECT_EQ(held.size, 4 * kMiB);
  ASSERT_OK(allocator_->HoldBlock(p).status());
  EXPECT_EQ(allocator_->HoldCount(p), 2);
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
  // Freed by its owner, still allocated: counted, and its address not handed out again.
  EXPECT_EQ(Allocated(), static_cast<std::int64_t>(4 * kMiB));
  EXPECT_THAT(allocator_->Free(p).message(), HasSubstr("double free"));
  const DevicePtr other = Alloc(4 * kMiB);
  EXPECT_NE(other, p);
  ASSERT_OK(allocator_->ReleaseHold(p));
  ExpectInvariants();
  EXPECT_EQ(Allocated(), static_cast<std::int64_t>(8 * kMiB));
  ASSERT_OK(allocator_->ReleaseHold(p));
  ExpectInvariants();
  EXPECT_EQ(allocator_->HoldCount(p), 0);
  EXPECT_EQ(Allocated(), static_cast<std::int64_t>(4 * kMiB));
  // Free now: the next allocation of its size gets it back.
  EXPECT_EQ(Alloc(4 * kMiB), p);
}

TEST_F(BlockHoldsTest, ReleasingTheLastHoldOfALiveBlockLeavesItAllocated) {
  const DevicePtr p = Alloc(kMiB);
  ASSERT_OK(allocator_->HoldBlock(p).status());
  ASSERT_OK(allocator_->ReleaseHold(p));
  ExpectInvariants();
  EXPECT_EQ(Allocated(), static_cast<std::int64_t>(kMiB));
  ASSERT_OK(allocator_->Free(p));
  ExpectInvariants();
  EXPECT_EQ(Allocated(), 0);
}

TEST_F(BlockHoldsTest, HoldOfAnUnknownPointerAndReleaseOfAnUnheldBlockAreErrors) {
  const DevicePtr p = Alloc(kMiB);
  EXPECT_EQ(allocator_->HoldBlock(p + 512).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status unheld = allocator_->ReleaseHold(p);
  EXPECT_EQ(unheld.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unheld.message(), HasSubstr("not held"));
  ASSERT_OK(allocator_->Free(p));
  EXPECT_EQ(allocator_->HoldBlock(p).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectInvariants();
}

TEST_F(BlockHoldsTest, AHoldReportsTheChunksUnderTheBlock) {
  // Two growths: the second block's chunk begins where the first's ends.
  const DevicePtr a = Alloc(6 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  ASSERT_OK_AND_ASSIGN(const HeldBlock held, allocator_->HoldBlock(b));
  EXPECT_TRUE(held.expandable);
  EXPECT_FALSE(held.shareable);  // not asked for
  ASSERT_FALSE(held.chunks.empty());
  EXPECT_LE(held.chunks.front().ptr, b);
  EXPECT_GE(held.chunks.back().ptr + held.chunks.back().size, b + 4 * kMiB);
  for (std::size_t i = 1; i < held.chunks.size(); ++i) {
    EXPECT_EQ(held.chunks[i].ptr, held.chunks[i - 1].ptr + held.chunks[i - 1].size);
  }
  EXPECT_FALSE(ChunksExport(held));
  ASSERT_OK(allocator_->ReleaseHold(b));
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK(allocator_->Free(b));
  ExpectInvariants();
}

TEST_F(BlockHoldsTest, ShareableHandlesConfigMakesEveryChunkExportable) {
  Config config;
  config.shareable_handles = true;
  MakeAllocator(config);
  const DevicePtr p = Alloc(6 * kMiB);
  ASSERT_OK_AND_ASSIGN(const HeldBlock held, allocator_->HoldBlock(p));
  EXPECT_TRUE(held.shareable);
  EXPECT_TRUE(ChunksExport(held));
  ASSERT_OK(allocator_->ReleaseHold(p));
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->EmptyCache());
  ExpectInvariants();
  EXPECT_EQ(Stats().reserved_bytes.all().current, 0);
}

TEST_F(BlockHoldsTest, OnlyAShareablePoolsHandlesExport) {
  PoolOptions options;
  options.shareable = true;
  ASSERT_OK_AND_ASSIGN(const PrivatePool pool, allocator_->CreatePool(options));
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
  const DevicePtr p = Alloc(6 * kMiB);
  route = PoolRoute();
  const DevicePtr plain = Alloc(6 * kMiB);
  ASSERT_OK_AND_ASSIGN(const HeldBlock held, allocator_->HoldBlock(p));
  EXPECT_TRUE(held.shareable);
  EXPECT_TRUE(ChunksExport(held));
  ASSERT_OK_AND_ASSIGN(const HeldBlock plain_held, allocator_->HoldBlock(plain));
  EXPECT_FALSE(plain_held.shareable);
  EXPECT_FALSE(ChunksExport(plain_held));
  ASSERT_OK(allocator_->ReleaseHold(p));
  ASSERT_OK(allocator_->ReleaseHold(plain));
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->Free(plain));
  ExpectInvariants();
}

TEST_F(BlockHoldsTest, APoolWithAHeldBlockDoesNotSleep) {
  ASSERT_OK_AND_ASSIGN(PrivatePool pool, allocator_->CreatePool(PoolOptions{}));
  ASSERT_OK_AND_ASSIGN(PoolRoute route,
                       allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread()));
  const DevicePtr p = Alloc(2 * kMiB);
  route = PoolRoute();
  ASSERT_OK(allocator_->HoldBlock(p).status());
  SleepRequest request;
  request.scope = SleepScope::Pool(pool.id());
  const absl::StatusOr<SleepResult> slept = allocator_->Sleep(request);
  EXPECT_EQ(slept.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(slept.status().message(), HasSubstr("shared with another process"));
  ExpectInvariants();
  ASSERT_OK(allocator_->ReleaseHold(p));
  ASSERT_OK(allocator_->Free(p));
  ASSERT_OK(allocator_->Sleep(request).status());
  ExpectInvariants();
}

}  // namespace
}  // namespace graphalloc
